"""Local training as jobs: one client's path, and many clients' jobs as one batched program.

A handler that trains does not call the trainer itself: it ``yield``s its :class:`FitJob` list
and receives one :class:`FitResult` per job (see ``core/client/handlers.py``). Run per client, the
jobs go through exactly the code they always did (``training.local_train`` or the NumPy MLP
kernel). Run batched (``batch-clients = true``, the in-process engine), the jobs of every
client of a round are grouped by what must agree for them to share one program (model,
training config, minibatch sizes) and each group trains at once:

* NumPy-kernel jobs (the built-in one-hidden-layer MLP of the FedDrift family) stack into the
  kernel of ``core/client/kernels.py``: one NumPy call per step for all clients' models;
* PyTorch jobs stack their parameters over the jobs and run ``torch.func.functional_call``
  under ``vmap``: one forward and backward pass and one optimizer step per minibatch for all.
  The loss is the sum of the jobs' losses, so the gradient of each job's slice is that job's
  own gradient, and Adam and SGD (momentum, weight decay) act element by element, so one
  optimizer over the stacked tensors is the jobs' own optimizers side by side. On a CPU, where
  ``vmap``'s stacked kernels lose to one client at a time for larger models, the built-in CNN
  trained with SGD runs the same program with grouped convolutions instead of ``vmap``
  (``core/client/grouped_cnn.py``), in programs of a few clients.

Jobs that continue an optimizer state (``optimizer-state = "step"``) stack in the NumPy kernel,
which continues each row's own state; PyTorch jobs with a state train per client.

Every job keeps the minibatches its client drew from its own random stream, so batched and
per-client runs see the same data in the same order and agree up to floating-point rounding
(``tests/core/client/test_batched.py`` checks each family). Models with buffers (batch norm)
or frozen parameters train per client.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import threading
from collections.abc import Callable, Iterator, Sequence
from functools import lru_cache
from typing import NamedTuple

import numpy as np
import torch
from torch.nn import functional as F

from fedcluster_app.core.client import grouped_cnn, kernels
from fedcluster_app.core.config import TrainConfig
from fedcluster_app.core.models import (
    ModelSpec,
    build_model,
    cached_model,
    get_weights,
    scratch_model,
)
from fedcluster_app.core.sampling import batch_sizes, total_rows
from fedcluster_app.core.training import (
    OptimizerState,
    arrays_on,
    as_tensor,
    local_train,
    make_optimizer,
)


@dataclasses.dataclass
class FitJob:
    """One model to train on one client's data, with the minibatches it will see."""

    spec: ModelSpec
    weights: list[np.ndarray]
    x: np.ndarray
    y: np.ndarray
    batches: list[np.ndarray]
    cfg: TrainConfig
    device: str = "cpu"
    numpy_kernel: bool = False          # the stacked NumPy MLP kernel instead of PyTorch
    sample_weights: np.ndarray | None = None
    prox_center: list[np.ndarray] | None = None
    # optimizer-state = "step": the optimizer state to continue from ({} = fresh), replaced by
    # the state after training (the client keeps it: core/client/handlers.py); None = not kept
    optimizer_state: OptimizerState | None = None


class FitResult(NamedTuple):
    weights: list[np.ndarray]
    loss: float                         # mean training loss over the minibatches


# --------------------------------------------------------------------------- per client
def run_jobs(jobs: Sequence[FitJob]) -> list[FitResult]:
    """One client's jobs, the way they ran before batching existed: PyTorch jobs one by one
    through ``local_train``, the NumPy-kernel jobs of the client stacked together."""
    out: list[FitResult | None] = [None] * len(jobs)
    numpy_idx = [i for i, job in enumerate(jobs) if job.numpy_kernel]
    for i, job in enumerate(jobs):
        if not job.numpy_kernel:
            out[i] = _torch_one(job)
    for key, members in _groups([jobs[i] for i in numpy_idx], kernel_only=True).items():
        results = kernels.numpy_train_many([_kernel_job(jobs[numpy_idx[m]]) for m in members],
                                           key[0])
        for m, (weights, loss) in zip(members, results):
            out[numpy_idx[m]] = FitResult(weights, loss)
    return out  # type: ignore[return-value]


