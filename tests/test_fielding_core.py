"""Fielding's clustering routine and drift handling (strategies/fielding_core.py), no Flower."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.spatial.distance import jensenshannon
from sklearn.metrics import adjusted_rand_score, silhouette_score

from fedcluster_app.strategies import fielding_core as core


def _groups(rng, n_per=10, d=10, groups=((0, 1, 2, 3), (4, 5, 6), (7, 8, 9))):
    rows, truth = [], []
    for g, labels in enumerate(groups):
        for _ in range(n_per):
            p = np.zeros(d)
            p[list(labels)] = rng.dirichlet(np.full(len(labels), 5.0))
            rows.append(p)
            truth.append(g)
    return np.array(rows), np.array(truth)


@pytest.mark.parametrize("metric", core.METRICS)
@pytest.mark.parametrize("sparse_data", [False, True])
def test_distances_and_silhouette_match_brute_force(metric, sparse_data):
    rng = np.random.default_rng(0)
    x = rng.dirichlet(np.full(12, 0.05 if sparse_data else 1.0), size=60)
    if sparse_data:
        x[x < 0.05] = 0.0
        x /= x.sum(1, keepdims=True)
    pts = core.Points(x, metric)
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
    dmat = core.pairwise(x, metric)
    sums = np.stack([dmat[:, labels == k].sum(1) for k in range(4)], axis=1)
    assert np.allclose(pts.cluster_sums(labels, 4), sums, atol=1e-8)
    assert core.silhouette(pts, labels) == pytest.approx(
        silhouette_score(dmat, labels, metric="precomputed"), abs=1e-9)


def test_cluster_recovers_groups_and_picks_k_by_silhouette():
    x, truth = _groups(np.random.default_rng(1))
    res = core.cluster(x, "l1", 2, 10, 10, seed=0)
    assert res.k == 3
    assert adjusted_rand_score(truth, res.labels) == 1.0
    assert set(res.scores) == set(range(2, 11))
    assert res.silhouette == max(res.scores.values())
    # same seed, same result; K range capped at N - 1
    again = core.cluster(x, "l1", 2, 10, 10, seed=0)
    assert np.array_equal(again.labels, res.labels)
    assert list(core.k_range(2, 10, 5)) == [2, 3, 4]
    # min-silhouette above the best score: one cluster
    assert core.cluster(x, "l1", 2, 4, 2, seed=0, min_silhouette=0.99).k == 1


def test_kmeans_drops_empty_clusters_and_reindexes():
    x = np.array([[1.0, 0.0]] * 5 + [[0.0, 1.0]] * 5)   # two distinct points only
    res = core.kmeans(core.Points(x, "l1"), 4, 3, np.random.default_rng(0))
    assert len(res.centers) == 2 and set(res.labels) == {0, 1}


def _state(x, labels):
    pts = core.Points(x, "l1")
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
    out = core.handle_drift(core.Points(x2, "l1"), truth, drifted, centers, centers, tau=1 / 3)
    assert out.trigger is None
    assert [(r, o, n) for r, o, n in out.moves] == [(i, 0, 1) for i in movers]
    assert out.theta == pytest.approx(2.0)             # disjoint label groups: L1 distance 2
    assert max(out.shifts.values()) < out.threshold == pytest.approx(2 / 3)
    # the same drift with tau = 0 re-clusters, with tau = inf never
    assert core.handle_drift(core.Points(x2, "l1"), truth, drifted, centers, centers, 0.0).trigger
    assert core.handle_drift(core.Points(x2, "l1"), truth, drifted, centers, centers,
                             math.inf).trigger is None


def test_large_drift_triggers_and_empty_cluster_is_reported():
    rng = np.random.default_rng(3)
    x, truth = _groups(rng)
    pts, centers = _state(x, truth)
    x2 = np.zeros_like(x)
    for i in range(len(x)):                          # everyone re-forms into {0..4} / {5..9}
        labels = [0, 1, 2, 3, 4] if i % 2 == 0 else [5, 6, 7, 8, 9]
        x2[i, labels] = rng.dirichlet(np.full(5, 5.0))
    out = core.handle_drift(core.Points(x2, "l1"), truth, np.ones(len(x), bool), centers,
                            centers, tau=1 / 3)
    assert out.trigger == "center_shift"
    res = core.cluster(x2, "l1", 2, 10, 5, seed=0)
    assert res.k == 2 and adjusted_rand_score(np.arange(len(x)) % 2, res.labels) == 1.0
    # all members of cluster 2 move away: the cluster is reported empty
    x3 = x.copy()
    x3[truth == 2] = x[0]
    out = core.handle_drift(core.Points(x3, "l1"), truth, truth == 2, centers, centers, math.inf)
    assert out.emptied == [2] and 2 not in out.centers


def test_diameter_trigger_catches_the_symmetric_split_the_center_shift_misses():
    # fielding.md 2.5 / 8.2: 3 groups re-form as 5 pairs; centers barely move
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
    shift = core.handle_drift(core.Points(x2, "l1"), truth, drifted, centers, centers, 1 / 3,
                              "center_shift")
    both = core.handle_drift(core.Points(x2, "l1"), truth, drifted, centers, centers, 1 / 3,
                             "either", delta_diam=1.5)
    assert shift.trigger is None
    assert both.trigger == "diameter" and both.max_diameter > 1.5


def test_js_distance_is_bounded_and_symmetric():
    p, q = np.array([1.0, 0, 0]), np.array([0, 0, 1.0])
    assert core.distance(p, q, "js") == pytest.approx(1.0)
    assert core.distance(p, p, "js") == 0.0
    rng = np.random.default_rng(5)
    a, b = rng.dirichlet(np.ones(6), 2)
    assert core.distance(a, b, "js") == pytest.approx(core.distance(b, a, "js"))
    with pytest.raises(ValueError, match="unknown distance"):
        core.Points(np.ones((2, 2)), "manhattan")
