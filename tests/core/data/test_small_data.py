"""Small data stay honest: a client whose pool or shard holds fewer rows than a step asks for
uses each row once, reports that true count (FedAvg's weights follow it), is tested on distinct
rows, and the run says once which clients are short; ``oversample = true`` draws with
replacement as before, and pools large enough are drawn exactly as before."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import fedcluster_app.families  # noqa: F401
from fedcluster_app.core import wire as P
from fedcluster_app.core.data import build_scenario
from fedcluster_app.core.server.strategy import ClusteredStrategy
from fedcluster_app.engine import run_inprocess

SIZES = {"a": 8, "b": 16, "c": 40}       # rows per user: 6, 12 and 30 to train on


@pytest.fixture
def users(tmp_path) -> str:
    rng = np.random.default_rng(1)
    user = np.repeat(list(SIZES), list(SIZES.values()))
    label = np.resize([0, 1], len(user))
    x = rng.normal(size=(len(user), 3)) + 3.0 * label[:, None]
    frame = pd.DataFrame(x, columns=["f1", "f2", "f3"]).assign(label=label, user=user)
    frame.to_csv(tmp_path / "users.csv", index=False)
    return f"csv:{tmp_path / 'users.csv'}"


@pytest.fixture
def weights(monkeypatch) -> list[list[float]]:
    """The num-examples every FedAvg aggregation of the run weighs its updates with."""
    seen: list[list[float]] = []
    original = ClusteredStrategy.collect_updates

    def collect(self, replies):
        updates = original(self, replies)
        seen.extend([n for _, n in items] for items in updates.values())
        return updates

    monkeypatch.setattr(ClusteredStrategy, "collect_updates", collect)
    return seen


def run(tmp_path, dataset: str, **overrides):
    cfg = {"strategy": "fedavg", "scenario": "dataset-static", "dataset": dataset,
           "partition-column": "user", "rounds-per-step": 2, "num-steps": 2, "local-steps": 3,
           "progress": False, "plot": False, "out-dir": str(tmp_path / "run")}
    cfg.update({k.replace("_", "-"): v for k, v in overrides.items()})
    return run_inprocess(cfg)


def test_a_short_client_reports_its_true_count_and_fedavg_weighs_by_it(tmp_path, users,
                                                                         weights, caplog):
    caplog.set_level("INFO", logger="flwr")
    summary = run(tmp_path, users, samples_per_step=200)
    assert summary["status"] == "completed"
    assert weights and all(w == [6.0, 12.0, 30.0] for w in weights)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("small data")]
    assert lines == ["small data: samples-per-step = 200, but clients 0-2 hold fewer (client: "
                     "rows 0: 6, 1: 12, 2: 30): each trains on its rows once and reports that "
                     "count as num-examples; test-samples = 100, but clients 0-2 hold fewer "
                     "(client: rows 0: 2, 1: 4, 2: 10): each is tested on those distinct rows "
                     "(oversample = true draws with replacement instead)"]


def test_oversample_draws_with_replacement_as_before(tmp_path, users, weights, caplog):
    caplog.set_level("INFO", logger="flwr")
    run(tmp_path, users, samples_per_step=200, oversample=True)
    assert weights and all(w == [200.0] * 3 for w in weights)
    assert "small data" not in caplog.text


def test_a_window_of_steps_reports_no_more_than_the_client_holds(tmp_path, users, weights):
    run(tmp_path, users, samples_per_step=200, window=2)
    assert weights[0] == [6.0, 12.0, 30.0]      # step 1: one step of rows
    assert weights[-1] == [6.0, 12.0, 30.0]     # step 2: two steps of the same rows, capped


def test_a_client_with_enough_rows_draws_as_many_as_asked(tmp_path, users, weights):
    run(tmp_path, users, samples_per_step=10)
    assert all(w == [6.0, 10.0, 10.0] for w in weights)   # only the 6-row client is short


@pytest.mark.parametrize("disjoint", [False, True])
def test_short_pools_give_distinct_train_and_test_rows(tmp_path, disjoint):
    x = np.random.default_rng(0).normal(size=(120, 4)).astype(np.float32)
    np.savez(tmp_path / "small.npz", x=x, y=np.resize([0, 1, 2], 120))
    s = build_scenario("dataset-static", dataset=f"npz:{tmp_path / 'small.npz'}",
                       num_clients=6, partition="iid", disjoint=disjoint,
                       samples_per_step=200, test_samples=100)
    pool_train, pool_test = 90, 30
    for k in range(6):
        d = s.step_data(k, 1)
        for a, held in ((d.x_train, 15 if disjoint else pool_train), (d.x_test, pool_test)):
            assert len(np.unique(a, axis=0)) == len(a) <= held
        if disjoint:
            assert len(d.y_train) == len(s.realisation.shards[k]) == s.rows_held(k)
    assert set(s.short_clients()) == set(range(6))


def test_pools_larger_than_a_step_are_drawn_exactly_as_before():
    base = build_scenario("digits-swap", seed=2)
    again = build_scenario("digits-swap", seed=2, oversample=True)
    assert base.short_clients() == {} and base.rows_held(0) is None
    for field in ("x_train", "y_train", "x_test", "y_test"):
        np.testing.assert_array_equal(getattr(base.step_data(4, 3), field),
                                      getattr(again.step_data(4, 3), field))
    big = build_scenario("digits-static", samples_per_step=2000)      # 1,347 training images
    assert set(big.short_clients()) == set(range(10))
    assert len(np.unique(big.step_data(0, 1).x_train, axis=0)) == len(big.step_data(0, 1).x_train)


def test_the_reply_of_a_short_client_is_capped_in_the_client(users):
    from fedcluster_app.core.experiment import load_experiment
    from fedcluster_app.core.client.stream_client import StreamClient
    from flwr.app import RecordDict

    exp = load_experiment({"scenario": "dataset-static", "dataset": users,
                           "partition-column": "user", "samples-per-step": 200, "window": 3})
    client = StreamClient(0, exp, RecordDict())
    metrics, per_model = client.honest_counts({P.NUM_EXAMPLES: 18}, {0: {P.NUM_EXAMPLES: 18}})
    assert metrics[P.NUM_EXAMPLES] == per_model[0][P.NUM_EXAMPLES] == 6
