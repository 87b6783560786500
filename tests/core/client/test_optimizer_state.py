"""``optimizer-state = "step"``: each client keeps its optimizer's state per model through a time
step (the FedDrift authors' clients build their optimizers once per time step), and SEA as the
authors' data files are (``sea2-authors`` / ``sea4-authors``)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from flwr.app import RecordDict

from fedcluster_app.core.client import kernels
from fedcluster_app.core import codec
from fedcluster_app.core import wire as P
from fedcluster_app.core.config import (
    ConfigError,
    TrainConfig,
    default_run_config,
    merge_overrides,
)
from fedcluster_app.core.data import build_scenario
from fedcluster_app.core.experiment import load_experiment
from fedcluster_app.core.client.handlers import call
from fedcluster_app.core.models import initial_weights
from fedcluster_app.core.client.stream_client import OPTIMIZER_PREFIX, StreamClient
from fedcluster_app.core.training import batch_indices, local_train
from fedcluster_app.engine import run_inprocess
from fedcluster_app.families.feddrift.client import train as feddrift_train

ADAM = TrainConfig(optimizer="adam", lr=0.01, weight_decay=0.001, local_steps=10, batch_size=20)
SGD_MOMENTUM = TrainConfig(optimizer="sgd", lr=0.05, momentum=0.9, local_steps=10, batch_size=20)


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 2)).astype(np.float32)
    y = (x[:, 0] > x[:, 1]).astype(np.int64)
    batches = batch_indices(200, TrainConfig(local_steps=20, batch_size=20), rng)
    return x, y, batches


def _mlp(weights):
    model = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    with torch.no_grad():
        for p, w in zip(model.parameters(), weights):
            p.copy_(torch.from_numpy(np.asarray(w)))
    return model


def _weights(model) -> list[np.ndarray]:
    return [p.detach().numpy().copy() for p in model.parameters()]


torch.manual_seed(1)
W0 = _weights(torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)))


def _one_long_round(cfg):
    """The data, the 20 minibatches, and W0 trained on all of them by one torch optimizer."""
    x, y, b = _data()
    full = _mlp(W0)
    local_train(full, x, y, cfg, None, batches=b)
    return x, y, b, full


@pytest.mark.parametrize("cfg", [ADAM, SGD_MOMENTUM], ids=["adam", "sgd-momentum"])
def test_two_rounds_with_a_kept_state_are_one_long_round(cfg):
    x, y, b, full = _one_long_round(cfg)
    state: dict = {}
    first = _mlp(W0)
    local_train(first, x, y, cfg, None, batches=b[:10], optimizer_state=state)
    assert state and all(k.split(".")[0].isdigit() for k in state)
    second = _mlp(_weights(first))      # the server's weights arrive in a new model
    local_train(second, x, y, cfg, None, batches=b[10:], optimizer_state=state)
    assert all(np.array_equal(a, c) for a, c in zip(_weights(second), _weights(full)))
    fresh = _mlp(_weights(first))
    local_train(fresh, x, y, cfg, None, batches=b[10:])
    assert max(float(np.abs(a - c).max()) for a, c in zip(_weights(fresh), _weights(full))) > 1e-3


@pytest.mark.parametrize("cfg", [ADAM, SGD_MOMENTUM], ids=["adam", "sgd-momentum"])
def test_the_numpy_kernel_continues_the_same_state_as_torch(cfg):
    x, y, b, full = _one_long_round(cfg)
    state: dict = {}
    w1, _ = kernels.numpy_train_many([(W0, x, y, b[:10], state)], cfg)[0]
    if cfg.optimizer == "adam":
        assert int(state["0.step"]) == 10
    handed = dict(state)               # the kernel's state, continued by torch
    w2, _ = kernels.numpy_train_many([(w1, x, y, b[10:], state)], cfg)[0]
    assert max(float(np.abs(a - c).max()) for a, c in zip(w2, _weights(full))) < 1e-5
    model = _mlp(w1)
    local_train(model, x, y, cfg, None, batches=b[10:], optimizer_state=handed)
    assert max(float(np.abs(a - c).max()) for a, c in zip(_weights(model), _weights(full))) < 1e-5


def test_stacked_rows_continue_their_own_states():
    """One stacked call: a row that continues a state and a fresh row each get what they get
    alone (each row its own bias correction)."""
    x, y, b = _data()
    state: dict = {}
    w1, _ = kernels.numpy_train_many([(W0, x, y, b[:10], state)], ADAM)[0]
    alone_kept = kernels.numpy_train_many([(w1, x, y, b[10:], dict(state))], ADAM)[0][0]
    alone_fresh = kernels.numpy_train_many([(w1, x, y, b[10:])], ADAM)[0][0]
    together = kernels.numpy_train_many([(w1, x, y, b[10:], dict(state)), (w1, x, y, b[10:])], ADAM)
    assert all(np.array_equal(a, c) for a, c in zip(together[0][0], alone_kept))
    assert all(np.array_equal(a, c) for a, c in zip(together[1][0], alone_fresh))


def _client(**overrides):
    rc = merge_overrides(default_run_config(), {
        "strategy": "window", "scenario": "sea2", "num-steps": 4, "local-steps": 5,
        "samples-per-step": 100, "test-samples": 50, "progress": False, "plot": False,
        **overrides})
    exp = load_experiment(rc)
    return StreamClient(1, exp, RecordDict()), exp


def _steps_taken(client: StreamClient, mid: int) -> int:
    record = client.state.array_records[f"{OPTIMIZER_PREFIX}{mid}"]
    return int(codec.to_numpy(record["0.step"]))


def test_a_client_keeps_its_optimizers_through_a_time_step_and_starts_fresh_at_the_next():
    client, exp = _client(**{"optimizer-state": "step"})
    models = {0: initial_weights(exp.spec, 0), 3: initial_weights(exp.spec, 1)}
    for rnd in (1, 2):
        call(feddrift_train, client, {P.ROUND: rnd, P.STEP: 2}, models)
    assert _steps_taken(client, 0) == _steps_taken(client, 3) == 10     # 2 rounds x 5 steps
    call(feddrift_train, client, {P.ROUND: 3, P.STEP: 3, "train-ids": [3]}, models)
    assert _steps_taken(client, 3) == 5                                  # a new step: fresh
    assert f"{OPTIMIZER_PREFIX}0" not in client.state.array_records      # step 2's are dropped
    plain, _ = _client()
    call(feddrift_train, plain, {P.ROUND: 1, P.STEP: 2}, models)
    assert not [k for k in plain.state.array_records if k.startswith(OPTIMIZER_PREFIX)]


def test_a_kept_state_changes_the_run_and_batching_keeps_it(fast_config, tmp_path):
    def run(name, **kw):
        out = tmp_path / name
        run_inprocess(fast_config(**{
            "strategy": "feddrift", "scenario": "sea2", "num-steps": 4, "rounds-per-step": 3,
            "local-steps": 5, "samples-per-step": 100, "protocol": "none", "out-dir": str(out),
            **kw}))
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        return [r["accuracy"] for r in rows if r.get("accuracy") is not None]

    kept = run("kept", **{"optimizer-state": "step", "batch-clients": False})
    kept_batched = run("kept-b", **{"optimizer-state": "step", "batch-clients": True})
    fresh = run("fresh", **{"batch-clients": False})
    assert kept and np.allclose(kept, kept_batched, atol=1e-6)
    assert kept != fresh


def test_an_unknown_optimizer_state_is_refused():
    with pytest.raises(ConfigError, match="optimizer-state must be one of 'round', 'step'"):
        _client(**{"optimizer-state": "epoch"})


def _threshold(x: np.ndarray, y: np.ndarray) -> float:
    """The SEA threshold that best explains the (noisy) labels ``y = [x1 + x2 <= t]``."""
    s = x[:, 0].astype(np.float64) + x[:, 1]
    grid = np.arange(5.0, 12.0, 0.25)
    return float(grid[np.argmax([np.mean((s <= t) == y) for t in grid])])


def test_sea_as_the_authors_files_has_three_distinct_concepts():
    textbook = build_scenario("sea4", samples_per_step=4000)
    authors = build_scenario("sea4-authors", samples_per_step=4000)
    assert authors.concept_matrix().tolist() == textbook.concept_matrix().tolist()   # schedule F
    found: dict[str, dict[int, float]] = {"sea4": {}, "sea4-authors": {}}
    for sc in (textbook, authors):
        for k in range(sc.num_clients):
            for t in range(1, sc.num_steps + 1):
                c = sc.concept(k, t)
                if c not in found[sc.name]:
                    d = sc.step_data(k, t)
                    found[sc.name][c] = _threshold(d.x_train, d.y_train)
    assert found["sea4"] == {0: 9.0, 1: 8.0, 2: 7.0, 3: 9.5}
    assert found["sea4-authors"] == {0: 8.0, 1: 9.0, 2: 7.0, 3: 9.0}
    sea2 = build_scenario("sea2-authors", samples_per_step=4000)
    d0, d1 = sea2.step_data(0, 1), sea2.step_data(0, sea2.num_steps)
    assert (_threshold(d0.x_train, d0.y_train), _threshold(d1.x_train, d1.y_train)) == (8.0, 9.0)


def test_fedccfa_refuses_a_kept_state():
    from fedcluster_app.api import make_strategy

    with pytest.raises(ConfigError, match="fedccfa trains in phases with a fresh optimizer each"):
        make_strategy("fedccfa", scenario="digits-ccfa", optimizer_state="step")