def _torch_one(job: FitJob) -> FitResult:
    model = scratch_model(job.spec, job.weights, job.device)
    loss = local_train(model, job.x, job.y, job.cfg, None, sample_weights=job.sample_weights,
                       prox_center=job.prox_center, batches=job.batches,
                       optimizer_state=job.optimizer_state)
    return FitResult(get_weights(model), loss)


def _kernel_job(job: FitJob) -> kernels.TrainJob:
    if job.optimizer_state is None:
        return (job.weights, job.x, job.y, job.batches)
    return (job.weights, job.x, job.y, job.batches, job.optimizer_state)


# --------------------------------------------------------------------------- batched
def run_jobs_batched(jobs: Sequence[FitJob]) -> list[FitResult]:
    """Many clients' jobs, each group of compatible jobs as one program (module docstring)."""
    out: list[FitResult | None] = [None] * len(jobs)
    for key, members in _groups(jobs).items():
        group = [jobs[m] for m in members]
        steps = [len(j.batches) for j in group]
        results: list = [None] * len(group)
        if group[0].numpy_kernel:      # it gathers every minibatch up front, in float64
            nbytes = [8 * total_rows(j.batches) * np.asarray(j.x[:1]).size for j in group]
            for chunk in _chunks(steps, nbytes, KERNEL_CHUNK_BYTES):
                done = kernels.numpy_train_many([_kernel_job(group[k]) for k in chunk], key[0])
                for k, (weights, loss) in zip(chunk, done):
                    results[k] = FitResult(weights, loss)
        elif _stackable(group[0].spec, group[0].device) and group[0].optimizer_state is None:
            spec, cfg = group[0].spec, group[0].cfg
            each = stacked_job_bytes(spec, cfg)
            nbytes = [np.asarray(j.x).size * 4 + each for j in group]
            max_jobs = max_stacked_jobs(spec, cfg.batch_size)
            if grouped_pays(spec, group[0].device, cfg, steps):
                max_jobs = min(max_jobs, grouped_cnn.PROGRAM_CLIENTS)
            for chunk in _chunks(steps, nbytes, memory_budget(group[0].device), max_jobs):
                done = _stacked_or_split([group[k] for k in chunk])
                for k, result in zip(chunk, done):
                    results[k] = result
        else:
            results = [_torch_one(j) for j in group]
        for m, result in zip(members, results):
            out[m] = result
    return out  # type: ignore[return-value]


#: a stacked step costs about this many single-client steps: measured on FlexCFL's MLPs,
#: 1.8 ms per stacked step of ~100 clients against 0.5 ms per step of one (vmap's bookkeeping,
#: the gathers, the padding of shorter minibatches)
BATCHED_STEP_COST = 3.0


#: what one stacked program may hold on the CPU (PyTorch: every job's inputs in float32, its
#: parameters, gradients and optimizer state, and what its minibatch's forward pass keeps for
#: the backward pass; the NumPy kernel: every job's minibatches in float64)
BATCH_BYTES = 256 << 20

#: on a GPU a stacked program may hold this share of the memory free when its group starts;
#: the estimate of a job's bytes leaves out the framework's workspaces, and a program that
#: still does not fit splits itself in halves (``_stacked_or_split``)
GPU_MEMORY_SHARE = 0.5


#: the NumPy kernel's calls take jobs up to this many bytes of gathered minibatches: a KUE
#: round's 100 jobs (4 MB) took 12% longer in one call than in 4 calls of 25 (best of 30,
#: interleaved, on a 2-core EPYC with 512 KB of L2 per core); each job's arithmetic is its
#: own either way, so the split changes no number
KERNEL_CHUNK_BYTES = 1 << 20


def _chunks(steps: list[int], nbytes: list[int], limit: int, max_jobs: int | None = None
            ) -> list[list[int]]:
    """Jobs of similar length together (a stacked program runs as long as its longest job):
    longest first, a chunk takes jobs down to half its first job's steps, data up to ``limit``
    bytes (10,000 clients of images would not fit in memory at once), and ``max_jobs``."""
    order = sorted(range(len(steps)), key=lambda j: -steps[j])
    chunks: list[list[int]] = []
    size = 0
    for j in order:
        if chunks and 2 * steps[j] >= steps[chunks[-1][0]] and size + nbytes[j] <= limit \
                and (max_jobs is None or len(chunks[-1]) < max_jobs):
            chunks[-1].append(j)
            size += nbytes[j]
        else:
            chunks.append([j])
            size = nbytes[j]
    return chunks


