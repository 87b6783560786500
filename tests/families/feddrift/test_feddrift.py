"""FedDrift family and the paper's time-step protocol: behaviour, bad input, robustness."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedcluster_app.api import STRATEGIES
from fedcluster_app.client_app import app as default_app
from fedcluster_app.core import wire as P
from fedcluster_app.core.config import (
    ConfigError,
    TrainConfig,
    default_run_config,
    merge_overrides,
)
from fedcluster_app.core.experiment import load_experiment
from fedcluster_app.core.results import load_run
from fedcluster_app.engine import run_inprocess
from fedcluster_app.families.feddrift.feddrift import FedDrift
from fedcluster_app.core.client.kernels import numpy_train
from fedcluster_app.families.feddrift.wire import ERROR_RATES

# 4 clients, 5 training steps + the test step. Step 3: clients 0, 1 move to a NEW concept (B);
# step 4: client 2 moves to the now KNOWN concept B; step 5: client 0 returns to A (known).
SCHEDULE = "0 0 0 0\n0 0 0 0\n1 1 0 0\n1 1 1 0\n0 1 1 0\n0 1 1 0\n"

FAST = {
    "scenario": "sine2", "rounds-per-step": 3, "local-steps": 40, "batch-size": 50,
    "lr": 0.05, "weight-decay": 0.001, "progress": False, "plot": False,
    "feddrift.delta": 0.2,
}


@pytest.fixture
def schedule(tmp_path):
    path = tmp_path / "s4.cp"
    path.write_text(SCHEDULE)
    return str(path)


def _cfg(tmp_path, **kw):
    cfg = dict(FAST)
    cfg["out-dir"] = str(tmp_path / "run")
    cfg.update(kw)
    return cfg


def _steps(summary):
    _, rounds = load_run(Path(summary["out_dir"]))
    return {r["time_step"]: r for r in rounds if r["accuracy"] is not None}


def test_detection_fires_only_at_clients_moving_to_a_new_concept(tmp_path, schedule):
    summary = run_inprocess(_cfg(tmp_path, strategy="feddrift", schedule=schedule))
    steps = _steps(summary)
    assert sorted(steps) == [1, 2, 3, 4, 5]                  # step 6 is test-only
    detected = {t: r["detected_clients"] for t, r in steps.items()}
    assert detected == {1: [], 2: [], 3: [0, 1], 4: [], 5: []}
    # isolation: two local models at step 3, merged into one B model at step 4;
    # A and B stay apart; the final number of models = concepts alive
    assert steps[3]["models_alive"] == 3 and steps[3]["merges"] == 0
    assert steps[4]["merges"] == 1
    ids = steps[5]["identities"]
    assert ids["1"] == ids["2"] != ids["0"] == ids["3"]
    assert summary["models_final"] == 2
    assert summary["acc_omit"] > 0.9


def test_eager_shares_one_new_model_and_never_merges(tmp_path, schedule):
    summary = run_inprocess(_cfg(tmp_path, strategy="feddrift-eager", schedule=schedule))
    steps = _steps(summary)
    assert steps[3]["detected_clients"] == [0, 1]
    assert steps[3]["models_new"] == 1 and steps[3]["models_alive"] == 2
    assert summary["merges_total"] == 0 and summary["models_final"] == 2
    assert steps[3]["identities"]["0"] == steps[3]["identities"]["1"] != steps[3]["identities"]["2"]


def test_complete_linkage_merges_same_concept_keeps_others_apart(tmp_path):
    exp = load_experiment(merge_overrides(default_run_config(), _cfg(tmp_path, strategy="feddrift")))
    s = FedDrift(exp)
    for _ in range(3):
        s.new_model()
    s.protocol.W = {1: {0: 0, 1: 1, 2: 2}}
    # 0 ~ 1 (same concept) and 1 ~ 2 close, but 0 and 2 far apart: complete linkage must stop
    D = {frozenset((0, 1)): 0.01, frozenset((1, 2)): 0.05, frozenset((0, 2)): 0.6}
    s.hierarchical_merge(1, [0, 1, 2], D, {0: 500, 1: 1500, 2: 500})
    assert len(s.models) == 2 and 2 in s.models
    merged = next(m for m in s.models if m != 2)
    assert s.W[1] == {0: merged, 1: merged, 2: 2}
    # size-weighted average: n(0) = 500, n(1) = 1500
    s2 = FedDrift(exp)
    a, b = s2.new_model([np.zeros(3, np.float32)]), s2.new_model([np.ones(3, np.float32)])
    s2.protocol.W = {1: {0: a, 1: b}}
    s2.hierarchical_merge(1, [a, b], {frozenset((a, b)): 0.0}, {a: 500, b: 1500})
    (only,) = s2.models.values()
    np.testing.assert_allclose(only[0], 0.75)


def _recording_app(log):
    def app(msg, ctx):
        if msg.metadata.message_type.startswith("train"):
            cfg = dict(msg.content.config_records[P.CONFIG])
            log.append((int(cfg[P.STEP]), {k: list(v) for k, v in cfg.items()
                                           if k.startswith(P.DATA_STEPS)}))
        return default_app(msg, ctx)
    return app


@pytest.mark.parametrize("strategy,expected", [
    ("window", lambda t: [t]), ("window-2", lambda t: [max(1, t - 1), t][-min(t, 2):]),
    ("oblivious", lambda t: list(range(1, t + 1))),
])
def test_single_model_baselines_train_on_their_window(tmp_path, schedule, strategy, expected):
    log: list = []
    run_inprocess(_cfg(tmp_path, strategy=strategy, schedule=schedule, **{"rounds-per-step": 1}),
                  client_app=_recording_app(log))
    assert len(log) == 5 * 4
    for step, steps in log:
        (only,) = steps.values()
        assert only == expected(step)


def test_window_variant_of_feddrift_trains_on_newest_batch(tmp_path, schedule):
    log: list = []
    run_inprocess(_cfg(tmp_path, strategy="feddrift-w", schedule=schedule),
                  client_app=_recording_app(log))
    assert all(v == [step] for step, steps in log for v in steps.values())


def test_oracle_t_clusters_by_concept_and_tests_on_next_step(tmp_path, schedule):
    summary = run_inprocess(_cfg(tmp_path, strategy="oracle-t", schedule=schedule))
    steps = _steps(summary)
    assert all(r["ari"] == 1.0 for r in steps.values())
    # omit-drift leaves out (client, step) pairs whose next batch is another concept:
    # step 2 (clients 0, 1), step 3 (client 2), step 4 (client 0)
    assert [steps[t]["omit_pairs"] for t in range(1, 6)] == [4, 2, 3, 3, 4]
    assert summary["acc_omit"] > summary["acc_include"]


def test_ifca_w_keeps_k_models_and_assigns_among_them(tmp_path, schedule):
    summary = run_inprocess(_cfg(tmp_path, strategy="ifca-w", schedule=schedule))
    steps = _steps(summary)
    assert steps[1]["models_alive"] == 2
    assert all(set(r["identities"].values()) <= {0, 1} for r in steps.values())


@pytest.mark.parametrize("choice, chosen", [("min-loss", 0), ("min-error", 1)])
def test_per_round_ifca_trains_the_model_of_lowest_loss_or_lowest_error(monkeypatch, choice,
                                                                        chosen):
    """IFCA-W's client scores every model on its newest batch and trains only the best: by
    cross-entropy (the IFCA paper) or by 0-1 error (the FedDrift authors' code, which picks the
    highest accuracy); here model 0 has the lower cross-entropy and model 1 the lower error."""
    from fedcluster_app.core.client.handlers import call
    from fedcluster_app.core.models import initial_weights
    from fedcluster_app.core.client.stream_client import StreamClient
    from fedcluster_app.families.feddrift import client as fd_client
    from flwr.app import RecordDict

    exp = load_experiment(merge_overrides(default_run_config(), {
        "strategy": "ifca-w", "scenario": "sea2", "num-steps": 3, "local-steps": 5,
        "samples-per-step": 100, "test-samples": 50, "progress": False, "plot": False}))
    models = {0: initial_weights(exp.spec, 0), 1: initial_weights(exp.spec, 1)}
    scores = {id(models[0][0]): (0.5, 0.4), id(models[1][0]): (0.9, 0.1)}    # (ce, error)
    monkeypatch.setattr(fd_client, "model_ce_error",
                        lambda client, weights, x, y, config: scores[id(weights[0])])
    metrics, trained, _ = call(fd_client.train, StreamClient(1, exp, RecordDict()),
                               {P.ROUND: 2, P.STEP: 2, P.SELECT: choice, P.DATA_STEPS: [2]},
                               models)
    assert metrics[P.CHOSEN] == chosen and list(trained) == [chosen]
    assert metrics[P.LOSSES] == [0.5, 0.9]          # the cross-entropies are reported either way


@pytest.mark.parametrize("choice, select", [(None, "min-error"), ("loss", "min-loss")])
def test_ifca_w_asks_for_the_lowest_error_model_by_default(tmp_path, schedule, monkeypatch,
                                                          choice, select):
    """IFCA-W chooses by 0-1 error as the FedDrift authors' code does (D23), by cross-entropy
    with ``ifca-choice = "loss"``; a choice it does not know fails before round 1."""
    from fedcluster_app.families.feddrift.baselines import IFCAW

    sent = []
    original = IFCAW.plan_train

    def spy(self, step):
        tasks = original(self, step)
        sent.extend(t.config.get(P.SELECT) for t in tasks.values())
        return tasks

    extra = {} if choice is None else {"feddrift-baselines.ifca-choice": choice}
    monkeypatch.setattr(IFCAW, "plan_train", spy)
    run_inprocess(_cfg(tmp_path, strategy="ifca-w", schedule=schedule, **extra))
    assert set(sent) == {None, select}      # round 1: everybody trains model 0 (warm start)
    if choice is None:
        with pytest.raises(ConfigError, match="ifca-choice"):
            run_inprocess(_cfg(tmp_path, strategy="ifca-w", schedule=schedule,
                               **{"feddrift-baselines.ifca-choice": "accuracy"}))


@pytest.mark.parametrize("delta", [0.0, -0.1, 1.5])
def test_bad_delta_fails_before_round_one(tmp_path, delta):
    cfg = _cfg(tmp_path, strategy="feddrift", **{"feddrift.delta": delta})
    with pytest.raises(ConfigError, match="feddrift.delta"):
        run_inprocess(cfg)
    assert not (Path(cfg["out-dir"]) / "metrics.jsonl").exists()


def test_bad_schedule_files_are_named(tmp_path):
    ragged = tmp_path / "ragged.cp"
    ragged.write_text("0 0 0\n0 1\n")
    with pytest.raises(ValueError, match="ragged.cp.*ragged"):
        run_inprocess(_cfg(tmp_path, strategy="feddrift", schedule=str(ragged)))
    wide = tmp_path / "wide.cp"
    wide.write_text("0 0 0\n0 1 1\n")
    with pytest.raises(ValueError, match="wide.cp.*3 columns"):
        run_inprocess(_cfg(tmp_path, strategy="feddrift", schedule=str(wide), **{"num-clients": 4}))


def _corrupting_app(step_of_fault):
    """Client 0 drops a model from its probe, client 1 reports NaN, at one step;
    client 2 sends a malformed distance report at every step."""
    def app(msg, ctx):
        reply = default_app(msg, ctx)
        kind = msg.metadata.message_type
        cfg = dict(msg.content.config_records[P.CONFIG])
        cid = int(ctx.node_config["partition-id"])
        m = reply.content.metric_records.get(P.METRICS)
        if m is None:
            return reply
        if kind == "query.fd_probe" and int(cfg[P.STEP]) == step_of_fault:
            if cid == 0:
                m[P.MODEL_IDS] = list(m[P.MODEL_IDS])[:-1] or [999]
                m[ERROR_RATES] = list(m[ERROR_RATES])[:-1] or [0.0]
            elif cid == 1:
                m[ERROR_RATES] = [float("nan")] * len(list(m[ERROR_RATES]))
        if kind == "query.fd_distance" and cid == 2:
            m["fd.errors"] = [1.0]
        return reply
    return app


def test_bad_loss_reports_are_left_out_and_the_run_goes_on(tmp_path, schedule):
    summary = run_inprocess(_cfg(tmp_path, strategy="feddrift", schedule=schedule),
                            client_app=_corrupting_app(step_of_fault=3))
    assert summary["status"] == "completed"
    steps = _steps(summary)
    assert summary["failures"] >= 1                          # the NaN reply was rejected
    assert steps[3]["detected_clients"] == []                # both drifting clients left out
    # they kept their reference error, so they fire one step later, together with client 2,
    # for which concept B is still new (no B model was created at step 3)
    assert steps[4]["detected_clients"] == [0, 1, 2]
    assert all(r["accuracy"] is not None for r in steps.values())


def test_numpy_trainer_matches_torch():
    from fedcluster_app.core.models import (
        ModelSpec,
        build_model,
        get_weights,
        set_weights,
    )
    from fedcluster_app.core.training import local_train

    spec = ModelSpec("mlp", (3,), 2, 6)
    model = build_model(spec, 0)
    w0 = get_weights(model)
    rng = np.random.default_rng(0)
    x = rng.random((500, 3)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 1).astype(np.int64)
    for opt, steps in (("adam", 30), ("sgd", 30), ("adam", 0)):   # 0: one epoch, partial last batch
        cfg = TrainConfig(optimizer=opt, lr=0.01, weight_decay=1e-3, local_steps=steps, batch_size=64,
                          local_epochs=1, momentum=0.5 if opt == "sgd" else 0.0)
        set_weights(model, w0)
        local_train(model, x, y, cfg, np.random.default_rng(1))
        fast, _ = numpy_train(w0, x, y, cfg, np.random.default_rng(1))
        for a, b in zip(get_weights(model), fast):
            np.testing.assert_allclose(a, b, atol=1e-5)



def test_stacked_numpy_training_equals_training_each_model_alone():
    """KUE/AUE/FedDrift clients train their models in one stacked call: each model must come
    out as if trained alone on its own data and batches (and groups of unequal shape split)."""
    from fedcluster_app.core.training import batch_indices
    from fedcluster_app.core.client.kernels import numpy_train_many

    rng = np.random.default_rng(3)
    steps = TrainConfig(optimizer="adam", lr=0.01, weight_decay=1e-3, local_steps=20, batch_size=50)
    epochs = TrainConfig(optimizer="adam", lr=0.01, weight_decay=1e-3, local_steps=0, batch_size=64)
    for cfg in (steps, epochs):      # epochs: equal-size jobs share a partial last batch
        jobs = []
        for k, (n, hidden) in enumerate([(500, 4), (900, 4), (300, 4), (500, 6), (500, 4)]):
            w = [rng.normal(size=(hidden, 3)), rng.normal(size=hidden),
                 rng.normal(size=(2, hidden)), rng.normal(size=2)]
            x = rng.random((n, 3))
            y = (x[:, 0] > x[:, k % 3]).astype(np.int64)
            jobs.append((w, x, y, batch_indices(n, cfg, np.random.default_rng(k))))
        together = numpy_train_many(jobs, cfg)
        for (w, x, y, batches), (weights, loss) in zip(jobs, together):
            alone, alone_loss = numpy_train(w, x, y, cfg, np.random.default_rng(0), batches)
            assert loss == pytest.approx(alone_loss, rel=1e-9)
            for a, b in zip(alone, weights):
                np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
        assert not np.allclose(together[0][0][0], together[1][0][0])   # different data and models

def test_family_is_registered():
    for name in ("feddrift", "feddrift-eager", "feddrift-c", "feddrift-w", "feddrift-eager-w",
                 "oblivious", "window", "window-2", "oracle-t", "oracle-w", "ifca-t", "ifca-w"):
        assert name in STRATEGIES


# ---------------------------------------------------------------------------- baselines
def test_cfl_splitter_splits_opposed_groups_only():
    from fedcluster_app.families.foundation.cfl import CFLSplitter

    rng = np.random.default_rng(0)
    d = np.zeros(20)
    d[0] = 1.0
    opposed = np.stack([d + 0.05 * rng.normal(size=20) for _ in range(3)] +
                       [-d + 0.05 * rng.normal(size=20) for _ in range(3)])
    aligned = np.stack([d + 0.05 * rng.normal(size=20) for _ in range(6)])
    s = CFLSplitter(gamma=0.1)
    assert s.propose(aligned * 3) is None              # a new maximum mean norm: not tested
    # eps1 = 3 / 10, eps2 = 6 eps1: small mean update, large individual ones, opposed directions
    groups = s.propose(opposed * 2)
    assert groups is not None and sorted(map(sorted, groups)) == [[0, 1, 2], [3, 4, 5]]
    assert CFLSplitter(gamma=0.1, max_mean_norm=100.0).propose(aligned * 0.01) is None


def _all_flip_schedule(tmp_path):
    path = tmp_path / "flip.cp"
    path.write_text("0 0 0 0\n0 0 0 0\n" + "1 1 1 1\n" * 5)
    return str(path)


def test_driftsurf_enters_reactive_state_and_switches_models(tmp_path):
    summary = run_inprocess(_cfg(tmp_path, strategy="driftsurf", schedule=_all_flip_schedule(tmp_path),
                                 **{"feddrift-baselines.driftsurf-delta": 0.1}))
    steps = _steps(summary)
    assert steps[2]["driftsurf_state"] == "stable"
    assert steps[3]["driftsurf_state"] == "reactive"       # everybody flipped at step 3
    # r = 3 steps counting step 3: compared at 4 and 5, decided at 5
    assert steps[4]["driftsurf_state"] == "reactive"
    assert steps[5]["driftsurf_state"] == "stable"
    assert steps[5]["switches"] == 1                       # the reactive model became predictive


class _ScriptedDriftSurf:
    """A DriftSurf whose pooled accuracies come from a script: tau -> {"p", "s", "r"}."""

    def __init__(self, script, r=3, delta=0.1):
        from fedcluster_app.api import make_strategy

        self.ds = ds = make_strategy("driftsurf", driftsurf_reactive=r, driftsurf_delta=delta)
        ds.clients = {}
        ds.probe = lambda grid, tau, live: {0: {m: 0.0 for m in live}}

        def pooled(errs, m, tau):
            return script[tau]["p" if m == ds.p else "s" if m == ds.s else "r"]
        ds._pooled_acc = pooled

    def step(self, tau):
        self.ds.begin_step(None, tau)
        ds = self.ds
        return {"mode": ds.mode, "train": ds.active_models(tau), "use": ds.use, "p": ds.p,
                "s": ds.s, "rm": ds.rm}


def test_driftsurf_reactive_period_is_r_steps_with_r_minus_1_comparisons():
    # the drift at 3: the reactive model wins both comparisons (4, 5) and replaces the
    # predictive one at 5; a fresh stable model starts at 6, the first stable step after
    good = {"p": 0.9, "s": 0.9, "r": 0.0}
    script = {2: good, 3: {"p": 0.5, "s": 0.9, "r": 0.0}, 4: {"p": 0.5, "s": 0, "r": 0.8},
              5: {"p": 0.5, "s": 0, "r": 0.85}, 6: {"p": 0.86, "s": 0.0, "r": 0.0}}
    sd = _ScriptedDriftSurf(script, r=3)
    first = sd.step(1)
    p0, s0 = first["p"], first["s"]
    assert sd.step(2)["mode"] == "stable"
    at3 = sd.step(3)
    assert at3["mode"] == "reactive" and at3["s"] is None and at3["use"] == p0
    rm = at3["rm"]
    assert at3["train"] == sorted([p0, rm])
    at4 = sd.step(4)
    assert at4["mode"] == "reactive" and at4["use"] == rm       # the better one serves
    at5 = sd.step(5)
    assert at5["mode"] == "stable" and at5["p"] == rm and at5["use"] == rm
    assert at5["train"] == [rm] and sd.ds.switches == 1
    assert sd.ds.acc_best == 0.85                                  # the reactive model's best
    at6 = sd.step(6)
    assert at6["s"] is not None and at6["s"] not in (p0, s0, rm)
    assert sd.ds.steps[at6["s"]] == [6] and sd.ds.steps[rm][-3:] == [4, 5, 6]


def test_driftsurf_losing_reactive_model_serves_its_last_step_then_goes():
    script = {2: {"p": 0.9, "s": 0.9, "r": 0}, 3: {"p": 0.5, "s": 0.9, "r": 0},
              4: {"p": 0.7, "s": 0, "r": 0.6}, 5: {"p": 0.6, "s": 0, "r": 0.65},
              6: {"p": 0.9, "s": 0.0, "r": 0}}
    sd = _ScriptedDriftSurf(script, r=3)
    p0 = sd.step(1)["p"]
    sd.step(2)
    rm = sd.step(3)["rm"]
    assert sd.step(4)["use"] == p0
    at5 = sd.step(5)                 # mean 0.625 < 0.65: the predictive model stays
    assert at5["mode"] == "stable" and at5["p"] == p0 and sd.ds.switches == 0
    assert at5["use"] == rm and rm in at5["train"]       # it was the better at 5: it serves 5
    at6 = sd.step(6)
    assert rm not in at6["train"] and at6["use"] == p0
    # acc_best follows the predictive model in either state: 0.9 from step 2 stays the best
    assert sd.ds.acc_best == 0.9


def test_driftsurf_needs_a_reactive_period_of_two_steps():
    from fedcluster_app.api import make_strategy

    with pytest.raises(ConfigError, match="driftsurf-reactive"):
        make_strategy("driftsurf", driftsurf_reactive=1)


def test_weighted_and_adaptive_fedavg_send_their_training_rules(tmp_path, schedule):
    log: list = []

    def app(msg, ctx):
        if msg.metadata.message_type.startswith("train"):
            log.append(dict(msg.content.config_records[P.CONFIG]))
        return default_app(msg, ctx)

    run_inprocess(_cfg(tmp_path, strategy="weighted-exp", schedule=schedule, **{"rounds-per-step": 1}),
                  client_app=app)
    last = log[-1]
    (key,) = [k for k in last if k.startswith("fd.step-weights")]
    np.testing.assert_allclose(last[key], [2.0 ** (t - 5) for t in range(1, 6)])
    log.clear()
    run_inprocess(_cfg(tmp_path, strategy="adaptive-fedavg", schedule=schedule,
                       **{"rounds-per-step": 1, "out-dir": str(tmp_path / "afa"), "lr": 0.1}),
                  client_app=app)
    lrs = [float(c["lr"]) for c in log[::4]]
    assert not any("optimizer" in c for c in log)      # the run's optimizer: only the lr travels
    assert lrs[0] == 0.1 and all(0 < lr <= 0.1 for lr in lrs) and lrs[-1] < 0.1
    assert all(list(v) == [int(c[P.STEP])] for c in log for k, v in c.items()
               if k.startswith(P.DATA_STEPS))


def test_adaptive_fedavg_schedule_is_the_shared_one_with_the_feddrift_start():
    """adaptive-fedavg adapts its lr once per step with ``adaptive_fedavg.AdaptiveLR`` (one beta,
    m^_0 = w_1, so v_1 = 0 and the first variance ratio that counts is at step 3)."""
    from fedcluster_app.families.foundation.adaptive_fedavg import AdaptiveLR

    s = AdaptiveLR(0.1, 0.5, 0.5, 0.5, zero_start=False)
    # step 1, w = [1, 3]: v1 = 0; ratio 1 -> rho1 = 0.5, rho^1 = 1 -> lr = 0.1
    assert s.update(np.array([1.0, 3.0]), 1) == pytest.approx(0.1, abs=1e-15)
    # step 2, w = [2, 3]: v^_1 = 0 -> ratio 1: rho2 = 0.75, rho^2 = 1 -> lr = 0.1 / 2
    assert s.update(np.array([2.0, 3.0]), 2) == pytest.approx(0.05, rel=1e-12)
    # step 3, w = [2, 3]: m^2 = [5/3, 3], v3 = 0.125 + 0.5 / 18 = 11/72, v^3 = 11/63,
    # v^2 = 1/3 -> ratio 11/21; rho3 = 0.375 + 11/42 = 107/168, rho^3 = 107/147 -> lr / 3
    assert s.update(np.array([2.0, 3.0]), 3) == pytest.approx(0.1 * 107 / 441, rel=1e-12)


def test_aue_members_train_on_sliding_windows(tmp_path):
    log: list = []
    summary = run_inprocess(_cfg(tmp_path, strategy="aue", **{"rounds-per-step": 1, "local-steps": 5}),
                            client_app=_recording_app(log))
    at7 = [steps for step, steps in log if step == 7][0]
    assert sorted(map(tuple, at7.values()), key=len) == [tuple(range(7 - j, 8)) for j in range(5)]
    assert summary["models_final"] == 5


FAMILY = ["feddrift", "feddrift-eager", "feddrift-c", "feddrift-w", "feddrift-eager-w", "oblivious",
          "window", "window-2", "oracle-t", "oracle-w", "ifca-t", "ifca-w", "weighted-linear",
          "weighted-exp", "adaptive-fedavg", "cfl", "cfl-w", "driftsurf", "aue", "kue"]


@pytest.mark.parametrize("strategy", FAMILY)
def test_family_runs_on_any_scenario(tmp_path, strategy):
    """Every strategy of the family on a non-FedDrift scenario (6 rows: 5 steps + the test step)."""
    cfg = _cfg(tmp_path, strategy=strategy, scenario="mixture-swap", **{
        "rounds-per-step": 1, "local-steps": 5, "samples-per-step": 100, "test-samples": 50})
    summary = run_inprocess(cfg)
    disk, rounds = load_run(Path(cfg["out-dir"]))
    assert disk["status"] == "completed" and summary["rounds"] == 5 == len(rounds)
    assert [r["time_step"] for r in rounds] == [1, 2, 3, 4, 5]
    assert all(0.0 <= r["accuracy"] <= 1.0 and r["failures"] == 0 for r in rounds)
    assert 0.0 <= disk["acc_omit"] <= 1.0 and disk["models_sent_down"] > 0
    assert disk["ari_final"] is not None


def test_feddrift_resumes_after_a_crash_with_the_same_metrics(tmp_path, schedule):
    from fedcluster_app.engine import InProcessGrid

    class CrashingGrid(InProcessGrid):
        def send_and_receive(self, messages, *, timeout=None):
            messages = list(messages)
            if any(m.metadata.group_id == "7" for m in messages):
                raise RuntimeError("server crashed")
            return super().send_and_receive(messages, timeout=timeout)

    full = run_inprocess(_cfg(tmp_path, strategy="feddrift", schedule=schedule,
                              **{"out-dir": str(tmp_path / "full")}))
    cfg = _cfg(tmp_path, strategy="feddrift", schedule=schedule, **{
        "out-dir": str(tmp_path / "crashed"), "checkpoint-every": 1})
    with pytest.raises(RuntimeError, match="server crashed"):
        run_inprocess(cfg, grid_cls=CrashingGrid)          # crashes in step 3 (R = 3: round 7)
    resumed = run_inprocess(cfg | {"resume-from": cfg["out-dir"]})
    assert resumed["status"] == "completed"
    a, b = _steps(full), _steps(resumed)
    key = lambda r: (r["accuracy"], r["identities"], r["detected_clients"], r["merged"])  # noqa: E731
    assert [key(a[t]) for t in sorted(a)] == [key(b[t]) for t in sorted(b)]
    assert resumed["acc_omit"] == full["acc_omit"]


def test_kue_replaces_its_lowest_kappa_model_each_step(tmp_path, schedule):
    from fedcluster_app.families.feddrift.baselines import cohen_kappa

    assert cohen_kappa(np.array([[50, 0], [0, 50]])) == 1.0
    assert abs(cohen_kappa(np.array([[25, 25], [25, 25]]))) < 1e-12
    log: list = []

    def app(msg, ctx):
        if msg.metadata.message_type.startswith("train"):
            log.append(dict(msg.content.config_records[P.CONFIG]))
        return default_app(msg, ctx)

    summary = run_inprocess(_cfg(tmp_path, strategy="kue", schedule=schedule, **{"rounds-per-step": 1}),
                            client_app=app)
    assert summary["models_final"] == 10
    assert summary["models_created"] == 10 + 4               # one replacement per step after step 1
    masks = [v for k, v in log[0].items() if k.startswith("fd.mask.")]
    assert len(masks) == 10 and all(1 <= sum(m) <= 2 for m in masks)   # subspaces of the 2 features
    assert all(c["fd.bootstrap"] for c in log)


@pytest.mark.parametrize("shape, mask", [
    ((500, 2), [1.0, 0.0]),            # KUE on the paper's 2-feature data: the tiled mask
    ((37, 3), [0, 1, 1]),              # integer 0/1 masks, float64 data with inf and nan
    ((6, 4, 4), [1.0, 0.0] * 8),       # features of a sample flattened first
    ((20, 100), [1.0, 0.0] * 50),      # wide rows: NumPy's broadcast
    ((20, 2), [0.0]),                  # one mask value broadcast over every feature
])
def test_a_feature_mask_gives_numpys_broadcast_products_bit_for_bit(shape, mask):
    from fedcluster_app.families.feddrift.client import masked

    x = np.random.default_rng(3).standard_normal(shape) * 7
    x.reshape(len(x), -1)[:3, 0] = [np.inf, np.nan, -np.inf]
    x = x.astype(np.float64 if shape == (37, 3) else np.float32)
    with np.errstate(invalid="ignore"):            # inf x 0 is nan, both ways
        want = (np.asarray(x, dtype=np.float32).reshape(len(x), -1)
                * np.asarray(mask, dtype=np.float32)).reshape(shape)
        got = masked(x, {"fd.mask.4": mask}, 4)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes()          # -0.0 and nan where NumPy has them
    assert masked(x, {}, 4) is x                    # no mask: the data as they are


@pytest.mark.parametrize("strategy", ["kue", "ifca-w", "oracle-t", "cfl"])
def test_partial_participation_is_refused_under_the_time_step_protocol(strategy):
    """Every client trains every round under FedDrift's protocol: a fraction-train below 1
    would be ignored (the scale tier once ran FedDrift with all 100 clients training, beside
    methods that trained 20 a round), so it is refused before round 1, for every strategy
    but FedDrift's own (next test)."""
    from fedcluster_app.api import make_strategy

    with pytest.raises(ConfigError, match="fraction-train = 0.2 would be ignored"):
        make_strategy(strategy, run_config={"scenario": "mixture-swap", "fraction-train": 0.2})
    make_strategy(strategy, run_config={"scenario": "mixture-swap", "fraction-train": 1.0})


