"""docs/ holds together: every link and every ``docs/...`` path the pages, the README and the
code mention exists, docs/README.md lists every page, and every raw-row file is cited; every
``tests/...`` path and every test module named anywhere exists too.

Fast (reads files only). A moved or deleted page fails here with the file and line that still
point at it.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.support import ROOT

DOCS = ROOT / "docs"
INDEX = DOCS / "README.md"

# [text](target) and ![alt](target); the target ends at a space (a title) or ')'
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)[^)]*\)")
# a repository path under docs/, as prose, code and commands write it ("docs/fedrc/README.md,"):
# not part of a longer path (runs/x/docs/...), ending before trailing punctuation
DOCS_PATH = re.compile(r"(?<![\w/.-])docs/[\w./-]*[\w/]")
# the same for a path under tests/ ("tests/core/test_stopping.py::test_..."), and a test module
# named alone ("test_fielding_core.py pins them")
TESTS_PATH = re.compile(r"(?<![\w/.-])tests/[\w./-]*[\w/]")
TEST_MODULE = re.compile(r"(?<![\w/.-])test_\w+\.py\b")
# a path with a placeholder (docs/{family}/README.md, docs/x_<commit>.jsonl) is a template
TEMPLATE = re.compile(r"[<{*]")


def pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def tracked_text_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    out = []
    for name in names:
        path = ROOT / name
        if path.suffix in {".md", ".py", ".toml", ".txt", ".cfg", ".yml", ".yaml", ".sh"} \
                and path.is_file():
            out.append(path)
    return out


def links(page: Path) -> list[tuple[int, str]]:
    return [(i, m.group(1)) for i, line in enumerate(page.read_text().splitlines(), 1)
            for m in LINK.finditer(line)]


def local(target: str) -> str | None:
    """The file part of a link to a file of the repository; None for a URL or an anchor."""
    if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
        return None
    return target.split("#", 1)[0]


def test_every_relative_link_points_to_a_file():
    broken = []
    for page in [ROOT / "README.md", *pages()]:
        for line, target in links(page):
            path = local(target)
            if path and not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)}:{line}: ({target})")
    assert broken == [], "links to nothing:\n" + "\n".join(broken)


def mentions_of_nothing(pattern: re.Pattern, exists) -> list[str]:
    """``file:line: text`` of every match of ``pattern`` in the tracked text files (this one
    aside) that is no template and for which ``exists(text)`` is false."""
    missing = []
    for f in tracked_text_files():
        if f == Path(__file__):
            continue
        for i, line in enumerate(f.read_text().splitlines(), 1):
            for m in pattern.finditer(line):
                if not (TEMPLATE.match(line, m.end()) or exists(m.group())):
                    missing.append(f"{f.relative_to(ROOT)}:{i}: {m.group()}")
    return missing


def test_every_docs_path_mentioned_anywhere_exists():
    """README, pages, package, benchmarks, tests, presets: a ``docs/...`` path names a file or
    folder that is there (a benchmark's default --jsonl is a file it appends to, so it exists)."""
    missing = mentions_of_nothing(DOCS_PATH, lambda path: (ROOT / path).exists())
    assert missing == [], "paths that are not in docs/:\n" + "\n".join(missing)


def test_every_tests_path_and_test_module_mentioned_anywhere_exists():
    """A moved test module fails here with the file and line that still point at it."""
    modules = {p.name for p in (ROOT / "tests").rglob("test_*.py")}
    missing = mentions_of_nothing(TESTS_PATH, lambda path: (ROOT / path).exists())
    missing += mentions_of_nothing(TEST_MODULE, lambda name: name in modules)
    assert missing == [], "tests/ paths and test modules that are not there:\n" + "\n".join(missing)


def test_the_index_lists_every_page():
    listed = {(INDEX.parent / p).resolve() for _, t in links(INDEX) if (p := local(t))}
    unlisted = [str(p.relative_to(ROOT)) for p in pages() if p != INDEX and p not in listed]
    assert unlisted == [], "pages docs/README.md does not list: " + ", ".join(unlisted)


def test_every_raw_row_file_is_cited():
    """A raw-row file stays only while a page (or the README) cites it by name: the numbers it
    holds are somewhere in the docs. Files nothing cites any more go; git keeps them."""
    text = "\n".join(p.read_text() for p in [ROOT / "README.md", *pages()])
    uncited = [str(p.relative_to(ROOT)) for p in sorted(DOCS.rglob("*.jsonl"))
               if p.name not in text]
    assert uncited == [], "raw rows no page cites: " + ", ".join(uncited)


def test_the_checker_sees_a_broken_link(tmp_path):
    """The patterns above find what they are meant to (so the tests above can fail)."""
    page = tmp_path / "p.md"
    page.write_text("See [a](gone.md), [b](https://x.org/y), [c](#top), ![d](img.png \"t\").\n"
                    "Rows in `docs/fedrc/nothing.jsonl`, a template docs/fielding/x_<commit>.jsonl.\n")
    assert [t for _, t in links(page)] == ["gone.md", "https://x.org/y", "#top", "img.png"]
    assert [local(t) for _, t in links(page)] == ["gone.md", None, None, "img.png"]
    text = page.read_text()
    found = [(m.group(), bool(TEMPLATE.match(text, m.end()))) for m in DOCS_PATH.finditer(text)]
    assert found == [("docs/fedrc/nothing.jsonl", False), ("docs/fielding/x_", True)]
    line = "`tests/core/test_x.py::test_y`, runs/a/tests/b.py, test_z.py pins it; my_test_q.py"
    assert [m.group() for m in TESTS_PATH.finditer(line)] == ["tests/core/test_x.py"]
    assert [m.group() for m in TEST_MODULE.finditer(line)] == ["test_z.py"]
