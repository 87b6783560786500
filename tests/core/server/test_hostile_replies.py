"""No reply, however malformed, crashes the server: it is rejected for that client and round,
counted, and the run goes on (unit-level fuzzing of the reply check, then whole runs of every
strategy with clients that corrupt their replies)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedcluster_app.api import STRATEGIES
from fedcluster_app.core import codec
from fedcluster_app.core import wire as P
from fedcluster_app.core.server.messages import RejectedReply, Task, validate_reply
from fedcluster_app.core.results import load_run
from fedcluster_app.engine import InProcessGrid, run_inprocess
from fedcluster_app.faults import MALFORMATIONS, faulty_app, malform

SHAPES = ((3, 2), (3,))
DTYPES = (np.dtype(np.float32), np.dtype(np.float32))
_KEYS = sorted(P.REPLY_METRICS) + ["custom", "x.y"]

numbers = st.one_of(st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True))
metric_values = st.one_of(numbers, st.lists(st.integers(-5, 5), max_size=4),
                          st.lists(st.floats(allow_nan=True), max_size=4))
dtypes = st.sampled_from(["<f4", "<f8", "<i8", "|u1", "<c8", "<U3", "|b1", "object", "|S2", "weird"])
shapes = st.lists(st.integers(0, 4), max_size=3).map(tuple)


@st.composite
def arrays(draw):
    """An Array that may be anything: valid .npy bytes of any dtype/shape, or random bytes
    behind any header."""
    if draw(st.booleans()):
        shape = draw(st.sampled_from(SHAPES) | shapes)
        a = np.full(shape, draw(st.floats(allow_nan=True, width=32)))
        dtype = draw(st.sampled_from(["<f4", "<f8", "<i4", "<c8", "<U3", "|b1"]))
        with np.errstate(invalid="ignore"):
            return Array.from_numpy_ndarray(np.asarray(a.astype(dtype)))
    return Array(draw(dtypes), draw(shapes), draw(st.sampled_from(["numpy.ndarray", "x"])),
                 draw(st.sampled_from([b"\x93NUMPY", b""])) + draw(st.binary(max_size=64)))


@st.composite
def replies(draw):
    content = RecordDict()
    for key in draw(st.lists(st.sampled_from(["model.0", "model.1", "model.-1", "model.abc",
                                              "model.", "model.2" + "0" * 30, "extra.x", "other"]),
                             max_size=3, unique=True)):
        content[key] = ArrayRecord({str(i): draw(arrays()) for i in range(draw(st.integers(0, 3)))})
    if draw(st.booleans()):
        metrics = draw(st.dictionaries(st.sampled_from(_KEYS), metric_values, max_size=6))
        if draw(st.booleans()):
            metrics[P.CLIENT_ID] = 4
        content[P.METRICS] = MetricRecord(metrics)
    if draw(st.booleans()):
        content[P.model_metrics_key(0)] = MetricRecord(
            draw(st.dictionaries(st.sampled_from(_KEYS), metric_values, max_size=3)))
    return content


@pytest.fixture(scope="module")
def instruction():
    InProcessGrid({}, 0)   # sets the task identity Message() needs outside a Flower runtime
    return Message(content=RecordDict(), dst_node_id=11, message_type=P.TRAIN, group_id="1")


@settings(max_examples=2000, deadline=None, suppress_health_check=list(HealthCheck))
@given(content=replies())
def test_any_reply_is_accepted_clean_or_rejected_never_raises_anything_else(instruction, content):
    task = Task(models=[0, 1], train_ids=[0])
    try:
        reply = validate_reply(Message(content, reply_to=instruction), 4, task, SHAPES, DTYPES,
                               max_examples=100)
    except RejectedReply:
        return
    assert_clean(reply)


def assert_clean(reply):
    """What a strategy may rely on in an accepted reply."""
    assert reply.cid == 4 and set(reply.models) <= {0}
    for arrays_ in reply.models.values():
        assert [a.shape for a in arrays_] == list(SHAPES)
        assert all(a.dtype == d and np.isfinite(a).all() for a, d in zip(arrays_, DTYPES))
    for metrics in [reply.metrics, *reply.model_metrics.values()]:
        for key, value in metrics.items():
            kind = P.REPLY_METRICS.get(key)
            assert kind is None or kind.endswith("list") == isinstance(value, list)
        assert 0 <= metrics.get(P.NUM_EXAMPLES, 0) <= 100
        assert 0 <= metrics.get(P.ACCURACY, 0) <= 1


# corruptions that may leave a valid reply (a junk extra array the strategy ignores, no
# model at all, a metric set to a plausible value): rejected, or accepted clean
HARMLESS = ("extra-junk", "drop-arrays", "metric-length", "metric-value")


@pytest.mark.parametrize("how", MALFORMATIONS)
def test_every_malformation_of_a_real_reply_is_rejected_or_harmless(instruction, how):
    rng = np.random.default_rng(0)
    honest = RecordDict({"model.0": codec.pack_arrays([np.ones(s, np.float32) for s in SHAPES])})
    honest[P.METRICS] = MetricRecord({P.CLIENT_ID: 4, P.NUM_EXAMPLES: 50, P.LOSSES: [0.5, 0.2],
                                      P.MODEL_IDS: [0, 1], P.ACCURACY: 0.5})
    for _ in range(20):   # the corruption is random: it must be rejected every time
        content = RecordDict({k: v for k, v in honest.items()})
        bad = malform(instruction, Message(content, reply_to=instruction), rng, how)
        try:
            reply = validate_reply(bad, 4, Task(models=[0, 1], train_ids=[0]), SHAPES, DTYPES, 100)
        except RejectedReply:
            continue
        assert how in HARMLESS, f"{how} was accepted"
        assert_clean(reply)


@pytest.mark.matrix
@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_clients_sending_malformed_replies_never_stop_a_run(fast_config, strategy):
    from fedcluster_app.client_app import app as honest

    sent = []

    def counting(msg, ctx):   # they identify themselves (tested below), then corrupt every reply
        if msg.metadata.message_type == P.QUERY_INFO:
            return honest(msg, ctx)
        sent.append(ctx.node_config["partition-id"] in (0, 3, 7))
        return app(msg, ctx)

    app = faulty_app({0, 3, 7}, "malformed", seed=sorted(STRATEGIES).index(strategy))
    summary = run_inprocess(fast_config(strategy=strategy), client_app=counting)
    disk, rounds = load_run(Path(summary["out_dir"]))
    assert disk["status"] == "completed" and len(rounds) == summary["rounds"]
    assert sum(sent) >= 20                               # every reply of 3 clients is corrupt
    assert summary["failures"] >= 10
    assert all(r["accuracy"] is None or 0 <= r["accuracy"] <= 1 for r in rounds)


def test_nodes_claiming_ids_outside_the_population_are_refused(fast_config, caplog):
    from fedcluster_app.core.config import default_run_config, merge_overrides
    from fedcluster_app.server_app import run_server

    claims = {10: 999, 11: -1, 12: 2**70, 13: 1.5, 14: [3]}

    def node_config(i):
        return {"client-id": i} if i < 10 else {"client-id": 0, "claim": i}

    def app(msg, ctx):
        from fedcluster_app.client_app import app as honest

        claim = ctx.node_config.get("claim")
        if claim is None:
            return honest(msg, ctx)
        return Message(RecordDict({P.METRICS: MetricRecord({P.CLIENT_ID: claims[claim]})}),
                       reply_to=msg)

    rc = merge_overrides(default_run_config(), fast_config(strategy="fedavg"))
    grid = InProcessGrid(rc, 15, client_app=app, node_config=node_config)
    caplog.set_level("INFO", logger="flwr")
    summary = run_server(grid, rc)
    _, rounds = load_run(Path(summary["out_dir"]))
    assert summary["status"] == "completed" and summary["failures"] == 0
    assert all(r["evaluated_clients"] == 10 for r in rounds)
    for text in ("client id 999 is outside this scenario's clients 0..9",
                 "client id -1 is outside", f"client id {2**70} is outside",
                 "'client-id' must hold integers", "'client-id' must be a number"):
        assert text in caplog.text


# ------------------------------------------------------------------ honest status
def test_a_run_whose_training_replies_are_all_rejected_is_degraded(fast_config):
    from fedcluster_app.client_app import app as honest

    def app(msg, ctx):   # every client identifies itself, then sends non-finite models
        reply = honest(msg, ctx)
        if msg.metadata.message_type == P.TRAIN and int(msg.content["config"][P.ROUND]) >= 5:
            reply = malform(msg, reply, np.random.default_rng(0), "garbage-bytes")
        return reply

    summary = run_inprocess(fast_config(strategy="fedavg"), client_app=app)
    assert summary["status"] == "degraded"
    assert summary["reason"].startswith("8 of 12 rounds had no usable training reply")
    assert "rounds 5, 6, 7" in summary["reason"]


def test_a_run_that_admitted_no_client_fails_and_names_the_cause(fast_config, tmp_path):
    missing = tmp_path / "nowhere" / "client.npz"

    def app(msg, ctx):
        raise FileNotFoundError(f"dataset file not found: {missing}")

    summary = run_inprocess(fast_config(strategy="fedavg", **{"node-wait-s": 0}), client_app=app)
    assert summary["status"] == "failed"
    assert summary["reason"].startswith("no client was ever admitted")
    assert str(missing) in summary["reason"]


def test_defences_against_one_poisoning_client(fast_config):
    def run(attack, **cfg):
        out = f"{fast_config()['out-dir']}-{attack}-{'-'.join(map(str, cfg.values()))}"
        return run_inprocess(fast_config(strategy="fedavg", seed=3, out_dir=out, **cfg),
                             client_app=faulty_app({0} if attack else set(), attack or "huge"))

    clean = run(None)["mean_accuracy"]
    # 1e30 weights are no training step: rejected every round, bound or not
    summary = run("huge", update_norm_bound=0)
    assert summary["status"] == "completed" and summary["failures"] >= 12
    assert summary["mean_accuracy"] > clean - 0.05
    # the num-examples cap absorbs an inflated count
    summary = run("inflated")
    assert summary["status"] == "completed" and summary["mean_accuracy"] > clean - 0.05
    # a scaled update is bounded, not undone: the coordinate-wise median is the defence
    assert run("scaled")["mean_accuracy"] < clean - 0.1
    for rule in ("median", "trimmed-mean"):
        assert run("scaled", robust_aggregation=rule)["mean_accuracy"] > clean - 0.05


def test_a_model_never_becomes_non_finite_after_aggregation(fast_config, monkeypatch, caplog):
    """Finite updates can still average to inf (here: an aggregation that overflows in round 3);
    the model keeps its weights from before the round and the run goes on."""
    from fedcluster_app.core.server.strategy import ClusteredStrategy

    aggregate = ClusteredStrategy.aggregate

    def overflowing(self, items):
        out = aggregate(self, items)
        return [a * np.float32(np.inf) for a in out] if self.round == 3 else out

    monkeypatch.setattr(ClusteredStrategy, "aggregate", overflowing)
    summary = run_inprocess(fast_config(strategy="fedavg"))
    _, rounds = load_run(Path(summary["out_dir"]))
    assert summary["status"] == "completed" and rounds[2]["accuracy"] == pytest.approx(
        rounds[1]["accuracy"], abs=0.1)
    assert "model 0 became non-finite after aggregation" in caplog.text


def test_a_run_whose_evaluations_are_all_rejected_is_degraded(fast_config):
    from fedcluster_app.client_app import app as honest

    def app(msg, ctx):   # training works; every evaluation reply loses its metrics
        reply = honest(msg, ctx)
        if msg.metadata.message_type == P.EVALUATE:
            reply = malform(msg, reply, np.random.default_rng(0), "drop-metrics")
        return reply

    summary = run_inprocess(fast_config(strategy="fedavg"), client_app=app)
    assert summary["status"] == "degraded" and summary["mean_accuracy"] is None
    assert summary["reason"].startswith("12 of 12 rounds had no usable evaluation reply")


def _bounding(soft_weights: dict[int, float] | None, norms: dict[int, float], bound=10.0):
    """Run the update bound of one model (id 0, sent as zeros) over replies whose updates have
    the given norms; the clients' soft weights on it, or None for a hard assignment."""
    from types import SimpleNamespace

    from fedcluster_app.core.server.courier import Courier
    from fedcluster_app.core.server.messages import Reply
    from fedcluster_app.core.server.nodes import ClientRecord
    from fedcluster_app.core.server.runner import RoundStats

    fake = SimpleNamespace(cfg=SimpleNamespace(update_norm_bound=bound), round=1,
                           models={0: [np.zeros(4)]}, round_stats=RoundStats(),
                           clients={c: ClientRecord(cid=c) for c in norms})
    for c, rec in fake.clients.items():
        rec.soft = {0: soft_weights[c]} if soft_weights else None
    replies = [Reply(cid=c, metrics={}, models={0: [np.full(4, n / 2.0)]})
               for c, n in sorted(norms.items())]
    Courier(fake).bound_updates(replies, {(c, 0): n for c, n in norms.items()})
    return {r.cid: float(np.linalg.norm(r.models[0][0])) for r in replies}


