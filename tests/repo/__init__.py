"""The repository as a whole: the README's commands, the app bundle, docs/ links, the package's
structure, the benchmark scripts."""
