"""FedRC, FedEM, FedSoft and the round-based CFL, in-process."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from flwr.app import Message, RecordDict

from fedcluster_app.client_app import app as client_app
from fedcluster_app.core import wire as P
from fedcluster_app.core.config import ConfigError
from fedcluster_app.core.experiment import load_experiment
from fedcluster_app.core.results import load_run
from fedcluster_app.core.server.strategy import read_checkpoint
from fedcluster_app.core.client.stream_client import StreamClient
from fedcluster_app.engine import run_inprocess
from fedcluster_app.families.fedrc import client as FC
from fedcluster_app.families.fedrc import em as C
from fedcluster_app.families.fedrc import fedrc as fedrc_module
from fedcluster_app.families.fedrc import wire as W
from fedcluster_app.families.fedrc.em import importance_weights
from fedcluster_app.families.fedrc.params import FedRCParams
from tests.core.server.test_checkpoint import CrashingGrid

# The calibrated population, small: 6 clients (+ 3 held-out test clients), FedRC's local training.
SMALL = {
    "scenario": "shifts-3", "num-clients": 6, "rounds-per-step": 4, "num-clusters": 3,
    "optimizer": "sgd", "lr": 0.2, "local-steps": 0, "local-epochs": 1, "batch-size": 32,
    "drop-last": True, "progress": False, "plot": False,
}


def small(tmp_path, name="run", **over):
    return {**SMALL, "out-dir": str(tmp_path / name), **{k: v for k, v in over.items()}}


def records(summary):
    return load_run(Path(summary["out_dir"]))[1]


# ------------------------------------------------------------------ the E-step
def test_responsibilities_are_the_robust_posterior():
    losses = np.array([[0.1, 2.0], [1.0, 1.0], [3.0, 0.2]])
    y = np.array([0, 1, 1])
    omega = np.array([0.25, 0.75])
    prior = np.array([[0.9, 0.1], [0.5, 0.5]])
    gamma = C.responsibilities(losses, y, omega, np.log(prior))
    # by hand: gamma_jk ~ omega_k exp(-loss_jk) / P~[k, y_j]
    num = omega[None, :] * np.exp(-losses) / prior[:, y].T
    np.testing.assert_allclose(gamma, num / num.sum(axis=1, keepdims=True), rtol=1e-12)
    # sample 1 has equal losses: only omega and the label prior decide (label 1 is rare in
    # cluster 0, so cluster 0 is boosted)
    assert gamma[1, 0] > 0.25


def test_uniform_prior_is_fedem_and_zero_weight_is_absorbing():
    rng = np.random.default_rng(0)
    losses, y = rng.exponential(size=(50, 3)), rng.integers(0, 4, 50)
    omega = np.array([0.5, 0.5, 0.0])
    uniform = np.log(np.full((3, 4), 0.25))
    gamma = C.responsibilities(losses, y, omega, uniform)
    fedem = omega * np.exp(-losses)
    np.testing.assert_allclose(gamma, fedem / fedem.sum(axis=1, keepdims=True), rtol=1e-12)
    assert (gamma[:, 2] == 0).all()                       # a cluster at omega = 0 stays at 0
    mass = C.label_cluster_mass(gamma, y, 4)
    np.testing.assert_allclose(mass.sum(), 50.0)
    np.testing.assert_allclose(mass[:, 1], gamma[y == 1].sum(axis=0))


def test_label_prior_moves_label_skewed_samples_out_of_a_label_homogeneous_cluster():
    """Two models that fit a label-1 sample equally: FedEM splits it by omega, FedRC sends it
    to the cluster where label 1 is rare (the balancing force of P~: docs/fedrc/README.md, "The
    algorithm as built")."""
    losses, y, omega = np.array([[0.5, 0.5]]), np.array([1]), np.array([0.5, 0.5])
    prior = np.array([[0.05, 0.95], [0.5, 0.5]])          # cluster 0 is almost all label 1
    fedem = C.responsibilities(losses, y, omega, np.log(np.full((2, 2), 0.5)))
    fedrc = C.responsibilities(losses, y, omega, np.log(prior))
    assert fedem[0, 0] == pytest.approx(0.5)
    assert fedrc[0, 0] == pytest.approx(0.5 / 0.95 / (0.5 / 0.95 + 0.5 / 0.5))


def test_new_client_weights_converge_on_the_model_that_fits_its_data():
    rng = np.random.default_rng(1)
    y = rng.integers(0, 3, 200)
    losses = np.stack([rng.exponential(2.0, 200), rng.exponential(0.2, 200),
                       rng.exponential(2.0, 200)], axis=1)
    omega, iters = C.estimate_omega(losses, y, np.log(np.full((3, 3), 1 / 3)), 50, 1e-4)
    assert omega.argmax() == 1 and omega[1] > 0.9 and np.isclose(omega.sum(), 1.0)
    assert iters < 50                                     # stopped once omega settled


def test_label_prior_from_masses_clamps_and_normalises():
    s1 = np.array([[2.0, 0.0], [0.0, 0.0]])
    prior = fedrc_module.label_prior([s1, s1])
    np.testing.assert_allclose(prior.sum(axis=1), 1.0)
    assert prior[0, 0] > 0.999 and prior[1, 0] == pytest.approx(0.5)   # empty row: uniform


def test_fedsoft_importance_weights_floor_and_normalise():
    losses = np.array([[0.1, 1.0], [0.2, 1.0], [2.0, 0.1]])
    u = importance_weights(losses, 1e-4)
    np.testing.assert_allclose(u, [2 / 3, 1 / 3])
    u = importance_weights(np.array([[0.1, 1.0, 1.0]]), 1e-4)
    assert u.min() > 0 and np.isclose(u.sum(), 1.0)


# ------------------------------------------------------------------ FedRC == FedEM under a uniform P~
def test_fedrc_with_a_uniform_label_correction_reproduces_fedem_exactly(tmp_path, monkeypatch):
    fedem = run_inprocess(small(tmp_path, "fedem", strategy="fedem"))
    fedrc_real = run_inprocess(small(tmp_path, "fedrc", strategy="fedrc"))
    k, c = 3, 10
    monkeypatch.setattr(fedrc_module, "label_prior", lambda masses: np.full((k, c), 1.0 / c))
    fedrc_uniform = run_inprocess(small(tmp_path, "uniform", strategy="fedrc"))
    keys = ("accuracy", "weighted_accuracy", "global_accuracy", "client_accuracy",
            "concept_cluster_mass", "cluster_mass")
    strip = lambda s: [{k_: r.get(k_) for k_ in keys} for r in records(s)]  # noqa: E731
    assert strip(fedrc_uniform) == strip(fedem)
    _, models_em = read_checkpoint(fedem["out_dir"])
    _, models_rc = read_checkpoint(fedrc_uniform["out_dir"])
    for mid in models_em:
        for a, b in zip(models_em[mid], models_rc[mid]):
            np.testing.assert_array_equal(a, b)
    # the real correction changes the run (so the comparison above can fail)
    assert strip(fedrc_real) != strip(fedem)
    assert fedrc_uniform["label_prior"] == [[0.1] * c] * k


# ------------------------------------------------------------------ a run, its metrics and state
def test_fedrc_run_reports_local_and_global_accuracy_and_the_mass_matrix(tmp_path):
    summary = run_inprocess(small(tmp_path, strategy="fedrc"))
    assert summary["status"] == "completed"
    rounds = records(summary)
    last = rounds[-1]
    assert last["evaluated_clients"] == 6                  # local: the participants only
    assert set(last["global_client_accuracy"]) == {"6", "7", "8"}   # the held-out clients
    assert 0 <= last["global_accuracy"] <= 1
    assert summary["final_global_accuracy"] == last["global_accuracy"]
    mass = last["concept_cluster_mass"]                    # concept -> cluster -> sum of omega
    exp = load_experiment({**SMALL})
    sizes = np.bincount([exp.scenario.concept(c, 1) for c in range(6)], minlength=3)
    for concept, row in mass.items():
        assert sum(row.values()) == pytest.approx(sizes[int(concept)], abs=1e-4)
    assert len(summary["label_prior"]) == 3 and all(
        sum(row) == pytest.approx(1.0, abs=1e-4) for row in summary["label_prior"])
    assert all(r["trained_clients"] == 6 for r in rounds)  # held-out clients never train


def test_held_out_clients_estimate_their_weights_and_pick_their_concept(tmp_path):
    """Models trained per concept (the Oracle), sent in a shuffled order: a held-out client's EM
    puts its weight on its own concept's model, and the mixture beats the other concepts'
    models."""
    over = {"rounds-per-step": 30, "num-clients": 12}
    summary = run_inprocess(small(tmp_path, strategy="oracle", **over))
    meta, models = read_checkpoint(summary["out_dir"])
    concept_model = {int(k): int(v) for k, v in meta["strategy_state"]["concept_model"].items()}
    exp = load_experiment({**SMALL, **over})
    shuffled = {10 + i: models[concept_model[c]] for i, c in enumerate((2, 0, 1))}
    for cid in exp.scenario.holdout_clients:
        client = StreamClient(cid, exp, RecordDict())
        concept = exp.scenario.concept(cid, 1)
        config = {P.STEP: 1, P.ROUND: 1, W.ESTIMATE: True,
                  **FedRCParams(em_iters=50, em_tol=1e-4).to_message(W.PARAMS)}
        metrics, _, _ = FC.evaluate(client, config, shuffled)
        omega = metrics[W.OMEGA_REPLY]
        assert sorted(shuffled)[int(np.argmax(omega))] == 10 + (2, 0, 1).index(concept)
        others = [client.evaluate(w, config)[2][P.ACCURACY] for m, w in shuffled.items()
                  if m != 10 + (2, 0, 1).index(concept)]
        assert max(omega) > 0.7 and metrics[P.ACCURACY] > max(others) + 0.1
        # hard prediction with the argmax model = that model alone
        hard, _, _ = FC.evaluate(client, {**config, W.PARAMS + "hard-test": True}, shuffled)
        _, _, alone = client.evaluate(shuffled[10 + (2, 0, 1).index(concept)], config)
        assert hard[P.ACCURACY] == pytest.approx(alone[P.ACCURACY])


def test_mixture_prediction_mixes_probabilities_by_omega(tmp_path):
    exp = load_experiment({**SMALL})
    client = StreamClient(0, exp, RecordDict())
    from fedcluster_app.core.models import initial_weights

    a, b = initial_weights(exp.spec, 1), initial_weights(exp.spec, 2)
    config = {P.STEP: 1, P.ROUND: 1}
    acc_a = client.evaluate(a, config)[2][P.ACCURACY]
    acc_b = client.evaluate(b, config)[2][P.ACCURACY]
    one_hot = client.evaluate_mixture([a, b], [1.0, 0.0], config)[2][P.ACCURACY]
    assert one_hot == pytest.approx(acc_a)
    assert client.evaluate_mixture([a, b], [0.0, 1.0], config)[2][P.ACCURACY] == pytest.approx(acc_b)
    # a real mixture: the weighted average of the two models' probabilities, argmax
    from fedcluster_app.core.models import build_model, set_weights
    from fedcluster_app.core.training import predict_proba

    nets = []
    for w in (a, b):
        net = build_model(exp.spec)
        set_weights(net, w)
        nets.append(net)
    x, y = client.test_data(1)
    want = float((predict_proba(nets, [0.3, 0.7], x).argmax(1).numpy() == y).mean())
    assert client.evaluate_mixture([a, b], [0.3, 0.7], config)[2][P.ACCURACY] == pytest.approx(want)


def test_hard_test_and_hard_train_variants(tmp_path):
    hard = run_inprocess(small(tmp_path, "tehc", strategy="fedrc", **{"fedrc.hard-test": True}))
    assert hard["status"] == "completed"
    trhc = run_inprocess(small(tmp_path, "trhc", strategy="fedrc", **{"fedrc.hard-train": True}))
    last = records(trhc)[-1]
    for row in last["concept_cluster_mass"].values():     # every client's omega is one-hot
        assert all(v == pytest.approx(round(v)) for v in row.values())


def test_pruning_removes_clusters_below_the_mass_threshold(tmp_path):
    summary = run_inprocess(small(tmp_path, strategy="fedrc", **{
        "num-clusters": 6, "rounds-per-step": 6, "fedrc.prune-threshold": 0.2,
        "fedrc.prune-warmup": 2, "fedrc.prune-every-round": True}))
    assert summary["status"] == "completed"
    assert summary["pruned"] and all(p["mass"] < 0.2 for p in summary["pruned"])
    assert summary["models_allocated_final"] == len(summary["model_ids"]) < 6
    assert len(summary["label_prior"]) == len(summary["model_ids"])
    meta, _ = read_checkpoint(summary["out_dir"])
    for rec in meta["clients"]:
        if rec["soft"]:
            assert set(map(int, rec["soft"])) == set(summary["model_ids"])
            assert sum(rec["soft"].values()) == pytest.approx(1.0)


class CrashAt3(CrashingGrid):
    crash_round = 3


@pytest.mark.parametrize("strategy", ["fedrc", "fedsoft", "cfl-rounds"])
def test_resume_continues_exactly(tmp_path, strategy):
    full = run_inprocess(small(tmp_path, "full", strategy=strategy))
    cfg = small(tmp_path, "crash", strategy=strategy, **{"checkpoint-every": 2})
    with pytest.raises(RuntimeError, match="server crashed"):
        run_inprocess(cfg, grid_cls=CrashAt3)
    resumed = run_inprocess(cfg | {"resume-from": cfg["out-dir"]})
    keys = ("accuracy", "global_accuracy", "concept_cluster_mass")
    strip = lambda s: [{k: r.get(k) for k in keys} for r in records(s)]  # noqa: E731
    if strategy == "fedsoft":   # personal models live on the clients: a new process loses them
        assert resumed["status"] == "completed"
        return
    assert strip(resumed) == strip(full)


@pytest.mark.parametrize("strategy", ["fedsoft", "cfl-rounds", "cfl3-rounds", "fesem", "ifca"])
def test_baselines_run_on_the_population_with_global_accuracy(tmp_path, strategy):
    over = {"fesem.clients-per-round": 6, "fesem.init": "min-loss"} if strategy == "fesem" else {}
    summary = run_inprocess(small(tmp_path, strategy=strategy, **over))
    assert summary["status"] == "completed"
    last = records(summary)[-1]
    assert set(last["global_client_accuracy"]) == {"6", "7", "8"}
    assert all(r["trained_clients"] == 6 for r in records(summary))


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("over, message", [
    ({"num-clusters": 0}, "num-clusters"),
    ({"fedrc.prune-threshold": 1.0}, "prune-threshold must be in [0, 1)"),
    ({"fedrc.prune-threshold": -0.1}, "prune-threshold must be in [0, 1)"),
    ({"fedrc.em-iters": 0}, "em-iters"),
    ({"fedrc.omega-floor": 0.5}, "omega-floor"),
    ({"fedsoft.sigma": 0.0, "strategy": "fedsoft"}, "fedsoft.sigma"),
    ({"cfl-rounds.max-clusters": -1, "strategy": "cfl-rounds"}, "max-clusters"),
    ({"fesem.init": "random", "strategy": "fesem"}, "fesem.init"),
])
def test_bad_configuration_fails_before_the_first_round(tmp_path, over, message):
    cfg = small(tmp_path, strategy="fedrc") | over
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace(")", r"\)")):
        run_inprocess(cfg)
    assert not Path(cfg["out-dir"], "metrics.jsonl").exists()


