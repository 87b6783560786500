"""Fielding's clustering logic in pure NumPy (fielding.md sections 2.2-2.5 and 2.8).

No Flower here: the strategies in ``fielding.py`` call these functions, the benchmarks time them
and the tests check them directly.

* :func:`to_centers` / :func:`distance` -- the pluggable distances rho: ``l1`` (default for label
  vectors), ``js`` (Jensen-Shannon distance, log base 2, in [0, 1]), ``sqeuclidean`` (embeddings),
  ``cosine`` (gradients).
* :func:`kmeans` -- Lloyd iterations with rho for the assignment, arithmetic-mean centers, k-means++
  seeding with rho, ``n_init`` restarts, lowest cost kept, empty clusters dropped.
* :func:`silhouette` -- the mean silhouette with rho, computed exactly from per-cluster distance
  sums ``S[i, k] = sum_{j in C_k} rho(r_i, r_j)`` without the N x N matrix for l1 (a sort per
  coordinate), sqeuclidean and cosine (closed forms); js falls back to the pairwise matrix.
* :func:`cluster` -- K chosen by the silhouette over ``k_min..min(k_max, N-1)`` (ties: smaller K).
* :func:`handle_drift` -- phase 1 (drifted clients to the nearest *frozen* center), phase 2
  (recompute centers, center-shift trigger ``max shift >= tau * theta``, diameter trigger).

Label vectors of streaming clients are sparse (a window holds a few of the labels), so l1 works on
the non-zero entries only: ``|x - c|_1 = |c|_1 + sum_{y in supp x} (|x_y - c_y| - |c_y|)``, which is
exact for any vectors and costs O(nnz * K) instead of O(N * d * K).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy import sparse
from scipy.special import xlogy

METRICS = ("l1", "js", "sqeuclidean", "cosine")
TRIGGERS = ("center_shift", "pairwise", "either")
SHIFT_REFERENCES = ("step", "last_global")
_LN2 = math.log(2.0)


# ------------------------------------------------------------------------------- distances
class Points:
    """Representations prepared once for repeated distance computations (N x d, float64)."""

    def __init__(self, x: np.ndarray, metric: str) -> None:
        if metric not in METRICS:
            raise ValueError(f"unknown distance {metric!r}; valid: {', '.join(METRICS)}")
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2:
            raise ValueError(f"representations must be an (N, d) array, got shape {x.shape}")
        self.x = x
        self.metric = metric
        self.n, self.d = x.shape
        self._csr = None
        self._sorted = None
        self._pair = None
        if metric == "l1":
            nnz = int(np.count_nonzero(x))
            if nnz <= 0.35 * x.size:
                self._csr = sparse.csr_matrix(x)
                lengths = np.diff(self._csr.indptr)
                self._rows = np.repeat(np.arange(self.n), lengths)
                # sums the contributions of each row's stored entries: (N x nnz) @ (nnz x K)
                self._rowsum = sparse.csr_matrix(
                    (np.ones(len(self._rows)), self._csr.indices * 0 + np.arange(len(self._rows)),
                     self._csr.indptr), shape=(self.n, len(self._rows)))
        if metric == "cosine":
            norms = np.linalg.norm(x, axis=1, keepdims=True)
            self.unit = np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)
        if metric == "sqeuclidean":
            self.sq = (x * x).sum(1)

    def to_centers(self, centers: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """(N, K) distances rho(r_i, mu_k) (only of ``rows`` when given)."""
        c = np.atleast_2d(np.asarray(centers, dtype=np.float64))
        if rows is not None:
            if self._csr is not None:
                sub = self._csr[rows]
                rowsum = sparse.csr_matrix(
                    (np.ones(sub.nnz), np.arange(sub.nnz), sub.indptr), shape=(len(rows), sub.nnz))
                return _l1_sparse(c, sub.indices, sub.data, rowsum)
            return Points(self.x[rows], self.metric).to_centers(c)
        if self.metric == "l1":
            if self._csr is not None:
                return _l1_sparse(c, self._csr.indices, self._csr.data, self._rowsum)
            return np.stack([np.abs(self.x - ck).sum(1) for ck in c], axis=1)
        if self.metric == "sqeuclidean":
            d = self.sq[:, None] - 2.0 * self.x @ c.T + (c * c).sum(1)[None, :]
            return np.maximum(d, 0.0)
        if self.metric == "cosine":
            cn = np.linalg.norm(c, axis=1, keepdims=True)
            cu = np.divide(c, cn, out=np.zeros_like(c), where=cn > 0)
            return np.clip(1.0 - self.unit @ cu.T, 0.0, 2.0)
        return np.stack([_js(self.x, ck[None, :]) for ck in c], axis=1)

    # -- S[i, k] = sum_{j in C_k} rho(r_i, r_j) -------------------------------------------
    def cluster_sums(self, labels: np.ndarray, k: int) -> np.ndarray:
        onehot = np.zeros((self.n, k))
        onehot[np.arange(self.n), labels] = 1.0
        counts = onehot.sum(0)
        if self.metric == "sqeuclidean":
            s = onehot.T @ self.x
            q = onehot.T @ self.sq
            return np.maximum(self.sq[:, None] * counts[None, :] - 2.0 * self.x @ s.T + q[None, :], 0.0)
        if self.metric == "cosine":
            return np.maximum(counts[None, :] - self.unit @ (onehot.T @ self.unit).T, 0.0)
        if self.metric == "js":
            if self._pair is None:
                self._pair = pairwise(self.x, "js")
            return self._pair @ onehot
        return self._l1_sums(onehot, counts)

    def _l1_sums(self, onehot: np.ndarray, counts: np.ndarray) -> np.ndarray:
        # Entries of X (the non-zeros, or all of them for dense data) sorted by (column, value).
        if self._sorted is None:
            if self._csr is not None:
                coo = self._csr.tocoo()
                rows, cols, vals = coo.row, coo.col, coo.data
            else:
                rows = np.repeat(np.arange(self.n), self.d)
                cols = np.tile(np.arange(self.d), self.n)
                vals = self.x.ravel()
            order = np.lexsort((vals, cols))
            rows, cols, vals = rows[order], cols[order], vals[order]
            starts = np.searchsorted(cols, np.arange(self.d), side="left")
            ends = np.searchsorted(cols, np.arange(self.d), side="right")
            rowsum = sparse.csr_matrix((np.ones(len(rows)), (rows, np.arange(len(rows)))),
                                       shape=(self.n, len(rows)))
            self._sorted = (rows, cols, vals, starts[cols], ends[cols] - 1, rowsum)
        rows, cols, vals, seg_start, seg_end, rowsum = self._sorted
        m = onehot[rows]                                   # nnz x K: cluster of each entry
        zero = np.zeros((1, m.shape[1]))
        cnt0 = np.vstack([zero, np.cumsum(m, axis=0)])
        tot0 = np.vstack([zero, np.cumsum(m * vals[:, None], axis=0)])
        pos = np.arange(1, len(vals) + 1)
        le_cnt = cnt0[pos] - cnt0[seg_start]
        le_sum = tot0[pos] - tot0[seg_start]
        all_cnt = cnt0[seg_end + 1] - cnt0[seg_start]
        all_sum = tot0[seg_end + 1] - tot0[seg_start]
        v = vals[:, None]
        # sum of |x_iy - x_jy| over the stored entries j of column y that lie in cluster k
        # (ties contribute 0 whichever side they fall on)
        entry = v * le_cnt - le_sum + (all_sum - le_sum) - v * (all_cnt - le_cnt)
        if self._csr is None:                              # dense: every entry was stored
            return np.asarray(rowsum @ entry)
        # sparse: an unstored x_jy = 0 adds |x_iy|; for an unstored x_iy = 0 the column adds
        # sum_{j in k} |x_jy|, counted for every column and taken back on the stored ones
        abs_col = onehot.T @ np.abs(self.x)                # K x d
        nnz_col = onehot.T @ (self.x != 0).astype(np.float64)
        entry = entry + np.abs(v) * (counts[None, :] - nnz_col[:, cols].T) - abs_col[:, cols].T
        return abs_col.sum(1)[None, :] + np.asarray(rowsum @ entry)


def _l1_sparse(c: np.ndarray, cols: np.ndarray, vals: np.ndarray, rowsum) -> np.ndarray:
    """|x - c|_1 = |c|_1 + sum over the stored entries of (|x_y - c_y| - |c_y|); for x, c >= 0
    (label vectors and their means) that is |c|_1 + |x|_1 - 2 sum min(x_y, c_y), fewer passes."""
    cv = np.ascontiguousarray(c.T)[cols]                    # nnz x K
    if c.min() >= 0 and (len(vals) == 0 or vals.min() >= 0):
        np.minimum(cv, vals[:, None], out=cv)
        out = rowsum @ cv
        out *= -2.0
        out += (rowsum @ vals)[:, None]
        out += c.sum(1)[None, :]
        return out
    contrib = np.abs(vals[:, None] - cv)
    contrib -= np.abs(cv)
    return np.abs(c).sum(1)[None, :] + rowsum @ contrib


def _rowwise(a: np.ndarray, b: np.ndarray, metric: str) -> np.ndarray:
    """rho(a_k, b_k) for every row k."""
    if metric == "l1":
        return np.abs(a - b).sum(1)
    if metric == "js":
        return _js(a, b)
    return np.array([distance(x, y, metric) for x, y in zip(a, b)])


def _js(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Jensen-Shannon distance (log base 2) between rows of p and q (broadcast)."""
    m = 0.5 * (p + q)
    kl_pm = (xlogy(p, p) - xlogy(p, m)).sum(-1)
    kl_qm = (xlogy(q, q) - xlogy(q, m)).sum(-1)
    return np.sqrt(np.maximum(0.5 * (kl_pm + kl_qm) / _LN2, 0.0))


