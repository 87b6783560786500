"""FedSoft's client side (Ruan & Joe-Wong 2022, as spec ``fedrc.md`` 6 runs it).

``train.fedsoft``: the server sends the K cluster centres. The client scores each training
sample against every centre and counts which centre has the lowest loss:

    u_k = max(#{j : argmin_k' loss_k'(x_j, y_j) = k} / N, sigma),   renormalised to sum to 1,

then trains its personal model w (kept in ``context.state``; on first use a copy of its most
important centre) on CE + lambda/2 sum_k u_k ||w - c_k||^2, which, with sum_k u_k = 1, is FedProx
towards sum_k u_k c_k. It returns w (under the personal model id) and u.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fedcluster_app.core import wire as P
from fedcluster_app.core.handlers import Models
from fedcluster_app.core.models import get_weights, scratch_model
from fedcluster_app.core.training import local_train, sample_losses
from fedcluster_app.core.stream_client import PERSONAL_KEY, StreamClient

TRAIN_KIND = "train.fedsoft"
SIGMA = "fedsoft-sigma"          # smallest importance weight
LAMBDA = "fedsoft-lambda"        # proximal coefficient
IMPORTANCE = "importance"        # reply: u, aligned with the sorted centre ids


def importance_weights(losses: np.ndarray, sigma: float) -> np.ndarray:
    """u (K) from per-sample losses (N x K): share of samples each centre fits best, floored."""
    k = losses.shape[1]
    counts = np.bincount(np.argmin(losses, axis=1), minlength=k) / max(len(losses), 1)
    u = np.maximum(counts, sigma)
    return u / u.sum()


def train(client: StreamClient, config: dict, models: Models):
    ids = sorted(models)
    x, y = client.train_data(int(config[P.STEP]))
    spec = client.exp.spec
    losses = np.stack([sample_losses(scratch_model(spec, models[m]), x, y) for m in ids], axis=1)
    u = importance_weights(losses, float(config[SIGMA]))
    center = [sum(float(w) * models[m][i] for w, m in zip(u, ids)) for i in range(len(models[ids[0]]))]
    start = (client.personal_weights() if PERSONAL_KEY in client.state.array_records
             else models[ids[int(np.argmax(u))]])
    net = scratch_model(spec, start)
    cfg = dataclasses.replace(client.train_config(config), prox_mu=float(config[LAMBDA]))
    loss = local_train(net, x, y, cfg, client.rng(int(config[P.ROUND]), P.PERSONAL_MODEL_ID),
                       prox_center=center)
    weights = get_weights(net)
    client.store_personal(weights)
    metrics = {P.NUM_EXAMPLES: len(y), IMPORTANCE: u.tolist(), P.MODEL_IDS: ids,
               P.TRAIN_LOSS: loss}
    return metrics, {P.PERSONAL_MODEL_ID: weights}, {}


HANDLERS = {TRAIN_KIND: train}