def test_a_soft_model_is_bounded_against_its_members_not_the_clients_that_hardly_use_it():
    # 7 clients hardly use model 0 (weight 0.01) and return it hardly changed; its 3 members
    # (weight 0.95) move it by about 1: an unweighted median (0.001) would bound the members
    outsiders = {c: 0.001 for c in range(7)}
    members = {7: 1.0, 8: 1.1, 9: 0.9}
    weights = {c: 0.01 for c in outsiders} | {c: 0.95 for c in members}
    after = _bounding(weights, outsiders | members)
    assert after == pytest.approx(outsiders | members)
    # a member that drags the model 100 away is still bounded, to 10x the members' median
    after = _bounding(weights | {10: 0.95}, outsiders | members | {10: 100.0})
    assert after[10] == pytest.approx(10.0)
    assert after[7] == pytest.approx(1.0)


def test_a_hard_assignment_keeps_the_plain_median_bound():
    after = _bounding(None, {0: 1.0, 1: 1.2, 2: 0.8, 3: 50.0})
    assert after[3] == pytest.approx(10 * 1.1)     # np.median of 4 updates: 1.1
    assert after[0] == pytest.approx(1.0)


def test_the_median_of_equal_weights_is_numpys_median():
    """weighted_median's sort for equal weights gives np.median's number to the last bit (odd
    and even counts, ties, norms from 1e-5 to 1e5); unequal weights and non-finite values
    take the weighted path."""
    from fedcluster_app.core.server.updates import weighted_median

    rng = np.random.default_rng(0)
    for k in range(3000):
        n = int(rng.integers(1, 15))
        values = list(np.abs(rng.normal(size=n)) * 10 ** rng.uniform(-5, 5, size=n))
        if k % 7 == 0:
            values[0] = values[-1]
        assert weighted_median(values, [0.5] * n) == float(np.median(values))
    assert weighted_median([1.0, 2.0, 10.0], [0.1, 0.1, 0.8]) == 10.0
    assert np.isnan(weighted_median([1.0, float("nan"), 3.0], [1.0] * 3))


