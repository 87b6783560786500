"""FedRC's and FedEM's client side (spec ``fedrc.md`` 2.3, 2.5-2.8, "Client-side requirements").

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
  up to ``fedrc-em-iters`` iterations from uniform, then the mixture predicts its test split.
"""

from __future__ import annotations

import numpy as np

from fedcluster_app.core import wire as P
from fedcluster_app.core.handlers import Models
from fedcluster_app.core.handlers import evaluate as plain_evaluate
from fedcluster_app.core.models import get_weights, scratch_model
from fedcluster_app.core.training import local_train, sample_losses
from fedcluster_app.core.stream_client import StreamClient

TRAIN_KIND = "train.fedrc"
EVAL_KIND = "evaluate.fedrc"

# config keys the server sends
OMEGA = "fedrc-omega"              # the client's cluster weights, aligned with the sorted model ids
PRIOR = "fedrc-prior"              # P~ flattened row-major (K x C); absent = uniform (FedEM)
HARD_TRAIN = "fedrc-hard-train"    # TrHC: omega (and gamma) one-hot on the argmax cluster
HARD_TEST = "fedrc-hard-test"      # TeHC: predict with the argmax-omega model only
OMEGA_FLOOR = "fedrc-omega-floor"  # lower bound on omega before the E-step (0 = off)
MASS_NOISE = "fedrc-mass-noise"    # std of Gaussian noise added to S (label privacy, 2.9.4)
ESTIMATE = "fedrc-estimate"        # evaluate: estimate omega on the adaptation split first
EM_ITERS = "fedrc-em-iters"
EM_TOL = "fedrc-em-tol"

# metric keys the client replies with
MASS = "label-cluster-mass"        # S, K x C flattened row-major
OMEGA_REPLY = "omega"
ITERATIONS = "em-iterations"


# ------------------------------------------------------------------ the E-step (pure numpy)
def responsibilities(losses: np.ndarray, y: np.ndarray, omega: np.ndarray,
                     log_prior: np.ndarray) -> np.ndarray:
    """gamma (N x K) from per-sample losses (N x K), labels, omega (K) and log P~ (K x C)."""
    with np.errstate(divide="ignore"):
        a = np.log(omega)[None, :] - losses - log_prior[:, y].T
    a = a - a.max(axis=1, keepdims=True)          # log-sum-exp: exact, no overflow
    e = np.exp(a)
    return e / e.sum(axis=1, keepdims=True)


def label_cluster_mass(gamma: np.ndarray, y: np.ndarray, num_classes: int) -> np.ndarray:
    """S[k, c] = sum of gamma[j, k] over the samples j of label c (K x C)."""
    onehot = np.zeros((len(y), num_classes))
    onehot[np.arange(len(y)), y] = 1.0
    return gamma.T @ onehot


def estimate_omega(losses: np.ndarray, y: np.ndarray, log_prior: np.ndarray, iters: int,
                   tol: float) -> tuple[np.ndarray, int]:
    """A new client's cluster weights: EM from uniform with the models fixed (spec 2.7)."""
    k = losses.shape[1]
    omega = np.full(k, 1.0 / k)
    for it in range(1, iters + 1):
        new = responsibilities(losses, y, omega, log_prior).mean(axis=0)
        done = float(np.abs(new - omega).max()) < tol
        omega = new
        if done:
            return omega, it
    return omega, iters


def one_hot(omega: np.ndarray) -> np.ndarray:
    out = np.zeros_like(omega)
    out[int(np.argmax(omega))] = 1.0
    return out


def log_prior_of(config: dict, k: int, c: int) -> np.ndarray:
    if PRIOR not in config:
        return np.full((k, c), np.log(1.0 / c))
    prior = np.asarray(config[PRIOR], dtype=np.float64)
    if prior.size != k * c:
        raise ValueError(f"{PRIOR} has {prior.size} values, expected K x C = {k} x {c}")
    return np.log(prior.reshape(k, c))


def _loss_matrix(client: StreamClient, models: Models, ids: list[int], x, y) -> np.ndarray:
    return np.stack([sample_losses(scratch_model(client.exp.spec, models[m]), x, y) for m in ids],
                    axis=1)


# ------------------------------------------------------------------ handlers
def train(client: StreamClient, config: dict, models: Models):
    ids = sorted(models)
    k, c = len(ids), client.exp.scenario.num_classes
    x, y = client.train_data(int(config[P.STEP]))
    omega = np.asarray(config[OMEGA], dtype=np.float64)
    if omega.shape != (k,):
        raise ValueError(f"{OMEGA} has {omega.size} values for {k} models")
    floor = float(config.get(OMEGA_FLOOR, 0.0))
    if floor > 0:
        omega = np.maximum(omega, floor)
        omega /= omega.sum()
    losses = _loss_matrix(client, models, ids, x, y)
    gamma = responsibilities(losses, y, omega, log_prior_of(config, k, c))
    new_omega = gamma.mean(axis=0)
    if config.get(HARD_TRAIN):
        new_omega = one_hot(new_omega)
        gamma = np.repeat(new_omega[None, :], len(y), axis=0)
    mass = label_cluster_mass(gamma, y, c)
    noise = float(config.get(MASS_NOISE, 0.0))
    if noise > 0:
        mass = mass + client.rng(int(config[P.ROUND]), -3).normal(0.0, noise, mass.shape)
    trained, per_model = {}, {}
    for j, mid in enumerate(ids):
        if new_omega[j] > 0:
            net = scratch_model(client.exp.spec, models[mid])
            local_train(net, x, y, client.train_config(config),
                        client.rng(int(config[P.ROUND]), mid), sample_weights=gamma[:, j])
            trained[mid] = get_weights(net)
        else:                                    # nothing assigned: the model goes back as is
            trained[mid] = models[mid]
        per_model[mid] = {P.NUM_EXAMPLES: len(y)}
    metrics = {P.NUM_EXAMPLES: len(y), OMEGA_REPLY: new_omega.tolist(),
               MASS: mass.ravel().tolist(), P.LOSSES: losses.mean(axis=0).tolist(),
               P.MODEL_IDS: ids}
    return metrics, trained, per_model


def evaluate(client: StreamClient, config: dict, models: Models):
    if not config.get(ESTIMATE):
        return plain_evaluate(client, config, models)
    ids = sorted(models)
    k, c = len(ids), client.exp.scenario.num_classes
    x, y = client.train_data(int(config[P.STEP]))            # the labelled adaptation split
    losses = _loss_matrix(client, models, ids, x, y)
    omega, iters = estimate_omega(losses, y, log_prior_of(config, k, c),
                                  int(config.get(EM_ITERS, 50)), float(config.get(EM_TOL, 1e-4)))
    weights = one_hot(omega) if config.get(HARD_TEST) else omega
    loss, n, m = client.evaluate_mixture([models[i] for i in ids], weights.tolist(), config)
    return ({P.LOSS: loss, P.NUM_EXAMPLES: n, **m, OMEGA_REPLY: omega.tolist(),
             ITERATIONS: iters}, {}, {})


from fedcluster_app.families.fedrc import fedsoft_client  # noqa: E402

HANDLERS = {TRAIN_KIND: train, EVAL_KIND: evaluate, **fedsoft_client.HANDLERS}
