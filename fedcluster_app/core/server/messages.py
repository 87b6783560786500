"""What a strategy asks one client (:class:`Task`), and a validated answer (:class:`Reply`).

:func:`validate_reply` is the generic check every reply passes before a strategy sees it: a
client error, a missing metrics record, a wrong client id, a non-finite metric, a negative
sample count, a model the client was not asked to train, wrong shapes or non-finite weights
reject the reply (:class:`RejectedReply`); the round goes on without it. A reply must also
answer what was asked: the round and time step of its instruction (a replayed reply of an
earlier round is refused), models only under the id it reports choosing, and no more bytes and
metric values than the instruction can produce (:func:`reply_budget`), measured before any of
it is decoded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import Message, MetricRecord

from fedcluster_app.core import codec
from fedcluster_app.core import flower_fast
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
    nbytes: int = 0   # its arrays' payload (the communication accounting's bytes up)

    @property
    def num_examples(self) -> int:
        return int(self.metrics.get(P.NUM_EXAMPLES, 0))


class RejectedReply(ValueError):
    """A client reply that cannot be used; the message says why, ``kind`` under which the
    round counts it (metrics.jsonl's ``rejected``): "invalid" (malformed or out of range),
    "stale" (another round's or step's answer), "wrong-model" (a model it was not asked for,
    or not the one it chose), "oversize" (more than its instruction can produce), "scale" (an update out of all
    proportion to its model)."""

    def __init__(self, message: str, kind: str = "invalid") -> None:
        super().__init__(message)
        self.kind = kind


# Decoding a hostile reply can fail anywhere in NumPy or Flower (a bad .npy header, a dtype
# that does not parse, a key that is not a number): every such failure rejects that reply.
_DECODE_ERRORS = (ValueError, TypeError, KeyError, IndexError, OverflowError, AttributeError,
                  EOFError, UnicodeDecodeError)
_NUMERIC_KINDS = "fiu"   # float, signed and unsigned int; never complex, str, bool or object


def validate_reply(msg: Message, cid: int, task: Task,
                   shapes: tuple[tuple[int, ...], ...],
                   dtypes: tuple[np.dtype, ...] | None = None,
                   max_examples: int | None = None, *,
                   asked: tuple[int, int] | None = None) -> Reply:
    """The reply of client ``cid`` to ``task``, or RejectedReply saying what is wrong.

    Model arrays are cast to the run's ``dtypes``; ``num-examples`` above ``max_examples``
    (the most training data a client of the scenario holds) is capped to it. ``asked``: the
    (round, time step) the instruction carried, which the reply must echo."""
    try:
        return _validate(msg, cid, task, shapes, dtypes, max_examples, asked)
    except RejectedReply:
        raise
    except _DECODE_ERRORS as ex:
        raise RejectedReply(f"malformed reply ({type(ex).__name__}: {ex})") from None


def reply_budget(task: Task, shapes: tuple[tuple[int, ...], ...],
                 dtypes: tuple[np.dtype, ...] | None) -> tuple[int, int]:
    """(array bytes, metric values) a reply to ``task`` may carry at most: the models it may
    return (those sent, or its personal one) plus two models' worth for what a family adds
    (FedCCFA's classifier and anchors, Fielding's representation, per-cluster lists), and
    slack for the .npy headers and the scalar metrics."""
    params = sum(math.prod(s) for s in shapes)
    itemsize = max((np.dtype(d).itemsize for d in dtypes), default=4) if dtypes else 4
    models = len(task.models) + 2
    return models * (params * itemsize + 256 * len(shapes)) + (1 << 20), models * params + 4096


def _validate(msg, cid, task, shapes, dtypes, max_examples, asked) -> Reply:
    if msg.has_error():
        raise RejectedReply(f"client error: {msg.error.reason}")
    content = msg.content
    max_bytes, max_values = reply_budget(task, shapes, dtypes)
    size = codec.nbytes(content)   # read from the arrays' headers: nothing decoded yet
    if size > max_bytes:
        raise RejectedReply(f"carries {size:,} bytes of arrays; an answer to this instruction "
                            f"holds at most {max_bytes:,}", "oversize")
    records = flower_fast.records_of(content, MetricRecord)
    values = sum(len(v) if isinstance(v, list) else 1
                 for r in records.values() for v in flower_fast.data_of(r).values())
    if values > max_values:
        raise RejectedReply(f"carries {values:,} metric values; an answer to this instruction "
                            f"holds at most {max_values:,}", "oversize")
    if P.METRICS not in records:
        raise RejectedReply("no metrics record")
    metrics = check_metrics(dict(flower_fast.data_of(records[P.METRICS])), max_examples)
    claimed = metrics.get(P.CLIENT_ID)
    if claimed != cid:
        raise RejectedReply(f"reply claims client id {claimed!r}")
    if asked is not None:
        for key, value in zip((P.ROUND, P.STEP), asked):
            if metrics.get(key) != value:
                raise RejectedReply(f"answers {key} {metrics.get(key)!r}; it was asked "
                                    f"{key} {value} (a stale or replayed reply)", "stale")
    models = codec.unpack_models(content)
    allowed = set(task.models if task.train_ids is None else task.train_ids)
    if task.personal:   # a client's own model may come back under the personal id
        allowed.add(P.PERSONAL_MODEL_ID)
    if P.CHOSEN in metrics and metrics[P.CHOSEN] not in task.models:
        raise RejectedReply(f"chose model {metrics[P.CHOSEN]}, which it was not sent",
                            "wrong-model")
    if P.CHOSEN in metrics and models and set(models) != {metrics[P.CHOSEN]}:
        raise RejectedReply(f"reports choosing model {metrics[P.CHOSEN]} but returns models "
                            f"{sorted(models)}", "wrong-model")
    ids = metrics.get(P.MODEL_IDS)
    if ids is not None and not set(ids) <= set(task.models) | {P.PERSONAL_MODEL_ID}:
        raise RejectedReply(f"reports models {ids}; it was sent {task.models}", "wrong-model")
    num_models = len(task.models if ids is None else ids)
    for key in P.PER_MODEL_METRICS & set(metrics):
        if len(metrics[key]) != num_models:
            raise RejectedReply(f"metric {key!r} has {len(metrics[key])} values for "
                                f"{num_models} models")
    for mid, arrays in models.items():
        if mid not in allowed:
            raise RejectedReply(f"returned model {mid}, which it was not asked to train",
                                "wrong-model")
        got = tuple(tuple(a.shape) for a in arrays)
        if got != shapes:
            raise RejectedReply(f"model {mid} has shapes {got}, expected {shapes}")
        models[mid] = _numeric(f"model {mid}", arrays, dtypes)
    model_metrics = {
        mid: check_metrics(dict(flower_fast.data_of(records[P.model_metrics_key(mid)])), max_examples)
        for mid in models
        if P.model_metrics_key(mid) in records
    }
    # extras: real-valued; finiteness and shapes are the strategy's check (FedCCFA drops a
    # client's bad classifier rows and still averages its extractor)
    extras = {name: _numeric(f"extra {name!r}", arrays, None, finite=False)
              for name, arrays in codec.unpack_extras(content).items()}
    return Reply(cid, metrics, models, model_metrics, extras, size)


_ANY_NUMBER = frozenset((None, "scalar"))
_INT_KINDS = _ANY_NUMBER | {"int"}


def check_metrics(metrics: dict[str, Any], max_examples: int | None = None) -> dict[str, Any]:
    """A reply's metrics, checked: finite numbers; the keys the wire declares scalar are
    scalars, those it declares lists are lists, ids are integers; num-examples is capped."""
    for key, value in metrics.items():
        kind = P.REPLY_METRICS.get(key)
        # the common cases, passed on sight: a Python int where a number or an integer will
        # do, a finite Python float where any number will
        if (type(value) is int and kind in _INT_KINDS) or (
                type(value) is float and kind in _ANY_NUMBER and math.isfinite(value)):
            continue
        values = value if isinstance(value, list) else [value]
        if not all(math.isfinite(v) for v in values):
            raise RejectedReply(f"metric {key!r} is not finite: {value!r}")
        if kind is None:
            continue
        if kind.endswith("list") != isinstance(value, list):
            raise RejectedReply(f"metric {key!r} must be a {'list' if kind.endswith('list') else 'number'}"
                                f", got {value!r}")
        if kind.startswith("int"):
            if not all(float(v).is_integer() for v in values):
                raise RejectedReply(f"metric {key!r} must hold integers, got {value!r}")
            metrics[key] = [int(v) for v in value] if isinstance(value, list) else int(value)
        if kind.startswith("unit") and not all(0 <= v <= 1 for v in values):
            raise RejectedReply(f"metric {key!r} must be in [0, 1], got {value!r}")
    n = metrics.get(P.NUM_EXAMPLES)
    if n is not None:
        if n < 0:
            raise RejectedReply(f"negative num-examples {n}")
        if max_examples is not None and n > max_examples:
            metrics[P.NUM_EXAMPLES] = max_examples
    return metrics


def _numeric(what: str, arrays: list[np.ndarray], dtypes, finite: bool = True) -> list[np.ndarray]:
    """Real-valued (and ``finite``) arrays, cast to ``dtypes`` when given (a cast can overflow
    to inf, so the finiteness check comes after it)."""
    out = []
    for i, a in enumerate(arrays):
        if a.dtype.kind not in _NUMERIC_KINDS:
            raise RejectedReply(f"{what} array {i} has dtype {a.dtype}, not a real number type")
        if dtypes is not None and a.dtype != dtypes[i]:
            with np.errstate(over="ignore", invalid="ignore"):
                a = a.astype(dtypes[i])
        # np.isfinite(a).all(), without the Python wrapper of .all() (hundreds of arrays a round)
        if finite and a.dtype.kind == "f" and not np.logical_and.reduce(np.isfinite(a), axis=None):
            raise RejectedReply(f"{what} contains non-finite values")
        out.append(a)
    return out
