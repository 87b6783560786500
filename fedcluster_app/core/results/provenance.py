"""What a run was made with, for its summary.json: the packages' versions and, when fedcluster
runs from a git checkout, its commit. Standard library only; nothing here fails a run (an
answer it cannot get is null)."""

from __future__ import annotations

import platform
import subprocess
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

#: the distributions whose versions a summary names
PACKAGES = ("fedcluster", "flwr", "torch", "numpy")


def package_versions(*extra: str) -> dict[str, str | None]:
    """``{distribution: version}`` of :data:`PACKAGES` and ``extra`` (None: not installed) and
    Python's."""
    out: dict[str, str | None] = {}
    for dist in (*PACKAGES, *extra):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = None
    out["python"] = platform.python_version()
    return out


#: the folder that holds fedcluster_app/: a git checkout's root when run from one
SOURCE = Path(__file__).resolve().parents[3]


@lru_cache(maxsize=8)
def git_commit(source: Path = SOURCE) -> dict[str, object] | None:
    """``{"commit": sha, "dirty": tracked files changed}`` of the checkout whose root is
    ``source``, or None (an installed wheel, no git, not a repository's root: a package inside
    some other project's tree does not take that project's commit)."""
    source = Path(source).resolve()

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(source), *args], capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()

    try:
        if Path(git("rev-parse", "--show-toplevel")).resolve() != source:
            return None
        return {"commit": git("rev-parse", "HEAD"),
                "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.SubprocessError):
        return None