def corrupting_app(bad: dict[int, str]):
    """The real ClientApp, but some clients' FedRC train replies are broken."""
    def app(msg: Message, ctx):
        reply = client_app(msg, ctx)
        cid = int(ctx.node_config["partition-id"])
        if cid in bad and msg.metadata.message_type == W.TRAIN_KIND and not reply.has_error():
            metrics = reply.content.metric_records[P.METRICS]
            if bad[cid] == "negative":
                metrics[W.OMEGA_REPLY] = [1.5, -0.25, -0.25]
            elif bad[cid] == "sum":
                metrics[W.OMEGA_REPLY] = [0.5, 0.3, 0.3]
            else:
                metrics[W.MASS] = list(metrics[W.MASS])[:-1]
        return reply
    return app


def test_bad_replies_are_rejected_logged_and_the_run_goes_on(tmp_path, caplog):
    cfg = small(tmp_path, strategy="fedrc")
    summary = run_inprocess(cfg, client_app=corrupting_app({1: "negative", 2: "sum", 4: "shape"}))
    assert summary["status"] == "completed"
    for rec in records(summary):
        assert rec["trained_clients"] == 3
        assert sorted(rec["failed_clients"]) == [1, 2, 4]
    assert "cluster weights must be >= 0 and sum to 1" in caplog.text
    assert "class-by-cluster mass has 29 entries, expected K x C = 3 x 10" in caplog.text
    meta, _ = read_checkpoint(cfg["out-dir"])
    soft = {r["cid"]: r["soft"] for r in meta["clients"]}
    assert soft[1] == {str(m): pytest.approx(1 / 3) for m in range(3)}   # never updated


