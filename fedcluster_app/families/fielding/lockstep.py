"""The lock-step l1 k-means engine: Lloyd with l1 for many restarts at once (:func:`lloyd_l1_batch`).

``kmeans.kmeans(batched=True)`` and the silhouette search run their restarts here (those of all
K together), optionally with successive halving. The restarts advance in lock step, so one NumPy
pass serves all of them, and Hamerly's bounds skip the distances that cannot change an
assignment; the distances themselves come from :class:`l1_entries.L1Entries`.

The engine's results depend on the rounding of every distance it computes and on which distances
it recomputes (label vectors tie exactly, and a tie goes to the lowest index): its speed-ups keep
both, so partitions and centers stay the same bit for bit (test_fielding_core.py pins them).
"""

from __future__ import annotations

import numpy as np

from fedcluster_app.families.fielding.l1_entries import L1Entries

_FULL_PASS_SHARE = 0.5          # more clients in doubt than this share: one dense full pass
_TIE = 1e-12                    # relative: l1 distances this close are tied (-> lowest k)
_PAD_PAIRS = 20_000             # pairs x padded centers below which one pass beats two buckets


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


def _assign_all(ent: L1Entries, centers: np.ndarray, cnorm: np.ndarray, eps: float,
                dist: np.ndarray | None = None, buf: np.ndarray | None = None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Nearest center of every row for R restarts (centers: R x K x d), from all distances
    (``dist``: K x R x N if already known, overwritten): labels (ties within ``eps`` -> lowest k),
    upper bounds (nearest distance + eps) and lower bounds (nearest other center), each R x N."""
    r, k, _ = centers.shape
    if dist is None and ent.compiled_pass():
        from fedcluster_app.families.fielding import compiled   # Numba, loaded on first use

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


def lloyd_l1_batch(ent: L1Entries, groups: list[tuple[np.ndarray, np.ndarray | None]],
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
    (the first iterations) gets a full pass (:meth:`L1Entries.full`) instead; right after the
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
