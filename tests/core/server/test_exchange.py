"""A deployed wave's replies are pulled every POLL_MAX_S at most (Flower's HttpGrid: 3 s)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from flwr.superlink.grid.http_grid import HttpGrid

from fedcluster_app.core.server import exchange


class FakeLink(HttpGrid):
    """An HttpGrid whose SuperLink is a dict: reply ``i`` arrives ``delays[i]`` s after the push."""

    def __init__(self, delays: list[float]) -> None:
        super().__init__(token="test")
        self.delays, self.pulls = delays, 0

    def push_messages(self, messages):
        self.t0 = time.monotonic()
        return [f"m{i}" for i, _ in enumerate(messages)]

    def pull_messages(self, message_ids):
        self.pulls += 1
        now = time.monotonic() - self.t0
        return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=m))
                for m in message_ids if self.delays[int(m[1:])] <= now]

    def send_and_receive(self, messages, *, timeout=None):
        raise AssertionError("Flower's 3 s loop must not be used for a deployed grid")


def test_replies_are_taken_soon_after_they_arrive():
    grid = FakeLink([0.0, 0.3, 0.6])
    t0 = time.monotonic()
    replies = exchange.send_and_receive(grid, ["a", "b", "c"], timeout=10.0)
    took = time.monotonic() - t0
    assert sorted(r.metadata.reply_to_message_id for r in replies) == ["m0", "m1", "m2"]
    assert 0.6 <= took < 0.6 + 2 * exchange.POLL_MAX_S + 0.2     # not Flower's 3 s
    assert grid.pulls < 30                                       # nor a busy loop


def test_the_deadline_ends_the_wait_with_the_replies_so_far():
    grid = FakeLink([0.0, 60.0])
    t0 = time.monotonic()
    replies = exchange.send_and_receive(grid, ["a", "b"], timeout=0.5)
    assert 0.5 <= time.monotonic() - t0 < 0.9
    assert [r.metadata.reply_to_message_id for r in replies] == ["m0"]


def test_other_grids_keep_their_own_send_and_receive():
    calls = []

    class Other:
        def send_and_receive(self, messages, *, timeout=None):
            calls.append(timeout)
            return iter(["r"])

    assert exchange.send_and_receive(Other(), ["a"], 5.0) == ["r"] and calls == [5.0]
