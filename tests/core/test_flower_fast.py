"""Messages as Flower builds them: the wire's arrays (``core/codec.py``) and the records and
messages the fast path (``core/flower_fast.py``) builds without Flower's per-item checks are the
very objects Flower builds, and its one switch gives the same messages and the same run."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord

from fedcluster_app.core import codec
from fedcluster_app.core import flower_fast
from fedcluster_app.core import wire as P


def test_wire_arrays_are_the_npy_bytes_flower_writes_and_reads():
    """codec.to_array / to_numpy skip Flower's per-array header parsing; the bytes must stay
    exactly what Array.from_numpy_ndarray writes, so any Flower runtime decodes them."""
    from flwr.app import Array

    rng = np.random.default_rng(0)
    cases = [rng.normal(size=(3, 4)).astype(np.float32), np.arange(5), np.array(2.5),
             rng.normal(size=(4, 3)).T, np.zeros((0, 3)), np.array([True, False]),
             rng.normal(size=(2, 3, 4))[:, ::2]]
    for a in cases:
        ours, theirs = codec.to_array(a), Array.from_numpy_ndarray(np.array(a, order="C"))
        assert (ours.dtype, ours.shape, ours.data) == (theirs.dtype, theirs.shape, theirs.data)
        # built without Flower's constructor: the very object it builds
        assert ours.__dict__ == theirs.__dict__ and ours == theirs
        for back in (ours.numpy(), codec.to_numpy(theirs), codec.to_numpy(ours)):
            assert back.dtype == a.dtype and back.shape == a.shape and np.array_equal(back, a)
            assert back.flags.writeable
    # a record of them, built without Flower's per-item checks: the record setitem builds
    from flwr.app import ArrayRecord

    theirs = ArrayRecord()
    for i, a in enumerate(cases):
        theirs[str(i)] = Array.from_numpy_ndarray(np.array(a, order="C"))
    ours = codec.pack_arrays(cases)
    assert ours.__dict__ == theirs.__dict__ and ours == theirs and list(ours) == list(theirs)
    fortran = Array.from_numpy_ndarray(np.asfortranarray(rng.normal(size=(3, 5))))
    np.testing.assert_array_equal(codec.to_numpy(fortran), fortran.numpy())


def test_records_built_on_sight_are_the_records_flower_builds():
    """flower_fast.metric_record / config_record / record_dict fill plain Python values in without
    Flower's per-item checks: the same records; anything else still meets Flower's check."""
    from flwr.app import ConfigRecord, MetricRecord, RecordDict

    metrics = {"a": 1, "b": 2.5, "c": [1, 2], "d": [0.5], "e": []}
    config = {**metrics, "s": "x", "t": True, "u": b"\x00", "v": ["p", "q"], "w": [False]}
    for ours, theirs in ((flower_fast.metric_record(metrics), MetricRecord(metrics)),
                         (flower_fast.config_record(config), ConfigRecord(config))):
        assert ours.__dict__ == theirs.__dict__ and list(ours) == list(theirs)
    records = {"m": MetricRecord(metrics), "c": ConfigRecord(config),
               "z": codec.pack_arrays([np.ones(2)])}
    ours, theirs = flower_fast.record_dict(records), RecordDict(records)
    assert ours.__dict__ == theirs.__dict__ and list(ours) == list(theirs)
    # NumPy scalars take Flower's path (and are kept as Flower keeps them)
    assert flower_fast.metric_record({"n": np.float64(0.5)}) == MetricRecord({"n": np.float64(0.5)})
    for bad in ({"x": True}, {"x": [1, 2.0]}, {"x": "s"}, {"x": {"y": 1}}, {1: 1.0}):
        with pytest.raises(TypeError):
            flower_fast.metric_record(bad)
    for bad in ({"x": [1, "a"]}, {"x": None}, {"x": (1, 2)}):
        with pytest.raises(TypeError):
            flower_fast.config_record(bad)
    with pytest.raises(TypeError):
        flower_fast.record_dict({"m": {"a": 1}})


def test_messages_built_here_are_the_messages_flower_builds():
    """flower_fast.instruction / flower_fast.reply skip Flower's argument checks: the same
    messages (metadata and content; only the creation times, and so the reply's time to live,
    differ); a message type Flower refuses is still refused."""
    from flwr.app import ConfigRecord, Message, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 7, 1, 3
    content = RecordDict({"config": ConfigRecord({"round": 2})})

    def same(ours, theirs, clock=("_created_at",)):
        a, b = ours.metadata.__dict__, theirs.metadata.__dict__
        assert list(a) == list(b)
        assert {k: v for k, v in a.items() if k not in clock} == \
            {k: v for k, v in b.items() if k not in clock}
        assert abs(a["_created_at"] - b["_created_at"]) < 5
        assert list(ours.__dict__) == list(theirs.__dict__)
        assert ours.content is content and not ours.has_error()

    for _ in range(2):           # the first call of a message type goes through Flower
        sent = flower_fast.instruction(content, 12345, "train.cluster", "4")
        same(sent, Message(content=content, dst_node_id=12345, message_type="train.cluster",
                           group_id="4"))
    sent.metadata.__dict__["_message_id"] = "m9"
    answer, flowers = flower_fast.reply(content, sent), Message(content, reply_to=sent)
    same(answer, flowers, ("_created_at", "_ttl"))
    assert answer.metadata.reply_to_message_id == "m9"
    assert abs(answer.metadata.ttl - flowers.metadata.ttl) < 5
    with pytest.raises(ValueError, match="Invalid message type"):
        flower_fast.instruction(content, 12345, "no spaces allowed", "4")


def _exchange(fast: bool, by_reference: bool):
    """An instruction carrying two models and a reply carrying them trained, with metrics, per
    model metrics and extras, built with the fast path on or off; and what the other side reads
    of them (arrays unpacked, records, byte counts), read with the same setting."""
    import contextlib

    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 7, 1, 3
    rng = np.random.default_rng(0)
    models = {0: [rng.normal(size=(3, 4)).astype(np.float32), np.arange(4)],
              2: [rng.normal(size=(5,)), np.zeros((0, 2))]}
    config = {P.ROUND: 3, P.STEP: 1, P.TRAIN_IDS: [0, 2], P.SELECT: "min-loss", "w": [0.5, 1.5]}
    metrics = {P.CLIENT_ID: 4, P.NUM_EXAMPLES: 100, P.LOSSES: [0.25, 0.5], "n": np.float64(2.0)}
    with flower_fast.fast_path(fast), (codec.by_reference() if by_reference
                                       else contextlib.nullcontext()):
        for _ in range(2):          # the first message of a type goes through Flower on both
            packed = {mid: codec.pack_message_arrays(w) for mid, w in models.items()}
            sent = flower_fast.instruction(codec.build_content(packed, config), 12345, "train", "4")
        sent.metadata.__dict__["_message_id"] = "m9"            # as the grid numbers it
        answer = flower_fast.reply(
            codec.reply_content(metrics, models, {0: {P.LOSS: 0.25}}, {"rows": [np.eye(2)]}), sent)
        read = [(codec.unpack_models(m.content), codec.unpack_extras(m.content),
                 {k: dict(flower_fast.data_of(r)) for k, r in
                  flower_fast.records_of(m.content, MetricRecord).items()},
                 {k: dict(flower_fast.data_of(r)) for k, r in
                  flower_fast.records_of(m.content, ConfigRecord).items()},
                 codec.nbytes(m.content)) for m in (sent, answer)]
    return sent, answer, read


def _same(a, b) -> bool:
    """Equal to the last bit, arrays with their dtypes and shapes, containers item by item."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape
                and a.tobytes() == b.tobytes())
    if isinstance(a, dict):
        return type(b) is dict and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("by_reference", [False, True], ids=["bytes", "by-reference"])