def memory_budget(device: str) -> int:
    """Bytes a stacked program may hold on ``device``: on a GPU, a share of what is free,
    counting the memory PyTorch keeps cached for reuse (free to this process, not to others:
    a round's program leaves tens of GB cached for the next one)."""
    if not str(device).startswith("cuda"):
        return BATCH_BYTES
    dev = torch.device(device)
    free, _ = torch.cuda.mem_get_info(dev)
    cached = torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev)
    return max(BATCH_BYTES, int(GPU_MEMORY_SHARE * (free + cached)))


#: PyTorch's CUDA kernels index some tensors with 32-bit integers and refuse (RuntimeError:
#: ``canUse32BitIndexMath``) a tensor of more elements; a stacked program's activations are
#: jobs x the largest one of a job (10,000 clients of the 28x28 CNN failed so on an H200)
MAX_TENSOR_ELEMENTS = 2**31 - 1


def max_stacked_jobs(spec: ModelSpec, batch_size: int) -> int:
    """How many jobs one stacked program may hold before a tensor of it passes
    ``MAX_TENSOR_ELEMENTS``."""
    return max(1, MAX_TENSOR_ELEMENTS // _forward_probe(spec, batch_size)[1])


#: float32 copies of the parameters one job keeps in a stacked program besides the
#: parameters themselves: the gradients, and the optimizer's state (Adam with amsgrad: 3)
_OPTIMIZER_COPIES = {"adam": 3, "sgd": 1}


def stacked_job_bytes(spec: ModelSpec, cfg: TrainConfig) -> int:
    """What one job adds to a stacked program besides its inputs: its parameters, their
    gradients, the optimizer's state and a proximal anchor, and the activations one minibatch
    keeps for the backward pass."""
    copies = 2 + _OPTIMIZER_COPIES.get(cfg.optimizer, 3) + (1 if cfg.prox_mu > 0 else 0)
    return copies * _parameter_bytes(spec) + activation_bytes(spec, cfg.batch_size)


@lru_cache(maxsize=32)
def _parameter_bytes(spec: ModelSpec) -> int:
    return sum(p.numel() * p.element_size() for p in cached_model(spec, "cpu").parameters())


def activation_bytes(spec: ModelSpec, batch_size: int) -> int:
    """Bytes the forward pass of one minibatch keeps for its backward pass (and its output)."""
    return _forward_probe(spec, batch_size)[0]


#: ``active`` while this thread's size probe (``_forward_probe``) runs its forward pass
_PROBE = threading.local()


def in_size_probe() -> bool:
    """Whether this thread is inside the size probe: the forward pass on the CPU that measures
    a stacked program's tensors, a module call that is no client's training. A watcher of the
    clients' module calls (``benchmarks/bench_gpu.py`` counts them per device) leaves it out."""
    return getattr(_PROBE, "active", False)


@lru_cache(maxsize=32)
def _forward_probe(spec: ModelSpec, batch_size: int) -> tuple[int, int]:
    """(bytes of the tensors one minibatch's forward pass keeps for the backward pass, and
    of its output; elements of the largest of them or of the input), counted on the CPU: the
    same tensors of the same sizes as on any device."""
    model = cached_model(spec, "cpu").train()
    x = torch.zeros((batch_size, *spec.input_shape))
    saved, largest = 0, x.numel()

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal saved, largest
        saved += t.numel() * t.element_size()
        largest = max(largest, t.numel())
        return t

    _PROBE.active = True
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = model(x)
    finally:
        _PROBE.active = False
    return saved + out.numel() * out.element_size(), max(largest, out.numel())


def _stacked_or_split(jobs: list[FitJob]) -> list[FitResult]:
    """The jobs as one stacked program when it pays (``vmap``, or grouped convolutions where
    only they pay), else one by one; a program too large for the GPU splits in halves (each
    job's arithmetic is its own either way)."""
    spec, device, cfg = jobs[0].spec, jobs[0].device, jobs[0].cfg
    steps = [len(j.batches) for j in jobs]
    if grouped_pays(spec, device, cfg, steps):
        return _torch_stacked(jobs, grouped_cnn.job_losses)
    if not stacking_pays(spec, device, steps):
        return [_torch_one(job) for job in jobs]
    try:
        return _torch_stacked(jobs)
    except (torch.OutOfMemoryError, RuntimeError) as ex:
        if len(jobs) == 1 or not _too_large(ex):
            raise
    torch.cuda.empty_cache()
    half = len(jobs) // 2
    return _stacked_or_split(jobs[:half]) + _stacked_or_split(jobs[half:])


def _too_large(ex: Exception) -> bool:
    """A program too large for the device: out of its memory, or a tensor past what its
    kernels index."""
    return isinstance(ex, torch.OutOfMemoryError) or "canUse32BitIndexMath" in str(ex)


def chunk_pays(steps: list[int]) -> bool:
    """Whether one stacked program beats the jobs one by one, by their steps alone."""
    return len(steps) > 1 and sum(steps) > BATCHED_STEP_COST * max(steps)


#: on a CPU, stacking with ``vmap`` pays for models of at most this many multiply-adds per
#: sample: a small model's step is mostly per-call overhead, which one stacked program pays
#: once for all clients; a larger one is compute-bound, and vmap's stacked (batched-matmul,
#: convolution) kernels are slower than the per-client ones. Measured with
#: benchmarks/bench_batching.py (docs/operations/performance.md): stacked / one by one at
#: 10 and 50 clients was 0.1-0.6 up to ~92k (MLP 784-64, the CNN on 8x8), about 1.0 at
#: ~100k-370k (MLP 784-128, the CNN on 16x16), 1.1-1.5 above (MLP 784-200, the CNN on 28x28).
#: The built-in CNN above it stacks another way, as grouped convolutions (``grouped_pays``).
CPU_STACKED_MACS = 100_000


def stacking_pays(spec: ModelSpec, device: str, steps: list[int]) -> bool:
    """Whether one stacked PyTorch program (``vmap``) of jobs with these step counts beats
    them one by one: enough steps to share (``chunk_pays``) and, on a CPU, a model small
    enough (``CPU_STACKED_MACS``). A rule of the model and the device, never a timing, so a
    seeded run trains the same way on every machine. ``stacking_forced`` overrides it (to
    measure). Where it says no, ``grouped_pays`` may still stack the built-in CNN."""
    if getattr(_FORCE, "active", False):
        return len(steps) > 1
    if str(device).startswith("cpu") and macs_per_sample(spec) > CPU_STACKED_MACS:
        return False
    return chunk_pays(steps)


def grouped_pays(spec: ModelSpec, device: str, cfg: TrainConfig, steps: list[int]) -> bool:
    """Whether jobs with these step counts stack as grouped convolutions
    (``core/client/grouped_cnn.py``, in programs of ``grouped_cnn.PROGRAM_CLIENTS``): more
    than one job of the built-in CNN trained with SGD on a CPU where ``vmap`` stacking does
    not pay (above ``CPU_STACKED_MACS``), where grouped programs measured 0.56-0.77x one by
    one. Like ``stacking_pays`` a rule of the model, the device and the config, never a
    timing; ``stacking_forced`` (which measures ``vmap``) turns it off."""
    if getattr(_FORCE, "active", False) or len(steps) < 2:
        return False
    return grouped_cnn.applies(spec, device, cfg) and macs_per_sample(spec) > CPU_STACKED_MACS


@lru_cache(maxsize=64)
def macs_per_sample(spec: ModelSpec) -> int:
    """Multiply-adds of one sample's forward pass through the model's linear and convolution
    layers (the work that decides whether stacking pays)."""
    model = build_model(spec, 0)
    total = 0

    def count(module: torch.nn.Module, _inputs, output: torch.Tensor) -> None:
        nonlocal total
        if isinstance(module, torch.nn.Linear):
            total += module.in_features * module.out_features
        elif isinstance(module, (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)):
            total += output.numel() * (module.in_channels // module.groups) * math.prod(
                module.kernel_size)

    hooks = [m.register_forward_hook(count) for m in model.modules()]
    try:
        model.eval()
        with torch.no_grad():
            model(torch.zeros((1, *spec.input_shape)))
    finally:
        for hook in hooks:
            hook.remove()
    return total


_FORCE = threading.local()   # stacking_forced() in this thread


@contextlib.contextmanager
def stacking_forced() -> Iterator[None]:
    """Stack every group of PyTorch jobs that can be stacked, whether it pays or not (to
    measure what stacking costs)."""
    _FORCE.active = True
    try:
        yield
    finally:
        _FORCE.active = False


def _groups(jobs: Sequence[FitJob], kernel_only: bool = False) -> dict[tuple, list[int]]:
    """Jobs that can share one program: same training config, engine, model, device, minibatch
    sizes, and the same use of sample weights and a proximal centre."""
    groups: dict[tuple, list[int]] = {}
    for i, job in enumerate(jobs):
        key = (job.cfg,) if kernel_only else (
            job.cfg, job.numpy_kernel, job.spec, job.device,
            # the NumPy kernel stacks equal minibatch sizes; PyTorch pads and masks instead
            batch_sizes(job.batches) if job.numpy_kernel else None,
            job.sample_weights is None, job.prox_center is None,
            # a kept optimizer state: the kernel continues it per row; PyTorch, per client
            job.optimizer_state is None)
        groups.setdefault(key, []).append(i)
    return groups


def _stackable(spec: ModelSpec, device: str) -> bool:
    """vmap needs a model without buffers (batch norm's running statistics are updated in
    place) whose parameters all train."""
    model = cached_model(spec, device)
    return not any(True for _ in model.buffers()) and all(
        p.requires_grad for p in model.parameters())


#: each job's loss on its minibatch, (jobs,), from the stacked parameters, minibatches
#: (jobs, batch, ...) and labels, and the per-sample weights and minibatch sizes (or None: the
#: jobs' plain means); the default is ``vmap`` over ``functional_call``
JobLosses = Callable[[torch.nn.Module, dict, torch.Tensor, torch.Tensor,
                      torch.Tensor | None, torch.Tensor | None], torch.Tensor]


def _torch_stacked(jobs: list[FitJob], job_losses: JobLosses | None = None) -> list[FitResult]:
    if any(len(job.y) == 0 for job in jobs):
        raise ValueError("no training data")    # as local_train; the caller retries per client
    # longest first: at step s the jobs still training are a prefix, trained through views
    order = sorted(range(len(jobs)), key=lambda j: -len(jobs[j].batches))
    jobs = [jobs[j] for j in order]
    first = jobs[0]
    cfg, dev, J = first.cfg, first.device, len(jobs)
    model = cached_model(first.spec, dev)     # its structure; functional_call swaps the weights
    names = [name for name, _ in model.named_parameters()]
    params = {name: torch.stack([as_tensor(job.weights[i], device=dev) for job in jobs])
              .requires_grad_() for i, name in enumerate(names)}
    # every client's data in one tensor; minibatch s of job j is rows offset[j] + batches[j][s]
    X = as_tensor(np.concatenate([np.asarray(j.x, dtype=np.float32) for j in jobs]), device=dev)
    Y = as_tensor(np.concatenate([j.y for j in jobs]), np.int64, dev)
    offsets = np.cumsum([0] + [len(j.y) for j in jobs[:-1]])
    W = None if first.sample_weights is None else as_tensor(
        np.concatenate([j.sample_weights for j in jobs]), device=dev)
    anchors = None
    if cfg.prox_mu > 0:
        anchors = ({n: p.detach().clone() for n, p in params.items()} if first.prox_center is None
                   else {n: torch.stack([as_tensor(j.prox_center[i], device=dev) for j in jobs])
                         for i, n in enumerate(names)})
    opt = make_optimizer(list(params.values()), cfg)
    job_losses = job_losses or _vmap_losses
    model.train()
    total = torch.zeros(J, dtype=torch.float64, device=dev)
    steps = [len(j.batches) for j in jobs]
    final: list[list[np.ndarray] | None] = [None] * J
    for s, (rows_t, mask, count) in enumerate(_step_plan([j.batches for j in jobs], offsets, dev)):
        a = len(rows_t)                                    # jobs still training: 0..a-1
        live = {n: p[:a] for n, p in params.items()}
        opt.zero_grad(set_to_none=True)
        if mask is None and W is None:
            losses = job_losses(model, live, X[rows_t], Y[rows_t], None, None)
        else:
            wb = torch.ones(rows_t.shape, device=dev) if mask is None else mask
            wb = wb if W is None else wb * W[rows_t]
            losses = job_losses(model, live, X[rows_t], Y[rows_t], wb, count)
        total[:a] += losses.detach().double()
        loss = losses.sum()
        if anchors is not None:
            loss = loss + 0.5 * cfg.prox_mu * sum(((live[n] - anchors[n][:a]) ** 2).sum()
                                                  for n in names)
        loss.backward()
        opt.step()
        done = sum(1 for n in steps if n > s + 1)          # jobs done..a-1 end at this step
        if done < a:     # their weights, one copy per parameter for the whole block
            block = [params[n][done:a].detach().cpu().numpy() for n in names]
            for j in range(done, a):
                final[j] = [b[j - done].copy() for b in block]
    mean_loss = (total / torch.tensor(steps, dtype=torch.float64, device=dev)).cpu().numpy()
    # get_weights order is the state dict's: the parameters, as there are no buffers
    results = [FitResult(final[j], float(mean_loss[j])) for j in range(J)]  # type: ignore[arg-type]
    out: list[FitResult | None] = [None] * J
    for j, r in zip(order, results):
        out[j] = r
    return out  # type: ignore[return-value]


def _vmap_losses(model: torch.nn.Module, params: dict, xb: torch.Tensor, yb: torch.Tensor,
                 wb: torch.Tensor | None, nb: torch.Tensor | None) -> torch.Tensor:
    """``JobLosses`` by ``vmap`` over ``functional_call``: any stackable model."""
    def job_loss(p, x, y, w, n):
        logits = torch.func.functional_call(model, p, (x,))
        if w is None:
            return F.cross_entropy(logits, y)
        # sample weights, and zeros on the padding of a shorter minibatch: its own mean
        return (w * F.cross_entropy(logits, y, reduction="none")).sum() / n

    dims = (0, 0, 0, None, None) if wb is None else (0, 0, 0, 0, 0)
    return torch.vmap(job_loss, in_dims=dims)(params, xb, yb, wb, nb)


def _step_plan(batches: list[list[np.ndarray]], offsets: np.ndarray, dev: str
               ) -> list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]]:
    """Every step's rows of the stacked data (one row per job still training), padding mask
    (None when its minibatches are of one size) and minibatch sizes, made on the host and
    copied to the device in one transfer each (a copy per step would make the host wait for
    the GPU at every step)."""
    steps = [len(b) for b in batches]
    rows, masks, counts = [], [], []
    for s in range(max(steps)):
        a = sum(1 for n in steps if n > s)
        step_rows, mask = _minibatch_rows([b[s] for b in batches[:a]], offsets[:a])
        rows.append(step_rows)
        masks.append(mask)
        counts.append(np.array([len(b[s]) for b in batches[:a]], dtype=np.float32))
    ragged = iter(arrays_on([m for m in masks if m is not None], np.float32, dev))
    return list(zip(arrays_on(rows, np.int64, dev),
                    [None if m is None else next(ragged) for m in masks],
                    arrays_on(counts, np.float32, dev)))


def _minibatch_rows(batches: list[np.ndarray], offsets: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray | None]:
    """Rows of the stacked data for one step's minibatches (jobs x largest batch), and, when
    they differ in size, the 0/1 mask of the real rows (a shorter one is padded with its first)."""
    sizes = [len(b) for b in batches]
    if min(sizes) == max(sizes):
        return np.stack(batches).astype(np.int64) + offsets[:, None], None
    rows = np.empty((len(batches), max(sizes)), dtype=np.int64)
    mask = np.zeros(rows.shape, dtype=np.float32)
    for k, (b, off) in enumerate(zip(batches, offsets)):
        rows[k] = off + b[0]
        rows[k, :len(b)] = off + b
        mask[k, :len(b)] = 1.0
    return rows, mask
