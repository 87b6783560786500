"""k-means with rho (docs/fielding/README.md, D4), in pure NumPy: :func:`kmeans` and its seeding.

* :func:`kmeans_pp` -- k-means++ seeding with rho (next center drawn with probability
  proportional to D_i^2); for sparse l1 data all restarts' seedings advance together
  (:func:`_kmeans_pp_restarts`, the same seeds and RNG draws);
* :func:`kmeans` -- ``n_init`` restarts of Lloyd iterations with rho for the assignment and
  arithmetic-mean centers, lowest cost kept, empty clusters dropped; :func:`kmeans_each_k` runs it
  for every K of the silhouette search, with the same RNG draws in the same order.

Two engines: one restart after the other (:func:`_kmeans_loop`: Hamerly's bounds for l1 and js,
plain Lloyd otherwise), and for l1 at scale the restarts in lock step (``lockstep.py``; in the
silhouette search those of all K together), optionally with successive halving (``keep``: only the
best restarts after a few iterations run to convergence). Hand-written: scikit-learn's KMeans and
kmeans_plusplus are Euclidean only, and its l1 distances are slower than ours
(``pairwise_distances_argmin_min(x, centers, metric="manhattan")`` on the sparse vectors: 5.9 ms for
5,078 clients x 10 centers, the dense pass with its bounds here 1.35 ms).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedcluster_app.families.fielding.distances import Points, pairwise, rowwise
from fedcluster_app.families.fielding.lockstep import lloyd_l1_batch

_BATCH_MIN_CLIENTS = 1000       # batched=None: the lock-step engine from this many (sparse) clients
_BATCH_ELEMENTS = 4_000_000     # restarts x clients x K held at once (more restarts: in chunks)
_MERGE_ELEMENTS = 4_000_000    # restarts x clients iterated in lock step at once (all K)


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


def kmeans_each_k(pts: Points, ks: list[int], n_init: int, rng: np.random.Generator,
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
                results += lloyd_l1_batch(ent, batch, max_iter, tol, keep, prune_at)
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
      (:func:`lockstep.lloyd_l1_batch`: Hamerly's bounds, dense full passes while most clients are in
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
    return kmeans_each_k(pts, [k], n_init, rng, max_iter, tol, keep, prune_at, batched)[0]


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
        moved = rowwise(centers, new_centers, pts.metric)
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
