"""The clustered base's mechanisms the five papers need, driven through the real ClientApp."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord

from fedcluster_app.core import codec
from fedcluster_app.core import wire as P
from fedcluster_app.core.config import default_run_config, merge_overrides
from fedcluster_app.core.experiment import load_experiment
from fedcluster_app.core.results import load_run
from fedcluster_app.core.server.strategy import ClusteredStrategy, Task
from fedcluster_app.core.client.stream_client import COUNTERS_KEY, PERSONAL_KEY
from fedcluster_app.engine import InProcessGrid
from fedcluster_app.server_app import run_server


def setup(fast_config, strategy_cls, **overrides):
    rc = merge_overrides(default_run_config(), fast_config(**overrides))
    exp = load_experiment(rc)
    grid = InProcessGrid(rc, exp.scenario.num_clients)
    strategy = strategy_cls(exp)
    return exp, grid, strategy, rc["out-dir"]


def test_queries_reach_every_client(fast_config):
    exp, grid, strategy, _ = setup(fast_config, ClusteredStrategy)
    strategy.discover(grid)
    strategy.on_start()
    strategy.round = 1
    hist = strategy.query(grid, P.QUERY_HISTOGRAM)
    assert sorted(hist) == list(range(10))
    for cid, reply in hist.items():
        _, y = exp.scenario.window(cid, 1, 1)
        assert reply.metrics[P.HISTOGRAM] == np.bincount(y, minlength=4).tolist()
    second = strategy.new_model(strategy.initial_weights(salt=5))
    losses = strategy.query(grid, P.QUERY_LOSSES, models=[0, second])
    assert all(r.metrics[P.MODEL_IDS] == [0, second] and len(r.metrics[P.LOSSES]) == 2
               for r in losses.values())
    assert P.CONCEPT not in losses[0].metrics      # ground truth is hidden from strategies


class TwoModelsEach(ClusteredStrategy):
    """Every client trains both models in one message (as FedDrift and FedRC clients do)."""

    name = "two-models"

    def on_start(self):
        a, b = self.new_model(), self.new_model(self.initial_weights(salt=1))
        for cid in self.clients:
            self.assign(cid, a if cid % 2 else b)

    def plan_train(self, step):
        return {cid: Task(models=[0, 1]) for cid in self.clients}


def test_clients_train_several_models_in_one_round(fast_config):
    _, grid, strategy, out = setup(fast_config, TwoModelsEach)
    strategy.run(grid, out)
    one_model = codec.nbytes(codec.build_content({0: ArrayRecord(strategy.models[0])}))  # bytes
    for r in load_run(out)[1]:
        assert r["trained_clients"] == 10
        assert r["bytes_up"] == 20 * one_model     # both models back from every client
    assert not np.allclose(strategy.models[0][0], strategy.models[1][0])


class SoftHalfHalf(ClusteredStrategy):
    """Soft assignments: every client is half in each of two models (FedRC-style)."""

    name = "soft"

    def on_start(self):
        a, b = self.new_model(), self.new_model(self.initial_weights(salt=1))
        for rec in self.clients.values():
            rec.soft = {a: 0.7, b: 0.3} if rec.cid < 5 else {a: 0.2, b: 0.8}

    def plan_train(self, step):
        return {cid: Task(models=[0, 1]) for cid in self.clients}


def test_soft_assignments_evaluate_the_mixture(fast_config):
    _, grid, strategy, out = setup(fast_config, SoftHalfHalf)
    strategy.run(grid, out)
    last = load_run(out)[1][-1]
    assert last["evaluated_clients"] == 10 and 0.0 <= last["accuracy"] <= 1.0
    assert [strategy.cluster_label(c) for c in range(10)] == [0] * 5 + [1] * 5
    assert last["ari"] == 1.0                    # the argmax clusters are clients 0-4 vs 5-9


def test_personal_model_lives_in_context_state(fast_config):
    rc = merge_overrides(default_run_config(), fast_config(strategy="local"))
    grid = InProcessGrid(rc, 10)
    summary = run_server(grid, rc)
    for ctx in grid.contexts.values():
        assert PERSONAL_KEY in ctx.state.array_records
        assert ctx.state.metric_records[COUNTERS_KEY]["trained"] == 12
    _, rounds = load_run(Path(summary["out_dir"]))
    # the model kept improving on the client: step-2 accuracy beats the first round's
    assert rounds[3]["accuracy"] > rounds[0]["accuracy"]


def test_registry_create_merge_delete(fast_config):
    _, grid, strategy, _ = setup(fast_config, ClusteredStrategy)
    strategy.discover(grid)
    a = strategy.new_model()
    b = strategy.new_model([w + 1.0 for w in strategy.initial_weights()])
    for cid in strategy.clients:
        strategy.assign(cid, a if cid < 3 else b)
    merged = strategy.merge_models([a, b], [3.0, 7.0])
    assert merged == 2 and sorted(strategy.models) == [2]           # ids are never reused
    assert strategy.members(merged) == list(range(10))
    expected = [0.3 * x + 0.7 * (x + 1.0) for x in strategy.initial_weights()]
    assert all(np.allclose(m, e) for m, e in zip(strategy.models[merged], expected))
    strategy.delete_model(merged)
    assert strategy.clusters_in_use() == [] and strategy.eval_task(0) is None


def test_clients_train_on_the_history_steps_and_test_on_the_step_they_are_told(fast_config):
    from flwr.app import RecordDict

    from fedcluster_app.core.models import initial_weights
    from fedcluster_app.core.client.stream_client import StreamClient

    rc = merge_overrides(default_run_config(), fast_config(window=1))
    exp = load_experiment(rc)
    client = StreamClient(2, exp, RecordDict())
    w = initial_weights(exp.spec, 0)
    base = {P.ROUND: 5, P.STEP: 3}
    assert client.fit(w, base)[1] == 100                                    # the window: step 3
    assert client.fit(w, {**base, P.DATA_STEPS: [1, 2, 3]})[1] == 300
    assert client.fit(w, {**base, "model-id": 7, f"{P.DATA_STEPS}.7": [2]})[1] == 100
    x, _ = client.fit_data({**base, f"{P.DATA_STEPS}.7": [2]}, 7)
    assert np.array_equal(x, exp.scenario.step_data(2, 2).x_train)
    assert client.evaluate(w, {**base, P.TEST_STEP: 4})[1] == 50            # step 4's test split
    x, _ = client.eval_data({**base, P.TEST_STEP: 4, P.TEST_SPLIT: "train"})
    assert np.array_equal(x, exp.scenario.step_data(2, 4).x_train)          # FedDrift's protocol
