"""``core.training.local_train`` for one-hidden-layer MLPs, without PyTorch.

The FedDrift paper's synthetic data use tiny MLPs (2-4-2, 3-6-2): on models this small
PyTorch's per-step overhead is about 20x the arithmetic, so the family's clients train them
here instead: the same computation (cross-entropy, Adam with amsgrad and L2 weight decay
exactly as ``torch.optim.Adam``, or SGD with momentum), on the same minibatches, in float64.
The training loop itself is compiled (``core/compiled_mlp.train_mlp``): it was a sequence of ~30
NumPy calls per step on arrays of a few dozen numbers, whose Python overhead was the cost
(docs/operations/performance.md). It states the earlier NumPy
formulation's arithmetic operation by operation and gives its numbers bit for bit for two
classes (all of FedDrift's data), checked on the golden runs; with an odd number of classes the
last class's weight gradient is summed in another order than OpenBLAS's remainder kernel
(differences of one rounding). Tests check it against PyTorch.
"""

from __future__ import annotations

import functools
import math
from itertools import accumulate

import numpy as np

from fedcluster_app.core.sampling import Minibatches, batch_sizes
from fedcluster_app.core.training import batch_indices


def is_mlp(weights: list[np.ndarray]) -> bool:
    return (len(weights) == 4 and weights[0].ndim == 2 and weights[2].ndim == 2
            and weights[2].shape[1] == weights[0].shape[0])


def mlp_logits(weights: list[np.ndarray], x: np.ndarray) -> np.ndarray:
    w1, b1, w2, b2 = weights
    h = x.reshape(len(x), -1) @ w1.T + b1
    np.maximum(h, 0.0, out=h)
    return h @ w2.T + b2


