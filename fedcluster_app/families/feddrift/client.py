"""Client side of the FedDrift family (feddrift.md section 9.1) and its baselines.

Message kinds registered here:

* ``train.feddrift`` -- train every model sent (or ``train-ids``) on the time steps the server
  attached to it (``data-steps.<id>``), K minibatch steps each (section 2.1, LOCAL_UPDATE).
  Optional per model: ``fd.step-weights.<id>`` (one weight per attached step: each minibatch first
  draws a step with these probabilities, Weighted-Linear/-Exp) and ``select = "min-loss"``
  (per-round IFCA: train only the lowest-loss model). Replies carry n(c, m) per model.
* ``query.fd_probe`` -- 0-1 error, cross-entropy and sample count of every model sent on the
  training batch of ``data-steps`` (the probe at the start of a step, section 2.2).
* ``query.fd_distance`` -- FedDrift's cluster-distance phase: for every cluster j in
  ``fd.clusters``, draw ``fd.quota.<j>`` points from this client's data of the steps
  ``fd.steps.<j>`` and count the errors of every model sent on them.

The tiny MLPs of the paper's synthetic data (2-4-2, 3-6-2) are trained by a NumPy
implementation of the same computation as ``training.local_train`` (cross-entropy, Adam with
amsgrad and L2 weight decay exactly as ``torch.optim.Adam``, or SGD with momentum): on models
this small PyTorch's per-step overhead is ~20x the arithmetic. ``fd.engine = "torch"`` (or a
model that is not a one-hidden-layer MLP) uses the foundation's PyTorch path.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedcluster_app.core import wire as P
from fedcluster_app.core.training import batch_indices
from fedcluster_app.core.handlers import Models
from fedcluster_app.core.stream_client import StreamClient

TRAIN_KIND = "train.feddrift"
PROBE_KIND = "query.fd_probe"
DISTANCE_KIND = "query.fd_distance"

# config / metric keys of this family
ENGINE = "fd.engine"                 # "numpy" (default for MLPs) | "torch"
STEP_WEIGHTS = "fd.step-weights"     # fd.step-weights.<id>: sampling weight per attached step
CLUSTERS = "fd.clusters"             # distance phase: cluster (model) ids j
STEPS = "fd.steps"                   # fd.steps.<j>: this client's steps attached to j
QUOTA = "fd.quota"                   # fd.quota.<j>: points to draw from them
ERRORS = "fd.errors"                 # reply: errors[i * len(clusters) + jj]
COUNTS = "fd.counts"                 # reply: points drawn per cluster
ERROR_RATES = "fd.error-rates"       # probe reply: 0-1 error per model
MSE = "fd.mse"                       # probe reply: mean (1 - p(y|x))^2 per model (AUE)
ENSEMBLE_KIND = "query.fd_ensemble"  # accuracy of a weighted ensemble of the models sent
ENS_WEIGHTS = "fd.weights"           # one weight per model (sorted ids)
ENS_VOTE = "fd.vote"                 # "hard": weighted vote of predictions | "soft": of softmax
MASK = "fd.mask"                     # fd.mask.<id>: 0/1 per input feature (KUE random subspaces)
BOOTSTRAP = "fd.bootstrap"           # train on a Poisson(1) bootstrap of the data (online bagging)
CONFUSION = "fd.confusion"           # probe reply: C x C confusion counts per model, flattened


# ------------------------------------------------------------------------ NumPy MLP kernels
def _is_mlp(weights: list[np.ndarray]) -> bool:
    return (len(weights) == 4 and weights[0].ndim == 2 and weights[2].ndim == 2
            and weights[2].shape[1] == weights[0].shape[0])


def mlp_logits(weights: list[np.ndarray], x: np.ndarray) -> np.ndarray:
    w1, b1, w2, b2 = weights
    h = x.reshape(len(x), -1) @ w1.T + b1
    np.maximum(h, 0.0, out=h)
    return h @ w2.T + b2


def _ce_and_error(logits: np.ndarray, y: np.ndarray) -> tuple[float, float]:
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


TrainJob = tuple[list[np.ndarray], np.ndarray, np.ndarray, list[np.ndarray]]  # weights, x, y, batches


def numpy_train_many(jobs: list[TrainJob], cfg) -> list[tuple[list[np.ndarray], float]]:
    """Train several MLPs at once (KUE's 10 members, AUE's 5, FedDrift's models of one client).

    Each job keeps its own data and minibatches; jobs whose shapes and batch sizes agree are
    stacked so that every NumPy call of a step serves all of them: on these tiny models the
    per-call overhead, not the arithmetic, is the cost. Results equal ``numpy_train`` per job
    up to floating-point rounding."""
    groups: dict[tuple, list[int]] = {}
    for j, (weights, _, _, batches) in enumerate(jobs):
        key = (tuple(np.shape(w) for w in weights), tuple(len(b) for b in batches))
        groups.setdefault(key, []).append(j)
    out: list = [None] * len(jobs)
    for members in groups.values():
        for j, result in zip(members, _train_stacked([jobs[j] for j in members], cfg)):
            out[j] = result
    return out


def _train_stacked(jobs: list[TrainJob], cfg) -> list[tuple[list[np.ndarray], float]]:
    M = len(jobs)
    shapes = [np.shape(w) for w in jobs[0][0]]
    offsets = np.cumsum([0] + [int(np.prod(s)) for s in shapes])
    flat = np.stack([np.concatenate([np.asarray(w, dtype=np.float64).ravel() for w in weights])
                     for weights, _, _, _ in jobs])                        # (M, P)
    grad = np.zeros_like(flat)

    def split(arr: np.ndarray) -> list[np.ndarray]:
        views = [arr[:, a:b].reshape((M, *s)) for a, b, s in zip(offsets[:-1], offsets[1:], shapes)]
        assert all(np.shares_memory(v, arr) for v in views)   # views, so updates reach `arr`
        return views

    w1, b1, w2, b2 = split(flat)
    g1, gb1, g2, gb2 = split(grad)
    xs = [np.asarray(x, dtype=np.float64).reshape(len(x), -1) for _, x, _, _ in jobs]
    ys = [np.asarray(y) for _, _, y, _ in jobs]
    sizes = [len(b) for b in jobs[0][3]]        # the same for every job of a group
    XB = YB = None
    if len(set(sizes)) == 1 and sizes[0] > 0:   # local steps: gather every minibatch at once
        XB = np.stack([x[np.stack(b)] for x, (_, _, _, b) in zip(xs, jobs)])  # (M, steps, bsz, d)
        YB = np.stack([y[np.stack(b)] for y, (_, _, _, b) in zip(ys, jobs)])

    def batch_at(step: int) -> tuple[np.ndarray, np.ndarray]:
        if XB is not None:
            return XB[:, step], YB[:, step]
        # epochs with a partial last batch: gathered step by step
        return (np.stack([x[b[step]] for x, (_, _, _, b) in zip(xs, jobs)]),
                np.stack([y[b[step]] for y, (_, _, _, b) in zip(ys, jobs)]))

    picked = []                                 # p(y | x) of every sample seen, per step
    mi = np.arange(M)[:, None]
    adam = cfg.optimizer == "adam"
    m = np.zeros_like(flat)
    v = np.zeros_like(flat)
    vmax = np.zeros_like(flat)
    tmp = np.empty_like(flat)
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    wd, lr = float(cfg.weight_decay), float(cfg.lr)
    t = 0
    for step, bsz in enumerate(sizes):
        if bsz == 0:
            continue
        t += 1                                  # torch's step counter: optimizer steps taken
        xb, yb = batch_at(step)
        rows = np.arange(bsz)[None, :]
        z1 = np.matmul(xb, w1.transpose(0, 2, 1))          # (M, bsz, hidden)
        z1 += b1[:, None, :]
        a1 = np.maximum(z1, 0.0)
        p = np.matmul(a1, w2.transpose(0, 2, 1))           # (M, bsz, classes)
        p += b2[:, None, :]
        p -= p.max(axis=2, keepdims=True)
        np.exp(p, out=p)
        p /= p.sum(axis=2, keepdims=True)
        picked.append(p[mi, rows, yb])
        p[mi, rows, yb] -= 1.0
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
            tmp *= 1.0 / np.sqrt(1 - beta2 ** t)
            tmp += eps
            np.divide(m, tmp, out=tmp)
            tmp *= lr / (1 - beta1 ** t)
            flat -= tmp
        elif cfg.momentum:   # torch.optim.SGD: the first step's buffer is the gradient itself
            if t == 1:
                m[...] = grad
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
    return [([np.asarray(w[k], dtype=np.float32).copy() for w in (w1, b1, w2, b2)], float(losses[k]))
            for k in range(M)]


def _use_numpy(config: dict, weights: list[np.ndarray]) -> bool:
    return config.get(ENGINE, "numpy") != "torch" and _is_mlp(weights)


def masked(x: np.ndarray, config: dict, mid: int) -> np.ndarray:
    mask = config.get(f"{MASK}.{mid}")
    if mask is None:
        return x
    flat = np.asarray(x, dtype=np.float32).reshape(len(x), -1) * np.asarray(mask, dtype=np.float32)
    return flat.reshape(np.shape(x))


def model_proba(client: StreamClient, weights, x, config) -> np.ndarray:
    if _use_numpy(config, weights):
        z = mlp_logits([np.asarray(w, np.float64) for w in weights], np.asarray(x, np.float64))
        z -= z.max(axis=1, keepdims=True)
        e = np.exp(z)
        return e / e.sum(axis=1, keepdims=True)
    from fedcluster_app.core.models import scratch_model
    from fedcluster_app.core.training import predict_proba

    return predict_proba([scratch_model(client.exp.spec, weights)], [1.0], x).numpy()


def model_ce_error(client: StreamClient, weights, x, y, config) -> tuple[float, float]:
    if len(y) == 0:
        return float("nan"), float("nan")
    if _use_numpy(config, weights):
        return _ce_and_error(mlp_logits([np.asarray(w, np.float64) for w in weights],
                                        np.asarray(x, np.float64)), y)
    from fedcluster_app.core.models import scratch_model
    from fedcluster_app.core.training import evaluate

    ce, acc = evaluate(scratch_model(client.exp.spec, weights), x, y)
    return ce, 1.0 - acc


# ------------------------------------------------------------------------ handlers
def _weighted_batches(client: StreamClient, steps: list[int], weights: list[float], cfg,
                      rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """Minibatches that first draw a step with probability proportional to its weight."""
    parts = [client.exp.scenario.step_data(client.client_id, int(t)) for t in steps]
    sizes = np.array([len(p.y_train) for p in parts])
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    x = np.concatenate([p.x_train for p in parts])
    y = np.concatenate([p.y_train for p in parts])
    prob = np.asarray(weights, dtype=np.float64)
    prob = prob / prob.sum()
    n_batches = cfg.local_steps if cfg.local_steps > 0 else max(1, int(np.ceil(len(y) / cfg.batch_size)))
    batches = []
    for _ in range(n_batches):
        k = int(rng.choice(len(parts), p=prob))
        size = min(cfg.batch_size, int(sizes[k]))
        batches.append(offsets[k] + rng.choice(int(sizes[k]), size=size, replace=False))
    return x, y, batches


def train(client: StreamClient, config: dict, models: Models):
    metrics: dict[str, Any] = {}
    train_ids = [int(i) for i in config.get(P.TRAIN_IDS, sorted(models))]
    if config.get(P.SELECT) == "min-loss":     # per-round IFCA: train the lowest-loss model
        ids = sorted(models)
        x, y = client.fit_data(config, -2)
        losses = [model_ce_error(client, models[i], x, y, config)[0] for i in ids]
        best = min(losses)
        chosen = ids[losses.index(best)]
        train_ids = [chosen]
        metrics.update({P.CHOSEN: chosen, P.LOSSES: losses, P.MODEL_IDS: ids})
    trained, per_model = {}, {}
    numpy_jobs: dict[int, TrainJob] = {}
    cfg = client.train_config(config)
    for mid in train_ids:
        rng = client.rng(int(config[P.ROUND]), mid)    # one stream per model: order-free
        steps = config.get(f"{P.DATA_STEPS}.{mid}", config.get(P.DATA_STEPS))
        step_w = config.get(f"{STEP_WEIGHTS}.{mid}")
        if steps and step_w:
            x, y, batches = _weighted_batches(client, list(steps), list(step_w), cfg, rng)
        else:
            x, y = client.fit_data(config, mid)
            batches = None
        x = masked(x, config, mid)
        if config.get(BOOTSTRAP) and batches is None:
            idx = np.repeat(np.arange(len(y)), rng.poisson(1.0, size=len(y)))
            if len(idx) == 0:
                idx = np.arange(len(y))
            x, y = x[idx], y[idx]
        per_model[mid] = {P.NUM_EXAMPLES: len(y)}
        if _use_numpy(config, models[mid]):
            numpy_jobs[mid] = (models[mid], x, y, batches or batch_indices(len(y), cfg, rng))
            continue
        from fedcluster_app.core.models import get_weights, scratch_model
        from fedcluster_app.core.training import local_train

        net = scratch_model(client.exp.spec, models[mid])
        per_model[mid][P.TRAIN_LOSS] = local_train(net, x, y, cfg, rng)
        trained[mid] = get_weights(net)
    if numpy_jobs:     # the NumPy models of this client train together (one call per step)
        results = numpy_train_many(list(numpy_jobs.values()), cfg)
        for mid, (weights, loss) in zip(numpy_jobs, results):
            trained[mid] = weights
            per_model[mid][P.TRAIN_LOSS] = loss
    trained = {mid: trained[mid] for mid in train_ids}
    metrics[P.NUM_EXAMPLES] = max((v[P.NUM_EXAMPLES] for v in per_model.values()), default=0)
    return metrics, trained, per_model


def probe(client: StreamClient, config: dict, models: Models):
    ids = sorted(models)
    x, y = client.fit_data(config, -2)
    losses, errors, mses, confusion = [], [], [], []
    rows = np.arange(len(y))
    C = client.exp.scenario.num_classes
    for i in ids:
        proba = model_proba(client, models[i], masked(x, config, i), config)
        py = np.clip(proba[rows, y], 1e-12, 1.0)
        pred = proba.argmax(axis=1)
        losses.append(float(-np.log(py).mean()))
        errors.append(float((pred != y).mean()))
        mses.append(float(((1.0 - py) ** 2).mean()))
        confusion += np.bincount(y * C + pred, minlength=C * C).astype(float).tolist()
    return {P.MODEL_IDS: ids, P.LOSSES: losses, ERROR_RATES: errors, MSE: mses,
            CONFUSION: confusion, P.NUM_EXAMPLES: len(y)}, {}, {}


def ensemble(client: StreamClient, config: dict, models: Models):
    """Accuracy of the weighted ensemble on the evaluation batch (AUE: hard vote)."""
    ids = sorted(models)
    weights = [float(w) for w in config[ENS_WEIGHTS]]
    if len(weights) != len(ids):
        raise ValueError(f"{len(weights)} ensemble weights for {len(ids)} models")
    x, y = client.eval_data(config)
    score = np.zeros((len(y), client.exp.scenario.num_classes))
    for i, w in zip(ids, weights):
        proba = model_proba(client, models[i], masked(x, config, i), config)
        if config.get(ENS_VOTE, "hard") == "hard":
            score[np.arange(len(y)), proba.argmax(axis=1)] += w
        else:
            score += w * proba
    acc = float((score.argmax(axis=1) == y).mean()) if len(y) else float("nan")
    return {P.ACCURACY: acc, P.NUM_EXAMPLES: len(y)}, {}, {}


def distance(client: StreamClient, config: dict, models: Models):
    ids = sorted(models)
    clusters = [int(j) for j in config.get(CLUSTERS, [])]
    rng = np.random.default_rng([client.exp.cfg.seed, client.client_id, int(config[P.ROUND]), 0xD15])
    errors: list[float] = []
    counts: list[float] = []
    samples = []
    for j in clusters:
        steps = list(config.get(f"{STEPS}.{j}", []))
        quota = int(config.get(f"{QUOTA}.{j}", 0))
        if not steps or quota <= 0:
            samples.append(None)
            counts.append(0.0)
            continue
        x, y = client.steps_data(steps)
        idx = rng.choice(len(y), size=min(quota, len(y)), replace=False)
        samples.append((x[idx], y[idx]))
        counts.append(float(len(idx)))
    for i in ids:
        for s in samples:
            if s is None:
                errors.append(0.0)
            else:
                _, err = model_ce_error(client, models[i], s[0], s[1], config)
                errors.append(float(round(err * len(s[1]))))
    return {P.MODEL_IDS: ids, CLUSTERS: clusters, ERRORS: errors, COUNTS: counts}, {}, {}


HANDLERS = {TRAIN_KIND: train, PROBE_KIND: probe, DISTANCE_KIND: distance, ENSEMBLE_KIND: ensemble}
