"""FedCCFA's personal classifier across rounds outside the in-process engine (slow): in a
`flwr run` Ray simulation and in a local deployment (a SuperLink and three SuperNodes).

Each training reply carries ``personal-age``: how many rounds in a row the client's personal
classifier has been trained, read from and written back to ``context.state``. metrics.jsonl's
``personal_age`` is [min, max] over the round's trained clients. Were the classifier rebuilt
each round (the state lost between messages), every round would read [1, 1].
"""

from __future__ import annotations

import pytest

from fedcluster_app.core.config import default_run_config, merge_overrides
from fedcluster_app.core.results import load_run
from fedcluster_app.deploy import LocalDeployment
from fedcluster_app.launcher import run_on_deployment
from tests.support import alive, fedcluster, superlinks

pytestmark = pytest.mark.slow

# docs/fedccfa/README.md, "The personal classifier across rounds in a `flwr run` simulation"
RAY_SETTINGS = ["model=mlp", "hidden=16", "num-steps=2", "rounds-per-step=2", "drift-step=2",
                "samples-per-step=80", "local-steps=2", "fedccfa.align-start=1", "plot=false"]


def test_personal_classifier_survives_rounds_in_a_ray_simulation(tmp_path):
    before = superlinks()
    out = tmp_path / "ray"
    sets = [a for s in RAY_SETTINGS for a in ("--set", s)]
    proc = fedcluster("run", "--engine", "ray", "--strategy", "fedccfa", "--scenario", "digits-ccfa",
                      "--out", str(out), *sets)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary, rounds = load_run(out)
    assert summary["status"] == "completed" and len(rounds) == 4
    assert [r["personal_age"] for r in rounds] == [[1, 1], [2, 2], [3, 3], [4, 4]]
    assert all(r["trained_clients"] == 10 and r["failures"] == 0 for r in rounds)
    assert superlinks() <= before                          # the SuperLink it started is gone


def test_personal_classifier_survives_rounds_in_a_deployment(tmp_path):
    out = tmp_path / "out"
    cfg = merge_overrides(default_run_config(), {
        "strategy": "fedccfa", "scenario": "digits-ccfa", "num-clients": 3, "num-steps": 1,
        "rounds-per-step": 2, "model": "mlp", "hidden": 16, "samples-per-step": 60,
        "test-samples": 30, "local-steps": 1, "fedccfa.align-start": 1, "plot": False,
        "out-dir": str(out), "round-timeout": 240.0, "node-wait-s": 60.0})
    with LocalDeployment(tmp_path / "dep", num_nodes=3) as dep:
        started = dict(dep.pids)
        run_on_deployment(cfg, dep.connection())
    # torn down: no process is left (a zombie has exited: an init that never reaps, as in some
    # containers, keeps it listed)
    assert not [pid for pid in started.values() if alive(pid)]
    summary, rounds = load_run(out)
    assert summary["status"] == "completed" and len(rounds) == 2
    assert all(r["trained_clients"] == 3 and r["failures"] == 0 for r in rounds)
    # each SuperNode's ClientApp found its classifier of the round before in context.state
    assert [r["personal_age"] for r in rounds] == [[1, 1], [2, 2]]
    # the server clustered the three clients' rows per class (MADD needs 3) in every round
    assert all(len(r["clusters_per_class"]) == 10 and r["rows_rejected"] == [] for r in rounds)