# ------------------------------------------------------------------ behaviour
def test_fedrc_separates_concepts_where_fedavg_cannot(tmp_path):
    """Concept shift only (no skew, no corruption): one FedAvg model fits one concept, FedRC
    serves held-out clients of several; a concept gets a cluster of its own (the third acceptance
    check of docs/fedrc/README.md's small experiment: > 70% of its mass on a cluster no other concept
    dominates)."""
    over = {"scenario": "shifts-concept-only", "num-clients": 12, "rounds-per-step": 40}
    rc = run_inprocess(small(tmp_path, "fedrc", strategy="fedrc", **over))
    avg = run_inprocess(small(tmp_path, "fedavg", strategy="fedavg", **over))
    assert rc["last5_global_accuracy"] > avg["last5_global_accuracy"] + 0.2
    mass = records(rc)[-1]["concept_cluster_mass"]
    top = {c: max(row, key=row.get) for c, row in mass.items()}
    own = [c for c, row in mass.items() if row[top[c]] > 0.7 * sum(row.values())
           and list(top.values()).count(top[c]) == 1]
    assert own, mass


def test_normal_init_is_the_calibrated_recipe():
    """init = "normal": weights N(0, 1/fan_in), biases 0 (docs/fedrc/README.md, D11); distinct seeds
    differ."""
    from fedcluster_app.core.models import ModelSpec, initial_weights

    spec = ModelSpec("mlp", (20,), 10, 32, "normal")
    w1, b1, w2, b2 = initial_weights(spec, 0)
    assert not b1.any() and not b2.any()
    assert np.std(w1) == pytest.approx(20 ** -0.5, rel=0.1)
    assert np.std(w2) == pytest.approx(32 ** -0.5, rel=0.15)
    assert not np.array_equal(w1, initial_weights(spec, 1)[0])
    torch_w = initial_weights(ModelSpec("mlp", (20,), 10, 32), 0)[0]
    assert np.std(torch_w) < 0.7 * np.std(w1)              # PyTorch's default is narrower
    with pytest.raises(ConfigError, match="init must be"):
        run_inprocess({**SMALL, "init": "xavier"})


