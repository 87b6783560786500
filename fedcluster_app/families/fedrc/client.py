"""The FedRC family's client side: FedRC, FedEM and FedSoft (the maths is in ``em.py``).

* ``train.fedrc``: the server sends all K cluster models, the client's cluster weights omega
  (kept by the server, so a client that restarts or a resumed run loses nothing) and, for FedRC,
  the label-frequency estimates P~ (K x C). The client runs one E-step on its training window,

      gamma[j, k] = softmax_k( log omega[k] - loss_k(x_j, y_j) - log P~[k, y_j] ),
      omega_new   = mean_j gamma[j, :],       S[k, y] = sum_j 1{y_j = y} gamma[j, k],

  then trains each model k with the gamma[:, k]-weighted cross-entropy (averaged over the batch
  size) and returns all K models, omega_new and S. FedEM is the same with P~ uniform.
* ``evaluate.fedrc``: local evaluation as the built-in ``evaluate`` (a mixture of the models by
  the client's omega), or, with ``fedrc-estimate``, a client that never trained (a held-out
  test client): omega is estimated by EM on its labelled adaptation split (its training split),
  up to ``em-iters`` iterations from uniform, then the mixture predicts its test split.
* ``train.fedsoft``: the server sends the K cluster centres. The client scores each training
  sample against every centre and counts which centre has the lowest loss,
  u_k = max(#{j : argmin_k' loss_k'(x_j, y_j) = k} / N, sigma), renormalised to sum to 1, then
  trains its personal model w (kept in ``context.state``; on first use a copy of its most
  important centre) on CE + lambda/2 sum_k u_k ||w - c_k||^2, which, with sum_k u_k = 1, is
  FedProx towards sum_k u_k c_k. It returns w (under the personal model id) and u.

Each message carries the strategy's hyper-parameters (``params.FedRCParams`` /
``params.FedSoftParams``); the client reads them through those classes.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fedcluster_app.core import wire as P
from fedcluster_app.core.client.handlers import Models
from fedcluster_app.core.client.handlers import evaluate as plain_evaluate
from fedcluster_app.core.client.stream_client import PERSONAL_KEY, StreamClient
from fedcluster_app.core.training import sample_losses
from fedcluster_app.families.fedrc.em import (
    estimate_omega,
    importance_weights,
    label_cluster_mass,
    one_hot,
    responsibilities,
)
from fedcluster_app.families.fedrc.params import FedRCParams, FedSoftParams
from fedcluster_app.families.fedrc.wire import (
    ESTIMATE,
    EVAL_KIND,
    FEDSOFT_PARAMS,
    FEDSOFT_TRAIN_KIND,
    IMPORTANCE,
    ITERATIONS,
    MASS,
    OMEGA,
    OMEGA_REPLY,
    PARAMS,
    PRIOR,
    TRAIN_KIND,
)


def log_prior_of(config: dict, k: int, c: int) -> np.ndarray:
    if PRIOR not in config:
        return np.full((k, c), np.log(1.0 / c))
    prior = np.asarray(config[PRIOR], dtype=np.float64)
    if prior.size != k * c:
        raise ValueError(f"{PRIOR} has {prior.size} values, expected K x C = {k} x {c}")
    return np.log(prior.reshape(k, c))


def _loss_matrix(client: StreamClient, models: Models, ids: list[int], x, y) -> np.ndarray:
    return np.stack([sample_losses(client.scratch(models[m]), x, y) for m in ids],
                    axis=1)


# ------------------------------------------------------------------ handlers
def train(client: StreamClient, config: dict, models: Models):
    ids = sorted(models)
    k, c = len(ids), client.exp.scenario.num_classes
    x, y = client.train_data(int(config[P.STEP]))
    p = FedRCParams.from_message(config, PARAMS)
    omega = np.asarray(config[OMEGA], dtype=np.float64)
    if omega.shape != (k,):
        raise ValueError(f"{OMEGA} has {omega.size} values for {k} models")
    if p.omega_floor > 0:
        omega = np.maximum(omega, p.omega_floor)
        omega /= omega.sum()
    losses = _loss_matrix(client, models, ids, x, y)
    gamma = responsibilities(losses, y, omega, log_prior_of(config, k, c))
    new_omega = gamma.mean(axis=0)
    if p.hard_train:
        new_omega = one_hot(new_omega)
        gamma = np.repeat(new_omega[None, :], len(y), axis=0)
    mass = label_cluster_mass(gamma, y, c)
    if p.mass_noise > 0:
        mass = mass + client.rng(int(config[P.ROUND]), -3).normal(0.0, p.mass_noise, mass.shape)
    # a model nothing is assigned to goes back as it came
    active = [j for j in range(k) if new_omega[j] > 0]
    results = yield [client.job(models[ids[j]], x, y, config, ids[j], sample_weights=gamma[:, j])
                     for j in active]
    trained = {mid: models[mid] for mid in ids}
    trained.update({ids[j]: r.weights for j, r in zip(active, results)})
    per_model = {mid: {P.NUM_EXAMPLES: len(y)} for mid in ids}
    # each model's loss is weighted by its responsibilities, so their sum is the objective the
    # client's step minimised (sum_j mean_i gamma_ij * loss_ij)
    metrics = {P.NUM_EXAMPLES: len(y), P.TRAIN_LOSS: sum(r.loss for r in results),
               OMEGA_REPLY: new_omega.tolist(), MASS: mass.ravel().tolist(),
               P.LOSSES: losses.mean(axis=0).tolist(), P.MODEL_IDS: ids}
    return metrics, trained, per_model


def evaluate(client: StreamClient, config: dict, models: Models):
    if not config.get(ESTIMATE):
        return plain_evaluate(client, config, models)
    p = FedRCParams.from_message(config, PARAMS)
    ids = sorted(models)
    k, c = len(ids), client.exp.scenario.num_classes
    x, y = client.train_data(int(config[P.STEP]))            # the labelled adaptation split
    losses = _loss_matrix(client, models, ids, x, y)
    omega, iters = estimate_omega(losses, y, log_prior_of(config, k, c),
                                  p.em_iters, p.em_tol)
    weights = one_hot(omega) if p.hard_test else omega
    loss, n, m = client.evaluate_mixture([models[i] for i in ids], weights.tolist(), config)
    return ({P.LOSS: loss, P.NUM_EXAMPLES: n, **m, OMEGA_REPLY: omega.tolist(),
             ITERATIONS: iters}, {}, {})


def fedsoft_train(client: StreamClient, config: dict, models: Models):
    ids = sorted(models)
    x, y = client.train_data(int(config[P.STEP]))
    losses = np.stack([sample_losses(client.scratch(models[m]), x, y) for m in ids], axis=1)
    p = FedSoftParams.from_message(config, FEDSOFT_PARAMS)
    u = importance_weights(losses, p.sigma)
    center = [sum(float(w) * models[m][i] for w, m in zip(u, ids)) for i in range(len(models[ids[0]]))]
    start = (client.personal_weights() if PERSONAL_KEY in client.state.array_records
             else models[ids[int(np.argmax(u))]])
    cfg = dataclasses.replace(client.train_config(config), prox_mu=p.lam)
    (weights, loss), = yield [client.job(start, x, y, config, P.PERSONAL_MODEL_ID, cfg=cfg,
                                         prox_center=center)]
    client.store_personal(weights)
    metrics = {P.NUM_EXAMPLES: len(y), IMPORTANCE: u.tolist(), P.MODEL_IDS: ids,
               P.TRAIN_LOSS: loss}
    return metrics, {P.PERSONAL_MODEL_ID: weights}, {}


HANDLERS = {TRAIN_KIND: train, EVAL_KIND: evaluate, FEDSOFT_TRAIN_KIND: fedsoft_train}
