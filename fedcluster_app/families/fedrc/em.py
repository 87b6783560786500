"""FedRC's, FedEM's and FedSoft's client-side maths, in NumPy (no Flower, no torch).

With per-sample losses L[j, k] of the K models, the cluster weights omega and the label
frequencies P~[k, y] (uniform for FedEM), one E-step is

    gamma[j, k] = softmax_k( log omega[k] - L[j, k] - log P~[k, y_j] ),
    omega_new   = mean_j gamma[j, :],       S[k, y] = sum_j 1{y_j = y} gamma[j, k].

A client that never trained (a held-out test client) estimates omega by iterating the E-step
from uniform with the models fixed. FedSoft's importance weights u_k are the share of samples
each centre fits best, floored at sigma.
"""

from __future__ import annotations

import numpy as np


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
    """A new client's cluster weights: EM from uniform with the models fixed."""
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


def importance_weights(losses: np.ndarray, sigma: float) -> np.ndarray:
    """u (K) from per-sample losses (N x K): share of samples each centre fits best, floored."""
    k = losses.shape[1]
    counts = np.bincount(np.argmin(losses, axis=1), minlength=k) / max(len(losses), 1)
    u = np.maximum(counts, sigma)
    return u / u.sum()
