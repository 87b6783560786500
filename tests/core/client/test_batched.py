"""Batched execution (``batch-clients``): a round's clients trained as one program give what
training them one after the other gives, up to floating-point rounding, in every family."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from torch import nn

from fedcluster_app.core.client import handlers
from fedcluster_app.core.client.batched import FitJob, run_jobs, run_jobs_batched
from fedcluster_app.core.config import TrainConfig
from fedcluster_app.core.training import batch_indices
from fedcluster_app.core.models import ModelSpec, initial_weights
from fedcluster_app.core.server.strategy import read_checkpoint
from fedcluster_app.engine import run_inprocess

SGD = {"optimizer": "sgd", "lr": 0.05}

# one strategy or more per family, each on its family's data, small; SGD, whose updates are
# linear in the gradient, so rounding differences stay at rounding size over a run
FAMILIES = {
    "foundation": (["fedavg", "ifca", "local"], {"scenario": "mixture-swap", **SGD}),
    "feddrift": (["feddrift", "kue", "window"], {
        "scenario": "sea4", "num-steps": 4, "local-steps": 10, "samples-per-step": 200,
        "feddrift.delta": 0.04}),
    "fedrc": (["fedrc", "fedsoft"], {"scenario": "shifts-3", "rounds-per-step": 3,
                                      "num-clusters": 3, **SGD}),
    "fielding": (["fielding"], {"scenario": "labels-small-large", **SGD}),
    # FlexCFL trains whole epochs over clients of very different sizes: ragged minibatches
    "flexcfl": (["flexcfl"], {"scenario": "synthetic-1-1-swap", "num-steps": 4,
                              "rounds-per-step": 1, "num-clusters": 3, "local-steps": 0,
                              "local-epochs": 1, "flexcfl.pretrain-scale": 2, **SGD}),
    # FedCCFA's own training (classifier and feature phases) runs per client either way
    "fedccfa": (["fedccfa"], {"scenario": "digits-ccfa", "num-steps": 3,
                              "local-steps": 1}),
}


def _run(fast_config, tmp_path: Path, name: str, strategy: str, cfg: dict, batch: bool):
    out = tmp_path / f"{name}-{strategy}-{batch}"
    summary = run_inprocess(fast_config(**{"strategy": strategy, "protocol": "none", **cfg,
                                           "batch-clients": batch, "out-dir": str(out)}))
    rounds = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return summary, rounds, read_checkpoint(out)[1]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_batched_runs_equal_the_per_client_runs(fast_config, tmp_path, family):
    strategies, cfg = FAMILIES[family]
    for strategy in strategies:
        s0, r0, m0 = _run(fast_config, tmp_path, family, strategy, cfg, False)
        s1, r1, m1 = _run(fast_config, tmp_path, family, strategy, cfg, True)
        assert s0["status"] == s1["status"] == "completed"
        assert sorted(m0) == sorted(m1)
        gap = max((float(np.abs(a - b).max()) for mid in m0 for a, b in zip(m0[mid], m1[mid])),
                  default=0.0)       # local keeps its models on the clients: accuracy below
        # the NumPy kernel stacks the same arithmetic: bit for bit; PyTorch's batched matrix
        # products round differently in the last bits
        assert gap <= (0.0 if family == "feddrift" else 1e-4), (strategy, gap)
        for a, b in zip(r0, r1):
            assert a.get("num_clusters") == b.get("num_clusters"), strategy
            if a.get("accuracy") is not None:
                assert abs(a["accuracy"] - b["accuracy"]) <= 1e-6, (strategy, a["round"])


# ------------------------------------------------------------------------ the jobs themselves
SPEC = ModelSpec(kind="mlp", input_shape=(5,), num_classes=3, hidden=8)


def _jobs(cfg: TrainConfig, sizes: list[int], spec: ModelSpec = SPEC, **kw) -> list[FitJob]:
    jobs = []
    for k, n in enumerate(sizes):
        rng = np.random.default_rng([7, k])
        x = rng.normal(size=(n, *spec.input_shape)).astype(np.float32)
        y = rng.integers(0, spec.num_classes, n)
        extra = {"sample_weights": rng.random(n)} if kw.get("weighted") else {}
        jobs.append(FitJob(spec, initial_weights(spec, k), x, y, batch_indices(n, cfg, rng), cfg,
                           **extra))
    return jobs


def _gap(a, b) -> float:
    return max(float(np.abs(p - q).max()) for ra, rb in zip(a, b) for p, q in zip(ra[0], rb[0]))


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("prox", [0.0, 0.1])
def test_ragged_epochs_train_as_alone(weighted, prox):
    # whole epochs over 23..161 samples: different step counts and a short last minibatch
    cfg = TrainConfig(optimizer="sgd", lr=0.1, momentum=0.9, weight_decay=1e-3, local_steps=0,
                      local_epochs=2, batch_size=16, prox_mu=prox)
    jobs = _jobs(cfg, [23, 40, 41, 64, 100, 161, 150, 30], weighted=weighted)
    alone, batched = run_jobs(jobs), run_jobs_batched(jobs)
    assert _gap(alone, batched) < 1e-5
    assert np.allclose([r.loss for r in alone], [r.loss for r in batched], rtol=1e-5)


def test_adam_agrees_within_its_rounding():
    """Adam divides by sqrt(v) + 1e-8: a gradient near 1e-8 turns rounding into ~1e-4 steps."""
    cfg = TrainConfig(optimizer="adam", lr=0.01, local_steps=20, batch_size=16)
    jobs = _jobs(cfg, [60, 80, 100, 120])
    assert _gap(run_jobs(jobs), run_jobs_batched(jobs)) < 2e-3


def test_a_job_does_not_depend_on_its_batch_mates():
    cfg = TrainConfig(optimizer="sgd", lr=0.1, local_steps=10, batch_size=16)
    jobs = _jobs(cfg, [50, 60, 70, 80, 90])
    together = run_jobs_batched(jobs)
    apart = run_jobs_batched(jobs[:2]) + run_jobs_batched(jobs[2:])
    assert _gap(together, apart) < 1e-6


class _Normed(nn.Module):
    def __init__(self, input_shape, num_classes):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(input_shape[0], 8), nn.BatchNorm1d(8), nn.ReLU(),
                                 nn.Linear(8, num_classes))

    def forward(self, x):
        return self.net(x)


def build_normed(input_shape, num_classes):
    return _Normed(input_shape, num_classes)


def test_a_model_with_buffers_trains_per_client_and_identically():
    spec = ModelSpec(kind=f"{__name__}:build_normed", input_shape=(5,), num_classes=3)
    cfg = TrainConfig(optimizer="adam", lr=0.01, local_steps=5, batch_size=16)
    jobs = _jobs(cfg, [40, 50, 60], spec=spec)
    assert _gap(run_jobs(jobs), run_jobs_batched(jobs)) == 0.0


def test_one_failing_client_fails_alone():
    cfg = TrainConfig(optimizer="sgd", lr=0.1, local_steps=3, batch_size=8)
    good = _jobs(cfg, [20, 30])

    def trains(job):
        def handler(client, config, models):
            (weights, loss), = yield [job]
            return {"loss": loss}, {0: weights}, {}
        return handler

    def raises_before(client, config, models):
        raise RuntimeError("no data here")

    def raises_after(client, config, models):
        yield good[:1]
        raise RuntimeError("bad reply")

    def plain(client, config, models):
        return {"n": 1}, {}, {}

    calls = [(trains(good[0]), None, {}, {}), (raises_before, None, {}, {}),
             (raises_after, None, {}, {}), (plain, None, {}, {}), (trains(good[1]), None, {}, {})]
    out = handlers.call_many(calls)
    assert isinstance(out[1], RuntimeError) and isinstance(out[2], RuntimeError)
    assert out[3] == ({"n": 1}, {}, {})
    for i, job in ((0, good[0]), (4, good[1])):
        (alone,) = run_jobs([job])
        assert np.allclose(out[i][1][0][0], alone.weights[0], atol=1e-6)


def test_empty_data_fails_that_client_only():
    cfg = TrainConfig(optimizer="sgd", lr=0.1, local_steps=3, batch_size=8)
    jobs = _jobs(cfg, [20, 30])
    empty = FitJob(SPEC, jobs[0].weights, jobs[0].x[:0], jobs[0].y[:0], [np.arange(0)] * 3, cfg)

    def trains(job):
        def handler(client, config, models):
            (weights, _), = yield [job]
            return {}, {0: weights}, {}
        return handler

    out = handlers.call_many([(trains(j), None, {}, {}) for j in (jobs[0], empty, jobs[1])])
    assert isinstance(out[1], ValueError) and "no training data" in str(out[1])
    assert not isinstance(out[0], Exception) and not isinstance(out[2], Exception)


def test_batching_is_switched_off_by_the_run_config(fast_config, tmp_path, monkeypatch):
    from fedcluster_app import engine

    real, calls = engine.handle_many, []
    monkeypatch.setattr(engine, "handle_many", lambda pairs: calls.append(len(pairs)) or real(pairs))
    for batch in (True, False):
        calls.clear()
        summary = run_inprocess(fast_config(strategy="fedavg", **{
            "batch-clients": batch, "out-dir": str(tmp_path / str(batch))}))
        assert summary["status"] == "completed"
        assert bool(calls) == batch
        if batch:
            assert max(calls) == 10      # a round's ten clients answered together


def test_a_memory_budget_splits_the_batch_without_changing_results(monkeypatch):
    from fedcluster_app.core.client import batched

    cfg = TrainConfig(optimizer="sgd", lr=0.1, local_steps=10, batch_size=16)
    jobs = _jobs(cfg, [50, 60, 70, 80, 90])
    calls = []
    real = batched._torch_stacked
    monkeypatch.setattr(batched, "_torch_stacked", lambda js: calls.append(len(js)) or real(js))
    whole = run_jobs_batched(jobs)
    each = batched.stacked_job_bytes(SPEC, cfg)       # parameters, state and activations
    monkeypatch.setattr(batched, "BATCH_BYTES", (50 + 60 + 70 + 80) * 5 * 4 + 4 * each)  # 4 jobs
    split = run_jobs_batched(jobs)
    assert calls == [5, 4]          # the fifth job trains alone
    assert _gap(whole, split) < 1e-6


def test_the_numpy_kernel_splits_by_memory_bit_for_bit(monkeypatch):
    from fedcluster_app.core.client import batched

    cfg = TrainConfig(optimizer="adam", lr=0.01, weight_decay=1e-3, local_steps=10, batch_size=16)
    jobs = [dataclasses.replace(j, numpy_kernel=True) for j in _jobs(cfg, [50, 60, 70, 80, 90])]
    calls = []
    real = batched.kernels.numpy_train_many
    monkeypatch.setattr(batched.kernels, "numpy_train_many",
                        lambda js, c: calls.append(len(js)) or real(js, c))
    whole = run_jobs_batched(jobs)
    monkeypatch.setattr(batched, "KERNEL_CHUNK_BYTES", 2 * 8 * 10 * 16 * 5)   # two jobs' batches
    split = run_jobs_batched(jobs)
    assert calls == [5, 2, 2, 1]
    assert _gap(whole, split) == 0.0
    assert _gap(whole, run_jobs(jobs)) == 0.0


def test_a_job_counts_its_model_state_and_activations_in_the_memory_budget():
    from fedcluster_app.core.client import batched

    adam = TrainConfig(optimizer="adam", batch_size=16)
    sgd = TrainConfig(optimizer="sgd", batch_size=16)
    params = batched._parameter_bytes(SPEC)
    assert params == 4 * (5 * 8 + 8 + 8 * 3 + 3)
    # the parameters, their gradients and Adam's three states (amsgrad) against SGD's one
    assert batched.stacked_job_bytes(SPEC, adam) - batched.stacked_job_bytes(SPEC, sgd) == 2 * params
    prox = TrainConfig(optimizer="sgd", batch_size=16, prox_mu=0.1)
    assert batched.stacked_job_bytes(SPEC, prox) - batched.stacked_job_bytes(SPEC, sgd) == params
    # what a minibatch keeps for the backward pass grows with its rows; a CNN keeps its
    # feature maps, many times its inputs
    a = [batched.activation_bytes(SPEC, rows) for rows in (16, 32, 48)]
    assert a[0] < a[1] < a[2] and a[2] - a[1] == a[1] - a[0] >= 16 * (8 + 3) * 4
    cnn = ModelSpec(kind="cnn", input_shape=(1, 28, 28), num_classes=10)
    assert batched.activation_bytes(cnn, 32) > 10 * 32 * 28 * 28 * 4


def test_the_size_probe_tells_a_watcher_its_module_calls_are_no_clients():
    """batched.in_size_probe(): true in the probe's forward pass (a CPU pass that measures a
    stacked program, which a count of the clients' module calls per device leaves out),
    false in a client's and after it."""
    import torch

    from fedcluster_app.core.client import batched

    seen = []
    hook = torch.nn.modules.module.register_module_forward_pre_hook(
        lambda module, inputs: seen.append(batched.in_size_probe()))
    try:
        batched.activation_bytes(dataclasses.replace(SPEC, hidden=11), 7)   # not cached yet
        probe, seen[:] = list(seen), []
        batched.cached_model(SPEC, "cpu")(torch.zeros(2, 5))    # as a client trains
    finally:
        hook.remove()
    assert probe and all(probe) and seen and not any(seen)
    assert batched.in_size_probe() is False


