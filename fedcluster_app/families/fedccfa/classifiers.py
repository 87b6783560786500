"""FedCCFA's pure pieces (docs/fedccfa/README.md, "The algorithm"): MADD, DBSCAN over it, the entropy
weight, the paper's swap schedule and the drift/recovery numbers. No Flower, no torch:
unit-testable.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

#: FedCCFA's swap pairs of groups G1, G2, G3 (docs/fedccfa/README.md, The algorithm; D1), by ``k % 10``.
SWAP_PAIRS = ((1, 2), (3, 4), (5, 6))
PATTERNS = ("none", "sudden", "incremental", "recurring")


def swap_group(k: int) -> int:
    """0 (G1) for ``k % 10`` in {0,1,2}, 1 (G2) for {3,4,5}, 2 (G3) for {6,7,8,9}."""
    r = k % 10
    return 0 if r < 3 else (1 if r < 6 else 2)


def swap_pair(k: int, t: int, pattern: str, start: int = 100, gap: int = 10,
              revert: int = 150) -> tuple[int, int] | None:
    """The label swap client ``k`` has at (0-indexed) round ``t`` (docs/fedccfa/README.md, Drift patterns).

    ``sudden``: every group swaps at ``start``; ``incremental``: group g at ``start + g * gap``;
    ``recurring`` ("reoccurring"): every group at ``start``, back to the original labels at
    ``revert``; ``none``: never. Paper values: 100, 10, 150 of T = 200.
    """
    pattern = {"reoccurring": "recurring", "static": "none"}.get(pattern, pattern)
    if pattern not in PATTERNS:
        raise ValueError(f"unknown drift pattern {pattern!r}; valid: {', '.join(PATTERNS)}")
    g = swap_group(k)
    if pattern == "none":
        return None
    first = start + g * gap if pattern == "incremental" else start
    if t < first or (pattern == "recurring" and t >= revert):
        return None
    return SWAP_PAIRS[g]


def apply_swap(y: np.ndarray, pair: tuple[int, int] | None) -> np.ndarray:
    """Relabel class a as b and b as a (an involution); ``None`` = unchanged."""
    y = np.asarray(y).copy()
    if pair is None:
        return y
    a, b = pair
    ia, ib = y == a, y == b
    y[ia], y[ib] = b, a
    return y


def madd(vectors: np.ndarray) -> np.ndarray:
    """MADD distance matrix (Eq. 4) of the rows of ``vectors`` (n x p), over cosine similarity:
    ``D[i, j] = mean over q not in {i, j} of |S[i, q] - S[j, q]|``, ``D[i, i] = 0``.

    Needs n >= 3 (the mean over q is empty otherwise). Zero vectors have similarity 0 to all.
    """
    v = np.asarray(vectors, dtype=np.float64)
    if v.ndim != 2:
        raise ValueError(f"madd needs a 2-d array of row vectors, got shape {v.shape}")
    n = v.shape[0]
    if n < 3:
        raise ValueError(f"madd needs at least 3 vectors, got {n}")
    norms = np.linalg.norm(v, axis=1, keepdims=True)
    u = np.divide(v, norms, out=np.zeros_like(v), where=norms > 0)
    s = u @ u.T
    diff = np.abs(s[:, None, :] - s[None, :, :])          # [i, j, q] = |S[i,q] - S[j,q]|
    total = diff.sum(axis=2)
    idx = np.arange(n)
    # remove q = i and q = j
    total -= diff[idx[:, None], idx[None, :], idx[:, None]]
    total -= diff[idx[:, None], idx[None, :], idx[None, :]]
    d = total / (n - 2)
    np.fill_diagonal(d, 0.0)
    return np.maximum(d, 0.0)


def connected_components(dist: np.ndarray, eps: float) -> np.ndarray:
    """Labels of the connected components of the graph with an edge where ``dist <= eps``
    (= DBSCAN with ``min_samples = 1``: every point is a core point). Labels are 0.. in order of
    each component's smallest member."""
    d = np.asarray(dist)
    n = d.shape[0]
    parent = list(range(n))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in range(n):
        for j in range(i + 1, n):
            if d[i, j] <= eps:
                ri, rj = find(i), find(j)
                if ri != rj:
                    parent[max(ri, rj)] = min(ri, rj)
    roots: dict[int, int] = {}
    return np.array([roots.setdefault(find(i), len(roots)) for i in range(n)], dtype=np.int64)


def dbscan_labels(dist: np.ndarray, eps: float, min_samples: int) -> np.ndarray:
    """DBSCAN over a precomputed distance matrix. ``min_samples = 1`` is connected components
    (dependency-free); otherwise scikit-learn's DBSCAN, whose noise points (-1) each become
    their own singleton cluster (they share nothing)."""
    if min_samples <= 1:
        return connected_components(dist, eps)
    from sklearn.cluster import DBSCAN

    labels = DBSCAN(eps=eps, min_samples=min_samples, metric="precomputed").fit(
        np.asarray(dist, dtype=np.float64)).labels_.astype(np.int64)
    nxt = int(labels.max()) + 1 if len(labels) else 0
    for i in np.flatnonzero(labels < 0):
        labels[i] = nxt
        nxt += 1
    return labels


def label_entropy(counts: Sequence[float]) -> float:
    """Shannon entropy (natural log) of the empirical label distribution; zero counts add 0."""
    c = np.asarray(counts, dtype=np.float64)
    total = c.sum()
    if total <= 0:
        return 0.0
    p = c[c > 0] / total
    return float(-(p * np.log(p)).sum())


def entropy_weight(counts: Sequence[float], gamma: float) -> float:
    """FedCCFA's adaptive alignment weight lambda = H(P_k(Y)) / gamma (Eq. 9)."""
    if not gamma > 0:
        raise ValueError(f"gamma must be > 0, got {gamma}")
    return label_entropy(counts) / gamma


def drift_recovery(series: Sequence[float | None], drift_index: int, baseline_window: int = 3,
                   tol: float = 0.01) -> dict[str, float | int | None]:
    """Accuracy drop after a drift and rounds to recover.

    ``series[i]`` is the accuracy after round ``i + 1``; the drift hits round ``drift_index + 1``.
    ``before`` = mean of the ``baseline_window`` rounds before the drift; ``drop`` = before - the
    lowest accuracy from the drift on; ``rounds_to_recover`` = rounds from the drift until the
    accuracy is back within ``tol`` of ``before`` (``None`` if never).
    """
    vals = [float("nan") if v is None else float(v) for v in series]
    pre = [v for v in vals[max(0, drift_index - baseline_window):drift_index] if not math.isnan(v)]
    post = [(i, v) for i, v in enumerate(vals) if i >= drift_index and not math.isnan(v)]
    if not pre or not post:
        return {"before": None, "drop": None, "rounds_to_recover": None}
    before = float(np.mean(pre))
    low = min(v for _, v in post)
    rec: int | None = 0
    dropped = False
    for i, v in post:
        if v < before - tol:
            dropped, rec = True, None
        elif dropped:
            rec = i - drift_index
            break
    return {"before": before, "drop": before - low, "rounds_to_recover": rec}
