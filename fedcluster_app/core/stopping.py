"""Stopping a run on SIGINT (Ctrl-C) or SIGTERM: every engine stops the same way.

``fedcluster run`` installs :func:`stop_signals`. When the round loop runs in this process's
main thread (the in-process engine) the first signal only asks it to stop: the loop finishes
the round it is in, writes a checkpoint and raises :class:`Interrupted`, so the checkpoint
holds a whole round. A second signal, or a signal while nothing can finish a round here (the
Ray and deployment engines wait on ``flwr run``), raises :class:`Interrupted` at once; the
engine then stops every process it started. Exit status 128 + the signal (130, 143), as
shells report it.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator

#: the signals that stop a run
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """A run stopped by a signal. A ``BaseException``, as ``KeyboardInterrupt``: no
    ``except Exception`` of a strategy or a client swallows it."""

    def __init__(self, signum: int, checkpointed_round: int | None = None) -> None:
        self.signum = signum
        #: the round whose end the stopped run checkpointed on its way out (None: not done)
        self.checkpointed_round = checkpointed_round
        super().__init__(f"stopped by {signal.Signals(signum).name}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    @property
    def signame(self) -> str:
        return signal.Signals(self.signum).name


class _State:
    installed = False   # stop_signals is active in this process
    deferring = False   # a round loop in the main thread honours stop_requested()
    requested: int | None = None


def _handler(signum: int, frame) -> None:
    if _State.deferring and _State.requested is None:
        _State.requested = signum
        print(f"fedcluster: {signal.Signals(signum).name}: stopping at the end of this round, "
              f"with a checkpoint (send it again to stop at once)", file=sys.stderr, flush=True)
        return
    raise Interrupted(signum)


@contextlib.contextmanager
def stop_signals() -> Iterator[None]:
    """SIGINT and SIGTERM raise :class:`Interrupted` (or ask the round loop to stop) while
    the block runs; the previous handlers come back after it. Main thread only (Python's rule
    for signal handlers); elsewhere it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _handler) for s in STOP_SIGNALS}
    _State.installed, _State.requested = True, None
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _State.installed = _State.deferring = False


@contextlib.contextmanager
def round_loop() -> Iterator[None]:
    """Around a round loop: where :func:`stop_signals` is active and this is the main thread,
    a first signal waits for the end of the round (:func:`stop_requested`)."""
    defer = _State.installed and threading.current_thread() is threading.main_thread()
    _State.deferring = defer
    try:
        yield
    finally:
        if defer:
            _State.deferring = False


def stop_requested() -> int | None:
    """The signal that asked the round loop to stop at the end of this round, or None."""
    return _State.requested