def ce_and_error(logits: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    z = logits - logits.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    ce = float(-logp[np.arange(len(y)), y].mean())
    err = float((logits.argmax(axis=1) != y).mean())
    return ce, err


def numpy_train(
    weights: list[np.ndarray],
    x: np.ndarray,
    y: np.ndarray,
    cfg,
    rng: np.random.Generator,
    batches: list[np.ndarray] | None = None,
) -> tuple[list[np.ndarray], float]:
    """``training.local_train`` for a one-hidden-layer MLP, in NumPy (same batches, same Adam)."""
    if batches is None:
        batches = batch_indices(len(y), cfg, rng)
    return numpy_train_many([(weights, x, y, batches)], cfg)[0]


#: weights, x, y, batches, and optionally the optimizer state to continue from (a dict in the
#: names of ``training.OptimizerState``; empty = fresh), replaced in place by the state after
TrainJob = tuple  # (list[np.ndarray], np.ndarray, np.ndarray, list[np.ndarray][, OptimizerState])


def numpy_train_many(jobs: list[TrainJob], cfg) -> list[tuple[list[np.ndarray], float]]:
    """Train several MLPs at once (KUE's 10 members, AUE's 5, FedDrift's models of one client).

    Each job keeps its own data and minibatches; jobs whose shapes and batch sizes agree go to
    the compiled loop in one call (one call per group, not per job: the call's preparation is
    the cost on these tiny models). Each job's arithmetic is its own, so results equal
    ``numpy_train`` per job exactly."""
    groups: dict[tuple, list[int]] = {}
    for j, (weights, _, _, batches, *_) in enumerate(jobs):
        key = (tuple(np.asarray(w).shape for w in weights), batch_sizes(batches))
        groups.setdefault(key, []).append(j)
    out: list = [None] * len(jobs)
    for members in groups.values():
        for j, result in zip(members, _train_stacked([jobs[j] for j in members], cfg)):
            out[j] = result
    return out


def _train_stacked(jobs: list[TrainJob], cfg) -> list[tuple[list[np.ndarray], float]]:
    from fedcluster_app.core.client import compiled_mlp as compiled     # Numba, loaded on first use

    M = len(jobs)
    shapes = [np.asarray(w).shape for w in jobs[0][0]]
    (h, d), C = shapes[0], shapes[2][0]
    # the arrays' own shape / ravel / reshape, not np.shape & co. (NumPy's function dispatch, a
    # microsecond a call, a few hundred calls per KUE round); bookkeeping in Python ints
    offsets = list(accumulate((math.prod(s) for s in shapes), initial=0))
    # every job's arrays one after the other are the (M, P) rows; one cast for all of them
    flat = np.concatenate([np.asarray(w).ravel() for weights, *_ in jobs for w in weights],
                          dtype=np.float64, casting="unsafe").reshape(M, -1)
    sizes = np.array(batch_sizes(jobs[0][3]), dtype=np.int64)   # the same for every job
    X = np.concatenate([np.asarray(x).reshape(len(x), -1) for _, x, *_ in jobs],
                       dtype=np.float64, casting="unsafe")
    Y = np.concatenate([y for _, _, y, *_ in jobs], dtype=np.int64, casting="unsafe")
    start = np.array(list(accumulate((len(y) for _, _, y, *_ in jobs[:-1]), initial=0)),
                     dtype=np.int64)
    rows = _minibatch_rows(jobs, sizes)
    adam = cfg.optimizer == "adam"
    m, v, vmax = np.zeros((3, *flat.shape))
    states = [job[4] if len(job) > 4 else None for job in jobs]
    kept = np.array([bool(state) for state in states])   # rows that continue an optimizer
    t0 = np.zeros(M, dtype=np.int64)            # Adam steps taken before this call
    for k in np.flatnonzero(kept):
        t0[k] = _load_state(states[k], adam, shapes, m[k], v[k], vmax[k])
    c1, c2 = _adam_factors(float(cfg.lr), tuple((sizes > 0).tolist()), tuple(t0.tolist()))
    picked = np.empty((len(sizes), M, rows.shape[2]))   # p(y | x) of every sample, per step
    compiled.train_mlp(flat, X, Y, start, rows, sizes, np.array([d, h, C], dtype=np.int64),
                       adam, float(cfg.momentum), float(cfg.weight_decay), float(cfg.lr),
                       c1, c2, ~kept, m, v, vmax, picked)
    # the mean over minibatches of the minibatch's mean cross-entropy, as local_train reports
    losses = compiled.mean_losses(picked, sizes).tolist()
    t = int(np.count_nonzero(sizes))
    for k, state in enumerate(states):
        if state is not None:
            _store_state(state, adam, cfg.momentum, shapes, offsets, t0[k] + t, m[k], v[k], vmax[k])
    # one cast for all jobs; each job's arrays are views of its own row
    out = flat.astype(np.float32)
    arrays = [out[:, a:b].reshape((M, *s)) for a, b, s in zip(offsets[:-1], offsets[1:], shapes)]
    return [([w[k] for w in arrays], losses[k]) for k in range(M)]


def _minibatch_rows(jobs: list[TrainJob], sizes: np.ndarray) -> np.ndarray:
    """Every job's minibatches as one (jobs, steps, largest batch) array of row indices; a
    step's shorter batch (an epoch's last) fills the first places."""
    if len(set(sizes.tolist())) == 1 and sizes[0] > 0:
        # one concatenation of the (steps, size) draws; np.stack's Python steps cost more
        parts = [job[3].array if isinstance(job[3], Minibatches) else np.stack(job[3])
                 for job in jobs]
        return np.concatenate(parts, dtype=np.int64, casting="unsafe").reshape(
            len(jobs), len(sizes), int(sizes[0]))
    rows = np.zeros((len(jobs), len(sizes), max(1, int(sizes.max(initial=0)))), dtype=np.int64)
    for k, job in enumerate(jobs):
        for s, batch in enumerate(job[3]):
            rows[k, s, :len(batch)] = batch
    return rows


@functools.lru_cache(maxsize=64)
def _adam_factors(lr: float, trains: tuple[bool, ...], t0: tuple[int, ...]
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Adam's bias corrections per step and row: c1 = lr / (1 - beta1^t), c2 = 1 / sqrt(1 -
    beta2^t), t counting the row's optimizer steps (those taken before this call included).
    Written as torch's ``Adam`` computes them, so the kernel gives its numbers."""
    beta1, beta2 = 0.9, 0.999
    c1 = np.zeros((len(trains), len(t0)))
    c2 = np.zeros((len(trains), len(t0)))
    t = 0
    for s, trained in enumerate(trains):
        if not trained:
            continue
        t += 1
        if any(t0):
            c2[s] = [1.0 / np.sqrt(1 - beta2 ** np.int64(t + s0)) for s0 in t0]
            c1[s] = [lr / (1 - beta1 ** np.int64(t + s0)) for s0 in t0]
        else:
            c2[s], c1[s] = 1.0 / np.sqrt(1 - beta2 ** t), lr / (1 - beta1 ** t)
    c1.flags.writeable = c2.flags.writeable = False     # shared through the cache
    return c1, c2


# ------------------------------------------------------ optimizer state (optimizer-state = step)
_ADAM = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")


def _load_state(state: dict, adam: bool, shapes: list, m: np.ndarray, v: np.ndarray,
                vmax: np.ndarray) -> int:
    """Fill one job's rows of the optimizer buffers from ``state`` (torch's names, per
    parameter); returns the Adam steps already taken (SGD keeps no count: 0)."""
    names = _ADAM if adam else ("momentum_buffer",)
    rows = (m, v, vmax) if adam else (m,)
    for name, row in zip(names, rows):
        row[...] = np.concatenate([np.asarray(state[f"{i}.{name}"], dtype=np.float64).ravel()
                                   for i in range(len(shapes))])
    return int(np.asarray(state["0.step"])) if adam else 0


def _store_state(state: dict, adam: bool, momentum: float, shapes: list, offsets: np.ndarray,
                 steps: int, m: np.ndarray, v: np.ndarray, vmax: np.ndarray) -> None:
    state.clear()
    if not adam and not momentum:
        return                                  # plain SGD keeps no state
    names = _ADAM if adam else ("momentum_buffer",)
    rows = (m, v, vmax) if adam else (m,)
    for i, (a, b, shape) in enumerate(zip(offsets[:-1], offsets[1:], shapes)):
        for name, row in zip(names, rows):
            state[f"{i}.{name}"] = row[a:b].reshape(shape).astype(np.float32)
        if adam:
            state[f"{i}.step"] = np.asarray(float(steps), dtype=np.float32)
