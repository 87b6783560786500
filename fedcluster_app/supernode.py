"""`flower-supernode` for local deployments, with short polls instead of Flower's 3 s.

A SuperNode with nothing to do asks its SuperLink for a message, and when none has come sleeps
3 s before asking again; while a reply is awaited from its ClientApp it looks every 0.5 s (both
fixed in flwr 1.41, no option). On a deployed round, whose two message waves (train, evaluate)
each find every SuperNode asleep, that is most of the round. This runs Flower's own
`flower-supernode` with the pauses of its loop shortened (below): the same arguments, the same
protocol (a run submitted with plain `flwr run` is served as by `flower-supernode`), at the
price of a small request to the SuperLink up to once a second per idle SuperNode. It is meant
for the SuperNodes of one machine (`fedcluster deploy up`); the module attributes it replaces
are checked first, and another flwr than the pinned one runs unchanged, with a warning.

    python -m fedcluster_app.supernode --superlink 127.0.0.1:9093 --insecure ...
"""

from __future__ import annotations

import functools
import sys
import time
from logging import WARNING

# The idle loop's pause: 50 ms after a message, growing by half each time nothing came, to at
# most 1 s (an idle SuperNode asks its SuperLink once a second: Flower's own pause is 3 s)
IDLE_FIRST_S, IDLE_GROWTH, IDLE_MAX_S = 0.05, 1.5, 1.0
REPLY_POLL_S = 0.02   # waiting for its ClientApp's reply: a look at its own state, no request
# The SuperLink offers a message as soon as the ServerApp has sent its header, before its
# contents (one request per array): a SuperNode that looks often nearly always finds some
# missing, and Flower's retry then waits 1 s, 2 s, ... Ask again after 10 ms, 20 ms, ...
PULL_BACKOFF_S = 0.01
PULL_BACKOFF_CAP_S = 0.5


class ShortSleeps:
    """The ``time`` module as the SuperNode's loop sees it, with its two pauses shortened: the
    3 s after finding no message (to ``idle``, which grows while nothing comes), and the 0.5 s
    between two looks for a reply of its ClientApp (to REPLY_POLL_S, which also means a message
    is being handled: the next idle pause starts short again)."""

    def __init__(self) -> None:
        self.idle = IDLE_FIRST_S

    def __getattr__(self, name: str):
        return getattr(time, name)

    def sleep(self, seconds: float) -> None:
        if seconds >= 1.0:             # the idle pause
            time.sleep(self.idle)
            self.idle = min(self.idle * IDLE_GROWTH, IDLE_MAX_S)
        else:                          # a message in hand
            self.idle = IDLE_FIRST_S
            time.sleep(min(seconds, REPLY_POLL_S))


def main() -> None:
    from flwr.supercore import log
    from flwr.supercore.inflatable.inflatable_utils import pull_objects
    from flwr.supernode import start_client_internal as loop
    from flwr.supernode.cli.flower_supernode import flower_supernode

    # the loop's module reads `time.sleep` at each pause, and `pull_objects` to fetch a
    # message's contents: only its own pauses are shortened
    if getattr(loop, "time", None) is time and loop.pull_objects is pull_objects:
        loop.time = ShortSleeps()
        loop.pull_objects = functools.partial(
            pull_objects, max_tries_per_object=None, initial_backoff=PULL_BACKOFF_S,
            backoff_cap=PULL_BACKOFF_CAP_S)
    else:   # another Flower than the one pinned: run it as it is
        log(WARNING, "fedcluster_app.supernode: this flwr's SuperNode loop is not the one "
            "expected; running it with its own polling intervals")
    sys.argv[0] = "flower-supernode"
    flower_supernode()


if __name__ == "__main__":
    main()
