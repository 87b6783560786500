"""Atomic file writes: a crash while writing never leaves a half-written file behind."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


def _create_beside(path: Path) -> tuple[int, Path]:
    """A new, uniquely named file beside ``path``, opened for writing. Created with mode 0o666
    less the user's umask, as ``open()`` creates files (``tempfile.mkstemp`` would make every
    result 0600, unreadable to the user's group)."""
    while True:
        tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:
            continue


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """Write to a temp file beside ``path``; on success fsync and rename it over ``path``."""
    path = Path(path)
    fd, tmp = _create_beside(path)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_open(path) as fh:
        fh.write(data)
