"""One writer per run directory: an exclusive lock on ``<out-dir>/.fedcluster.lock``.

``fcntl.flock`` on an open file is released by the kernel when its holder exits, however it
exits (SIGKILL included), so a lock is never stale: a file whose lock is free is a finished
holder's note, and the next run takes it over. The file records the holder (PID, host,
command, start time) for the refusal of a second writer.

A launcher that holds the lock for a run executed by other processes (``fedcluster run
--engine ray``: the ServerApp runs in Flower's simulation process) passes its token in
:data:`TOKEN_ENV`; a ServerApp that finds the lock held under that token writes on its behalf.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import socket
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

from fedcluster_app.core.results.files import LOCK_FILE

#: the token of the lock a launcher holds for the processes it starts
TOKEN_ENV = "FEDCLUSTER_RUN_LOCK"

#: this process's held locks: resolved directory -> (file descriptor, token, depth)
_held: dict[Path, list] = {}


class RunDirLocked(FileExistsError):
    """Another run is writing the directory (a refusal: ``fedcluster run`` exits 2)."""


def _command_line() -> str:
    """This process's command line for the lock file, secrets left out (Flower passes the
    ServerApp process its run token as ``--token VALUE``)."""
    words = list(sys.argv) or [sys.executable]
    return " ".join("***" if i and words[i - 1] == "--token" else w for i, w in enumerate(words))


def _holder(path: Path) -> dict:
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
        return info if isinstance(info, dict) else {}
    except (OSError, ValueError):
        return {}


def _refusal(out_dir: Path) -> RunDirLocked:
    info = _holder(out_dir / LOCK_FILE)
    who = (f"process {info.get('pid', '?')} on {info.get('host', '?')}, started "
           f"{info.get('started_at', '?')}: {info.get('command', '?')}") if info else "another process"
    return RunDirLocked(
        f"{out_dir} is being written by another run ({who}; lock file {out_dir / LOCK_FILE}): "
        f"one run writes a directory at a time. Wait for it to end (or stop it), or choose "
        f"another --out")


def _locked_by_other(out_dir: Path) -> bool:
    """Whether another process holds the lock (this process's own, or the launcher's whose
    token this process carries, do not count). Opens the file read-only: changes nothing."""
    if out_dir in _held:
        return False
    try:
        fd = os.open(out_dir / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        token = os.environ.get(TOKEN_ENV)
        return not (token and _holder(out_dir / LOCK_FILE).get("token") == token)
    finally:
        os.close(fd)   # releases a lock taken just to look
    return False


def check_unlocked(out_dir: str | os.PathLike) -> None:
    """Refuse (:class:`RunDirLocked`, naming the holder) when another run holds ``out_dir``'s
    lock; writes nothing."""
    out_dir = Path(out_dir).resolve()
    if _locked_by_other(out_dir):
        raise _refusal(out_dir)


def wait_unlocked(out_dir: str | os.PathLike, timeout: float) -> None:
    """Wait up to ``timeout`` seconds for another holder of ``out_dir``'s lock to end (a
    ServerApp stopped by ``flwr stop`` exits a moment later); :class:`RunDirLocked` if not."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return check_unlocked(out_dir)
        except RunDirLocked:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


@contextlib.contextmanager
def run_lock(out_dir: str | os.PathLike) -> Iterator[str | None]:
    """Hold ``out_dir``'s lock for the block (creating the directory); yields the token to pass
    in :data:`TOKEN_ENV` to processes that write for this holder. Re-entrant in one process;
    a no-op in a process whose launcher holds it. Refuses (:class:`RunDirLocked`) otherwise."""
    out_dir = Path(out_dir).resolve()
    if out_dir in _held:
        _held[out_dir][2] += 1
        try:
            yield _held[out_dir][1]
        finally:
            _held[out_dir][2] -= 1
        return
    created = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(out_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        if not _locked_by_other(out_dir):   # our launcher holds it for us
            yield os.environ.get(TOKEN_ENV)
            return
        raise _refusal(out_dir) from None
    token = secrets.token_hex(8)
    info = {"pid": os.getpid(), "host": socket.gethostname(),
            "command": _command_line(),
            "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "token": token}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
    _held[out_dir] = [fd, token, 1]
    try:
        yield token
    finally:
        del _held[out_dir]
        if created and [p.name for p in out_dir.iterdir()] == [LOCK_FILE]:
            # a run refused before it wrote anything leaves no directory behind; removed while
            # the lock is still held, so a writer that opened the file meanwhile is refused
            (out_dir / LOCK_FILE).unlink()
            try:
                out_dir.rmdir()
            except OSError:     # another writer's lock file appeared: the directory is theirs
                pass
        os.close(fd)   # closing releases the lock