# ----------------------------------------------------------------- replies answer what was asked
def _answer(instruction, metrics, models=None, extras=None):
    content = RecordDict({f"{P.MODEL_PREFIX}{mid}": codec.pack_arrays(w)
                          for mid, w in (models or {}).items()})
    for name, arrays_ in (extras or {}).items():
        content[P.EXTRA_PREFIX + name] = codec.pack_arrays(arrays_)
    content[P.METRICS] = MetricRecord({P.CLIENT_ID: 4, P.NUM_EXAMPLES: 50, **metrics})
    return Message(content, reply_to=instruction)


def _kind_of_rejection(msg, task, asked=(5, 2)):
    try:
        validate_reply(msg, 4, task, SHAPES, DTYPES, 100, asked=asked)
    except RejectedReply as ex:
        return ex.kind, str(ex)
    return None, ""


def test_a_reply_to_another_round_or_step_is_refused_as_stale(instruction):
    model = {0: [np.ones(s, np.float32) for s in SHAPES]}
    task = Task(models=[0])
    ok = _answer(instruction, {P.ROUND: 5, P.STEP: 2}, model)
    assert _kind_of_rejection(ok, task) == (None, "")
    for metrics in ({P.ROUND: 4, P.STEP: 2}, {P.ROUND: 5, P.STEP: 1}, {P.STEP: 2}):
        kind, why = _kind_of_rejection(_answer(instruction, metrics, model), task)
        assert kind == "stale" and "stale or replayed" in why


