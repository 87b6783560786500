"""A real SuperLink and SuperNodes on 127.0.0.1 (slow: every deployed message starts a process)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from fedcluster_app.core.config import default_run_config, merge_overrides
from fedcluster_app.core.results import load_run
from fedcluster_app.core.strategy import read_checkpoint
from fedcluster_app.deploy import LocalDeployment, make_node_keys
from fedcluster_app.launcher import run_on_deployment

pytestmark = pytest.mark.slow


def small_run(out: Path, **extra) -> dict:
    return merge_overrides(default_run_config(), {
        "strategy": "ifca", "scenario": "mixture-swap", "num-clients": 3, "num-steps": 3,
        "rounds-per-step": 1, "local-steps": 5, "samples-per-step": 100, "test-samples": 50,
        "out-dir": str(out), "round-timeout": 240.0, "node-wait-s": 60.0, **extra})


def checkpoint_clients(out: Path) -> dict[int, dict]:
    meta, _ = read_checkpoint(out)
    return {c["cid"]: c for c in meta["clients"]}


def test_three_supernodes_run_a_clustered_strategy(tmp_path):
    with LocalDeployment(tmp_path / "dep", num_nodes=3) as dep:
        run_on_deployment(small_run(tmp_path / "out"), dep.connection())
    summary, rounds = load_run(tmp_path / "out")
    assert summary["status"] == "completed" and len(rounds) == 3
    assert all(r["evaluated_clients"] == 3 and r["failures"] == 0 for r in rounds)
    assert rounds[-1]["ari"] == 1.0 and rounds[-1]["drifted_clients"] == 1   # client 0 drifts
    assert sorted(checkpoint_clients(tmp_path / "out")) == [0, 1, 2]


def test_each_supernode_reads_its_own_npz_file(tmp_path):
    """Every device holds its own data: node k's `data-dir` is its own .npz file. The server
    cannot read any of them and builds the models from num-classes and input-shape."""
    import numpy as np

    configs = []
    centres = np.array([[0.0, 0.0], [4.0, 0.0], [0.0, 4.0]])
    for k in range(3):
        rng = np.random.default_rng(k)
        y = rng.integers(0, 3, 240)
        x = (centres[y] + rng.normal(0.0, 0.5, (240, 2))).astype(np.float32)
        np.savez(tmp_path / f"node{k}.npz", x=x, y=y)
        configs.append({"client-id": k, "data-dir": f"npz:{tmp_path / f'node{k}.npz'}"})
    run = small_run(tmp_path / "out", **{
        "strategy": "fedavg", "scenario": "dataset-permute", "num-steps": 2,
        "samples-per-step": 60, "test-samples": 30, "local-steps": 40, "num-classes": 3,
        "input-shape": "2",
        "dataset": f"npz:{tmp_path / 'on-the-devices-only.npz'}"})
    with LocalDeployment(tmp_path / "dep", node_configs=configs) as dep:
        run_on_deployment(run, dep.connection())
    summary, rounds = load_run(tmp_path / "out")
    assert summary["status"] == "completed" and summary["failures"] == 0
    assert all(r["evaluated_clients"] == 3 for r in rounds)
    assert rounds[0]["accuracy"] > 0.8                 # three separable blobs, chance 1/3


def test_tls_and_supernode_authentication_refuse_an_unregistered_node(tmp_path):
    with LocalDeployment(tmp_path / "dep", num_nodes=2, tls=True, auth=True) as dep:
        stranger, _ = make_node_keys(tmp_path / "stranger", "key")   # never registered
        dep.node_configs.append({"client-id": 2})
        dep.start_node(2, key=stranger)
        time.sleep(8)
        assert dep.online_nodes() == 2                                  # it was refused
        run_on_deployment(small_run(tmp_path / "out", **{"num-clients": 2, "node-wait-s": 5.0}),
                          dep.connection())
    summary, rounds = load_run(tmp_path / "out")
    assert summary["status"] == "completed" and {r["evaluated_clients"] for r in rounds} == {2}
    log = (tmp_path / "dep" / "node2.log").read_text()
    assert "Failed to activate SuperNode" in log            # the SuperLink refused its key


def test_a_supernode_that_dies_and_comes_back_keeps_its_cluster(tmp_path):
    out = tmp_path / "out"
    with LocalDeployment(tmp_path / "dep", num_nodes=3) as dep:
        cfg = small_run(out, **{"num-steps": 6, "checkpoint-every": 1})
        runner = threading.Thread(target=run_on_deployment, args=(cfg, dep.connection()))
        runner.start()
        while not (out / "checkpoint.npz").is_file():   # round 1 done
            time.sleep(0.5)
        before = checkpoint_clients(out)[1]["cluster"]
        dep.stop_node(1)
        time.sleep(2)
        dep.start_node(1)                                # same client-id, new Flower node id
        runner.join(timeout=900)
        assert not runner.is_alive()
    summary, rounds = load_run(out)
    clients = checkpoint_clients(out)
    assert summary["status"] == "completed" and len(rounds) == 6
    assert sorted(clients) == [0, 1, 2]                  # matched by client-id, not duplicated
    assert clients[1]["failures"] >= 1 and clients[1]["last_round"] == 6
    assert any(1 in r["failed_clients"] for r in rounds)  # who missed a round is recorded
    assert clients[1]["cluster"] == before               # client 1 never drifts: same cluster
    assert rounds[-1]["evaluated_clients"] == 3


def test_a_crashed_server_resumes_from_its_checkpoint_in_deployment(tmp_path):
    """SIGKILL the SuperLink with its ServerApp mid-run (the server machine dies), bring it back
    on the same database and port, and resume the run with `resume-from`: it ends with the same
    assignments and metrics as an uninterrupted run with the same seed."""
    from fedcluster_app.engine import run_inprocess
    from fedcluster_app.launcher import RunFailed

    out = tmp_path / "out"
    cfg = small_run(out, **{"num-steps": 5, "checkpoint-every": 1})
    failure: list[BaseException] = []

    def first_attempt() -> None:
        try:
            run_on_deployment(cfg, dep.connection())
        except (RunFailed, OSError) as ex:
            failure.append(ex)

    with LocalDeployment(tmp_path / "dep", num_nodes=3) as dep:
        runner = threading.Thread(target=first_attempt)
        runner.start()
        while not (out / "metrics.jsonl").is_file() or \
                len((out / "metrics.jsonl").read_text().splitlines()) < 2:
            time.sleep(0.2)
        dep.stop_superlink(crash=True)
        runner.join(timeout=300)
        assert not runner.is_alive() and failure, "the first attempt should have failed"
        meta, _ = read_checkpoint(out)
        assert 2 <= meta["round"] < 5
        dep.start_superlink()
        dep.wait_online(3)
        run_on_deployment({**cfg, "resume-from": str(out)}, dep.connection())
    summary, rounds = load_run(out)
    reference = run_inprocess(small_run(tmp_path / "ref", **{"num-steps": 5}))
    _, ref_rounds = load_run(tmp_path / "ref")
    assert summary["status"] == reference["status"] == "completed"
    assert summary["resumed_after_round"] == meta["round"]       # continued, not started again
    assert [r["round"] for r in rounds] == list(range(1, 6))
    assert {c: v["cluster"] for c, v in checkpoint_clients(out).items()} == \
        {c: v["cluster"] for c, v in checkpoint_clients(tmp_path / "ref").items()}
    np.testing.assert_allclose([r["accuracy"] for r in rounds], [r["accuracy"] for r in ref_rounds],
                               atol=1e-9)