@pytest.mark.parametrize("strategy", ["feddrift", "feddrift-eager"])
def test_feddrift_trains_a_sample_each_round_and_decides_with_every_client(tmp_path, schedule,
                                                                           strategy):
    """FedDrift with fraction-train < 1 (this project's extension): each round trains
    fraction-train of the clients, a new draw each round, while the step's probes still hear
    every client, so the drifted clients are still found."""
    summary = run_inprocess(_cfg(tmp_path, strategy=strategy, schedule=schedule,
                                 **{"fraction-train": 0.5, "rounds-per-step": 4}))
    _, rounds = load_run(Path(summary["out_dir"]))
    assert {r["trained_clients"] for r in rounds} == {2}          # of 4
    steps = _steps(summary)
    assert {t: r["detected_clients"] for t, r in steps.items()}[3] == [0, 1]
    assert all(len(r["identities"]) == 4 for r in steps.values())
    full = run_inprocess(_cfg(tmp_path / "full", strategy=strategy, schedule=schedule,
                              **{"rounds-per-step": 4}))
    _, full_rounds = load_run(Path(full["out_dir"]))
    assert {r["trained_clients"] for r in full_rounds} == {4}
    steps_taken = lambda rs: sum(r["gradient_steps"] for r in rs)
    assert steps_taken(rounds) < 0.75 * steps_taken(full_rounds)   # about half the training