def test_the_fast_path_switch_gives_the_same_messages(by_reference):
    """flower_fast.FAST_PATH is the one switch between the shortcuts through Flower's private
    fields and Flower's public API. Both give the same messages: the same records of the same
    arrays (the very objects, when arrays travel as bytes), metadata (bar the creation times),
    and what a receiver reads of them, byte counts included. By reference (one process) only
    the fast path holds arrays instead of bytes; what is read is the same."""
    fast, public = _exchange(True, by_reference), _exchange(False, by_reference)
    for ours, theirs in zip(fast[:2], public[:2]):
        a, b = ours.metadata.__dict__, theirs.metadata.__dict__
        clock = ("_created_at", "_ttl")
        assert {k: v for k, v in a.items() if k not in clock} == \
            {k: v for k, v in b.items() if k not in clock}
        assert list(ours.content) == list(theirs.content)
        for key in ours.content:
            mine, flowers = ours.content[key], theirs.content[key]
            assert type(mine) is type(flowers) and list(mine) == list(flowers)
            if not (by_reference and isinstance(mine, ArrayRecord)):
                assert mine.__dict__ == flowers.__dict__ and mine == flowers
    assert _same(fast[2], public[2])                   # arrays, records and byte counts read
    models, extras = fast[2][1][0], fast[2][1][1]
    assert sorted(models) == [0, 2] and extras["rows"][0].tolist() == [[1.0, 0.0], [0.0, 1.0]]
    held = any(not a.data for r in fast[1].content.values() if isinstance(r, ArrayRecord)
               for a in r.values())
    assert held == by_reference                        # by reference only on the fast path
    assert all(a.data for r in public[1].content.values() if isinstance(r, ArrayRecord)
               for a in r.values())


def test_a_run_off_the_fast_path_is_the_same_run(fast_config, tmp_path):
    """A whole in-process run (several models per message, arrays by reference on the fast
    path, bytes off it) gives the same rounds with Flower's public API as with the shortcuts."""
    import json

    from fedcluster_app.engine import run_inprocess

    rows = []
    for fast in (True, False):
        out = tmp_path / str(fast)
        with flower_fast.fast_path(fast):
            run_inprocess(fast_config(strategy="ifca", num_clusters=2, out_dir=str(out)))
        rows.append([{k: v for k, v in json.loads(line).items() if k != "round_time_s"}
                     for line in (out / "metrics.jsonl").read_text().splitlines()])
    assert len(rows[0]) == 12 and rows[0] == rows[1]