def test_a_participant_that_never_trained_estimates_its_weights_before_predicting(tmp_path):
    seen: dict[int, list[bool]] = {}

    def spy(msg: Message, ctx):
        if msg.metadata.message_type == W.EVAL_KIND:
            cid = int(ctx.node_config["partition-id"])
            config = msg.content.config_records[P.CONFIG]
            seen.setdefault(int(config[P.ROUND]), []).append((cid, bool(config.get(W.ESTIMATE))))
        return client_app(msg, ctx)

    cfg = small(tmp_path, strategy="fedrc", **{"fraction-train": 0.5, "rounds-per-step": 2})
    run_inprocess(cfg, client_app=spy)
    rounds = records({"out_dir": cfg["out-dir"]})
    evaluated = {int(c) for c in rounds[0]["client_accuracy"]}
    assert evaluated == set(range(6))                       # every participant is scored
    estimated = {cid for cid, est in seen[1] if est and cid < 6}
    assert len(estimated) == 3                             # the 3 not sampled in round 1
    assert {cid for cid, est in seen[1] if cid >= 6} == {6, 7, 8} and all(
        est for cid, est in seen[1] if cid >= 6)          # held-out clients always estimate


def test_fedsoft_scores_a_client_without_a_personal_model_on_the_best_centre(tmp_path):
    seen = {}

    def spy(msg: Message, ctx):
        if msg.metadata.message_type == P.EVALUATE:
            config = msg.content.config_records[P.CONFIG]
            if int(config[P.ROUND]) == 1:
                seen[int(ctx.node_config["partition-id"])] = (
                    bool(config.get(P.PERSONAL)), config.get(P.SELECT))
        return client_app(msg, ctx)

    cfg = small(tmp_path, strategy="fedsoft", **{"fraction-train": 0.5, "rounds-per-step": 1})
    run_inprocess(cfg, client_app=spy)
    participants = {c: v for c, v in seen.items() if c < 6}
    assert sorted(v for v in participants.values()) == [(False, "min-loss")] * 3 + [(True, None)] * 3
