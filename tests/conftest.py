"""Shared fixtures: small, fast experiment settings for the in-process engine, and a fresh clone
of the repository for the tests of what a new user runs (README, app bundle)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import fedcluster_app.families  # noqa: F401  (every family's scenarios, for tests of the data)
from tests.support import FAST, ROOT


@pytest.fixture
def fast_config(tmp_path):
    """tests.support.FAST writing to ``tmp_path/run``; keyword overrides spelt with _ or -."""
    def make(**overrides):
        cfg = dict(FAST)
        cfg["out-dir"] = str(tmp_path / "run")
        cfg.update({k.replace("_", "-"): v for k, v in overrides.items()})
        return cfg

    return make


# ---------------------------------------------------------------------------- a fresh clone
#: where the local SuperLink that plain `flwr run .` starts listens (fixed by Flower 1.41)
LOCAL_SUPERLINK_PORT = 39091


class FreshClone:
    """A ``git clone`` of this repository's committed HEAD in a temporary folder, as a user has
    it after the README's install: the installed environment is reused (its ``flwr`` and
    ``fedcluster`` first on PATH; nothing is pip-installed), Flower's state (``FLWR_HOME``) and
    Ray's temporary files live in temporary folders, never in the user's home or the clone."""

    def __init__(self, base: Path) -> None:
        self.path = base / "fedcluster"
        subprocess.run(["git", "clone", "--quiet", str(ROOT), str(self.path)], check=True)
        self.flwr_home = base / "flwr-home"
        # Ray's socket paths must stay short (107 bytes): its temp dir sits right under /tmp
        self.ray_tmp = Path(tempfile.mkdtemp(prefix="ray-"))
        self.env = {**os.environ,
                    "PATH": os.pathsep.join([str(Path(sys.executable).parent),
                                             os.environ.get("PATH", "")]),
                    # the clone's code runs, as after `pip install -e .` in it
                    "PYTHONPATH": str(self.path),
                    "FLWR_HOME": str(self.flwr_home), "RAY_TMPDIR": str(self.ray_tmp),
                    "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1"}
        # the install's .pth file sets it in every process, as on a user's machine
        self.env.pop("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", None)

    def sh(self, command: str, timeout: float = 600,
           **env: str | None) -> subprocess.CompletedProcess:
        """One shell command line, run in the clone; ``env`` changes (None: unset) the
        environment. A plain ``flwr run`` needs 127.0.0.1:39091 for its own local SuperLink."""
        if command.startswith("flwr run") and not self.superlink_pids():
            self.require_free_superlink_port()
        full = {k: v for k, v in {**self.env, **env}.items() if v is not None}
        return subprocess.run(["bash", "-c", command], cwd=self.path, env=full, text=True,
                              capture_output=True, timeout=timeout, check=False)

    def require_free_superlink_port(self) -> None:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", LOCAL_SUPERLINK_PORT)) == 0:
                pytest.skip(f"a local SuperLink of another Flower home listens on 127.0.0.1:"
                            f"{LOCAL_SUPERLINK_PORT}: `flwr run .` would submit to it")

    def superlink_pids(self) -> list[int]:
        """The local SuperLinks `flwr run .` started for this clone: their command line names
        this clone's FLWR_HOME (their database and log live there)."""
        pids = []
        for proc in Path("/proc").iterdir():
            try:
                args = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if (proc.name.isdigit() and any(a.endswith(b"flower-superlink") for a in args)
                    and any(str(self.flwr_home).encode() in a for a in args)):
                pids.append(int(proc.name))
        return pids

    def stop_superlinks(self) -> None:
        """Stop the local SuperLinks of :meth:`superlink_pids` by PID, with their process group
        and their children's (the SuperExec Flower starts in a session of its own)."""
        from fedcluster_app.launcher import stop_process_group

        for pid in self.superlink_pids():
            children = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()
                        and _parent(p) == pid]
            for group in (pid, *children):
                stop_process_group(group)

    def close(self) -> None:
        self.stop_superlinks()
        shutil.rmtree(self.ray_tmp, ignore_errors=True)

    def changed_files(self) -> str:
        """``git status --porcelain``: tracked files changed and untracked files git does not
        ignore (empty when the commands wrote only into ignored places such as runs/)."""
        return subprocess.run(["git", "status", "--porcelain"], cwd=self.path, text=True,
                              capture_output=True, check=True).stdout


def _parent(proc: Path) -> int | None:
    try:   # /proc/PID/stat: "pid (name) state ppid ..."; the name may hold spaces
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


@pytest.fixture(scope="module")
def fresh_clone(tmp_path_factory):
    """One fresh clone per test module (its commands' results build on each other)."""
    clone = FreshClone(tmp_path_factory.mktemp("clone"))
    try:
        yield clone
    finally:
        clone.close()
