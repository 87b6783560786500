"""Fielding's clustering routine and drift handling (families/fielding/clustering.py) and what it
runs on (distances.py, kmeans.py, lockstep.py, l1_entries.py, compiled.py), no Flower."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest
from scipy.spatial.distance import jensenshannon
from sklearn.metrics import adjusted_rand_score, silhouette_score

from fedcluster_app.families.fielding import kmeans as km
from fedcluster_app.families.fielding import lockstep
from fedcluster_app.families.fielding.clustering import cluster, handle_drift, k_range, silhouette
from fedcluster_app.families.fielding.distances import Points, distance, pairwise
from fedcluster_app.families.fielding.kmeans import kmeans, kmeans_pp
from fedcluster_app.families.fielding.params import METRICS


def _groups(rng, n_per=10, d=10, groups=((0, 1, 2, 3), (4, 5, 6), (7, 8, 9))):
    rows, truth = [], []
    for g, labels in enumerate(groups):
        for _ in range(n_per):
            p = np.zeros(d)
            p[list(labels)] = rng.dirichlet(np.full(len(labels), 5.0))
            rows.append(p)
            truth.append(g)
    return np.array(rows), np.array(truth)


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("sparse_data", [False, True])
def test_distances_and_silhouette_match_brute_force(metric, sparse_data):
    rng = np.random.default_rng(0)
    x = rng.dirichlet(np.full(12, 0.05 if sparse_data else 1.0), size=60)
    if sparse_data:
        x[x < 0.05] = 0.0
        x /= x.sum(1, keepdims=True)
    pts = Points(x, metric)
    assert (pts._csr is not None) == (sparse_data and metric == "l1")
    centers = rng.dirichlet(np.ones(12), size=3)
    brute = {
        "l1": lambda a, b: np.abs(a - b).sum(),
        "sqeuclidean": lambda a, b: ((a - b) ** 2).sum(),
        "cosine": lambda a, b: 1 - a @ b / np.linalg.norm(a) / np.linalg.norm(b),
        "js": lambda a, b: jensenshannon(a, b, base=2),
    }[metric]
    expect = np.array([[brute(a, c) for c in centers] for a in x])
    assert np.allclose(pts.to_centers(centers), expect, atol=1e-9)
    labels = rng.integers(0, 4, size=60)
    dmat = pairwise(x, metric)
    sums = np.stack([dmat[:, labels == k].sum(1) for k in range(4)], axis=1)
    assert np.allclose(pts.cluster_sums(labels, 4), sums, atol=1e-8)
    assert silhouette(pts, labels) == pytest.approx(
        silhouette_score(dmat, labels, metric="precomputed"), abs=1e-9)


def test_cluster_recovers_groups_and_picks_k_by_silhouette():
    x, truth = _groups(np.random.default_rng(1))
    res = cluster(x, "l1", 2, 10, 10, seed=0)
    assert res.k == 3
    assert adjusted_rand_score(truth, res.labels) == 1.0
    assert set(res.scores) == set(range(2, 11))
    assert res.silhouette == max(res.scores.values())
    # same seed, same result; K range capped at N - 1
    again = cluster(x, "l1", 2, 10, 10, seed=0)
    assert np.array_equal(again.labels, res.labels)
    assert list(k_range(2, 10, 5)) == [2, 3, 4]
    # min-silhouette above the best score: one cluster
    assert cluster(x, "l1", 2, 4, 2, seed=0, min_silhouette=0.99).k == 1


def test_kmeans_drops_empty_clusters_and_reindexes():
    x = np.array([[1.0, 0.0]] * 5 + [[0.0, 1.0]] * 5)   # two distinct points only
    res = kmeans(Points(x, "l1"), 4, 3, np.random.default_rng(0))
    assert len(res.centers) == 2 and set(res.labels) == {0, 1}


def _state(x, labels):
    pts = Points(x, "l1")
    centers = {int(c): x[labels == c].mean(0) for c in np.unique(labels)}
    return pts, centers


def test_small_drift_moves_clients_without_global_reclustering():
    rng = np.random.default_rng(2)
    x, truth = _groups(rng)
    pts, centers = _state(x, truth)
    # 3 clients of group 0 adopt group 1's labels
    x2 = x.copy()
    movers = [0, 1, 2]
    for i in movers:
        x2[i] = 0.0
        x2[i, [4, 5, 6]] = rng.dirichlet(np.full(3, 5.0))
    drifted = np.zeros(len(x), bool)
    drifted[movers] = True
    out = handle_drift(Points(x2, "l1"), truth, drifted, centers, centers, tau=1 / 3)
    assert out.trigger is None
    assert [(r, o, n) for r, o, n in out.moves] == [(i, 0, 1) for i in movers]
    assert out.theta == pytest.approx(2.0)             # disjoint label groups: L1 distance 2
    assert max(out.shifts.values()) < out.threshold == pytest.approx(2 / 3)
    # the same drift with tau = 0 re-clusters, with tau = inf never
    assert handle_drift(Points(x2, "l1"), truth, drifted, centers, centers, 0.0).trigger
    assert handle_drift(Points(x2, "l1"), truth, drifted, centers, centers,
                             math.inf).trigger is None


def test_large_drift_triggers_and_empty_cluster_is_reported():
    rng = np.random.default_rng(3)
    x, truth = _groups(rng)
    pts, centers = _state(x, truth)
    x2 = np.zeros_like(x)
    for i in range(len(x)):                          # everyone re-forms into {0..4} / {5..9}
        labels = [0, 1, 2, 3, 4] if i % 2 == 0 else [5, 6, 7, 8, 9]
        x2[i, labels] = rng.dirichlet(np.full(5, 5.0))
    out = handle_drift(Points(x2, "l1"), truth, np.ones(len(x), bool), centers,
                            centers, tau=1 / 3)
    assert out.trigger == "center_shift"
    res = cluster(x2, "l1", 2, 10, 5, seed=0)
    assert res.k == 2 and adjusted_rand_score(np.arange(len(x)) % 2, res.labels) == 1.0
    # all members of cluster 2 move away: the cluster is reported empty
    x3 = x.copy()
    x3[truth == 2] = x[0]
    out = handle_drift(Points(x3, "l1"), truth, truth == 2, centers, centers, math.inf)
    assert out.emptied == [2] and 2 not in out.centers


def test_diameter_trigger_catches_the_symmetric_split_the_center_shift_misses():
    # docs/fielding/README.md, D14: 3 groups re-form as 5 pairs; centers barely move
    rng = np.random.default_rng(4)
    groups3 = ((0, 1, 2, 3), (4, 5, 6), (7, 8, 9))
    x, truth = _groups(rng, n_per=10, groups=groups3)
    pts, centers = _state(x, truth)
    pairs = ((0, 1), (2, 3), (4, 5), (6, 7), (8, 9))
    x2 = np.zeros_like(x)
    for i in range(len(x)):
        # a client of group g takes one of the pairs inside (or overlapping) its group
        options = [p for p in pairs if set(p) & set(groups3[truth[i]])]
        p = options[i % len(options)]
        x2[i, list(p)] = rng.dirichlet(np.full(2, 5.0))
    drifted = np.ones(len(x), bool)
    shift = handle_drift(Points(x2, "l1"), truth, drifted, centers, centers, 1 / 3,
                              "center_shift")
    both = handle_drift(Points(x2, "l1"), truth, drifted, centers, centers, 1 / 3,
                             "either", delta_diam=1.5)
    assert shift.trigger is None
    assert both.trigger == "diameter" and both.max_diameter > 1.5


def test_js_distance_is_bounded_and_symmetric():
    p, q = np.array([1.0, 0, 0]), np.array([0, 0, 1.0])
    assert distance(p, q, "js") == pytest.approx(1.0)
    assert distance(p, p, "js") == 0.0
    rng = np.random.default_rng(5)
    a, b = rng.dirichlet(np.ones(6), 2)
    assert distance(a, b, "js") == pytest.approx(distance(b, a, "js"))
    with pytest.raises(ValueError, match="unknown distance"):
        Points(np.ones((2, 2)), "manhattan")


# ------------------------------------------------------------------ lock-step l1 k-means
def _buckets(rng, n, d=40, per=(2, 7)):
    """Streaming-window-like label vectors: a few random labels per client, unstructured."""
    x = np.zeros((n, d))
    for i in range(n):
        labels = rng.choice(d, size=int(rng.integers(*per)), replace=False)
        x[i, labels] = rng.dirichlet(np.ones(len(labels)))
    return x


def _brute_kmeans_cost(x, labels, centers):
    return float(np.abs(x - centers[labels]).sum())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lock_step_kmeans_finds_the_same_clusters_as_the_per_restart_loop(seed):
    rng = np.random.default_rng(seed)
    sparse_groups = [tuple(rng.choice(60, 4, replace=False)) for _ in range(6)]
    for x, true_k in ((_groups(rng)[0], 3),
                      (_groups(rng, n_per=25, d=60, groups=sparse_groups)[0], 6)):
        pts = Points(x, "l1")
        for k in (2, true_k, true_k + 2):
            old = kmeans(pts, k, 5, np.random.default_rng(seed), batched=False)
            for keep in (None, 2):
                new = kmeans(pts, k, 5, np.random.default_rng(seed), batched=True, keep=keep)
                # the reported centers and cost are those of the returned partition
                assert new.cost == pytest.approx(_brute_kmeans_cost(x, new.labels, new.centers))
                if k == true_k:                 # the clusters: found by both
                    assert new.cost == pytest.approx(old.cost, rel=1e-9)
                    assert adjusted_rand_score(old.labels, new.labels) == 1.0
                else:                           # no clear answer: ties may lead elsewhere
                    assert new.cost <= old.cost * 1.05
        old = cluster(x, "l1", 2, 8, 5, seed=seed, batched=False)
        new = cluster(x, "l1", 2, 8, 5, seed=seed, batched=True, keep=2)
        assert new.k == old.k and adjusted_rand_score(old.labels, new.labels) == 1.0


def test_lock_step_kmeans_is_as_good_on_unstructured_label_vectors():
    # exact ties (rounding) can lead both engines to different local optima: compare quality
    rng = np.random.default_rng(7)
    x = _buckets(rng, 400)
    pts = Points(x, "l1")
    for k in (3, 8):
        old = [kmeans(pts, k, 6, np.random.default_rng(s), batched=False).cost
               for s in range(4)]
        new = [kmeans(pts, k, 6, np.random.default_rng(s), batched=True).cost
               for s in range(4)]
        halved = [kmeans(pts, k, 6, np.random.default_rng(s), batched=True, keep=2).cost
                  for s in range(4)]
        assert np.mean(new) == pytest.approx(np.mean(old), rel=0.01)
        assert np.mean(halved) == pytest.approx(np.mean(old), rel=0.01)
        res = kmeans(pts, k, 6, np.random.default_rng(0), batched=True)
        assert res.cost == pytest.approx(_brute_kmeans_cost(x, res.labels, res.centers))
        # a Lloyd fixed point: every client is at a nearest center of the partition it ended in
        dist = pts.to_centers(res.centers)
        assert np.all(dist[np.arange(len(x)), res.labels] <= dist.min(1) + 1e-9)


def test_successive_halving_only_drops_restarts_that_are_still_running():
    x, truth = _groups(np.random.default_rng(3))
    pts = Points(x, "l1")
    full = kmeans(pts, 3, 8, np.random.default_rng(1), batched=True)
    # every restart converges before iteration 50: pruning there changes nothing
    late = kmeans(pts, 3, 8, np.random.default_rng(1), batched=True, keep=1, prune_at=50)
    assert late.cost == full.cost and np.array_equal(late.labels, full.labels)
    early = kmeans(pts, 3, 8, np.random.default_rng(1), batched=True, keep=1, prune_at=1)
    assert adjusted_rand_score(truth, early.labels) == 1.0


def test_dense_pass_matches_the_sparse_pass_and_brute_force():
    rng = np.random.default_rng(4)
    x = _buckets(rng, 200, d=30)
    pts = Points(x, "l1")
    ent = pts._l1_entries()
    centers = np.stack([kmeans_pp(pts, 4, rng) for _ in range(3)])
    centers = 0.5 * centers + 0.5 * rng.dirichlet(np.ones(30), size=(3, 4))
    cnorm = ent.norms(centers)
    dense = ent.full(centers, cnorm)                                   # R x K x N
    r, i = np.repeat(np.arange(3), 200), np.tile(np.arange(200), 3)
    pairs = ent.to_pairs(centers, cnorm, r, i).reshape(4, 3, 200).transpose(1, 0, 2)
    brute = np.abs(x[None, None, :, :] - centers[:, :, None, :]).sum(-1)
    assert np.allclose(dense, brute, atol=1e-12) and np.allclose(pairs, brute, atol=1e-12)
    own = ent.to_own(centers, cnorm, r, i, np.tile(np.arange(200) % 4, 3))
    assert np.allclose(own, brute[r, np.tile(np.arange(200) % 4, 3), i], atol=1e-12)
    # dense data (every label everywhere) or signed vectors: the sparse pass does it
    assert Points(rng.dirichlet(np.ones(6), 50), "l1")._l1_entries().full(
        rng.dirichlet(np.ones(6), (2, 3)), np.ones((2, 3))) is None
    assert Points(rng.normal(size=(50, 6)), "l1")._l1_entries().support() is None


def test_compiled_full_pass_gives_the_sparse_pass_assignment_bit_for_bit():
    """The compiled full pass (label vectors: a few labels each) gives the labels, upper and
    lower bounds of the NumPy sparse pass to the last bit, ties included (exact ties: clients
    that share no label with several centers); dense data keeps the NumPy passes."""
    rng = np.random.default_rng(7)
    x = _buckets(rng, 300, d=40, per=(2, 5))
    pts = Points(x, "l1")
    ent = pts._l1_entries()
    assert ent.compiled_pass()
    centers = np.stack([kmeans_pp(pts, 6, rng) for _ in range(4)])   # points: exact ties
    centers[2] = 0.5 * centers[2] + 0.5 * rng.dirichlet(np.ones(40), size=6)
    cnorm = ent.norms(centers)
    eps = lockstep._TIE * 3.0
    lab, up, low = lockstep._assign_all(ent, centers, cnorm, eps)
    r, i = np.repeat(np.arange(4), 300), np.tile(np.arange(300), 4)
    dist = ent.to_pairs(centers, cnorm, r, i).reshape(6, 4, 300)
    near = np.sort(dist, 0)
    ties = np.count_nonzero(near[1] == near[0])              # exactly tied nearest centers
    want_lab, want_up = lockstep._argmin0(dist, eps)
    lockstep._exclude(dist, want_lab)
    assert np.array_equal(lab, want_lab) and np.array_equal(up, want_up)
    assert np.array_equal(low, lockstep._min0(dist))
    assert ties > 0 and len(np.unique(lab)) > 1
    assert not Points(rng.dirichlet(np.ones(6), 50), "l1")._l1_entries().compiled_pass()


@pytest.mark.parametrize("kind", ["dense", "signed", "duplicates"])
def test_lock_step_kmeans_on_dense_signed_and_duplicate_points(kind):
    rng = np.random.default_rng(5)
    if kind == "dense":
        x = rng.dirichlet(np.ones(8), size=120)
    elif kind == "signed":
        x = rng.normal(size=(120, 5)) + np.repeat(np.eye(5)[:3] * 6, 40, axis=0)
    else:                                              # 3 distinct points, K = 5 asked
        x = np.repeat(np.eye(4)[:3], 40, axis=0)
    pts = Points(x, "l1")
    k = 5 if kind == "duplicates" else 3
    old = kmeans(pts, k, 4, np.random.default_rng(2), batched=False)
    new = kmeans(pts, k, 4, np.random.default_rng(2), batched=True)
    assert new.cost == pytest.approx(_brute_kmeans_cost(x, new.labels, new.centers))
    assert new.cost <= old.cost * 1.02 + 1e-9
    assert len(new.centers) == len(np.unique(new.labels)) == new.labels.max() + 1
    if kind == "duplicates":
        assert len(new.centers) == 3 and new.cost == pytest.approx(0.0, abs=1e-9)


def test_engine_is_picked_by_size(monkeypatch):
    calls = []
    batch = km.lloyd_l1_batch
    monkeypatch.setattr(km, "lloyd_l1_batch", lambda *a, **k: calls.append(1) or batch(*a, **k))
    x, _ = _groups(np.random.default_rng(6))
    cluster(x, "l1", 2, 4, 3, seed=0)
    assert calls == []                                   # 30 clients: per-restart engine
    monkeypatch.setattr(km, "_BATCH_MIN_CLIENTS", 30)
    cluster(x, "l1", 2, 4, 3, seed=0)
    assert len(calls) == 1                               # one lock-step batch for all K
    cluster(x, "sqeuclidean", 2, 4, 3, seed=0)      # l1 only
    dense = np.random.default_rng(1).dirichlet(np.ones(10), size=30)
    cluster(dense, "l1", 2, 4, 3, seed=0)           # sparse vectors only
    assert len(calls) == 1


# ------------------------------------------------------------ against a plain reference
def _plain_kmeans(x, k, n_init, rng, keep=None, prune_at=3, max_iter=100):
    """docs/fielding/README.md, D4 written plainly: brute-force l1 distances, k-means++ with the same
    RNG calls, Lloyd until no client moves; with ``keep``, successive halving after
    ``prune_at`` iterations (restarts already finished stay in the pool and are never dropped)."""
    dist = lambda c: np.abs(x[:, None, :] - c[None, :, :]).sum(2)
    runs = []
    for _ in range(n_init):
        idx = [int(rng.integers(len(x)))]
        dmin = dist(x[idx[0]][None])[:, 0]
        while len(idx) < k:
            w = dmin ** 2
            nxt = int(rng.choice(len(x), p=w / w.sum())) if w.sum() > 0 else int(
                rng.integers(len(x)))
            idx.append(nxt)
            dmin = np.minimum(dmin, dist(x[nxt][None])[:, 0])
        c = x[idx].copy()
        lab = dist(c).argmin(1)
        costs, done_at = [], max_iter - 1
        for it in range(max_iter):
            c = np.stack([x[lab == j].mean(0) if (lab == j).any() else c[j] for j in range(k)])
            new = dist(c).argmin(1)
            moved, lab = (new != lab).any(), new
            costs.append(float(np.abs(x - c[lab]).sum()))
            if not moved:
                done_at = it
                break
        runs.append((lab, costs, done_at))
    alive = list(range(n_init))
    if keep is not None and 0 < keep < n_init:
        early = [costs[-1] for _, costs, done_at in runs if done_at < prune_at - 1]
        at_prune = {r: runs[r][1][prune_at - 1] for r in range(n_init)
                    if runs[r][2] >= prune_at - 1}
        cut = sorted(early + list(at_prune.values()))[keep - 1]
        alive = [r for r in range(n_init) if not (r in at_prune and at_prune[r] > cut
                                                  and runs[r][2] != prune_at - 1)]
    best = min(alive, key=lambda r: runs[r][1][-1])                 # first of equal costs
    return np.unique(runs[best][0], return_inverse=True)[1]


@pytest.mark.parametrize("keep", [None, 2])
def test_lock_step_search_matches_a_plain_reference(keep):
    # every K's partition and the K chosen equal those of the plain loops above (the lock step,
    # the bounds, the full passes and the merged K only change how the distances are computed);
    # rows of random mass, so that no two centers are exactly as far from a client (a client
    # sharing no label with two centers of equal mass is), which argmin would break by rounding
    rng = np.random.default_rng(11)
    x = _buckets(rng, 240, d=24, per=(2, 5)) * rng.uniform(0.5, 2.0, size=(240, 1))
    ks = range(2, 7)
    res = cluster(x, "l1", 2, 6, 4, seed=5, batched=True, keep=keep)
    ref_rng = np.random.default_rng(5)
    plain = {k: _plain_kmeans(x, k, 4, ref_rng, keep=keep) for k in ks}
    scores = {k: silhouette_score(x, plain[k], metric="manhattan") for k in ks}
    best_k = max(ks, key=lambda k: (scores[k], -k))                 # ties: smaller K
    assert res.k == best_k and np.array_equal(res.labels, plain[best_k])
    assert all(res.scores[k] == pytest.approx(scores[k], abs=1e-12) for k in ks)
    pts = Points(x, "l1")
    for k in ks:                                                    # each K alone, too
        one = kmeans(pts, k, 4, np.random.default_rng(k), batched=True, keep=keep)
        assert np.array_equal(one.labels, _plain_kmeans(x, k, 4, np.random.default_rng(k),
                                                        keep=keep))


# ------------------------------------------------------------ the speed-ups change no result
def test_choice_draws_what_numpy_choice_draws():
    for s in range(300):
        rng = np.random.default_rng(s)
        w = rng.random(int(rng.integers(2, 3000))) ** 2
        if s % 3 == 0:
            w[rng.random(len(w)) < 0.5] = 0.0
        w[rng.integers(len(w))] += 1.0
        a, b = np.random.default_rng(s + 1000), np.random.default_rng(s + 1000)
        for _ in range(4):
            assert km._choice(a, w / w.sum()) == int(b.choice(len(w), p=w / w.sum()))
        assert a.random() == b.random()                       # the same draws consumed


@pytest.mark.parametrize("kind", ["buckets", "three points"])
def test_seeding_in_lock_step_matches_one_restart_after_the_other(kind):
    # three distinct points and K = 5: the weights run out (all zero), the fallback path
    x = (_buckets(np.random.default_rng(8), 300, d=30) if kind == "buckets"
         else np.repeat(np.eye(4)[:3], 40, axis=0))
    pts = Points(x, "l1")
    for k in (2, 5):
        one, together = np.empty((k, 4, len(x))), np.empty((k, 4, len(x)))
        a, b = np.random.default_rng(3), np.random.default_rng(3)
        seeds = np.stack([kmeans_pp(pts, k, a, one[:, j]) for j in range(4)])
        assert np.array_equal(km._kmeans_pp_restarts(pts, k, 4, b, together), seeds)
        assert np.array_equal(together, one) and a.random() == b.random()


def test_default_engine_gives_the_results_it_gave_before_its_speed_ups():
    """The default engine where it runs in lock step (1,500 clients, K = 2..10, 10 restarts,
    n-keep 2): partitions and centers as recorded with the engine of commit 06d4a89 (before the
    speed-ups of issue 16, part 3), bit for bit. Label vectors of a few labels each, so that
    many clients share no label with several seeds (exact ties): a change in which distances
    are recomputed, or in how they round, would move some of them. (The silhouettes go through
    a BLAS product whose last bits depend on its thread count: compared to 1e-12.)"""
    x = _buckets(np.random.default_rng(16), 1500, d=60, per=(2, 7))
    for seed, expect, sil in ((0, "cc1fc7e04a472165", 0.05289117120346801),
                              (1, "aee1f8c1c9be268f", 0.05180771212156532)):
        res = cluster(x, "l1", 2, 10, 10, seed=seed, keep=2)
        got = hashlib.sha256(res.labels.astype(np.int64).tobytes()
                             + res.centers.tobytes()).hexdigest()[:16]
        assert (res.k, got) == (10, expect)
        assert res.silhouette == pytest.approx(sil, abs=1e-12)
