"""Faulty clients, for testing a federation's defences: malformed replies and poisoning attacks.

Wrap any ClientApp callable (``fedcluster_app.client_app.app``, or your own) and run it on the
in-process engine::

    from fedcluster_app.engine import run_inprocess
    from fedcluster_app.faults import faulty_app

    run_inprocess(cfg, client_app=faulty_app(attackers={0, 3}, attack="scaled"))

``attack`` is one of :data:`ATTACKS` (what a poisoning client does to an honest reply) or
``"malformed"`` (a random corruption of the reply's bytes, dtypes, shapes, keys or metrics,
drawn per reply from :data:`MALFORMATIONS`). Attackers are logical client ids.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
from flwr.app import Array, Context, Error, Message, MetricRecord

from fedcluster_app.core import codec
from fedcluster_app.core import wire as P

ClientAppFn = Callable[[Message, Context], Message]

#: poisoning attacks on an honest reply
ATTACKS = {
    "huge": "every returned weight is 1e30 (finite, so it passes a NaN check)",
    "scaled": "the update (returned - sent model) is multiplied by -1000",
    "inflated": "num-examples is multiplied by 10^6, to dominate weighted averages",
    "permuted": "every list-valued metric (representations, histograms, losses) is shuffled",
}

MALFORMATIONS = (
    "garbage-bytes", "bad-header", "dtype-str", "dtype-complex", "dtype-object", "dtype-bool",
    "shape", "stype", "model-key", "extra-junk", "drop-arrays", "metric-list", "metric-scalar",
    "metric-length", "metric-value", "client-id", "drop-metrics", "error",
)

_JUNK_KEYS = ("abc", "", "999", "-5", "1e3", "0x1", str(2**70), "1.5", " 2")
_JUNK_VALUES = (float("nan"), float("inf"), -1, -(2**63), 2**70, 1e300, 0.5, 0, [])


def faulty_app(attackers: Iterable[int], attack: str, *, seed: int = 0, rate: float = 1.0,
               base: ClientAppFn | None = None) -> ClientAppFn:
    """A ClientApp whose ``attackers`` (logical client ids) answer with ``attack`` applied
    to ``rate`` of their replies; every other client is ``base`` (the built-in ClientApp)."""
    if attack != "malformed" and attack not in ATTACKS:
        raise ValueError(f"attack must be 'malformed' or one of {sorted(ATTACKS)}, got {attack!r}")
    from fedcluster_app.client_app import logical_client_id

    if base is None:
        from fedcluster_app.client_app import app as base
    bad = frozenset(int(c) for c in attackers)
    rng = np.random.default_rng(seed)

    def app(msg: Message, ctx: Context) -> Message:
        reply = base(msg, ctx)
        if logical_client_id(ctx) not in bad or rng.random() >= rate:
            return reply
        if attack == "malformed":
            return malform(msg, reply, rng)
        return poison(msg, reply, attack, rng)

    return app


# ------------------------------------------------------------------ poisoning
def poison(msg: Message, reply: Message, attack: str, rng: np.random.Generator) -> Message:
    if reply.has_error():
        return reply
    content = reply.content
    sent = codec.unpack_models(msg.content)
    if attack in ("huge", "scaled"):
        for key in [k for k in content.array_records if k.startswith(P.MODEL_PREFIX)]:
            arrays = codec.unpack_arrays(content.array_records[key])
            mid = int(key[len(P.MODEL_PREFIX):])
            if attack == "huge":
                arrays = [np.full_like(a, 1e30) if a.dtype.kind == "f" else a for a in arrays]
            elif mid in sent:
                arrays = [(s + (-1000.0) * (a - s)).astype(a.dtype) if a.dtype.kind == "f" else a
                          for a, s in zip(arrays, sent[mid])]
            content[key] = codec.pack_arrays(arrays)
    for name, record in list(content.metric_records.items()):
        metrics = dict(record)
        if attack == "inflated" and P.NUM_EXAMPLES in metrics:
            metrics[P.NUM_EXAMPLES] = int(metrics[P.NUM_EXAMPLES]) * 10**6
        if attack == "permuted":
            for key, value in metrics.items():
                if isinstance(value, list) and len(value) > 1 and key != P.MODEL_IDS:
                    metrics[key] = [value[i] for i in rng.permutation(len(value))]
        content[name] = MetricRecord(metrics)
    return reply


# ------------------------------------------------------------------ malformed replies
def malform(msg: Message, reply: Message, rng: np.random.Generator,
            how: str | None = None) -> Message:
    """``reply`` corrupted in one of the :data:`MALFORMATIONS` ways (random unless ``how``)."""
    how = how or str(rng.choice(MALFORMATIONS))
    if how == "error" or reply.has_error():
        return Message(Error(code=7, reason="malformed on purpose"), reply_to=msg)
    content = reply.content
    arrays = list(content.array_records)
    metrics = dict(content.metric_records.get(P.METRICS, {}))
    if how in ("garbage-bytes", "bad-header", "dtype-str", "dtype-complex", "dtype-object",
               "dtype-bool", "shape", "stype") and arrays:
        key = str(rng.choice(arrays))
        record = content.array_records[key]
        names = list(record)
        if names:
            name = str(rng.choice(names))
            record[name] = _bad_array(record[name], how, rng)
            content[key] = record
    elif how == "model-key":
        content[P.MODEL_PREFIX + str(rng.choice(_JUNK_KEYS))] = codec.pack_arrays(
            [rng.standard_normal(3).astype(np.float32)])
    elif how == "extra-junk":
        content[P.EXTRA_PREFIX + "junk"] = codec.pack_arrays(
            [rng.standard_normal(rng.integers(1, 5, size=2)).astype(np.float32)])
    elif how == "drop-arrays":
        for key in arrays:
            del content[key]
    elif how == "drop-metrics":
        if P.METRICS in content.metric_records:
            del content[P.METRICS]
    elif how == "client-id":
        metrics[P.CLIENT_ID] = _junk_value(rng)
        if rng.random() < 0.3:
            metrics.pop(P.CLIENT_ID)
        content[P.METRICS] = MetricRecord(metrics)
    else:   # metric-*: every metric record of the reply
        for name, record in list(content.metric_records.items()):
            content[name] = MetricRecord(_bad_metrics(dict(record), how, rng))
    return reply


def _bad_array(array: Array, how: str, rng: np.random.Generator) -> Array:
    data = array.data
    if how == "garbage-bytes":
        return Array(array.dtype, array.shape, array.stype, rng.bytes(int(rng.integers(0, 64))))
    if how == "bad-header":
        return Array(array.dtype, array.shape, array.stype,
                     b"\x93NUMPY" + rng.bytes(int(rng.integers(0, 2 * len(data) + 8))))
    if how == "dtype-object":
        return Array("object", array.shape, array.stype, data)
    if how == "stype":
        return Array(array.dtype, array.shape, "torch.Tensor", data)
    a = codec.to_numpy(array)
    if how == "dtype-str":
        a = a.astype(str)
    elif how == "dtype-complex":
        a = a.astype(np.complex64)
    elif how == "dtype-bool":
        a = a != 0
    else:   # shape
        a = rng.standard_normal(tuple(rng.integers(0, 4, size=int(rng.integers(0, 4))))).astype(
            np.float32)
    return Array.from_numpy_ndarray(a)


def _junk_value(rng: np.random.Generator):
    value = _JUNK_VALUES[int(rng.integers(len(_JUNK_VALUES)))]
    if rng.random() < 0.3:
        value = [1.5, -2.0, 7.0]
    return value


def _bad_metrics(metrics: dict, how: str, rng: np.random.Generator) -> dict:
    if not metrics:
        return metrics
    if how == "metric-value":
        key = str(rng.choice(list(metrics)))
        metrics[key] = _junk_value(rng)
        return metrics
    for key, value in metrics.items():
        if how == "metric-list" and not isinstance(value, list):
            metrics[key] = [value] * int(rng.integers(0, 4))
        elif how == "metric-scalar" and isinstance(value, list):
            metrics[key] = value[0] if value else 0
        elif how == "metric-length" and isinstance(value, list):
            n = int(rng.integers(0, 2 * len(value) + 2))
            metrics[key] = (value * (n // max(len(value), 1) + 1))[:n] if value else [0.0] * n
    return metrics

