"""What a strategy asks one client (:class:`Task`), and a validated answer (:class:`Reply`).

:func:`validate_reply` is the generic check every reply passes before a strategy sees it: a
client error, a missing metrics record, a wrong client id, a non-finite metric, a negative
sample count, a model the client was not asked to train, wrong shapes or non-finite weights
reject the reply (:class:`RejectedReply`); the round goes on without it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import Message

from fedcluster_app.core import wire as P

Weights = list[np.ndarray]


@dataclass
class Task:
    """What one client is asked to do in one message."""

    models: list[int] = field(default_factory=list)   # ids of the models sent
    train_ids: list[int] | None = None                 # which of them to train (None: all)
    config: dict[str, Any] = field(default_factory=dict)
    personal: bool = False                             # use the model kept on the client

    @classmethod
    def min_loss(cls, ids: list[int]) -> Task | None:
        """Every model of ``ids`` goes down and the client predicts with the one of lowest loss
        on its adaptation split (one model: just that one); None when there is none."""
        if not ids:
            return None
        return cls(models=list(ids), config={P.SELECT: "min-loss"} if len(ids) > 1 else {})


@dataclass
class Reply:
    """A validated client reply."""

    cid: int
    metrics: dict[str, Any]
    models: dict[int, Weights] = field(default_factory=dict)
    model_metrics: dict[int, dict[str, Any]] = field(default_factory=dict)
    extras: dict[str, Weights] = field(default_factory=dict)   # checked by the strategy

    @property
    def num_examples(self) -> int:
        return int(self.metrics.get(P.NUM_EXAMPLES, 0))


class RejectedReply(ValueError):
    """A client reply that cannot be used; the message says why."""


def validate_reply(msg: Message, cid: int, task: Task,
                   shapes: tuple[tuple[int, ...], ...]) -> Reply:
    """The reply of client ``cid`` to ``task``, or RejectedReply saying what is wrong."""
    if msg.has_error():
        raise RejectedReply(f"client error: {msg.error.reason}")
    content = msg.content
    records = content.metric_records   # a property that copies: read it once
    if P.METRICS not in records:
        raise RejectedReply("no metrics record")
    metrics = dict(records[P.METRICS])
    if int(metrics.get(P.CLIENT_ID, -1)) != cid:
        raise RejectedReply(f"reply claims client id {metrics.get(P.CLIENT_ID)!r}")
    for key, value in metrics.items():
        values = value if isinstance(value, list) else [value]
        if not all(math.isfinite(v) for v in values):
            raise RejectedReply(f"metric {key!r} is not finite: {value!r}")
    if metrics.get(P.NUM_EXAMPLES, 0) < 0:
        raise RejectedReply(f"negative num-examples {metrics[P.NUM_EXAMPLES]}")
    models = P.unpack_models(content)
    allowed = set(task.models if task.train_ids is None else task.train_ids)
    if task.personal:   # a client's own model may come back under the personal id
        allowed.add(P.PERSONAL_MODEL_ID)
    for mid, arrays in models.items():
        if mid not in allowed:
            raise RejectedReply(f"returned model {mid}, which it was not asked to train")
        got = tuple(tuple(a.shape) for a in arrays)
        if got != shapes:
            raise RejectedReply(f"model {mid} has shapes {got}, expected {shapes}")
        if not all(np.isfinite(a).all() for a in arrays):
            raise RejectedReply(f"model {mid} contains non-finite values")
    model_metrics = {
        mid: dict(records[P.model_metrics_key(mid)])
        for mid in models
        if P.model_metrics_key(mid) in records
    }
    return Reply(cid, metrics, models, model_metrics, P.unpack_extras(content))
