"""The stored entries of an l1 point set, for the lock-step k-means (``lockstep.py``).

:class:`L1Entries` holds a point set's non-zero entries in row order (CSR) and computes, for many
k-means restarts at once, what the lock-step engine needs: distances of rows to centers (all
rows and centers: :meth:`L1Entries.full` or, compiled, ``compiled.nearest_l1``; a few (restart,
row) pairs in doubt: :meth:`L1Entries.to_pairs`, :meth:`L1Entries.to_own`), the k-means++
seeds' distances (:meth:`L1Entries.to_rows`), cluster sums and costs, and the sums moved by the
clients that changed cluster.

Apart from :mod:`lockstep` because it is the arithmetic, and the loop is the algorithm: every
method here gives the numbers of :func:`distances._l1_sparse` (the same formulas and summation
order), bit for bit where the docstrings say so; which of them to call is the loop's choice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from scipy import sparse

if TYPE_CHECKING:
    from fedcluster_app.families.fielding.distances import Points

_SUPPORT_ELEMENTS = 5_000_000   # largest N x d 0/1 support matrix (float64), dense passes
_GATHER_ELEMENTS = 4_000_000    # entries x K gathered at once by L1Entries.to_pairs
_ENTRY_ELEMENTS = 200_000      # restarts x stored entries per pass of sums_all / costs_all
_COMPILED_DENSITY = 0.1         # slots per row / d up to which full passes run compiled


def _segment_ids(offsets: np.ndarray) -> np.ndarray:
    """For segments ``offsets[j]:offsets[j + 1]`` of ``offsets[-1]`` items: the segment of each
    item (``np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))``). A count of segment
    starts, summed up in place: ~2x faster than np.repeat with short runs, and values spread
    over the items by np.take of these ids are ~2x faster than by np.repeat as well."""
    ids = np.bincount(offsets[1:-1], minlength=int(offsets[-1]) + 1)[:-1]
    np.cumsum(ids, out=ids)
    return ids


class L1Entries:
    """The stored entries of an l1 point set in row order (CSR), for the lock-step k-means.

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
        """Whether ``lockstep._assign_all``'s full passes run compiled (``compiled.py``,
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