def test_a_model_returned_under_another_id_than_the_one_chosen_is_refused(instruction):
    models = {1: [np.ones(s, np.float32) for s in SHAPES]}
    task = Task.min_loss([0, 1])
    echo = {P.ROUND: 5, P.STEP: 2, P.LOSSES: [0.1, 0.9], P.MODEL_IDS: [0, 1]}
    kind, why = _kind_of_rejection(_answer(instruction, {**echo, P.CHOSEN: 0}, models), task)
    assert kind == "wrong-model" and "reports choosing model 0 but returns models [1]" in why
    assert _kind_of_rejection(_answer(instruction, {**echo, P.CHOSEN: 1}, models), task)[0] is None


def test_a_reply_larger_than_its_instruction_can_produce_is_refused_before_decoding(instruction):
    from fedcluster_app.core.server.messages import reply_budget

    task = Task(models=[0])
    max_bytes, max_values = reply_budget(task, SHAPES, DTYPES)
    echo = {P.ROUND: 5, P.STEP: 2}
    big = {"junk": [np.zeros(max_bytes // 4 + 1, np.float32)]}   # 4 bytes a value: one too many
    kind, why = _kind_of_rejection(_answer(instruction, echo, extras=big), task)
    assert kind == "oversize" and f"at most {max_bytes:,}" in why
    listed = {**echo, "custom": [0.0] * max_values}
    kind, why = _kind_of_rejection(_answer(instruction, listed), task)
    assert kind == "oversize" and "metric values" in why
    # what a family adds (up to two models' worth) still fits
    extra = {"classifier": [np.ones(s, np.float32) for s in SHAPES] * 2}
    assert _kind_of_rejection(_answer(instruction, echo, extras=extra), task)[0] is None


def test_replayed_and_relabelled_replies_are_refused_counted_and_the_run_goes_on(fast_config):
    """Client 0 answers every training instruction with its first reply again (a replay);
    client 1 returns the model it trained under the id of a model it did not choose. Both are
    refused every round and counted by kind in metrics.jsonl; the others' run is unharmed."""
    from fedcluster_app.client_app import app as honest

    first = {}

    def app(msg, ctx):
        reply = honest(msg, ctx)
        cid = int(reply.content[P.METRICS][P.CLIENT_ID]) if not reply.has_error() else None
        if msg.metadata.message_type != P.TRAIN or cid not in (0, 1):
            return reply
        if cid == 0:
            old = first.setdefault(0, reply.content)
            return Message(old, reply_to=msg)
        metrics = reply.content[P.METRICS]
        chosen = int(metrics[P.CHOSEN])
        other = next(m for m in metrics[P.MODEL_IDS] if m != chosen)
        content = reply.content
        content[f"{P.MODEL_PREFIX}{other}"] = content[f"{P.MODEL_PREFIX}{chosen}"]
        del content[f"{P.MODEL_PREFIX}{chosen}"]
        return reply

    clean = run_inprocess(fast_config(strategy="ifca", out_dir=fast_config()["out-dir"] + "-c"))
    summary = run_inprocess(fast_config(strategy="ifca"), client_app=app)
    _, rounds = load_run(Path(summary["out_dir"]))
    assert summary["status"] == "completed"
    assert rounds[0]["rejected"] == {"wrong-model": 1}          # round 1's replay is the reply
    for r in rounds[1:]:
        assert r["rejected"] == {"stale": 1, "wrong-model": 1}, r["round"]
        assert sorted(r["failed_clients"]) == [0, 1]
    assert summary["mean_accuracy"] > clean["mean_accuracy"] - 0.05


# ----------------------------------------------------------------- one deadline per round
def _sleepy(seconds_by_client, kind=P.TRAIN, from_round=1):
    import time as _time

    from fedcluster_app.client_app import app as honest

    def app(msg, ctx):
        cid = ctx.node_config.get("partition-id")
        config = msg.content["config"]
        if (msg.metadata.message_type == kind and cid in seconds_by_client
                and int(config[P.ROUND]) >= from_round):
            _time.sleep(seconds_by_client[cid])
        return honest(msg, ctx)

    return app


def test_round_timeout_bounds_a_round_in_process_and_drops_the_late_reply(fast_config):
    """In-process as on Flower's runtimes: client 9 takes 10 s to evaluate in round 4 with
    round-timeout = 5 s. Its reply comes after its instruction expired and is dropped (not
    counted in the accuracy); the round waits that one call, not more; the run goes on and
    completes with the other nine clients' scores."""
    summary = run_inprocess(fast_config(strategy="fedavg", num_steps=2, round_timeout=5.0),
                            client_app=_sleepy({9: 10.0}, kind=P.EVALUATE, from_round=4))
    _, rounds = load_run(Path(summary["out_dir"]))
    assert summary["status"] == "completed"
    assert all(r["failures"] == 0 for r in rounds[:3])
    last = rounds[3]
    assert last["failed_clients"] == [9] and last["rejected"] == {"no-reply": 1}
    assert last["trained_clients"] == 10 and len(last["client_accuracy"]) == 9
    assert 10 <= last["round_time_s"] < 13


def test_a_round_has_one_deadline_for_all_its_exchanges(fast_config):
    """Training that uses up the round's deadline leaves no time to evaluate: the evaluation
    is not sent, and the run says its rounds went unevaluated (before, each exchange waited
    round-timeout anew, so a round could wait several times it)."""
    summary = run_inprocess(fast_config(strategy="fedavg", num_steps=1, round_timeout=4.0),
                            client_app=_sleepy({c: 0.5 for c in range(10)}))
    _, rounds = load_run(Path(summary["out_dir"]))
    assert summary["status"] == "degraded" and "evaluation" in summary["reason"]
    for r in rounds:   # trained until the deadline, one client after another; then nothing
        assert r["accuracy"] is None and 3 <= r["trained_clients"] < 10
        assert r["rejected"]["no-reply"] == 10 + 10 - r["trained_clients"]


def test_an_expired_instruction_raises_in_the_clientapp_so_flower_keeps_the_newer_state():
    """On a simulation, Flower writes a call's Context back when the call returns; a late
    call would overwrite what a newer message wrote meanwhile. The ClientApp raises instead,
    so nothing is written back."""
    from flwr.app import ConfigRecord, Context

    from fedcluster_app.client_app import InstructionExpired
    from fedcluster_app.client_app import app as honest
    from fedcluster_app.core.config import default_run_config
    from fedcluster_app.core.flower_fast import instruction

    InProcessGrid({}, 0)
    rc = {**default_run_config(), "scenario": "mixture-swap", "samples-per-step": 50,
          "test-samples": 20}
    ctx = Context(run_id=1, node_id=5, node_config={"partition-id": 3, "num-partitions": 10},
                  state=RecordDict(), run_config=rc)
    content = RecordDict({"config": ConfigRecord({P.ROUND: 1, P.STEP: 1})})
    fresh = instruction(content, 5, P.QUERY_INFO, "1", ttl=600.0)
    assert not honest(fresh, ctx).has_error()
    stale = instruction(content, 5, P.QUERY_INFO, "1", ttl=1e-9)
    with pytest.raises(InstructionExpired, match="expired while it was handled"):
        honest(stale, ctx)