def distance(a: np.ndarray, b: np.ndarray, metric: str) -> float:
    """rho(a, b) for two vectors."""
    a = np.asarray(a, dtype=np.float64)[None, :]
    return float(Points(a, metric).to_centers(np.asarray(b, dtype=np.float64)[None, :])[0, 0])


def pairwise(x: np.ndarray, metric: str) -> np.ndarray:
    """Full (N, N) distance matrix (small N: diameters, JS silhouettes, tests)."""
    pts = Points(x, metric)
    out = np.empty((pts.n, pts.n))
    for s in range(0, pts.n, 256):
        out[:, s:s + 256] = pts.to_centers(pts.x[s:s + 256])
    np.fill_diagonal(out, 0.0)
    return out


# ------------------------------------------------------------------------------- clustering
def _means(pts: Points, labels: np.ndarray, k: int, old: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    counts = np.bincount(labels, minlength=k).astype(np.float64)
    if pts._csr is not None:
        sums = np.bincount(labels[pts._rows] * pts.d + pts._csr.indices, weights=pts._csr.data,
                           minlength=k * pts.d).reshape(k, pts.d)
    else:
        onehot = np.zeros((k, pts.n))
        onehot[labels, np.arange(pts.n)] = 1.0
        sums = onehot @ pts.x
    centers = np.divide(sums, counts[:, None], out=np.zeros_like(sums), where=counts[:, None] > 0)
    if old is not None:  # keep the old center of an empty cluster
        centers[counts == 0] = old[counts == 0]
    return centers, counts


def kmeans_pp(pts: Points, k: int, rng: np.random.Generator) -> np.ndarray:
    """k-means++ seeding with rho: next center drawn with probability proportional to D_i^2."""
    idx = [int(rng.integers(pts.n))]
    dmin = pts.to_centers(pts.x[idx[0]][None, :])[:, 0]
    while len(idx) < k:
        w = dmin ** 2
        total = w.sum()
        nxt = int(rng.integers(pts.n)) if not np.isfinite(total) or total <= 0 else int(
            rng.choice(pts.n, p=w / total))
        idx.append(nxt)
        dmin = np.minimum(dmin, pts.to_centers(pts.x[nxt][None, :])[:, 0])
    return pts.x[idx].copy()


@dataclass
class KMeansResult:
    labels: np.ndarray      # 0..K'-1
    centers: np.ndarray     # K' x d
    cost: float


def kmeans(pts: Points, k: int, n_init: int, rng: np.random.Generator,
           max_iter: int = 100, tol: float = 0.0) -> KMeansResult:
    """Lloyd iterations with rho (fielding.md 2.3); the run of lowest cost is kept.

    For the metrics (l1, js) the iterations use Hamerly's bounds: a client whose distance to its
    center (upper bound) is below half the distance from that center to the nearest other one
    and below its lower bound to every other center cannot change cluster, so only the others
    are recomputed. The triangle inequality makes this exact: same fixed point, fewer distances.
    ``tol`` > 0 stops once at most that fraction of the clients changed cluster in an iteration
    (0 = the spec's "until the assignment is unchanged").
    """
    best: KMeansResult | None = None
    bounded = pts.metric in ("l1", "js") and k > 1
    for _ in range(n_init):
        centers = kmeans_pp(pts, k, rng)
        if bounded:
            labels, centers = _lloyd_bounded(pts, centers, max_iter, tol)
            dist = pts.to_centers(centers)
        else:
            labels = None
            for _ in range(max_iter):
                dist = pts.to_centers(centers)
                new = dist.argmin(1)                 # ties -> lowest k
                if labels is not None and int((new != labels).sum()) <= tol * pts.n:
                    labels = new
                    break
                labels = new
                centers, _ = _means(pts, labels, k, centers)
            else:
                dist = pts.to_centers(centers)
        cost = float(dist[np.arange(pts.n), labels].sum())
        if best is None or cost < best.cost:
            best = KMeansResult(labels.copy(), centers.copy(), cost)
    assert best is not None
    used = np.unique(best.labels)                # drop empty clusters and re-index
    remap = np.full(k, -1)
    remap[used] = np.arange(len(used))
    return KMeansResult(remap[best.labels], best.centers[used], best.cost)


def _lloyd_bounded(pts: Points, centers: np.ndarray, max_iter: int, tol: float
                   ) -> tuple[np.ndarray, np.ndarray]:
    k = len(centers)
    dist = pts.to_centers(centers)
    labels = dist.argmin(1)
    ar = np.arange(pts.n)
    upper = dist[ar, labels]
    lower = np.partition(dist, 1, axis=1)[:, 1]
    for _ in range(max_iter):
        new_centers, _ = _means(pts, labels, k, centers)
        moved = _rowwise(centers, new_centers, pts.metric)
        centers = new_centers
        if moved.max() <= 0:
            break
        upper += moved[labels]
        lower -= moved.max()
        cc = pairwise(centers, pts.metric)
        np.fill_diagonal(cc, np.inf)
        half = 0.5 * cc.min(1)
        cand = np.flatnonzero(upper > np.maximum(half[labels], lower))
        if not len(cand):
            break
        d = pts.to_centers(centers, rows=None if len(cand) > pts.n // 2 else cand)
        if len(d) != len(cand):
            d = d[cand]
        new = d.argmin(1)
        changes = int((new != labels[cand]).sum())
        changed = changes > tol * pts.n
        labels[cand] = new
        upper[cand] = d[np.arange(len(cand)), new]
        lower[cand] = np.partition(d, 1, axis=1)[:, 1]
        if not changed:
            break
    return labels, centers


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
            pts: Points | None = None, tol: float = 0.0) -> ClusterResult:
    """CLUSTER of fielding.md 2.3: k-means for every K in range, the best silhouette wins
    (ties -> smaller K). Fewer than 3 clients, or a best silhouette below ``min_silhouette``:
    one cluster."""
    pts = pts or Points(x, metric)
    rng = np.random.default_rng(seed)
    best: ClusterResult | None = None
    scores: dict[int, float] = {}
    for k in k_range(k_min, k_max, pts.n):
        res = kmeans(pts, k, n_init, rng, tol=tol)
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
    """HANDLE_DRIFT of fielding.md 2.5 (it does not re-cluster; ``trigger`` says whether to).

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
