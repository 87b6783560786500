"""Client side of the FedDrift family and its baselines (docs/feddrift/README.md, "Client side").

Message kinds registered here:

* ``train.feddrift`` -- train every model sent (or ``train-ids``) on the time steps the server
  attached to it (``data-steps.<id>``), K minibatch steps each (TRAIN in docs/feddrift/README.md;
  minibatches: D9). Optional per model: ``fd.step-weights.<id>`` (one weight per attached step:
  each minibatch first draws a step with these probabilities, Weighted-Linear/-Exp) and
  ``select = "min-loss"`` / ``"min-error"`` (per-round IFCA: train only the model of lowest
  cross-entropy / 0-1 error on the newest batch, ties to the lowest id). Replies carry
  n(c, m) per model.
* ``query.fd_probe`` -- 0-1 error, cross-entropy and sample count of every model sent on the
  training batch of ``data-steps`` (the probe at the start of a step, docs/feddrift/README.md D2).
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

from functools import lru_cache
from typing import Any

import numpy as np

from fedcluster_app.core.client import kernels
from fedcluster_app.core import wire as P
from fedcluster_app.core.client.batched import FitJob
from fedcluster_app.core.client.handlers import Models
from fedcluster_app.core.client.stream_client import StreamClient
from fedcluster_app.families.feddrift.wire import (
    BOOTSTRAP,
    CLUSTERS,
    CONFUSION,
    COUNTS,
    DISTANCE_KIND,
    ENGINE,
    ENS_VOTE,
    ENS_WEIGHTS,
    ENSEMBLE_KIND,
    ERROR_RATES,
    ERRORS,
    MASK,
    MSE,
    PROBE_KIND,
    QUOTA,
    SELECT_BY,
    STEP_WEIGHTS,
    STEPS,
    TRAIN_KIND,
)


def _use_numpy(client: StreamClient, config: dict, weights: list[np.ndarray]) -> bool:
    """The NumPy kernel serves the built-in one-hidden-layer MLP only (a user's model with the
    same array shapes may compute something else), on the CPU: with ``device = "auto"`` too,
    since on an H200 these MLPs trained 2.4-6.4x faster here than in PyTorch on the GPU
    (docs/operations/performance.md, GPU); a client told ``cuda`` trains there, in PyTorch. It has no
    proximal term: with ``prox-mu`` > 0 PyTorch trains."""
    return (config.get(ENGINE, "numpy") != "torch" and client.exp.spec.kind == "mlp"
            and float(config.get(P.TRAIN_PROX_MU, client.exp.cfg.train.prox_mu)) == 0
            and (client.device == "cpu" or client.exp.cfg.device == "auto")
            and kernels.is_mlp(weights))


def masked(x: np.ndarray, config: dict, mid: int) -> np.ndarray:
    mask = config.get(f"{MASK}.{mid}")
    if mask is None:
        return x
    flat = np.asarray(x, dtype=np.float32).reshape(len(x), -1)
    if flat.shape[1] == len(mask) <= _TILED_MASK_FEATURES:
        # the same products, element by element: NumPy's broadcasting over a row of a few
        # features costs ~10 us a call (a KUE run masks 100,000 training batches)
        out = flat.reshape(-1) * _tiled_mask(tuple(mask), len(flat))
    else:
        out = flat * np.asarray(mask, dtype=np.float32)
    return out.reshape(np.shape(x))


_TILED_MASK_FEATURES = 64       # wider rows broadcast fast enough, and a tiled mask grows


@lru_cache(maxsize=64)          # a KUE ensemble's masks x a client's few batch sizes
def _tiled_mask(mask: tuple, rows: int) -> np.ndarray:
    """``mask`` as float32, repeated for ``rows`` rows (read only: it is shared)."""
    tiled = np.tile(np.asarray(mask, dtype=np.float32), rows)
    tiled.flags.writeable = False
    return tiled


def model_proba(client: StreamClient, weights, x, config) -> np.ndarray:
    if _use_numpy(client, config, weights):
        z = kernels.mlp_logits([np.asarray(w, np.float64) for w in weights], np.asarray(x, np.float64))
        z -= z.max(axis=1, keepdims=True)
        e = np.exp(z)
        return e / e.sum(axis=1, keepdims=True)
    from fedcluster_app.core.training import predict_proba

    return predict_proba([client.scratch(weights)], [1.0], x).numpy()


def model_ce_error(client: StreamClient, weights, x, y, config) -> tuple[float, float]:
    if len(y) == 0:
        return float("nan"), float("nan")
    if _use_numpy(client, config, weights):
        return kernels.ce_and_error(kernels.mlp_logits([np.asarray(w, np.float64) for w in weights],
                                        np.asarray(x, np.float64)), y)
    from fedcluster_app.core.training import evaluate

    ce, acc = evaluate(client.scratch(weights), x, y)
    return ce, 1.0 - acc


# ------------------------------------------------------------------------ handlers
def _weighted_batches(client: StreamClient, steps: list[int], weights: list[float], cfg,
                      rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """Minibatches that first draw a step with probability proportional to its weight:
    ``local-steps`` of them, or ``local-epochs`` times as many as an epoch of all the steps has
    (its full batches only, with ``drop-last``)."""
    parts = [client.exp.scenario.step_data(client.client_id, int(t)) for t in steps]
    sizes = np.array([len(p.y_train) for p in parts])
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    x, y = client.steps_data(steps)
    prob = np.asarray(weights, dtype=np.float64)
    prob = prob / prob.sum()
    per_epoch = len(y) // cfg.batch_size if cfg.drop_last else -(-len(y) // cfg.batch_size)
    n_batches = cfg.local_steps if cfg.local_steps > 0 else cfg.local_epochs * max(1, per_epoch)
    batches = []
    for _ in range(n_batches):
        k = int(rng.choice(len(parts), p=prob))
        size = min(cfg.batch_size, int(sizes[k]))
        batches.append(offsets[k] + rng.choice(int(sizes[k]), size=size, replace=False))
    return x, y, batches


def train(client: StreamClient, config: dict, models: Models):
    metrics: dict[str, Any] = {}
    train_ids = [int(i) for i in config.get(P.TRAIN_IDS, sorted(models))]
    if config.get(P.SELECT) in SELECT_BY:      # per-round IFCA: train the best model only
        ids = sorted(models)
        x, y = client.fit_data(config, -2)
        scores = [model_ce_error(client, models[i], x, y, config) for i in ids]
        by = [s[SELECT_BY[config[P.SELECT]]] for s in scores]
        chosen = ids[by.index(min(by))]
        losses = [ce for ce, _ in scores]
        train_ids = [chosen]
        metrics.update({P.CHOSEN: chosen, P.LOSSES: losses, P.MODEL_IDS: ids})
    cfg = client.train_config(config)
    jobs, per_model = [], {}
    rnd = int(config[P.ROUND])
    for mid in train_ids:           # one random stream per model: order-free
        steps = config.get(f"{P.DATA_STEPS}.{mid}", config.get(P.DATA_STEPS))
        step_w = config.get(f"{STEP_WEIGHTS}.{mid}")
        if steps and step_w:
            x, y, batches = _weighted_batches(client, list(steps), list(step_w), cfg,
                                              client.rng(rnd, mid))
        else:
            x, y = client.fit_data(config, mid)   # cached and read only: masks and
                                                  # bootstrap samples make copies
            rows, batches = client.draws(rnd, mid, len(y), cfg, bool(config.get(BOOTSTRAP)))
            if rows is not None:
                x, y = np.take(x, rows, axis=0), y[rows]   # take: 3x faster than x[rows]
        x = masked(x, config, mid)
        jobs.append(FitJob(client.exp.spec, models[mid], x, y, batches, cfg, client.device,
                           numpy_kernel=_use_numpy(client, config, models[mid]),
                           optimizer_state=client.optimizer_state(config, mid, cfg)))
        per_model[mid] = {P.NUM_EXAMPLES: len(y)}
    results = yield jobs      # this client's NumPy models train together (one call per step)
    trained = {}
    for mid, (weights, loss) in zip(train_ids, results):
        trained[mid] = weights
        per_model[mid][P.TRAIN_LOSS] = loss
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

    def vote_accuracy(x: np.ndarray, y: np.ndarray) -> float:
        score = np.zeros((len(y), client.exp.scenario.num_classes))
        for i, w in zip(ids, weights):
            proba = model_proba(client, models[i], masked(x, config, i), config)
            if config[ENS_VOTE] == "hard":   # the server always says which vote
                score[np.arange(len(y)), proba.argmax(axis=1)] += w
            else:
                score += w * proba
        return float((score.argmax(axis=1) == y).mean()) if len(y) else float("nan")

    x, y = client.eval_data(config)
    metrics = {P.ACCURACY: vote_accuracy(x, y), P.NUM_EXAMPLES: len(y)}
    if (balanced := client.balanced_data(config)) is not None:
        metrics[P.BALANCED_ACCURACY] = vote_accuracy(*balanced)
    return metrics, {}, {}


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
