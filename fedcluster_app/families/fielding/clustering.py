"""Fielding's clustering logic in pure NumPy (docs/fielding/README.md, "The algorithm as implemented").

No Flower here: the strategies in ``fielding.py`` call these functions, the benchmarks time them
and the tests check them directly.

* :func:`to_centers` / :func:`distance` -- the pluggable distances rho: ``l1`` (default for label
  vectors), ``js`` (Jensen-Shannon distance, log base 2, in [0, 1]), ``sqeuclidean`` (embeddings),
  ``cosine`` (gradients).
* :func:`kmeans` -- Lloyd iterations with rho for the assignment, arithmetic-mean centers, k-means++
  seeding with rho, ``n_init`` restarts, lowest cost kept, empty clusters dropped. For l1 at
  scale the restarts run in lock step (:func:`_lloyd_l1_batch`; in :func:`cluster` those of all
  K together), optionally with successive halving (``keep``: only the best restarts after a few
  iterations run to convergence). Hand-written: scikit-learn's KMeans and kmeans_plusplus are
  Euclidean only, and its l1 distances are slower than ours (``pairwise_distances_argmin_min(x,
  centers, metric="manhattan")`` on the sparse vectors: 5.9 ms for 5,078 clients x 10 centers,
  the dense pass with its bounds here 1.35 ms).
* :func:`silhouette` -- the mean silhouette with rho, computed exactly from per-cluster distance
  sums ``S[i, k] = sum_{j in C_k} rho(r_i, r_j)`` without the N x N matrix for l1 (a sort per
  coordinate), sqeuclidean and cosine (closed forms); js falls back to the pairwise matrix.
  (At 5,078 label vectors and K = 10: 7-9 ms, scikit-learn's ``silhouette_score(x, labels,
  metric="manhattan")`` 1.4-2.0 s for the same value within 1e-16.)
* :func:`cluster` -- K chosen by the silhouette over ``k_min..min(k_max, N-1)`` (ties: smaller K).
* :func:`handle_drift` -- phase 1 (drifted clients to the nearest *frozen* center), phase 2
  (recompute centers, center-shift trigger ``max shift >= tau * theta``, diameter trigger).

Label vectors of streaming clients are sparse (a window holds a few of the labels), so l1 works on
the non-zero entries only: ``|x - c|_1 = |c|_1 + sum_{y in supp x} (|x_y - c_y| - |c_y|)``, which is
exact for any vectors and costs O(nnz * K) instead of O(N * d * K).

The lock-step engine's results depend on the rounding of every distance it computes and on
which distances it recomputes (label vectors tie exactly, and a tie goes to the lowest index):
its speed-ups keep both, so partitions and centers stay the same bit for bit (see
test_fielding_core.py, which pins them).
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
_FULL_PASS_SHARE = 0.5          # more clients in doubt than this share: one dense full pass
_MERGE_ELEMENTS = 4_000_000    # restarts x clients iterated in lock step at once (all K)
_ENTRY_ELEMENTS = 200_000      # restarts x stored entries per pass of sums_all / costs_all
_TIE = 1e-12                    # relative: l1 distances this close are tied (-> lowest k)
_PAD_PAIRS = 20_000             # pairs x padded centers below which one pass beats two buckets
_COMPILED_DENSITY = 0.1         # slots per row / d up to which full passes run compiled


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
        self._abs = None
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
        return self._l1_sums(onehot, counts, np.asarray(labels))

    def _l1_sums(self, onehot: np.ndarray, counts: np.ndarray, labels: np.ndarray) -> np.ndarray:
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
            self._sorted = (rows, cols, vals, starts, ends, ends - starts, rowsum)
        rows, cols, vals, starts, ends, width, rowsum = self._sorted
        # cluster-major (K x nnz): the prefix sums run along contiguous rows and the per-column
        # values are spread by np.repeat (entries are sorted by column); the same sums, bit for
        # bit, as entry-major gathers, ~2x faster measured
        k = onehot.shape[1]
        lab = labels[rows]                                        # cluster of each entry
        if self._csr is not None and (len(vals) == 0 or vals.min() > 0):
            # prefix counts (exact in int32) and prefix sums per cluster: each cluster's sums
            # run over its own entries only and are spread by its counts -- the same numbers
            # as a running sum over all entries with the others' as +0.0 (adding +0.0 changes
            # nothing), without K latency-bound passes over all entries
            hit = lab[None, :] == np.arange(k)[:, None]
            cnt0 = np.zeros((k, len(vals) + 1), dtype=np.int32)
            np.cumsum(hit, axis=1, dtype=np.int32, out=cnt0[:, 1:])
            tot0 = np.empty((k, len(vals) + 1))
            for c in range(k):
                own = np.zeros(int(cnt0[c, -1]) + 1)
                np.cumsum(vals[hit[c]], out=own[1:])
                np.take(own, cnt0[c], out=tot0[c])
        else:
            m = np.zeros((k, len(vals)))
            m[lab, np.arange(len(vals))] = 1.0
            cnt0 = np.zeros((k, len(vals) + 1))
            np.cumsum(m, axis=1, out=cnt0[:, 1:])
            m *= vals[None, :]
            tot0 = np.zeros((k, len(vals) + 1))
            np.cumsum(m, axis=1, out=tot0[:, 1:])
        le_cnt = cnt0[:, 1:] - np.repeat(cnt0[:, starts], width, axis=1)
        le_sum = tot0[:, 1:] - np.repeat(tot0[:, starts], width, axis=1)
        all_cnt = np.repeat(cnt0[:, ends] - cnt0[:, starts], width, axis=1)
        all_sum = np.repeat(tot0[:, ends] - tot0[:, starts], width, axis=1)
        v = vals[None, :]
        # sum of |x_iy - x_jy| over the stored entries j of column y that lie in cluster k
        # (ties contribute 0 whichever side they fall on):
        # v * le_cnt - le_sum + (all_sum - le_sum) - v * (all_cnt - le_cnt), in that order
        entry = v * le_cnt
        entry -= le_sum
        all_sum -= le_sum
        entry += all_sum
        all_cnt -= le_cnt
        entry -= all_cnt * v
        if self._csr is None:                              # dense: every entry was stored
            return np.asarray(rowsum @ entry.T)
        # sparse: an unstored x_jy = 0 adds |x_iy|; for an unstored x_iy = 0 the column adds
        # sum_{j in k} |x_jy|, counted for every column and taken back on the stored ones
        if self._abs is None:
            self._abs = np.abs(self.x)
        abs_col = onehot.T @ self._abs                     # K x d
        # stored entries per cluster and column: counted (exact, as the 0/1 product was)
        nnz_col = np.bincount(lab * self.d + cols, minlength=k * self.d
                              ).reshape(k, self.d).astype(np.float64)
        fill = counts[:, None] - np.repeat(nnz_col, width, axis=1)
        fill *= np.abs(v)
        entry += fill
        entry -= np.repeat(abs_col, width, axis=1)
        return abs_col.sum(1)[None, :] + np.asarray(rowsum @ entry.T)


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


def kmeans_pp(pts: Points, k: int, rng: np.random.Generator,
              out: np.ndarray | None = None) -> np.ndarray:
    """k-means++ seeding with rho: next center drawn with probability proportional to D_i^2.
    ``out`` (K x N), if given, receives the distances to the seeds (computed anyway)."""
    if pts.metric == "l1" and pts._csr is not None:
        ent = pts._l1_entries()
        if ent.nonneg:
            def to_seed(i: int) -> np.ndarray:
                s = ent.to_row(i)
                s += pts.x[i].sum()
                return s
        else:
            def to_seed(i: int) -> np.ndarray:
                return ent.to_one(pts.x[i])
    else:
        def to_seed(i: int) -> np.ndarray:
            return pts.to_centers(pts.x[i][None, :])[:, 0]
    idx = [int(rng.integers(pts.n))]
    dmin = to_seed(idx[0])
    if out is not None:
        out[0] = dmin
    while len(idx) < k:
        w = dmin ** 2
        total = w.sum()
        nxt = int(rng.integers(pts.n)) if not np.isfinite(total) or total <= 0 else _choice(
            rng, w / total)
        dist = to_seed(nxt)
        if out is not None:
            out[len(idx)] = dist
        idx.append(nxt)
        np.minimum(dmin, dist, out=dmin)
    return pts.x[idx].copy()


def _segment_ids(offsets: np.ndarray) -> np.ndarray:
    """For segments ``offsets[j]:offsets[j + 1]`` of ``offsets[-1]`` items: the segment of each
    item (``np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))``). A count of segment
    starts, summed up in place: ~2x faster than np.repeat with short runs, and values spread
    over the items by np.take of these ids are ~2x faster than by np.repeat as well."""
    ids = np.bincount(offsets[1:-1], minlength=int(offsets[-1]) + 1)[:-1]
    np.cumsum(ids, out=ids)
    return ids


def _choice(rng: np.random.Generator | float, p: np.ndarray) -> int:
    """``int(rng.choice(len(p), p=p))``, the same draw from the same RNG state: NumPy's choice
    normalises the cumulative sum by its last entry and bisects one ``rng.random()`` draw; done
    here without its checks on ``p`` (a Kahan sum and two passes), ~2x faster (the seeding draws
    450 times per re-clustering of K = 2..10; test_fielding_core.py compares the two). A float
    for ``rng``: that draw, made beforehand."""
    cdf = np.cumsum(p)
    cdf /= cdf[-1]
    u = rng if isinstance(rng, float) else rng.random()
    return int(cdf.searchsorted(u, side="right"))


def _kmeans_pp_restarts(pts: Points, k: int, n_init: int, rng: np.random.Generator,
                        out: np.ndarray) -> np.ndarray:
    """``n_init`` :func:`kmeans_pp` seedings one after the other (R x K x d; ``out``, K x R x N,
    receives the distances to the seeds): the same seeds, distances and RNG draws. For
    non-negative sparse l1 data the restarts advance together -- their draws do not depend on
    the data (per restart one ``integers``, then one ``random`` per further seed), so they are
    made first, in the original order, and each step computes the distances to all R new
    seeds in one pass. Should a restart run out of positive weights (its next draw would be an
    ``integers``), the RNG state is restored and the restarts run one at a time."""
    def one_by_one() -> np.ndarray:
        return np.stack([kmeans_pp(pts, k, rng, out[:, j]) for j in range(n_init)])

    if not (pts.metric == "l1" and pts._csr is not None and k > 1):
        return one_by_one()
    ent = pts._l1_entries()
    if not ent.nonneg:
        return one_by_one()
    state = rng.bit_generator.state
    idx = np.empty((n_init, k), dtype=np.int64)
    draws = []
    for j in range(n_init):
        idx[j, 0] = int(rng.integers(pts.n))
        draws.append([rng.random() for _ in range(k - 1)])

    def to_seeds(rows: np.ndarray) -> np.ndarray:
        s = ent.to_rows(rows)
        s += np.array([pts.x[i].sum() for i in rows])[:, None]       # as kmeans_pp: |x_i|_1
        return s

    out[0] = to_seeds(idx[:, 0])
    dmin = out[0].copy()
    for t in range(1, k):
        w = dmin ** 2
        for j in range(n_init):
            total = w[j].sum()
            if not np.isfinite(total) or total <= 0:
                rng.bit_generator.state = state
                return one_by_one()
            idx[j, t] = _choice(draws[j][t - 1], w[j] / total)
        out[t] = to_seeds(idx[:, t])
        np.minimum(dmin, out[t], out=dmin)
    return pts.x[idx]


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
        self._support_csr = None
        self._csc = None
        self._slots = None

    def compiled_pass(self) -> bool:
        """Whether :func:`_assign_all`'s full passes run compiled (``core/compiled.py``,
        ``nearest_l1``): for sparse non-negative rows of even length (:meth:`slots`), where
        it costs O(L x N x K) per restart against the dense product's O(N x d x K): 2x
        faster than :meth:`full` on the drift-step trace (L = 6 slots for 3.9 of 100 labels),
        and it gives :meth:`to_pairs`'s distances bit for bit where :meth:`full` rounds
        differently (~1e-13)."""
        slots = self.slots()
        return slots is not None and len(slots[0]) <= _COMPILED_DENSITY * self.d

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
                                 2.0 * self.vals[order], rows[order], starts, width)
        return self._support or None

    def full(self, centers: np.ndarray, cnorm: np.ndarray, out: np.ndarray | None = None
             ) -> np.ndarray | None:
        """(R, K, N) distances of every row to every center, or None (use :meth:`to_pairs`).

        sum_y min(x_y, c_y) over supp x = (B c)_x - sum_{y in supp x, c_y > x_y} (c_y - x_y):
        a dense product with the 0/1 support matrix, less a correction on the few entries
        smaller than the center coordinate (a prefix of each column's sorted entries). Equal
        to :meth:`to_pairs` up to rounding (~1e-13). ``out`` (at least 2 x R x K x N floats): a
        buffer reused across passes for the result (its first R x K x N) and the correction
        (the second): fresh arrays of a few MB cost their page faults on every pass.
        """
        sup = self.support()
        if sup is None:
            return None
        bt, key, svals2, srows, starts, width = sup
        n_r, k, d = centers.shape
        flat = centers.reshape(n_r * k, d)
        q = flat + (np.arange(d) * width)[None, :]
        base = np.broadcast_to(starts, flat.shape).ravel()
        cnt = np.searchsorted(key, q.ravel(), "left") - base
        total = int(cnt.sum())
        if total > 0.3 * len(key) * n_r * k:        # dense-ish data: the gather is cheaper
            return None
        # -2 (B c - corr) computed as (-2 c) B^T + (2 corr): the same numbers, bit for bit
        # (scaling by 2 is exact, in every partial sum too), one pass fewer
        size = n_r * k * self.n
        g = None if out is None else out.reshape(-1)[:size].reshape(n_r * k, self.n)
        g = np.matmul(-2.0 * flat, bt, out=g)                              # RK x N
        if total:
            off = np.zeros(len(cnt) + 1, dtype=np.int64)
            np.cumsum(cnt, out=off[1:])
            seg = _segment_ids(off)                 # the (center, column) of each correction
            pos = np.take(base - off[:-1], seg)
            pos += np.arange(total)
            w = np.take(2.0 * flat.ravel(), seg)
            w -= svals2[pos]
            tgt = np.take(np.repeat(np.arange(n_r * k) * self.n, d), seg)
            tgt += srows[pos]
            if out is None:
                corr = np.bincount(tgt, weights=w, minlength=size)
            else:
                # np.add.at into zeros adds each target's terms in order from 0, as bincount
                # does, without a fresh R x K x N array (measured ~2x faster on full passes)
                corr = out.reshape(-1)[size:2 * size]
                corr[:] = 0.0
                np.add.at(corr, tgt, w)
            g += corr.reshape(n_r * k, self.n)
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

    def to_row(self, row: int) -> np.ndarray:
        """:meth:`to_one` for the center ``x[row]``, a point of non-negative data (k-means++
        seeds): only the columns of its few stored entries contribute to sum min(x_y, c_y), so
        the pass runs over those columns' entries instead of all (the same sums, bit for bit:
        each row's terms are added in column order, the zeros left out add nothing)."""
        return self.to_rows(np.array([row]))[0]

    def to_rows(self, rows: np.ndarray) -> np.ndarray:
        """:meth:`to_row` for several centers at once, (R, N)."""
        if self._csc is None:
            order = np.argsort(self.cols, kind="stable")
            colptr = np.zeros(self.d + 1, dtype=np.int64)
            np.cumsum(np.bincount(self.cols, minlength=self.d), out=colptr[1:])
            if self._rows is None:
                self._rows = np.repeat(np.arange(self.n), self.lens)
            self._csc = (colptr, self._rows[order], self.vals[order])
        colptr, crows, cvals = self._csc
        own, _, _, seed = self.select(rows)                 # the centers' entries, in order
        cols = self.cols[own]
        # the entries of their columns, column after column: one bincount adds each row's terms
        # in column order from 0, as a loop of s[rows] += ... per column would
        offsets = np.zeros(len(cols) + 1, dtype=np.int64)
        np.cumsum(colptr[cols + 1] - colptr[cols], out=offsets[1:])
        entry = _segment_ids(offsets)                       # the center entry of each
        pos = np.take(colptr[cols] - offsets[:-1], entry)
        pos += np.arange(len(pos))
        tgt = np.take(seed * self.n, entry)
        tgt += crows[pos]
        s = np.bincount(tgt, weights=np.minimum(cvals[pos], np.take(self.vals[own], entry)),
                        minlength=len(rows) * self.n).reshape(len(rows), self.n)
        s *= -2.0
        s += self.xnorm
        return s

    def _entry_index(self, k: int, labels: np.ndarray) -> np.ndarray:
        """(R, E) flat index (r, labels[r, row of e], column of e) into R x K x d arrays: each
        row's label repeated over its entries (~3x faster than gathering the labels by row,
        measured at 10 restarts x 20,000 entries)."""
        idx = np.repeat(labels, self.lens, axis=1)
        idx += (np.arange(len(labels)) * k)[:, None]
        idx *= self.d
        idx += self.cols[None, :]
        return idx

    def _chunks(self, n_r: int) -> list[slice]:
        """Restarts in groups small enough that their R x E index arrays stay in cache (one
        pass over 90 restarts at once measured 1.5-1.8x slower than in groups)."""
        step = max(1, _ENTRY_ELEMENTS // max(1, len(self.vals)))
        return [slice(s, s + step) for s in range(0, n_r, step)]

    def sums_all(self, k: int, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Coordinate sums (R x K x d) and sizes (R x K) of the clusters ``labels`` (R x N); per
        (restart, cluster, column) the entries add up in row order, as in :func:`_means`."""
        n_r = len(labels)
        if n_r > 1 and n_r * len(self.vals) > _ENTRY_ELEMENTS:
            parts = [self.sums_all(k, labels[s]) for s in self._chunks(n_r)]
            return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
        idx = self._entry_index(k, labels)
        sums = np.bincount(idx.ravel(), weights=np.tile(self.vals, n_r),
                           minlength=n_r * k * self.d).reshape(n_r, k, self.d)
        counts = np.bincount((labels + (np.arange(n_r) * k)[:, None]).ravel(),
                             minlength=n_r * k).reshape(n_r, k).astype(np.float64)
        return sums, counts

    def costs_all(self, centers: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """(R,) sum over the rows of rho(x_i, centers[r, labels[r, i]]), from the entry sums."""
        n_r, k, _ = centers.shape
        if n_r > 1 and n_r * len(self.vals) > _ENTRY_ELEMENTS:
            return np.concatenate([self.costs_all(centers[s], labels[s])
                                   for s in self._chunks(n_r)])
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

    def select(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Entry positions of ``rows`` (in that order), each row's entry count, the CSR offsets
        and the row (position in ``rows``) of each selected entry."""
        lens = self.lens[rows]
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        owner = _segment_ids(offsets)
        pos = np.take(self.indptr[rows] - offsets[:-1], owner)
        pos += np.arange(offsets[-1])
        return pos, lens, offsets, owner

    def norms(self, centers: np.ndarray) -> np.ndarray:
        return (centers if self.nonneg else np.abs(centers)).sum(-1)

    def slots(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Each row's stored entries slot by slot, (L x N) columns and values (L: the most
        entries of a row; the missing ones column 0, value 0), or None (signed data, or rows
        so unequal that the padding costs more than it saves: L > 2 x the mean length).

        For a few rows (the clients in doubt) sum_y min(x_y, c_y) then adds up slot after slot
        from the first, as bincount / the sparse product do entry after entry, with a padding
        min(0, c_y) = +0 added at the end that changes nothing: the same sums, bit for bit,
        without building the entry positions of the rows first (~1.5x faster for
        :meth:`to_own` and :meth:`to_pairs` on the drift-step trace, L = 6 for 3.9 entries).
        """
        if self._slots is None:
            length = int(self.lens.max(initial=0))
            if not self.nonneg or length == 0 or length > 2 * max(1.0, float(self.lens.mean())):
                self._slots = False
            else:
                slot = np.arange(len(self.cols)) - np.repeat(self.indptr[:-1], self.lens)
                rows = np.repeat(np.arange(self.n), self.lens)
                cols, vals = np.zeros((length, self.n), np.int64), np.zeros((length, self.n))
                cols[slot, rows], vals[slot, rows] = self.cols, self.vals
                self._slots = (cols, vals)
        return self._slots or None

    def to_pairs(self, centers: np.ndarray, cnorm: np.ndarray, r: np.ndarray, i: np.ndarray
                 ) -> np.ndarray:
        """(K, P) distances of rows ``i`` to the K centers of restarts ``r`` (R x K x d)."""
        n_r, k, d = centers.shape
        slots = self.slots()
        entries = (len(slots[0]) * len(i) if slots else int(self.lens[i].sum())) * k
        if entries > _GATHER_ELEMENTS and len(i) > 1:     # bound the E x K gather
            parts = np.array_split(np.arange(len(i)), -(-entries // _GATHER_ELEMENTS))
            return np.concatenate([self.to_pairs(centers, cnorm, r[p], i[p]) for p in parts],
                                  axis=1)
        if slots:
            flat = np.ascontiguousarray(centers.transpose(0, 2, 1)).reshape(n_r * d, k)
            idx = np.take(slots[0], i, axis=1)
            idx += r * d
            cv = np.take(flat, idx.ravel(), axis=0).reshape(len(idx), len(i), k)   # L x P x K
            np.minimum(cv, np.take(slots[1], i, axis=1)[:, :, None], out=cv)
            out = cv[0].copy()
            for t in range(1, len(cv)):
                out += cv[t]
            out = out.T
            out *= -2.0
            out += self.xnorm[i][None, :]
            out += cnorm[r].T
            return np.ascontiguousarray(out)
        pos, lens, offsets, owner = self.select(i)
        flat = np.ascontiguousarray(centers.transpose(0, 2, 1)).reshape(n_r * d, k)
        idx = np.take(r * d, owner)
        idx += self.cols[pos]
        cv = np.take(flat, idx, axis=0)                                   # E x K
        vals = self.vals[pos]
        it = np.int32 if len(pos) < 2 ** 31 else np.int64    # scipy would downcast (a copy)
        seg = sparse.csr_matrix((np.ones(len(pos)), np.arange(len(pos), dtype=it),
                                 offsets.astype(it)), shape=(len(i), len(pos)))
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
        slots = self.slots()
        if slots:                                           # see slots()
            idx = np.take(slots[0], i, axis=1)
            idx += (r * k + lab) * d
            cv = np.take(centers.reshape(-1), idx)                          # L x P
            np.minimum(cv, np.take(slots[1], i, axis=1), out=cv)
            s = cv[0].copy()
            for t in range(1, len(cv)):
                s += cv[t]
            return (s * -2.0 + self.xnorm[i]) + cnorm[r, lab]
        pos, _, _, owner = self.select(i)
        idx = np.take((r * k + lab) * d, owner)
        idx += self.cols[pos]
        cv = np.take(centers.reshape(-1), idx)
        vals = self.vals[pos]
        if self.nonneg:
            s = np.bincount(owner, weights=np.minimum(cv, vals), minlength=len(i))
            return (s * -2.0 + self.xnorm[i]) + cnorm[r, lab]
        s = np.bincount(owner, weights=np.abs(vals - cv) - np.abs(cv), minlength=len(i))
        return s + cnorm[r, lab]

    def moved_sums(self, n_r: int, k: int, r: np.ndarray, i: np.ndarray, new: np.ndarray,
                   old: np.ndarray) -> list[np.ndarray]:
        """For rows ``i`` of restarts ``r`` moving from cluster ``old`` to ``new``: the (n_r, k, d)
        coordinate sums they add to the new clusters and (negated) take from the old ones (one
        entry selection for both)."""
        pos, _, _, owner = self.select(i)
        cols, vals = self.cols[pos], self.vals[pos]
        out = []
        for lab, w in ((new, vals), (old, -vals)):
            idx = np.take((r * k + lab) * self.d, owner)
            idx += cols
            out.append(np.bincount(idx, weights=w, minlength=n_r * k * self.d
                                   ).reshape(n_r, k, self.d))
        return out

    def col_sums(self, v: np.ndarray) -> np.ndarray:
        """(R, N) sum over the stored entries y of row i of v[r, y] (v: R x d)."""
        if self._support_csr is None:
            self._support_csr = sparse.csr_matrix(
                (np.ones(len(self.cols)), self.cols, self.indptr), shape=(self.n, self.d))
        return np.ascontiguousarray((self._support_csr @ v.T).T)


def _argmin0(d: np.ndarray, eps: float | np.ndarray = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Along axis 0 of a (K, ...) array: the lowest k whose value is within ``eps`` of the minimum
    (ties -> lowest k; with eps > 0 the rounding of the dense pass cannot break a tie that
    docs/fielding/README.md, D4 breaks by the index) and an upper bound on its value (min + eps). A loop
    over the short axis: numpy's reductions over a short last axis are slow. (The second loop
    stops at k = 1, so a tie between center 0 and another goes to the other one; kept as it is,
    since changing it changes the partitions wherever such exact ties occur.)"""
    val = d[0].copy()
    for j in range(1, len(d)):
        np.minimum(val, d[j], out=val)
    if np.any(eps):
        val += eps
    if len(d) > 255:
        best = np.zeros(d.shape[1:], dtype=np.int64)
        for j in range(len(d) - 1, 0, -1):
            np.copyto(best, j, where=d[j] <= val)
        return best, val
    # best = j where d[j] <= val, from j = K - 1 down, branch-free on bytes: best ^= (best ^ j)
    # & mask (mask 0 or 255). The same choice as np.copyto(best, j, where=...), which branches
    # on every element of a random mask: ~3x slower measured on full passes
    best = np.zeros(d.shape[1:], dtype=np.uint8)
    hit = np.empty(d.shape[1:], dtype=bool)
    mask = hit.view(np.uint8)
    tmp = np.empty_like(best)
    for j in range(len(d) - 1, 0, -1):
        np.less_equal(d[j], val, out=hit)
        np.negative(mask, out=mask)                        # True -> 255, False -> 0
        np.bitwise_xor(best, j, out=tmp)
        tmp &= mask
        best ^= tmp
    return best.astype(np.int64), val


def _nonzero2(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """np.nonzero of a 2-D mask (the same indices, row-major), from the flat positions: 3-7x
    faster than np.nonzero on 2-D masks, measured at 18 x 5,078."""
    return np.divmod(np.flatnonzero(mask), mask.shape[1])


def _min0(d: np.ndarray) -> np.ndarray:
    """Minimum along axis 0 of a (K, ...) array (a loop over the short axis, as in _argmin0)."""
    val = d[0].copy()
    for j in range(1, len(d)):
        np.minimum(val, d[j], out=val)
    return val


def _assign_all(ent: _L1Entries, centers: np.ndarray, cnorm: np.ndarray, eps: float,
                dist: np.ndarray | None = None, buf: np.ndarray | None = None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Nearest center of every row for R restarts (centers: R x K x d), from all distances
    (``dist``: K x R x N if already known, overwritten): labels (ties within ``eps`` -> lowest k),
    upper bounds (nearest distance + eps) and lower bounds (nearest other center), each R x N."""
    r, k, _ = centers.shape
    if dist is None and ent.compiled_pass():
        from fedcluster_app.core import compiled     # Numba, loaded on first use

        lab, up, low = (np.empty((r, ent.n), dtype) for dtype in (np.int64, float, float))
        compiled.nearest_l1(*ent.slots(), ent.xnorm, np.ascontiguousarray(centers),
                            np.ascontiguousarray(cnorm), float(eps), lab, up, low)
        return lab, up, low
    if dist is None:
        full = ent.full(centers, cnorm, buf)                                # R x K x N
        if full is None:
            rows = np.repeat(np.arange(r), ent.n), np.tile(np.arange(ent.n), r)
            dist = ent.to_pairs(centers, cnorm, *rows).reshape(k, r, ent.n)
        else:
            dist = full.transpose(1, 0, 2)                                  # K x R x N view
    lab, up = _argmin0(dist, eps)
    _exclude(dist, lab)                                                     # own center: no bound
    return lab, up, _min0(dist)


def _exclude(dist: np.ndarray, lab: np.ndarray) -> None:
    """dist[lab[r, i], r, i] = inf for a K x R x N ``dist`` (one write per (r, i)). Through a
    flat index into the contiguous array behind it (``dist`` itself, or the R x K x N array of
    the full pass it is a view of): ~2x faster than np.put_along_axis, which broadcasts index
    arrays over all three axes."""
    store = dist if dist.flags.c_contiguous else dist.transpose(1, 0, 2)
    if not store.flags.c_contiguous:
        np.put_along_axis(dist, lab[None], np.inf, 0)
        return
    sk, sr, si = (s // dist.itemsize for s in dist.strides)
    idx = lab * sk
    idx += (np.arange(dist.shape[1]) * sr)[:, None]
    idx += np.arange(dist.shape[2]) * si
    store.reshape(-1)[idx] = np.inf


def _lloyd_l1_batch(ent: _L1Entries, groups: list[tuple[np.ndarray, np.ndarray | None]],
                    max_iter: int, tol: float, keep: int | None = None, prune_at: int = 3
                    ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Lloyd with l1 for many restarts at once: ``groups`` holds (initial centers R x K x d from
    k-means++, their distances K x R x N or None) per group, e.g. the restarts of every K of the
    silhouette search; returns (labels R x N, centers R x K x d, costs R) per group.

    Each restart follows the iterations of the plain loop -- assign every client to its nearest
    center (ties -> lowest k), recompute the arithmetic means (an empty cluster keeps its
    center), stop when no client changed cluster (or at most ``tol`` x N did) or after
    ``max_iter`` center updates -- but all restarts advance in lock step, so one NumPy pass
    serves all of them (the centers of smaller K are padded; padded centers are never nearest),
    and Hamerly's bounds skip the distances that cannot change an assignment: an upper bound u_i
    on the distance to the own center and one lower bound l_i on the distance to every other
    center. A client with u_i <= l_i keeps its cluster; for the others the own distance is
    recomputed first and, if still in doubt, all K. A restart with most of its clients in doubt
    (the first iterations) gets a full pass (:meth:`_L1Entries.full`) instead; right after the
    seeding every restart does (the seeding's distances give the first assignment). Means are
    updated incrementally from the clients that changed cluster (recounted, per group as if it
    ran alone, when many did). Distances within rounding (``_TIE``) of the minimum count as
    tied (:func:`_argmin0` picks one). Bounds and the choice of pass only decide which distances
    are recomputed, not the assignments (short of distances tied within rounding), so every
    group ends as if it had run alone.

    The bounds move by how far rho(x_i, c) can move when c moves to c', which for l1 is at most
    ``min(|c' - c|_1, ||c'|_1 - |c|_1| + 2 sum_{y in supp x_i} |c'_y - c_y|)``: the triangle
    inequality, or (min is 1-Lipschitz) the change of the norm plus the moves on x_i's few
    labels. Means of normalised label vectors keep |c|_1 = 1, so for label vectors the second
    term is the one that counts: a client in doubt only if its own labels' coordinates moved.

    ``keep`` (successive halving): after ``prune_at`` iterations only the ``keep`` restarts of
    a group of lowest cost so far (finished ones included) iterate on; the others are dropped
    (cost inf). None: every restart runs to the end, as the k-means of docs/fielding/README.md, D4.
    """
    n, d = ent.n, ent.d
    sizes = [len(c) for c, _ in groups]
    ks = [int(c.shape[1]) for c, _ in groups]
    n_g, kmax, total = len(groups), max(ks), sum(sizes)
    offs = np.concatenate([[0], np.cumsum(sizes)])
    gid = np.repeat(np.arange(n_g), sizes)                     # group of each restart
    k_of = np.repeat(ks, sizes)                                # K of each restart
    halve = [keep if keep is not None and 0 < keep < s else None for s in sizes]
    xmax = float(ent.xnorm.max(initial=0.0))
    eps_g = np.array([_TIE * (1.0 + xmax + float(ent.norms(np.asarray(c, np.float64)).max(
        initial=0.0))) for c, _ in groups])
    centers = np.zeros((total, kmax, d))
    labels = np.empty((total, n), dtype=np.int64)
    upper, lower = np.empty((total, n)), np.empty((total, n))
    seeded = all(first is not None for _, first in groups)
    for g, (c, first) in enumerate(groups):
        sl = slice(offs[g], offs[g + 1])
        centers[sl, :ks[g]] = c
        if seeded:     # only the labels: iteration 0 gives every restart a full pass (bounds)
            labels[sl] = _argmin0(np.asarray(first, dtype=np.float64), eps_g[g])[0]
            continue
        labels[sl], upper[sl], lower[sl] = _assign_all(
            ent, centers[sl, :ks[g]], ent.norms(centers[sl, :ks[g]]), eps_g[g],
            None if first is None else np.asarray(first, dtype=np.float64))
    cnorm = ent.norms(centers)
    out_labels = np.empty((total, n), dtype=np.int64)
    out_centers = centers.copy()
    out_cost = np.full(total, np.nan)          # nan: still running; inf: dropped
    live = np.arange(total)
    sums, counts = ent.sums_all(kmax, labels)
    scratch = np.empty(2 * max(s * k for s, k in zip(sizes, ks)) * n)  # for the full passes
    for it in range(max_iter):
        a = len(live)
        g_live = gid[live]
        live_g = np.bincount(g_live, minlength=n_g)
        k_live = k_of[live]
        # recompute the centers (arithmetic means; an empty cluster keeps its center)
        new = np.divide(sums, counts[:, :, None], out=centers.copy(), where=counts[:, :, None] > 0)
        if ent.nonneg:
            np.maximum(new, 0.0, out=new)          # incremental sums: no -1e-17 coordinates
        delta = np.abs(new - centers)                                       # A x K x d
        moved = delta.sum(2)                                                # A x K
        new_norm = ent.norms(new)
        dnorm = np.abs(new_norm - cnorm)
        centers, cnorm = new, new_norm
        # (restart, client) pairs are also kept as flat indices into the A x N arrays: a
        # gather or scatter through them is 2-4x faster than with the two index arrays
        up_f, low_f, lab_f = upper.reshape(-1), lower.reshape(-1), labels.reshape(-1)
        if it == 0 and seeded:
            # the centers just moved from single points to means: (nearly) every client is in
            # doubt, so a full pass without computing the bounds first
            rr = ii = fi = np.empty(0, dtype=np.int64)
            bound = np.empty(0)
            heavy = np.ones(a, dtype=bool)
        else:
            # how far any client's distance to any center can have moved (see above), one bound
            # for the own and the other centers (a separate own-center bound, a gather over the
            # entries, saved fewer distances than it cost)
            drift = ent.col_sums(2.0 * delta.max(1))       # = 2 x the sums, bit for bit
            drift += dnorm.max(1)[:, None]
            np.minimum(drift, moved.max(1)[:, None], out=drift)
            upper += drift
            lower -= drift
            # clients whose own center is provably still the nearest keep it (Hamerly's second
            # test, half the distance from the own center to the nearest other one, is left
            # out: on the drift-step trace it cleared none of 570,731 clients in doubt and cost
            # a K x K x d pass per iteration)
            doubt = upper > lower
            heavy = np.count_nonzero(doubt, axis=1) > _FULL_PASS_SHARE * n
            if heavy.any():             # their clients get the full pass below
                light = np.flatnonzero(~heavy)
                rr, ii = _nonzero2(doubt[light])
                rr = light[rr]
                fi = rr * n + ii
            else:
                fi = np.flatnonzero(doubt)
                rr, ii = np.divmod(fi, n)
            bound = low_f[fi]
        parts = []                       # (restart, row, flat index, old cluster, new cluster)
        for g in np.unique(g_live[heavy]):         # most clients in doubt: a full pass
            rows = np.flatnonzero(heavy & (g_live == g))
            lab, upper[rows], lower[rows] = _assign_all(
                ent, centers[rows, :ks[g]], cnorm[rows, :ks[g]], eps_g[g], buf=scratch)
            before = labels[rows]
            diff = np.flatnonzero(lab != before)
            r2, i2 = np.divmod(diff, n)
            r2 = rows[r2]
            parts.append((r2, i2, r2 * n + i2, before.reshape(-1)[diff], lab.reshape(-1)[diff]))
        old = lab_f[fi]
        if len(rr):
            own_d = ent.to_own(centers, cnorm, rr, ii, old)
            up_f[fi] = own_d
            doubt = own_d > bound
            rr, ii, fi, old = rr[doubt], ii[doubt], fi[doubt], old[doubt]
        if len(rr):
            # the restarts of small K need fewer center columns: two buckets by K, where the
            # columns saved outweigh a second pass (each pair's distances are the same either
            # way, the padded columns inf)
            k_pair = k_live[rr]
            kcut = (kmax + 1) // 2
            small = k_pair <= kcut
            if np.count_nonzero(small) * (kmax - kcut) < _PAD_PAIRS:
                small[:] = False
            for sel, kk in ((small, kcut), (~small, kmax)):
                if not sel.any():
                    continue
                rs, is_, fs, os_ = rr[sel], ii[sel], fi[sel], old[sel]
                dist = ent.to_pairs(centers[:, :kk], cnorm[:, :kk], rs, is_)   # K x P
                padded = np.arange(kk)[:, None] >= k_pair[sel][None, :]
                if padded.any():
                    dist[padded] = np.inf
                best, up_f[fs] = _argmin0(dist, eps_g[g_live[rs]])
                dist.reshape(-1)[best * len(rs) + np.arange(len(rs))] = np.inf
                low_f[fs] = _min0(dist)
                parts.append((rs, is_, fs, os_, best))
        parts.append((rr[:0], ii[:0], fi[:0], old[:0], old[:0]))      # (none left: empty arrays)
        rr, ii, fi, old, best = (np.concatenate(p) for p in zip(*parts))
        ch = best != old
        changed = np.zeros(a, dtype=np.int64)
        if ch.any():
            rc, ic, oc, nc = rr[ch], ii[ch], old[ch], best[ch]
            lab_f[fi[ch]] = nc
            changed = np.bincount(rc, minlength=a)
            # per group: many changes -> recount from scratch, else update by the changes
            recount = np.bincount(g_live, weights=changed, minlength=n_g) > 0.25 * live_g * n
            if recount.any():
                rows = np.flatnonzero(recount[g_live])
                sums[rows], counts[rows] = ent.sums_all(kmax, labels[rows])
                upd = ~recount[g_live[rc]]
                rc, ic, oc, nc = rc[upd], ic[upd], oc[upd], nc[upd]
            if len(rc):
                added, taken = ent.moved_sums(a, kmax, rc, ic, nc, oc)
                sums += added
                sums += taken
                counts += np.bincount(rc * kmax + nc, minlength=a * kmax).reshape(a, kmax)
                counts -= np.bincount(rc * kmax + oc, minlength=a * kmax).reshape(a, kmax)
        done = changed <= tol * n if it + 1 < max_iter else np.ones(a, dtype=bool)
        if keep is not None and it + 1 == prune_at:
            # successive halving: per group, the ``keep`` restarts of lowest cost so far go on
            for g in np.flatnonzero(live_g):
                if halve[g] is None:
                    continue
                rows = np.flatnonzero(g_live == g)
                cost = ent.costs_all(centers[rows, :ks[g]], labels[rows])
                prev = out_cost[offs[g]:offs[g + 1]]
                pool = np.concatenate([prev[np.isfinite(prev)], cost])
                cut = np.sort(pool)[min(halve[g], len(pool)) - 1]
                drop = rows[(cost > cut) & ~done[rows]]
                out_cost[live[drop]] = np.inf
                done[drop] = True
        if done.any():
            out_labels[live[done]] = labels[done]
            out_centers[live[done]] = centers[done]
            fin = done & ~np.isinf(out_cost[live])
            for g in np.unique(g_live[fin]):
                rows = np.flatnonzero(fin & (g_live == g))
                out_cost[live[rows]] = ent.costs_all(centers[rows, :ks[g]], labels[rows])
            going = ~done
            live = live[going]
            if not len(live):
                break
            labels, upper, lower = labels[going], upper[going], lower[going]
            centers, sums, counts = centers[going], sums[going], counts[going]
            cnorm = cnorm[going]
    return [(out_labels[offs[g]:offs[g + 1]], out_centers[offs[g]:offs[g + 1], :ks[g]],
             out_cost[offs[g]:offs[g + 1]]) for g in range(n_g)]


def _kmeans_ks(pts: Points, ks: list[int], n_init: int, rng: np.random.Generator,
               max_iter: int = 100, tol: float = 0.0, keep: int | None = None,
               prune_at: int = 3, batched: bool | None = None) -> list[KMeansResult]:
    """:func:`kmeans` for every K in ``ks`` (the same RNG draws, in the same order, as one call
    per K); the lock-step engine runs the restarts of all K together."""
    if batched is None:          # sparse vectors only: on dense ones the gathers cost more
        batched = pts.n >= _BATCH_MIN_CLIENTS and pts._csr is not None
    lock = batched and pts.metric == "l1" and max_iter > 0 and n_init > 0
    out: dict[int, KMeansResult] = {}
    groups: list[tuple[np.ndarray, np.ndarray]] = []
    owner: list[int] = []
    for pos, k in enumerate(ks):
        if not (lock and k > 1):
            out[pos] = _kmeans_loop(pts, k, n_init, rng, max_iter, tol)
            continue
        # all seedings first (the same RNG draws, in the same order, as one restart at a time);
        # the seeding's distances to the seeds serve as the first assignment pass
        dists = np.empty((k, n_init, pts.n))
        seeds = _kmeans_pp_restarts(pts, k, n_init, rng, dists)
        step = max(1, int(_BATCH_ELEMENTS // max(1, pts.n * k)))
        for s in range(0, n_init, step):
            groups.append((seeds[s:s + step], dists[:, s:s + step]))
            owner.append(pos)
    if groups:
        ent = pts._l1_entries()
        results = []
        batch: list[tuple[np.ndarray, np.ndarray]] = []
        for grp in groups + [None]:     # as many groups at once as _MERGE_ELEMENTS allows
            if batch and (grp is None or (sum(len(c) for c, _ in batch) + len(grp[0])) * pts.n
                          > _MERGE_ELEMENTS):
                results += _lloyd_l1_batch(ent, batch, max_iter, tol, keep, prune_at)
                batch = []
            if grp is not None:
                batch.append(grp)
        best: dict[int, KMeansResult] = {}
        for pos, (labels, centers, costs) in zip(owner, results):
            for j in range(len(costs)):
                if pos not in best or costs[j] < best[pos].cost:
                    best[pos] = KMeansResult(labels[j].copy(), centers[j].copy(), float(costs[j]))
        for pos, res in best.items():
            out[pos] = _reindex(res)
    return [out[pos] for pos in range(len(ks))]


def _reindex(res: KMeansResult) -> KMeansResult:
    """Drop empty clusters and re-index the rest."""
    used = np.unique(res.labels)
    remap = np.full(len(res.centers), -1)
    remap[used] = np.arange(len(used))
    return KMeansResult(remap[res.labels], res.centers[used], res.cost)


def kmeans(pts: Points, k: int, n_init: int, rng: np.random.Generator,
           max_iter: int = 100, tol: float = 0.0, keep: int | None = None,
           prune_at: int = 3, batched: bool | None = None) -> KMeansResult:
    """k-means with rho (docs/fielding/README.md, D4): ``n_init`` k-means++ seedings with rho, Lloyd
    iterations with rho for the assignment and arithmetic-mean centers (an empty cluster keeps its
    center) until the assignment is unchanged or ``max_iter``; the run of lowest cost is kept,
    empty clusters are dropped and the rest re-indexed.

    Two engines with the same RNG draws (seeding only) and the same iterations; they differ
    only in how distances equal up to rounding are tie-broken, which on data with exact ties
    (duplicate label vectors) can lead Lloyd to another, equally good local optimum:

    * lock step (``batched=True``; l1 only): the restarts advance together
      (:func:`_lloyd_l1_batch`: Hamerly's bounds, dense full passes while most clients are in
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
    return _kmeans_ks(pts, [k], n_init, rng, max_iter, tol, keep, prune_at, batched)[0]


def _kmeans_loop(pts: Points, k: int, n_init: int, rng: np.random.Generator,
                 max_iter: int, tol: float) -> KMeansResult:
    """The per-restart engine of :func:`kmeans`."""
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
    return _reindex(best)


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
    """The silhouette search (docs/fielding/README.md, D5): k-means for every K in range, the best
    silhouette wins (ties -> smaller K). Fewer than 3 clients, or a best silhouette below
    ``min_silhouette``: one cluster."""
    pts = pts or Points(x, metric)
    rng = np.random.default_rng(seed)
    best: ClusterResult | None = None
    scores: dict[int, float] = {}
    ks = list(k_range(k_min, k_max, pts.n))
    for k, res in zip(ks, _kmeans_ks(pts, ks, n_init, rng, tol=tol, keep=keep,
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