def test_a_stacked_program_out_of_gpu_memory_splits_in_halves(monkeypatch):
    import torch

    from fedcluster_app.core.client import batched

    cfg = TrainConfig(optimizer="sgd", lr=0.1, local_steps=10, batch_size=16)
    jobs = _jobs(cfg, [50, 60, 70, 80, 90, 55, 65, 75])
    whole = run_jobs_batched(jobs)
    calls, real = [], batched._torch_stacked

    def small_gpu(js):      # a device on which at most four jobs fit at once
        calls.append(len(js))
        if len(js) > 4:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(js)

    monkeypatch.setattr(batched, "_torch_stacked", small_gpu)
    monkeypatch.setattr(batched.torch.cuda, "empty_cache", lambda: None)
    split = run_jobs_batched(jobs)
    assert calls == [8, 4, 4]
    assert _gap(whole, split) < 1e-6

    def no_room(js):
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(batched, "_torch_stacked", no_room)
    monkeypatch.setattr(batched, "chunk_pays", lambda steps: True)
    with pytest.raises(torch.OutOfMemoryError):   # not even one job fits: the error stands
        run_jobs_batched(jobs[:1] * 2)


def test_a_stacked_program_keeps_its_tensors_within_32_bit_indexing(monkeypatch):
    """10,000 clients of the 28x28 CNN in one program made a tensor of more than 2**31
    elements on an H200, which PyTorch's CUDA kernels refuse (canUse32BitIndexMath)."""
    from fedcluster_app.core.client import batched

    cnn = ModelSpec(kind="cnn", input_shape=(1, 28, 28), num_classes=10)
    # its largest activation per job: 32 rows x 16 channels x 28 x 28, the first convolution's
    assert batched.max_stacked_jobs(cnn, 32) == (2**31 - 1) // (32 * 16 * 28 * 28)
    cfg = TrainConfig(optimizer="sgd", lr=0.1, local_steps=10, batch_size=16)
    jobs = _jobs(cfg, [50, 60, 70, 80, 90, 55, 65])
    whole = run_jobs_batched(jobs)
    calls, real = [], batched._torch_stacked
    monkeypatch.setattr(batched, "_torch_stacked", lambda js: calls.append(len(js)) or real(js))
    largest = batched._forward_probe(SPEC, 16)[1]
    monkeypatch.setattr(batched, "MAX_TENSOR_ELEMENTS", 4 * largest)
    assert _gap(whole, run_jobs_batched(jobs)) < 1e-6
    assert calls == [4]          # four jobs in one program; three, too few to pay, one by one

    def indexing_refused(js):    # what CUDA says when a tensor passes 2**31 elements
        if len(js) > 4:
            raise RuntimeError("Expected canUse32BitIndexMath(input) && canUse32BitIndexMath("
                               "output) to be true, but got false.")
        return real(js)

    calls.clear()
    monkeypatch.setattr(batched, "MAX_TENSOR_ELEMENTS", 2**31 - 1)
    monkeypatch.setattr(batched, "_torch_stacked", indexing_refused)
    monkeypatch.setattr(batched.torch.cuda, "empty_cache", lambda: None)
    assert _gap(whole, run_jobs_batched(jobs)) < 1e-6
    monkeypatch.setattr(batched, "_torch_stacked", lambda js: (_ for _ in ()).throw(
        RuntimeError("a bug")))
    with pytest.raises(RuntimeError, match="a bug"):   # any other error is not split away
        run_jobs_batched(jobs)


