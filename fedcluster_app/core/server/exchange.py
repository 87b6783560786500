"""A wave of messages out and its replies in: the grid's send_and_receive, polled briefly.

Flower's deployed grid (``HttpGrid``, the ServerApp's link to its SuperLink) pushes the
messages and then asks for the replies every 3 s (fixed in flwr 1.41), so every message wave of
a deployed round waited for up to 3 s after its last reply had arrived. Here the same pull runs
at growing intervals from 5 ms up to ``POLL_MAX_S``: a reply is taken within 0.1 s of its
arrival, and a long wave costs the SuperLink ten small requests a second. Other grids (the
in-process one, Ray's in-memory one, a test's) keep their own ``send_and_receive``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable

POLL_MAX_S = 0.1   # the longest pause between two pulls of a deployed wave's replies


def send_and_receive(grid, messages: Iterable, timeout: float | None) -> list:
    """``grid.send_and_receive(messages, timeout=timeout)``, polling a deployed grid often."""
    if not _is_http_grid(grid):
        return list(grid.send_and_receive(messages, timeout=timeout))
    waiting = set(grid.push_messages(messages))
    deadline = None if timeout is None else time.monotonic() + timeout
    replies: list = []
    pause = 0.005
    while waiting:
        got = list(grid.pull_messages(waiting))
        replies += got
        waiting -= {msg.metadata.reply_to_message_id for msg in got}
        left = None if deadline is None else deadline - time.monotonic()
        if not waiting or (left is not None and left <= 0):
            break
        time.sleep(pause if left is None else min(pause, left))
        pause = min(2 * pause, POLL_MAX_S)
    return replies


def _is_http_grid(grid) -> bool:
    # an HttpGrid exists only where its module was imported (the deployed ServerApp's runtime):
    # asking sys.modules spares every other run the import
    module = sys.modules.get("flwr.superlink.grid.http_grid")
    return module is not None and isinstance(grid, module.HttpGrid)
