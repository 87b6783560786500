"""Fielding's clustering logic in pure NumPy (docs/fielding.md, "The algorithm as implemented").

No Flower here: the strategies in ``fielding.py`` call these functions, the benchmarks time them
and the tests check them directly.

* :func:`to_centers` / :func:`distance` -- the pluggable distances rho: ``l1`` (default for label
  vectors), ``js`` (Jensen-Shannon distance, log base 2, in [0, 1]), ``sqeuclidean`` (embeddings),
  ``cosine`` (gradients).
* :func:`kmeans` -- Lloyd iterations with rho for the assignment, arithmetic-mean centers, k-means++
  seeding with rho, ``n_init`` restarts, lowest cost kept, empty clusters dropped. For l1 at
  scale the restarts run in lock step (:func:`_lloyd_l1_batch`), optionally with successive
  halving (``keep``: only the best restarts after a few iterations run to convergence).
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

from fedcluster_app.families.fielding.params import METRICS

_LN2 = math.log(2.0)


# lock-step l1 k-means (kmeans(batched=...), _lloyd_l1_batch)
_BATCH_MIN_CLIENTS = 1000       # batched=None: the lock-step engine from this many (sparse) clients
_BATCH_ELEMENTS = 4_000_000     # restarts x clients x K held at once (more restarts: in chunks)
_SUPPORT_ELEMENTS = 5_000_000   # largest N x d 0/1 support matrix (float64), dense passes
_GATHER_ELEMENTS = 4_000_000    # entries x K gathered at once by _L1Entries.to_pairs
_FULL_PASS_SHARE = 0.3          # more clients in doubt than this share: one dense full pass
_TIE = 1e-12                    # relative: l1 distances this close are tied (-> lowest k)


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
        self._entries: _L1Entries | None = None
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

    def _l1_entries(self) -> _L1Entries:
        if self._entries is None:
            self._entries = _L1Entries(self)
        return self._entries

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
    if pts.metric == "l1" and pts._csr is not None:
        ent = pts._l1_entries()
        to_one = ent.to_one
    else:
        def to_one(c: np.ndarray) -> np.ndarray:
            return pts.to_centers(c[None, :])[:, 0]
    idx = [int(rng.integers(pts.n))]
    dmin = to_one(pts.x[idx[0]])
    while len(idx) < k:
        w = dmin ** 2
        total = w.sum()
        nxt = int(rng.integers(pts.n)) if not np.isfinite(total) or total <= 0 else int(
            rng.choice(pts.n, p=w / total))
        idx.append(nxt)
        np.minimum(dmin, to_one(pts.x[nxt]), out=dmin)
    return pts.x[idx].copy()


@dataclass
class KMeansResult:
    labels: np.ndarray      # 0..K'-1
    centers: np.ndarray     # K' x d
    cost: float


class _L1Entries:
    """The stored entries of an l1 point set in row order (CSR), for the batched k-means below.

    A distance pass over P (restart, row) pairs gathers, for every stored entry, the K center
    coordinates of its column: ``|x - c|_1 = |c|_1 + |x|_1 - 2 sum_{y in supp x} min(x_y, c_y)``
    for non-negative data (label vectors), ``|c|_1 + sum_{y in supp x} (|x_y - c_y| - |c_y|)``
    otherwise -- the same formulas (and summation order) as :func:`_l1_sparse`.
    """

    def __init__(self, pts: Points) -> None:
        csr = pts._csr if pts._csr is not None else sparse.csr_matrix(pts.x)
        self.n, self.d = pts.n, pts.d
        self.indptr = csr.indptr.astype(np.int64)
        self.cols = csr.indices.astype(np.int64)
        self.vals = csr.data.astype(np.float64)
        self.lens = np.diff(self.indptr)
        self.nonneg = bool(len(self.vals) == 0 or self.vals.min() >= 0)
        ones = sparse.csr_matrix((np.ones(len(self.vals)), np.arange(len(self.vals)), self.indptr),
                                 shape=(self.n, len(self.vals)))
        self.xnorm = ones @ (self.vals if self.nonneg else np.abs(self.vals))
        self._support = None
        self._rows = None

    def support(self):
        """For the full passes of non-negative data: the support matrix B^T (d x N, 0/1) and the
        entries sorted by (column, value), or None where that does not pay (signed data, or a
        support matrix too large to hold)."""
        if self._support is None:
            if not self.nonneg or self.n * self.d > _SUPPORT_ELEMENTS or not len(self.vals):
                self._support = False
            else:
                bt = np.zeros((self.d, self.n))
                rows = np.repeat(np.arange(self.n), self.lens)
                bt[self.cols, rows] = 1.0
                order = np.lexsort((self.vals, self.cols))
                width = 2.0 * (float(self.vals.max()) + 1.0)
                starts = np.searchsorted(self.cols[order], np.arange(self.d))
                self._support = (bt, self.cols[order] * width + self.vals[order],
                                 self.vals[order], rows[order], starts, width)
        return self._support or None

    def full(self, centers: np.ndarray, cnorm: np.ndarray) -> np.ndarray | None:
        """(R, K, N) distances of every row to every center, or None (use :meth:`to_pairs`).

        sum_y min(x_y, c_y) over supp x = (B c)_x - sum_{y in supp x, c_y > x_y} (c_y - x_y):
        a dense product with the 0/1 support matrix, less a correction on the few entries
        smaller than the center coordinate (a prefix of each column's sorted entries). Equal
        to :meth:`to_pairs` up to rounding (~1e-13).
        """
        sup = self.support()
        if sup is None:
            return None
        bt, key, svals, srows, starts, width = sup
        n_r, k, d = centers.shape
        flat = centers.reshape(n_r * k, d)
        q = flat + (np.arange(d) * width)[None, :]
        base = np.broadcast_to(starts, flat.shape).ravel()
        cnt = np.searchsorted(key, q.ravel(), "left") - base
        total = int(cnt.sum())
        if total > 0.3 * len(key) * n_r * k:        # dense-ish data: the gather is cheaper
            return None
        g = flat @ bt                                                      # RK x N
        if total:
            off = np.zeros(len(cnt), dtype=np.int64)
            np.cumsum(cnt[:-1], out=off[1:])
            pos = np.repeat(base - off, cnt)
            pos += np.arange(total)
            w = np.repeat(flat.ravel(), cnt)
            w -= svals[pos]
            tgt = np.repeat(np.arange(n_r * k) * self.n, cnt.reshape(n_r * k, d).sum(1))
            tgt += srows[pos]
            g -= np.bincount(tgt, weights=w, minlength=n_r * k * self.n).reshape(n_r * k, self.n)
        g *= -2.0
        g += self.xnorm[None, :]
        g += cnorm.reshape(-1)[:, None]
        return g.reshape(n_r, k, self.n)

    def to_one(self, c: np.ndarray) -> np.ndarray:
        """(N,) distances of every row to one center (same arithmetic as :func:`_l1_sparse`)."""
        if self._rows is None:
            self._rows = np.repeat(np.arange(self.n), self.lens)
        cv = c[self.cols]
        if self.nonneg and c.min() >= 0:
            np.minimum(cv, self.vals, out=cv)
            s = np.bincount(self._rows, weights=cv, minlength=self.n)
            s *= -2.0
            s += self.xnorm
            s += c.sum()
            return s
        contrib = np.abs(self.vals - cv)
        contrib -= np.abs(cv)
        s = np.bincount(self._rows, weights=contrib, minlength=self.n)
        s += np.abs(c).sum()
        return s

    def _entry_index(self, k: int, labels: np.ndarray) -> np.ndarray:
        """(R, E) flat index (r, labels[r, row of e], column of e) into R x K x d arrays."""
        if self._rows is None:
            self._rows = np.repeat(np.arange(self.n), self.lens)
        idx = labels[:, self._rows]
        idx += (np.arange(len(labels)) * k)[:, None]
        idx *= self.d
        idx += self.cols[None, :]
        return idx

    def sums_all(self, k: int, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Coordinate sums (R x K x d) and sizes (R x K) of the clusters ``labels`` (R x N); per
        (restart, cluster, column) the entries add up in row order, as in :func:`_means`."""
        n_r = len(labels)
        idx = self._entry_index(k, labels)
        sums = np.bincount(idx.ravel(), weights=np.tile(self.vals, n_r),
                           minlength=n_r * k * self.d).reshape(n_r, k, self.d)
        counts = np.bincount((labels + (np.arange(n_r) * k)[:, None]).ravel(),
                             minlength=n_r * k).reshape(n_r, k).astype(np.float64)
        return sums, counts

    def costs_all(self, centers: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """(R,) sum over the rows of rho(x_i, centers[r, labels[r, i]]), from the entry sums."""
        n_r, k, _ = centers.shape
        cv = np.take(centers.reshape(-1), self._entry_index(k, labels))       # R x E
        cnorm = self.norms(centers)
        sizes = np.bincount((labels + (np.arange(n_r) * k)[:, None]).ravel(),
                            minlength=n_r * k).reshape(n_r, k)
        base = (sizes * cnorm).sum(1)
        if self.nonneg:
            np.minimum(cv, self.vals[None, :], out=cv)
            return base + self.xnorm.sum() - 2.0 * cv.sum(1)
        contrib = np.abs(self.vals[None, :] - cv)
        contrib -= np.abs(cv)
        return base + contrib.sum(1)

    def select(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Entry positions of ``rows`` (in that order), each row's entry count and CSR offsets."""
        lens = self.lens[rows]
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        pos = np.repeat(self.indptr[rows] - offsets[:-1], lens)
        pos += np.arange(offsets[-1])
        return pos, lens, offsets

    def norms(self, centers: np.ndarray) -> np.ndarray:
        return (centers if self.nonneg else np.abs(centers)).sum(-1)

    def to_pairs(self, centers: np.ndarray, cnorm: np.ndarray, r: np.ndarray, i: np.ndarray
                 ) -> np.ndarray:
        """(K, P) distances of rows ``i`` to the K centers of restarts ``r`` (R x K x d)."""
        n_r, k, d = centers.shape
        entries = int(self.lens[i].sum()) * k
        if entries > _GATHER_ELEMENTS and len(i) > 1:     # bound the E x K gather
            parts = np.array_split(np.arange(len(i)), -(-entries // _GATHER_ELEMENTS))
            return np.concatenate([self.to_pairs(centers, cnorm, r[p], i[p]) for p in parts],
                                  axis=1)
        pos, lens, offsets = self.select(i)
        flat = np.ascontiguousarray(centers.transpose(0, 2, 1)).reshape(n_r * d, k)
        idx = np.repeat(r * d, lens)
        idx += self.cols[pos]
        cv = np.take(flat, idx, axis=0)                                   # E x K
        vals = self.vals[pos]
        seg = sparse.csr_matrix((np.ones(len(pos)), np.arange(len(pos)), offsets),
                                shape=(len(i), len(pos)))
        if self.nonneg:
            np.minimum(cv, vals[:, None], out=cv)
            out = (seg @ cv).T
            out *= -2.0
            out += self.xnorm[i][None, :]
        else:
            contrib = np.abs(vals[:, None] - cv)
            contrib -= np.abs(cv)
            out = (seg @ contrib).T
        out += cnorm[r].T
        return np.ascontiguousarray(out)

    def to_own(self, centers: np.ndarray, cnorm: np.ndarray, r: np.ndarray, i: np.ndarray,
               lab: np.ndarray) -> np.ndarray:
        """(P,) distances of rows ``i`` to center ``lab`` of restart ``r``."""
        n_r, k, d = centers.shape
        pos, lens, _ = self.select(i)
        owner = np.repeat(np.arange(len(i)), lens)
        idx = np.repeat((r * k + lab) * d, lens)
        idx += self.cols[pos]
        cv = np.take(centers.reshape(-1), idx)
        vals = self.vals[pos]
        if self.nonneg:
            s = np.bincount(owner, weights=np.minimum(cv, vals), minlength=len(i))
            return (s * -2.0 + self.xnorm[i]) + cnorm[r, lab]
        s = np.bincount(owner, weights=np.abs(vals - cv) - np.abs(cv), minlength=len(i))
        return s + cnorm[r, lab]

    def sums(self, n_r: int, k: int, r: np.ndarray, i: np.ndarray, lab: np.ndarray,
             sign: float = 1.0) -> np.ndarray:
        """(n_r, k, d) coordinate sums of rows ``i`` added to cluster ``lab`` of restart ``r``."""
        pos, lens, _ = self.select(i)
        idx = np.repeat((r * k + lab) * self.d, lens)
        idx += self.cols[pos]
        w = self.vals[pos] if sign > 0 else -self.vals[pos]
        return np.bincount(idx, weights=w, minlength=n_r * k * self.d).reshape(n_r, k, self.d)


def _argmin0(d: np.ndarray, eps: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Along axis 0 of a (K, ...) array: the lowest k whose value is within ``eps`` of the minimum
    (ties -> lowest k; with eps > 0 the rounding of the dense pass cannot break a tie that
    docs/fielding.md, D4 breaks by the index) and an upper bound on its value (min + eps). A loop
    over the short axis: numpy's reductions over a short last axis are slow."""
    val = d[0].copy()
    for j in range(1, len(d)):
        np.minimum(val, d[j], out=val)
    if eps:
        val += eps
    best = np.zeros(d.shape[1:], dtype=np.int64)
    for j in range(len(d) - 1, 0, -1):
        np.copyto(best, j, where=d[j] <= val)
    return best, val


def _lloyd_l1_batch(ent: _L1Entries, centers: np.ndarray, max_iter: int, tol: float,
                    keep: int | None = None, prune_at: int = 3
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Lloyd with l1 for R restarts at once (centers: R x K x d, from k-means++).

    Each restart follows the iterations of the plain loop -- assign every client to its nearest
    center (ties -> lowest k), recompute the arithmetic means (an empty cluster keeps its
    center), stop when no client changed cluster (or at most ``tol`` x N did) or after
    ``max_iter`` center updates -- but the restarts advance in lock step, so one NumPy pass
    serves all of them, and Elkan's bounds skip the distances that cannot change an assignment:
    an upper bound u_i on the distance to the own center and a lower bound l_ik on the distance
    to every other center (moved by how far the centers moved: the triangle inequality), and
    half the distance from the own center to the nearest other one. A client with u_i <= that
    half-distance or u_i <= min_k l_ik keeps its cluster; for the others the own distance is
    recomputed first and, if still in doubt, all K. While most clients are in doubt (the first
    iterations), a full pass (:meth:`_L1Entries.full`) replaces the bounds. Means are updated
    incrementally from the clients that changed cluster (recounted when many did). Distances
    within rounding (``_TIE``) of the minimum count as tied: the lowest k wins.

    ``keep`` (successive halving): after ``prune_at`` iterations only the ``keep`` restarts of
    lowest cost so far (finished ones included) iterate on; the others are dropped (cost inf).
    None: every restart runs to the end, as the k-means of docs/fielding.md, D4.
    Returns labels (R x N), centers (R x K x d) and costs (R,).
    """
    n_r, k, d = centers.shape
    n = ent.n
    centers = centers.astype(np.float64, copy=True)
    out_labels = np.empty((n_r, n), dtype=np.int64)
    out_centers = centers.copy()
    out_cost = np.full(n_r, np.nan)            # nan: still running; inf: dropped
    live = np.arange(n_r)

    def all_rows(a: int) -> tuple[np.ndarray, np.ndarray]:
        return np.repeat(np.arange(a), n), np.tile(np.arange(n), a)

    def full_pass(cent: np.ndarray, cn: np.ndarray):
        dist = ent.full(cent, cn)                                          # A x K x N
        if dist is None:
            r, i = all_rows(len(cent))
            dist = ent.to_pairs(cent, cn, r, i).reshape(k, len(cent), n).transpose(1, 0, 2)
        lab, up = _argmin0(dist.transpose(1, 0, 2), eps)
        low = np.ascontiguousarray(dist)
        np.put_along_axis(low, lab[:, None, :], np.inf, 1)                 # own center: no bound
        return lab, up, low

    cnorm = ent.norms(centers)
    eps = _TIE * (1.0 + float(ent.xnorm.max(initial=0.0)) + float(cnorm.max(initial=0.0)))
    labels, upper, lower = full_pass(centers, cnorm)
    sums, counts = ent.sums_all(k, labels)
    eye = np.eye(k, dtype=bool)
    for it in range(max_iter):
        a = len(live)
        # recompute the centers (arithmetic means; an empty cluster keeps its center)
        new = np.divide(sums, counts[:, :, None], out=centers.copy(), where=counts[:, :, None] > 0)
        if ent.nonneg:
            np.maximum(new, 0.0, out=new)          # incremental sums: no -1e-17 coordinates
        moved = np.abs(new - centers).sum(2)                                # A x K
        centers = new
        cnorm = ent.norms(centers)
        upper += np.take_along_axis(moved, labels, 1)
        lower -= moved[:, :, None]
        # clients whose own center is provably still the nearest keep it
        cc = np.abs(centers[:, :, None, :] - centers[:, None, :, :]).sum(3)
        cc[:, eye] = np.inf
        half = 0.5 * cc.min(2)
        lmin = lower[:, 0].copy()
        for j in range(1, k):
            np.minimum(lmin, lower[:, j], out=lmin)
        bound = np.maximum(np.take_along_axis(half, labels, 1), lmin)
        rr, ii = np.nonzero(upper > bound)
        if len(rr) > _FULL_PASS_SHARE * a * n:
            new_labels, upper, lower = full_pass(centers, cnorm)
            rr, ii = np.nonzero(new_labels != labels)
            old, best = labels[rr, ii], new_labels[rr, ii]
        else:
            old = labels[rr, ii]
            if len(rr):
                own = ent.to_own(centers, cnorm, rr, ii, old)
                upper[rr, ii] = own
                doubt = own > bound[rr, ii]
                rr, ii, old = rr[doubt], ii[doubt], old[doubt]
            best = old
            if len(rr):
                dist = ent.to_pairs(centers, cnorm, rr, ii)                # K x P
                best, upper[rr, ii] = _argmin0(dist, eps)
                dist[best, np.arange(len(rr))] = np.inf
                lower[rr, :, ii] = dist.T
        ch = best != old
        changed = np.zeros(a, dtype=np.int64)
        if ch.any():
            rc, ic, oc, nc = rr[ch], ii[ch], old[ch], best[ch]
            labels[rc, ic] = nc
            if len(rc) > 0.25 * a * n:               # many changes: recount from scratch
                sums, counts = ent.sums_all(k, labels)
            else:
                sums += ent.sums(a, k, rc, ic, nc)
                sums += ent.sums(a, k, rc, ic, oc, -1.0)
                counts += np.bincount(rc * k + nc, minlength=a * k).reshape(a, k)
                counts -= np.bincount(rc * k + oc, minlength=a * k).reshape(a, k)
            changed = np.bincount(rc, minlength=a)
        done = changed <= tol * n if it + 1 < max_iter else np.ones(a, dtype=bool)
        if keep is not None and it + 1 == prune_at:
            # successive halving: the ``keep`` restarts of lowest cost so far go on
            cost = ent.costs_all(centers, labels)
            pool = np.concatenate([out_cost[np.isfinite(out_cost)], cost])
            cut = np.sort(pool)[min(keep, len(pool)) - 1]
            drop = (cost > cut) & ~done
            out_cost[live[drop]] = np.inf
            done |= drop
        if done.any():
            out_labels[live[done]] = labels[done]
            out_centers[live[done]] = centers[done]
            fin = np.flatnonzero(done & ~np.isinf(out_cost[live]))
            if len(fin):
                out_cost[live[fin]] = ent.costs_all(centers[fin], labels[fin])
            going = ~done
            live = live[going]
            if not len(live):
                break
            labels, upper, lower = labels[going], upper[going], lower[going]
            centers, sums, counts = centers[going], sums[going], counts[going]
    return out_labels, out_centers, out_cost


def kmeans(pts: Points, k: int, n_init: int, rng: np.random.Generator,
           max_iter: int = 100, tol: float = 0.0, keep: int | None = None,
           prune_at: int = 3, batched: bool | None = None) -> KMeansResult:
    """k-means with rho (docs/fielding.md, D4): ``n_init`` k-means++ seedings with rho, Lloyd
    iterations with rho for the assignment and arithmetic-mean centers (an empty cluster keeps its
    center) until the assignment is unchanged or ``max_iter``; the run of lowest cost is kept,
    empty clusters are dropped and the rest re-indexed.

    Two engines with the same RNG draws (seeding only) and the same iterations; they differ
    only in how distances equal up to rounding are tie-broken, which on data with exact ties
    (duplicate label vectors) can lead Lloyd to another, equally good local optimum:

    * lock step (``batched=True``; l1 only): the restarts advance together
      (:func:`_lloyd_l1_batch`: Elkan's bounds, dense full passes while most clients are in
      doubt, ties within rounding -> lowest k); with ``keep`` (None or >= n_init: off),
      successive halving: after ``prune_at`` Lloyd iterations only the ``keep`` restarts of
      lowest cost so far iterate on;
    * one restart after the other (``batched=False``): Hamerly's bounds for l1 and js, plain
      Lloyd for sqeuclidean and cosine; ``keep`` is ignored.

    ``batched=None`` picks the lock-step engine for sparse l1 vectors (at most 35% non-zeros,
    as label vectors of streaming windows) from ``_BATCH_MIN_CLIENTS`` clients on, where the time
    goes; smaller problems keep the per-restart engine and so reproduce the partitions of
    earlier runs bit for bit, and dense vectors keep its cheaper dense distance passes.
    ``tol`` > 0 stops a run once at most that fraction of the clients changed cluster in an
    iteration (0 = D4's "until the assignment is unchanged").
    """
    best: KMeansResult | None = None
    if batched is None:          # sparse vectors only: on dense ones the gathers cost more
        batched = pts.n >= _BATCH_MIN_CLIENTS and pts._csr is not None
    if batched and pts.metric == "l1" and k > 1 and max_iter > 0 and n_init > 0:
        # all seedings first (the same RNG draws, in the same order, as one restart at a time),
        # then the restarts' Lloyd iterations in lock step
        seeds = np.stack([kmeans_pp(pts, k, rng) for _ in range(n_init)])
        ent = pts._l1_entries()
        step = max(1, int(_BATCH_ELEMENTS // max(1, pts.n * k)))
        for s in range(0, n_init, step):
            chunk = seeds[s:s + step]
            halve = keep if keep is not None and 0 < keep < len(chunk) else None
            labels, centers, costs = _lloyd_l1_batch(ent, chunk, max_iter, tol, halve, prune_at)
            for j in range(len(costs)):
                if best is None or costs[j] < best.cost:
                    best = KMeansResult(labels[j].copy(), centers[j].copy(), float(costs[j]))
        n_init = 0
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
            pts: Points | None = None, tol: float = 0.0, keep: int | None = None,
            prune_at: int = 3, batched: bool | None = None) -> ClusterResult:
    """The silhouette search (docs/fielding.md, D5): k-means for every K in range, the best
    silhouette wins (ties -> smaller K). Fewer than 3 clients, or a best silhouette below
    ``min_silhouette``: one cluster."""
    pts = pts or Points(x, metric)
    rng = np.random.default_rng(seed)
    best: ClusterResult | None = None
    scores: dict[int, float] = {}
    for k in k_range(k_min, k_max, pts.n):
        res = kmeans(pts, k, n_init, rng, tol=tol, keep=keep, prune_at=prune_at, batched=batched)
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
    """HANDLE_DRIFT (docs/fielding.md, "The algorithm as implemented", steps 1-3; D2, D3, D6)
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