def test_the_gpu_budget_counts_the_memory_pytorch_keeps_cached(monkeypatch):
    """A round's program leaves tens of GB in PyTorch's cache; free to the next one."""
    import torch

    from fedcluster_app.core.client import batched

    gib = 2**30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev: (40 * gib, 140 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda dev: 90 * gib)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda dev: 10 * gib)
    assert batched.memory_budget("cuda:0") == int(batched.GPU_MEMORY_SHARE * 120 * gib)
    assert batched.memory_budget("cpu") == batched.BATCH_BYTES


def test_stacking_is_chosen_by_the_models_size_on_a_cpu_and_kept_on_a_gpu():
    """A rule of the model and the device (never a timing, so a seeded run trains the same
    way everywhere): on a CPU, models above CPU_STACKED_MACS multiply-adds per sample train
    one by one, where stacking measured slower (benchmarks/bench_batching.py)."""
    from fedcluster_app.core.client.batched import (
        CPU_STACKED_MACS,
        macs_per_sample,
        stacking_forced,
        stacking_pays,
    )

    small_mlp = ModelSpec("mlp", (8,), 4, hidden=32)
    digits_cnn = ModelSpec("cnn", (1, 8, 8), 10)
    mnist_cnn = ModelSpec("cnn", (1, 28, 28), 10)
    wide_mlp = ModelSpec("mlp", (784,), 10, hidden=200)
    assert macs_per_sample(small_mlp) == 8 * 32 + 32 * 4
    assert macs_per_sample(wide_mlp) == 784 * 200 + 200 * 10
    steps = [5] * 10
    for spec in (small_mlp, digits_cnn):
        assert macs_per_sample(spec) <= CPU_STACKED_MACS and stacking_pays(spec, "cpu", steps)
    for spec in (mnist_cnn, wide_mlp):
        assert macs_per_sample(spec) > CPU_STACKED_MACS
        assert not stacking_pays(spec, "cpu", steps) and stacking_pays(spec, "cuda:0", steps)
        with stacking_forced():
            assert stacking_pays(spec, "cpu", steps)
    assert not stacking_pays(small_mlp, "cpu", [5])   # one job: nothing to share


