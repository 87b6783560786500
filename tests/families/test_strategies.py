"""The whole ServerApp + ClientApp in-process, for every strategy."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fedcluster_app.api import STRATEGIES
from fedcluster_app.core.server.runner import train_loss
from fedcluster_app.core.server.messages import Reply
from fedcluster_app.core.results import load_run
from fedcluster_app.engine import run_inprocess

FOUNDATION = ("fedavg", "fedprox", "ifca", "oracle", "local")


@pytest.mark.matrix
@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_every_strategy_runs_end_to_end(strategy, fast_config):
    cfg = fast_config(strategy=strategy)
    summary = run_inprocess(cfg)
    out = Path(cfg["out-dir"])
    disk, rounds = load_run(out)
    assert disk["strategy"] == strategy and disk["status"] == "completed"
    assert len(rounds) == summary["rounds"] > 0
    steps = [r["time_step"] for r in rounds]
    assert steps == sorted(steps) and steps[-1] <= 6
    if strategy in FOUNDATION:  # families with their own time-step protocol differ here
        assert len(rounds) == 12 and steps == [s for s in range(1, 7) for _ in range(2)]
    assert all(r["accuracy"] is None or 0.0 <= r["accuracy"] <= 1.0 for r in rounds)
    assert any(r["accuracy"] is not None for r in rounds)
    assert all(r["failures"] == 0 for r in rounds)
    # every family's training replies report the loss they trained on
    assert all(r["train_loss"] > 0 for r in rounds if r["trained_clients"])
    assert disk["ari_final"] is not None
    assert (out / "checkpoint.npz").is_file()
    # a clustered model is better than chance (4 classes)
    assert disk["mean_accuracy"] > 0.4


def test_fedavg_keeps_one_model_and_counts_bytes(fast_config):
    _, rounds = load_run(Path(run_inprocess(fast_config(strategy="fedavg"))["out_dir"]))
    assert {r["num_clusters"] for r in rounds} == {1}
    # each round: 10 clients get the model for training and for evaluation, 10 send it back
    assert all(r["bytes_down"] == 2 * r["bytes_up"] > 0 for r in rounds)


def test_the_training_loss_falls_until_the_drift_raises_it(fast_config):
    _, rounds = load_run(Path(run_inprocess(fast_config(strategy="fedavg"))["out_dir"]))
    loss = [r["train_loss"] for r in rounds]
    # steps 1-2 (rounds 1-4) are one concept; half the clients' labels swap at step 3 (round 5)
    assert loss[0] > loss[1] > loss[2] > loss[3]
    assert loss[4] > 2 * loss[3]


def test_the_round_training_loss_is_the_example_weighted_mean_of_the_reports():
    def reply(cid, metrics, per_model=None):
        return Reply(cid, metrics, model_metrics=per_model or {})

    replies = [reply(0, {"num-examples": 10, "train-loss": 1.0}),            # one per reply
               reply(1, {"num-examples": 30},                                # one per model
                     {0: {"num-examples": 30, "train-loss": 2.0},
                      1: {"num-examples": 20, "train-loss": 0.5}}),
               reply(2, {"num-examples": 40})]                               # reports none
    assert train_loss(replies) == pytest.approx((10 + 60 + 10) / 60)
    assert train_loss(replies[2:]) is None
    assert train_loss([]) is None
    # a huge (finite, so accepted) report from a hostile client: recorded as null, not inf
    huge = [reply(0, {"num-examples": 10 ** 6, "train-loss": 1e308})] * 2
    assert train_loss(huge) is None


def test_local_strategy_sends_no_model(fast_config):
    summary = run_inprocess(fast_config(strategy="local"))
    assert summary["bytes_up"] == 0 and summary["bytes_down"] == 0
    assert summary["num_clusters_final"] == 10


def test_oracle_recovers_the_true_clusters(fast_config):
    summary = run_inprocess(fast_config(strategy="oracle"))
    _, rounds = load_run(Path(summary["out_dir"]))
    assert summary["ari_final"] == 1.0
    assert all(r["ari"] == 1.0 for r in rounds)
    assert [r["num_clusters"] for r in rounds][-1] == 2
    assert sum(r.get("drifted_clients", 0) for r in rounds) == 5   # clients 0-4 drift at step 3


def test_ifca_separates_the_two_concepts_after_the_drift(fast_config):
    summary = run_inprocess(fast_config(strategy="ifca", **{"rounds-per-step": 3}))
    _, rounds = load_run(Path(summary["out_dir"]))
    after = [r for r in rounds if r["time_step"] >= 4]
    assert summary["ari_final"] == 1.0
    assert np.mean([r["ari"] for r in after]) > 0.9


def test_clustering_beats_fedavg_under_concept_drift(fast_config, tmp_path):
    acc = {}
    for strategy in ("fedavg", "oracle"):
        s = run_inprocess(fast_config(strategy=strategy, out_dir=str(tmp_path / strategy)))
        acc[strategy] = s["mean_accuracy_after_drift"]
    assert acc["oracle"] > acc["fedavg"] + 0.1


def test_same_seed_same_metrics_different_seed_different(fast_config, tmp_path):
    def accuracies(seed, name):
        s = run_inprocess(fast_config(strategy="ifca", seed=seed, out_dir=str(tmp_path / name)))
        return [r["accuracy"] for r in load_run(Path(s["out_dir"]))[1]]

    a, b, c = accuracies(1, "a"), accuracies(1, "b"), accuracies(2, "c")
    assert a == b
    assert a != c


def test_metrics_jsonl_has_the_contract_fields(fast_config):
    summary = run_inprocess(fast_config(strategy="ifca"))
    out = Path(summary["out_dir"])
    first = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    for key in ("round", "time_step", "accuracy", "num_clusters", "ari", "bytes_up", "bytes_down",
                "failures"):
        assert key in first
    for key in ("strategy", "scenario", "seed", "rounds", "mean_accuracy", "final_accuracy",
                "ari_final", "bytes_up", "bytes_down", "wall_time_s"):
        assert key in summary


@pytest.mark.parametrize("warm", [False, True])
def test_the_oracle_starts_a_new_concepts_model_afresh_or_from_its_clients_models(
        fast_config, monkeypatch, warm):
    """oracle.warm-start: the model of the concept that appears at the drift is the mean of
    the models its clients were on (here all on concept 0's model), not the common
    initialisation; off, it is the common initialisation (D4)."""
    from fedcluster_app.families.foundation.oracle import Oracle

    created = []
    new_model = Oracle.new_model

    def spy(self, weights=None, **kw):
        start = weights if weights is not None else self.initial_weights()
        created.append(([a.copy() for a in start], {m: [a.copy() for a in w]
                                                    for m, w in self.models.items()}))
        return new_model(self, weights, **kw)

    monkeypatch.setattr(Oracle, "new_model", spy)
    summary = run_inprocess(fast_config(strategy="oracle", **{"oracle.warm-start": warm}))
    assert summary["status"] == "completed" and len(created) == 2
    (first, _), (second, models_then) = created
    assert all(np.array_equal(a, b) for a, b in zip(first, second)) != warm
    if warm:
        assert all(np.allclose(a, b) for a, b in zip(second, models_then[0]))
