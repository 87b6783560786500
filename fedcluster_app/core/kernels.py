"""A NumPy implementation of ``core.training.local_train`` for one-hidden-layer MLPs.

The FedDrift paper's synthetic data use tiny MLPs (2-4-2, 3-6-2): on models this small
PyTorch's per-step overhead is about 20x the arithmetic, so the family's clients train them
here instead: the same computation (cross-entropy, Adam with amsgrad and L2 weight decay
exactly as ``torch.optim.Adam``, or SGD with momentum), on the same minibatches. Several models
of one client train stacked, one NumPy call per step for all of them. Tests check both against
PyTorch.
"""

from __future__ import annotations

import numpy as np

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

    Each job keeps its own data and minibatches; jobs whose shapes and batch sizes agree are
    stacked so that every NumPy call of a step serves all of them: on these tiny models the
    per-call overhead, not the arithmetic, is the cost. Results equal ``numpy_train`` per job
    up to floating-point rounding."""
    groups: dict[tuple, list[int]] = {}
    for j, (weights, _, _, batches, *_) in enumerate(jobs):
        key = (tuple(np.shape(w) for w in weights), tuple(len(b) for b in batches))
        groups.setdefault(key, []).append(j)
    out: list = [None] * len(jobs)
    for members in groups.values():
        for j, result in zip(members, _train_stacked([jobs[j] for j in members], cfg)):
            out[j] = result
    return out


def _last_axis(op: np.ufunc, a: np.ndarray) -> np.ndarray:
    """``op.reduce(a, axis=-1, keepdims=True)`` for a few classes as a chain of element-wise
    calls: the same values (NumPy reduces fewer than 8 elements one after the other), at a
    fraction of the cost of a reduction over a short last axis."""
    if a.shape[-1] >= 8:
        return op.reduce(a, axis=-1, keepdims=True)
    out = a[..., 0].copy()
    for c in range(1, a.shape[-1]):
        op(out, a[..., c], out=out)
    return out[..., None]


def _train_stacked(jobs: list[TrainJob], cfg) -> list[tuple[list[np.ndarray], float]]:
    M = len(jobs)
    shapes = [np.shape(w) for w in jobs[0][0]]
    offsets = np.cumsum([0] + [int(np.prod(s)) for s in shapes])
    flat = np.stack([np.concatenate([np.asarray(w, dtype=np.float64).ravel() for w in weights])
                     for weights, *_ in jobs])                             # (M, P)
    grad = np.zeros_like(flat)

    def split(arr: np.ndarray) -> list[np.ndarray]:
        views = [arr[:, a:b].reshape((M, *s)) for a, b, s in zip(offsets[:-1], offsets[1:], shapes)]
        assert all(np.shares_memory(v, arr) for v in views)   # views, so updates reach `arr`
        return views

    w1, b1, w2, b2 = split(flat)
    g1, gb1, g2, gb2 = split(grad)
    xs = [np.asarray(x, dtype=np.float64).reshape(len(x), -1) for _, x, *_ in jobs]
    ys = [np.asarray(y) for _, _, y, *_ in jobs]
    sizes = [len(b) for b in jobs[0][3]]        # the same for every job of a group
    XB = YB = None
    if len(set(sizes)) == 1 and sizes[0] > 0:   # local steps: gather every minibatch at once
        XB = np.stack([x[np.stack(job[3])] for x, job in zip(xs, jobs)])  # (M, steps, bsz, d)
        YB = np.stack([y[np.stack(job[3])] for y, job in zip(ys, jobs)])

    def batch_at(step: int) -> tuple[np.ndarray, np.ndarray]:
        if XB is not None:
            return XB[:, step], YB[:, step]
        # epochs with a partial last batch: gathered step by step
        return (np.stack([x[job[3][step]] for x, job in zip(xs, jobs)]),
                np.stack([y[job[3][step]] for y, job in zip(ys, jobs)]))

    picked = []                                 # p(y | x) of every sample seen, per step
    mi = np.arange(M)[:, None]
    adam = cfg.optimizer == "adam"
    m = np.zeros_like(flat)
    v = np.zeros_like(flat)
    vmax = np.zeros_like(flat)
    tmp = np.empty_like(flat)
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    wd, lr = float(cfg.weight_decay), float(cfg.lr)
    states = [job[4] if len(job) > 4 else None for job in jobs]
    kept = np.array([bool(state) for state in states])   # rows that continue an optimizer
    t0 = np.zeros(M, dtype=np.int64)            # Adam steps taken before this call
    for k in np.flatnonzero(kept):
        t0[k] = _load_state(states[k], adam, shapes, m[k], v[k], vmax[k])
    t = 0
    for step, bsz in enumerate(sizes):
        if bsz == 0:
            continue
        t += 1                                  # torch's step counter: optimizer steps taken
        if t0.any():   # jobs that continue an optimizer: each its own bias correction
            c2 = np.array([[1.0 / np.sqrt(1 - beta2 ** (t + s))] for s in t0])
            c1 = np.array([[lr / (1 - beta1 ** (t + s))] for s in t0])
        else:
            c2, c1 = 1.0 / np.sqrt(1 - beta2 ** t), lr / (1 - beta1 ** t)
        xb, yb = batch_at(step)
        rows = np.arange(bsz)[None, :]
        z1 = np.matmul(xb, w1.transpose(0, 2, 1))          # (M, bsz, hidden)
        z1 += b1[:, None, :]
        a1 = np.maximum(z1, 0.0)
        p = np.matmul(a1, w2.transpose(0, 2, 1))           # (M, bsz, classes)
        p += b2[:, None, :]
        p -= _last_axis(np.maximum, p)
        np.exp(p, out=p)
        p /= _last_axis(np.add, p)
        at_label = ((mi * bsz + rows) * p.shape[2] + yb).ravel()   # p[m, i, y_mi] in p.flat
        flat_p = p.reshape(-1)
        picked.append(flat_p[at_label].reshape(M, bsz))
        flat_p[at_label] -= 1.0
        p /= bsz
        g2[...] = np.matmul(p.transpose(0, 2, 1), a1)
        gb2[...] = p.sum(axis=1)
        d1 = np.matmul(p, w2)
        d1 *= z1 > 0
        g1[...] = np.matmul(d1.transpose(0, 2, 1), xb)
        gb1[...] = d1.sum(axis=1)
        if wd:
            np.multiply(flat, wd, out=tmp)
            grad += tmp
        if adam:   # torch.optim.Adam with amsgrad and L2 weight decay
            m *= beta1
            np.multiply(grad, 1 - beta1, out=tmp)
            m += tmp
            v *= beta2
            np.multiply(grad, grad, out=tmp)
            tmp *= 1 - beta2
            v += tmp
            np.maximum(vmax, v, out=vmax)
            np.sqrt(vmax, out=tmp)
            tmp *= c2
            tmp += eps
            np.divide(m, tmp, out=tmp)
            tmp *= c1
            flat -= tmp
        elif cfg.momentum:   # torch.optim.SGD: the first step's buffer is the gradient itself
            if t == 1 and not kept.any():
                m[...] = grad
            elif t == 1:
                m[~kept] = grad[~kept]
                m[kept] *= cfg.momentum
                m[kept] += grad[kept]
            else:
                m *= cfg.momentum
                m += grad
            np.multiply(m, lr, out=tmp)
            flat -= tmp
        else:
            np.multiply(grad, lr, out=tmp)
            flat -= tmp
    # the mean over minibatches of the minibatch's mean cross-entropy, as local_train reports
    losses = -np.mean([np.log(pk).mean(axis=1) for pk in picked], axis=0) if picked else np.zeros(M)
    for k, state in enumerate(states):
        if state is not None:
            _store_state(state, adam, cfg.momentum, shapes, offsets, t0[k] + t, m[k], v[k], vmax[k])
    return [([np.asarray(w[k], dtype=np.float32).copy() for w in (w1, b1, w2, b2)], float(losses[k]))
            for k in range(M)]


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