def test_the_built_in_cnn_stacks_as_grouped_convolutions_where_vmap_does_not_pay():
    """On a CPU the built-in CNN above CPU_STACKED_MACS trained with SGD stacks as grouped
    convolutions (core/client/grouped_cnn.py); Adam, a GPU, another model or one job do not."""
    from fedcluster_app.core.client.batched import grouped_pays, stacking_forced

    sgd, adam = TrainConfig(optimizer="sgd"), TrainConfig(optimizer="adam")
    mnist_cnn = ModelSpec("cnn", (1, 28, 28), 10)
    steps = [5] * 10
    assert grouped_pays(mnist_cnn, "cpu", sgd, steps)
    assert not grouped_pays(mnist_cnn, "cpu", adam, steps)
    assert not grouped_pays(mnist_cnn, "cuda:0", sgd, steps)      # vmap stacks there
    assert not grouped_pays(mnist_cnn, "cpu", sgd, [5])
    assert not grouped_pays(ModelSpec("cnn", (1, 8, 8), 10), "cpu", sgd, steps)   # vmap pays
    assert not grouped_pays(ModelSpec("mlp", (784,), 10, hidden=200), "cpu", sgd, steps)
    with stacking_forced():                                        # it measures vmap
        assert not grouped_pays(mnist_cnn, "cpu", sgd, steps)


