"""Fielding's full k-means assignment pass in compiled code (Numba): ``nearest_l1``, for the
lock-step engine's full passes on sparse label vectors (``lockstep._assign_all``, where
``L1Entries.compiled_pass`` allows).

Imported only where it runs, so that importing the family does not load Numba; compiled once
per machine and cached on disk beside this file.
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True, error_model="numpy")
def nearest_l1(cols, vals, xnorm, centers, cnorm, eps, labels, upper, lower):
    """Fielding's full assignment pass for non-negative sparse rows and R restarts of K
    non-negative centers (``centers``: R x K x d, ``cnorm``: R x K), into ``labels``,
    ``upper``, ``lower`` (R x N). The rows come slot by slot (``cols``, ``vals``: L x N, a
    row's j-th stored entry in slot j, padded with column 0, value 0), so that every loop runs
    over the N rows (vectorised).

    The distance is |x - c|_1 = (sum_{y in supp x} min(x_y, c_y)) * -2 + |x|_1 + |c|_1, the
    minima added slot after slot, as ``L1Entries.to_pairs`` adds them (the same numbers, bit
    for bit; a padding slot adds +0). Then ``lockstep._argmin0``'s choice: the minimum plus ``eps`` is
    the upper bound, the label the lowest k >= 1 within it (else 0); ``lower`` is the nearest
    other center (inf for K = 1), as ``_exclude`` + ``_min0``. One pass per restart, without
    the R x K x N distance array."""
    L, n = cols.shape
    R, K, _ = centers.shape
    dist = np.empty((K, n))
    for r in range(R):
        for k in range(K):
            c, row = centers[r, k], dist[k]
            for i in range(n):
                a, b = c[cols[0, i]], vals[0, i]
                row[i] = a if a < b else b
            for t in range(1, L):
                for i in range(n):
                    a, b = c[cols[t, i]], vals[t, i]
                    row[i] += a if a < b else b
            for i in range(n):
                row[i] = (row[i] * -2.0 + xnorm[i]) + cnorm[r, k]
        bound, lab, other = upper[r], labels[r], lower[r]
        bound[:] = dist[0]
        for k in range(1, K):
            for i in range(n):
                bound[i] = min(bound[i], dist[k, i])
        if eps != 0.0:
            for i in range(n):
                bound[i] += eps
        lab[:] = 0
        for k in range(K - 1, 0, -1):
            for i in range(n):
                if dist[k, i] <= bound[i]:
                    lab[i] = k
        other[:] = np.inf
        for k in range(K):
            for i in range(n):
                if k != lab[i] and dist[k, i] < other[i]:
                    other[i] = dist[k, i]
