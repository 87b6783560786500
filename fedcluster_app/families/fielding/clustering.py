"""Fielding's clustering routine and drift handling (docs/fielding/README.md, "The algorithm as
implemented"): what the strategies in ``fielding.py`` and ``auxo.py`` call. Pure NumPy, no Flower.

* :func:`cluster` -- K chosen by the silhouette over ``k_min..min(k_max, N-1)`` (ties: smaller K),
  with the k-means of ``kmeans.py`` for every K;
* :func:`silhouette` -- the mean silhouette with rho, computed exactly from per-cluster distance
  sums (``distances.Points.cluster_sums``) without the N x N matrix where rho allows;
* :func:`handle_drift` -- phase 1 (drifted clients to the nearest *frozen* center), phase 2
  (recompute centers, center-shift trigger ``max shift >= tau * theta``, diameter trigger).

The pieces under them, each in a module of its own: the distances rho (``distances.py``),
k-means and its seeding (``kmeans.py``), the lock-step l1 engine for many restarts at once
(``lockstep.py``, over ``l1_entries.py``; its full pass compiled in ``compiled.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from fedcluster_app.families.fielding.distances import Points, distance, pairwise
from fedcluster_app.families.fielding.kmeans import kmeans_each_k


def silhouette(pts: Points, labels: np.ndarray) -> float:
    """Mean silhouette with rho (s_i = 0 for singleton clusters); needs >= 2 clusters."""
    k = int(labels.max()) + 1
    if k < 2:
        return 0.0
    sums = pts.cluster_sums(labels, k)
    counts = np.bincount(labels, minlength=k).astype(np.float64)
    own = sums[np.arange(pts.n), labels]
    own_n = counts[labels] - 1.0
    a = np.divide(own, own_n, out=np.zeros_like(own), where=own_n > 0)
    mean_other = sums / np.maximum(counts, 1.0)[None, :]
    mean_other[np.arange(pts.n), labels] = np.inf
    mean_other[:, counts == 0] = np.inf
    b = mean_other.min(1)
    den = np.maximum(a, b)
    s = np.divide(b - a, den, out=np.zeros_like(a), where=den > 0)
    s[own_n <= 0] = 0.0
    return float(s.mean())


@dataclass
class ClusterResult:
    labels: np.ndarray
    centers: np.ndarray
    k: int
    silhouette: float
    scores: dict[int, float] = field(default_factory=dict)


def k_range(k_min: int, k_max: int, n: int) -> range:
    """The K values tried for n clients: k_min..min(k_max, n - 1)."""
    return range(k_min, min(k_max, n - 1) + 1)


def cluster(x: np.ndarray, metric: str, k_min: int = 2, k_max: int = 10, n_init: int = 10,
            seed: int | list[int] = 0, min_silhouette: float = -1.0,
            pts: Points | None = None, tol: float = 0.0, keep: int | None = None,
            prune_at: int = 3, batched: bool | None = None) -> ClusterResult:
    """The silhouette search (docs/fielding/README.md, D5): k-means for every K in range, the best
    silhouette wins (ties -> smaller K). Fewer than 3 clients, or a best silhouette below
    ``min_silhouette``: one cluster."""
    pts = pts or Points(x, metric)
    rng = np.random.default_rng(seed)
    best: ClusterResult | None = None
    scores: dict[int, float] = {}
    ks = list(k_range(k_min, k_max, pts.n))
    for k, res in zip(ks, kmeans_each_k(pts, ks, n_init, rng, tol=tol, keep=keep,
                                     prune_at=prune_at, batched=batched)):
        s = silhouette(pts, res.labels)
        scores[k] = s
        if best is None or s > best.silhouette:
            best = ClusterResult(res.labels, res.centers, len(res.centers), s)
    if best is None or best.silhouette < min_silhouette:
        labels = np.zeros(pts.n, dtype=np.int64)
        return ClusterResult(labels, pts.x.mean(0, keepdims=True), 1,
                             best.silhouette if best else 0.0, scores)
    best.scores = scores
    return best


# ------------------------------------------------------------------------------- drift handling
@dataclass
class DriftOutcome:
    labels: np.ndarray                  # cluster ids after the phase-1 moves
    moves: list[tuple[int, int, int]]   # (row, old cluster or -1, new cluster)
    centers: dict[int, np.ndarray]      # recomputed centers of the non-empty clusters
    emptied: list[int]                  # clusters that lost all members
    shifts: dict[int, float]
    theta: float                        # mean pairwise distance of the reference centers
    threshold: float                    # tau * theta
    trigger: str | None                 # why a global re-clustering is needed (None: it is not)
    max_diameter: float | None = None


def max_diameter(pts: Points, labels: np.ndarray) -> float:
    """Largest rho between two members of one cluster."""
    best = 0.0
    for c in np.unique(labels):
        rows = np.flatnonzero(labels == c)
        if len(rows) < 2:
            continue
        sub = Points(pts.x[rows], pts.metric)
        for s in range(0, len(rows), 512):
            best = max(best, float(sub.to_centers(sub.x[s:s + 512]).max()))
    return best


def handle_drift(pts: Points, labels: np.ndarray, drifted: np.ndarray,
                 centers: dict[int, np.ndarray], reference: dict[int, np.ndarray],
                 tau: float, trigger: str = "center_shift",
                 delta_diam: float = math.inf) -> DriftOutcome:
    """HANDLE_DRIFT (docs/fielding/README.md, "The algorithm as implemented", steps 1-3; D2, D3, D6)
    (it does not re-cluster; ``trigger`` says whether to).

    ``labels`` holds each row's cluster id (-1: never clustered, moved like a drifted client),
    ``drifted`` a boolean mask, ``centers`` the current (frozen) centers, ``reference`` the centers
    the shift is measured against (the same dict for ``shift_reference = "step"``).
    """
    labels = np.asarray(labels).copy()
    ids = sorted(centers)
    movers = np.flatnonzero(np.asarray(drifted, dtype=bool) | (labels < 0))
    moves: list[tuple[int, int, int]] = []
    if ids and len(movers):
        frozen = np.stack([centers[c] for c in ids])
        sub = Points(pts.x[movers], pts.metric)
        nearest = sub.to_centers(frozen).argmin(1)
        for row, j in zip(movers, nearest):
            new = ids[int(j)]
            if labels[row] != new:
                moves.append((int(row), int(labels[row]), new))
                labels[row] = new
    present = sorted(set(int(c) for c in labels if c >= 0))
    new_centers = {c: pts.x[labels == c].mean(0) for c in present}
    emptied = [c for c in ids if c not in new_centers]
    ref_ids = [c for c in present if c in reference]
    theta = 0.0
    if len(ref_ids) >= 2:
        ref = np.stack([reference[c] for c in ref_ids])
        d = pairwise(ref, pts.metric)
        iu = np.triu_indices(len(ref_ids), 1)
        theta = float(d[iu].mean())
    shifts = {c: distance(new_centers[c], reference[c], pts.metric) for c in ref_ids}
    threshold = tau * theta if math.isfinite(tau) else math.inf
    why = None
    if not ids or not present:
        why = "no clusters"
    elif len(ref_ids) < 2 and math.isfinite(tau):
        why = "fewer than 2 clusters"
    elif trigger in ("center_shift", "either") and shifts and max(shifts.values()) >= threshold:
        why = "center_shift"
    diam = None
    if trigger in ("pairwise", "either"):
        diam = max_diameter(pts, labels)
        if why is None and diam > delta_diam:
            why = "diameter"
    return DriftOutcome(labels, moves, new_centers, emptied, shifts, theta, threshold, why, diam)