@pytest.mark.parametrize("cfg", [
    TrainConfig(optimizer="sgd", lr=0.05, local_steps=4, batch_size=16),
    TrainConfig(optimizer="sgd", lr=0.05, momentum=0.9, weight_decay=1e-3, local_steps=4,
                batch_size=16),
    # whole epochs over clients of different sizes: different step counts, short minibatches
    TrainConfig(optimizer="sgd", lr=0.05, momentum=0.9, local_steps=0, local_epochs=2,
                batch_size=16, prox_mu=0.1),
], ids=["sgd", "momentum", "ragged-prox"])
def test_grouped_cnn_programs_train_as_alone(monkeypatch, cfg):
    from fedcluster_app.core.client import batched, grouped_cnn

    calls = []
    real = grouped_cnn.job_losses
    monkeypatch.setattr(grouped_cnn, "job_losses",
                        lambda model, p, xb, *a: calls.append(len(xb)) or real(model, p, xb, *a))
    spec = ModelSpec("cnn", (1, 16, 16), 10)
    for weighted in (False, True):
        calls.clear()
        jobs = _jobs(cfg, [40, 50, 60, 35, 45, 70, 30], spec=spec, weighted=weighted)
        alone, together = run_jobs(jobs), run_jobs_batched(jobs)
        assert calls and max(calls) == grouped_cnn.PROGRAM_CLIENTS   # programs of 5 and 2
        assert _gap(alone, together) < 1e-5
        assert np.allclose([r.loss for r in alone], [r.loss for r in together], rtol=1e-5)


def test_the_built_in_cnn_with_adam_trains_one_by_one_on_a_cpu():
    cfg = TrainConfig(optimizer="adam", lr=0.01, local_steps=3, batch_size=16)
    jobs = _jobs(cfg, [40, 50, 60], spec=ModelSpec("cnn", (1, 16, 16), 10))
    assert _gap(run_jobs(jobs), run_jobs_batched(jobs)) == 0.0


def test_a_model_trained_one_by_one_by_the_rule_gives_the_per_client_results():
    cfg = TrainConfig(optimizer="sgd", lr=0.05, local_steps=3, batch_size=16)
    spec = ModelSpec("mlp", (784,), 10, hidden=200)
    jobs = _jobs(cfg, [40, 50, 60], spec=spec)
    alone, batched = run_jobs(jobs), run_jobs_batched(jobs)
    assert _gap(alone, batched) == 0.0   # the same code path: identical, not just close
