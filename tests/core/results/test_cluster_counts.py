"""metrics.jsonl's cluster fields: ``assignments`` (every client's cluster this round),
``num_clusters`` (the clusters in use: distinct assignments) and ``models_allocated``."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedcluster_app.core.data import build_scenario
from fedcluster_app.core.results import load_run
from fedcluster_app.engine import run_inprocess

# short: 3 steps of the fast scenario (its drift is at step 3), one round each
SHORT = {"num-steps": 3, "rounds-per-step": 1, "samples-per-step": 60, "test-samples": 30,
         "local-steps": 3}


def run(config: dict) -> tuple[dict, list[dict]]:
    summary = run_inprocess(config)
    return load_run(Path(summary["out_dir"]))


def clusters(record: dict) -> set[int]:
    return {m for m in record["assignments"].values() if m is not None}


def check_counts(summary: dict, rounds: list[dict]) -> None:
    """What every run must log, whatever the strategy."""
    assert rounds
    clients = {str(c) for c in range(summary["num_clients"])}
    for r in rounds:
        assert set(r["assignments"]) == clients
        assert all(m is None or isinstance(m, int) for m in r["assignments"].values())
        assert r["num_clusters"] == len(clusters(r))
        assert r["models_allocated"] >= r["num_clusters"]
    assert summary["num_clusters_final"] == rounds[-1]["num_clusters"]
    assert summary["models_allocated_final"] == rounds[-1]["models_allocated"]


def test_ifca_counts_the_models_its_clients_chose_not_the_models_it_holds(tmp_path):
    summary, rounds = run({"strategy": "ifca", "scenario": "sea4", "num-clusters": 4,
                           "num-steps": 3, "rounds-per-step": 1, "samples-per-step": 100,
                           "local-steps": 5, "progress": False, "plot": False,
                           "out-dir": str(tmp_path / "run")})
    check_counts(summary, rounds)
    assert {r["models_allocated"] for r in rounds} == {4}
    # every client ends on one model: one cluster in use, four models held
    last = rounds[-1]
    assert len(set(last["assignments"].values())) == 1
    assert last["num_clusters"] == summary["num_clusters_final"] == 1
    assert summary["models_allocated_final"] == 4


@pytest.mark.parametrize("strategy", ["fedavg", "ifca", "feddrift", "aue", "fielding",
                                      "flexcfl", "fedrc", "fedsoft", "fedccfa", "local"])
def test_every_round_logs_every_clients_cluster(fast_config, strategy):
    summary, rounds = run(fast_config(strategy=strategy, **SHORT))
    check_counts(summary, rounds)


@pytest.mark.parametrize("strategy", ["fedavg", "fedccfa"])
def test_one_global_model_is_one_cluster(fast_config, strategy):
    # FedCCFA too: its class-level clusters share the one model every client uses
    _, rounds = run(fast_config(strategy=strategy, **SHORT))
    assert all(set(r["assignments"].values()) == {0} for r in rounds)
    assert {(r["num_clusters"], r["models_allocated"]) for r in rounds} == {(1, 1)}


def test_local_clients_are_clusters_of_their_own(fast_config):
    _, rounds = run(fast_config(strategy="local", **SHORT))
    for r in rounds:
        assert r["assignments"] == {str(c): c for c in range(10)}
        assert r["num_clusters"] == r["models_allocated"] == 10


@pytest.mark.parametrize("strategy", ["feddrift", "aue"])
def test_time_step_assignments_are_the_identities_of_the_step(fast_config, strategy):
    _, rounds = run(fast_config(strategy=strategy, **{**SHORT, "rounds-per-step": 2}))
    by_step: dict[int, list[dict]] = {}
    for r in rounds:
        by_step.setdefault(r["time_step"], []).append(r)
    for step_rounds in by_step.values():
        identities = step_rounds[-1]["identities"]     # logged with the step's evaluation
        for r in step_rounds:                           # every round of the step has them
            assert {c: m for c, m in r["assignments"].items() if c in identities} == identities
    if strategy == "aue":
        # every client trains the whole ensemble but is on its newest model: one cluster in
        # use, more models allocated
        assert all(r["num_clusters"] == 1 for r in rounds)
        assert rounds[-1]["models_allocated"] > 1


def test_held_out_clients_are_in_no_cluster(tmp_path):
    held_out = {str(c) for c in build_scenario("shifts-3").holdout_clients}
    summary, rounds = run({"strategy": "fedrc", "scenario": "shifts-3", "num-clusters": 3,
                           "rounds-per-step": 1, "local-steps": 2, "progress": False,
                           "plot": False, "out-dir": str(tmp_path / "run")})
    check_counts(summary, rounds)
    assert held_out
    for r in rounds:   # they choose a model when they are scored; the others are clustered
        assert all((m is None) == (c in held_out) for c, m in r["assignments"].items())
