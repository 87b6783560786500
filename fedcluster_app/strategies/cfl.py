"""Clustered Federated Learning (Sattler et al.): the splitting rule, written once for reuse.

After a round, a cluster whose clients have (almost) converged on average but not individually
(mean update norm < eps1 and largest update norm > eps2) is bipartitioned by complete-linkage
clustering of the pairwise cosine similarities of the clients' updates; the split is made if
sqrt((1 - alpha_cross) / 2) > gamma, alpha_cross being the largest similarity across the two
groups. ``CFLSplitter`` holds the thresholds: fixed eps1/eps2, or the FedDrift reference-code
heuristic eps1 = (largest mean-update norm seen so far) / 10, eps2 = 6 eps1, tested only in
rounds where the mean norm is not a new maximum (feddrift.md section 4.4).

Used by the FedDrift baselines ``cfl`` / ``cfl-w`` (``feddrift_baselines``); usable by any
strategy that has the clients' updates of one cluster as flat vectors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import squareform


def flatten(weights: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in weights])


def pairwise_cosine(updates: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(updates, axis=1, keepdims=True)
    unit = updates / np.maximum(norms, 1e-12)
    return np.clip(unit @ unit.T, -1.0, 1.0)


def bipartition(similarity: np.ndarray) -> tuple[list[int], list[int]]:
    """Two groups by complete-linkage agglomerative clustering on the distance 1 - similarity."""
    n = len(similarity)
    if n < 2:
        raise ValueError("bipartition needs at least 2 clients")
    dist = 1.0 - similarity
    np.fill_diagonal(dist, 0.0)
    labels = fcluster(linkage(squareform(np.maximum(dist, 0.0), checks=False), "complete"),
                      2, criterion="maxclust")
    a = [i for i in range(n) if labels[i] == labels[0]]
    b = [i for i in range(n) if labels[i] != labels[0]]
    return a, b


@dataclass
class CFLSplitter:
    gamma: float = 0.1
    eps1: float | None = None          # None: the reference-code heuristic
    eps2: float | None = None
    max_mean_norm: float = 0.0

    def propose(self, updates: np.ndarray) -> tuple[list[int], list[int]] | None:
        """Rows of ``updates`` are the clients' flat updates of one cluster in one round; returns
        the two groups (row indices) if the cluster should split, else None."""
        if len(updates) < 2:
            return None
        mean_norm = float(np.linalg.norm(updates.mean(axis=0)))
        max_norm = float(np.linalg.norm(updates, axis=1).max())
        if self.eps1 is None:
            if mean_norm > self.max_mean_norm:
                self.max_mean_norm = mean_norm
                return None
            eps1 = self.max_mean_norm / 10.0
            eps2 = 6.0 * eps1
        else:
            eps1, eps2 = self.eps1, self.eps2 if self.eps2 is not None else 6.0 * self.eps1
        if not (mean_norm < eps1 and max_norm > eps2):
            return None
        sim = pairwise_cosine(updates)
        a, b = bipartition(sim)
        if not b:
            return None
        alpha_cross = float(sim[np.ix_(a, b)].max())
        if np.sqrt((1.0 - alpha_cross) / 2.0) > self.gamma:
            return a, b
        return None
