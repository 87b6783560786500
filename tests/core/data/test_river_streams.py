"""Tests of River's drift streams as scenario families (core/data/river_streams.py)."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest

from fedcluster_app.core.data import build_scenario, list_scenarios
from fedcluster_app.core.data import scenarios as scen_mod
from fedcluster_app.core.data.drift import TabularRealisation
from fedcluster_app.core.data.generators import SeaConcept
from fedcluster_app.core.data.river_streams import (
    AgrawalConcept,
    HyperplaneConcept,
    RbfConcept,
    StaggerConcept,
    river_concepts,
)

# variant -> (scenario, number of concepts, input dimension, classes)
FAMILIES = {
    "stagger": ("stagger3", 3, 9, 2),
    "agrawal": ("agrawal4", 4, 13, 2),
    "hyperplane": ("hyperplane2", 2, 10, 2),
    "rbf": ("rbf4", 4, 10, 4),
    "rbf-drift": ("rbf-drift", 2, 10, 4),
}


def rng(*key: int) -> np.random.Generator:
    return np.random.default_rng([99, *key])


def stagger_rule(function: int, x: np.ndarray) -> np.ndarray:
    """STAGGER's boolean rules, decoded from the one-hot inputs."""
    size, color, shape = x[:, 0:3].argmax(1), x[:, 3:6].argmax(1), x[:, 6:9].argmax(1)
    rules = [(size == 0) & (color == 0), (color == 2) | (shape == 0), size >= 1]
    return rules[function].astype(np.int64)


def fresh(name: str, **kw):
    """An uncached rebuild, as another process would build it."""
    s = build_scenario(name, **kw)
    return scen_mod._build_cached.__wrapped__(s.spec)


# ------------------------------------------------------------------------------ registry


def test_list_scenarios_lists_the_river_families():
    listed = dict(list_scenarios())
    for name, n, dim, _ in FAMILIES.values():
        assert name in listed
        assert "River" in listed[name] and f"{dim}-d" in listed[name]


@pytest.mark.parametrize("variant", sorted(FAMILIES))
def test_concepts_have_stated_dimension_and_classes(variant):
    name, n, dim, classes = FAMILIES[variant]
    concepts = river_concepts(variant)
    assert len(concepts) == n
    for i, c in enumerate(concepts):
        x, y = c.sample(200, rng(i))
        assert x.shape == (200, dim) and x.dtype == np.float32 and np.isfinite(x).all()
        assert y.shape == (200,) and y.dtype == np.int64
        assert c.dim == dim and c.num_classes == classes
        assert set(np.unique(y)) == set(range(classes))  # every class occurs
    s = build_scenario(name)
    assert (s.input_shape, s.num_classes, s.model) == ((dim,), classes, "mlp")
    assert s.hidden == max(16, 2 * dim) and s.num_clients == 10 and s.num_steps in (6, 11)
    assert s.realisation.num_classes == classes


def test_tabular_realisation_takes_classes_from_its_concepts():
    assert TabularRealisation([SeaConcept(9.0)]).num_classes == 2  # no attribute: binary
    assert TabularRealisation([RbfConcept(1), RbfConcept(2)]).num_classes == 4
    assert build_scenario("sea2").num_classes == 2


def test_unknown_variant_is_refused():
    with pytest.raises(ValueError, match="stagger"):
        river_concepts("led")


# ---------------------------------------------------------------------------- determinism


@pytest.mark.parametrize("variant", sorted(FAMILIES))
def test_samples_are_deterministic_from_the_generator(variant):
    c = river_concepts(variant)[1]
    a, b = c.sample(100, rng(1, 2)), c.sample(100, rng(1, 2))
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert not np.array_equal(a[0], c.sample(100, rng(1, 3))[0])


def test_scenario_data_rebuild_identically_and_differ_by_client_and_step():
    s = build_scenario("agrawal4", seed=3, samples_per_step=60, test_samples=30)
    other = fresh("agrawal4", seed=3, samples_per_step=60, test_samples=30)
    assert other is not s
    for k, t in ((0, 1), (4, 9)):
        a, b = s.step_data(k, t), other.step_data(k, t)
        for f in ("x_train", "y_train", "x_test", "y_test"):
            np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
    base = s.step_data(1, 2).x_train
    assert not np.array_equal(base, s.step_data(2, 2).x_train)
    assert not np.array_equal(base, s.step_data(1, 3).x_train)
    assert not np.array_equal(base, build_scenario("agrawal4", seed=4, samples_per_step=60,
                                                   test_samples=30).step_data(1, 2).x_train)


# ------------------------------------------------------------------- the concepts are real


def test_stagger_concepts_follow_their_rules_and_disagree():
    grid = np.array(list(itertools.product(range(3), repeat=3)))
    x = np.zeros((27, 9), dtype=np.float32)
    x[np.arange(27)[:, None], grid + [0, 3, 6]] = 1.0
    for f, c in enumerate(river_concepts("stagger")):
        xs, ys = c.sample(300, rng(f))
        np.testing.assert_array_equal(ys, stagger_rule(f, xs))  # noise-free rule
        assert abs(ys.mean() - 0.5) < 0.01  # balanced classes
    for f, g in itertools.combinations(range(3), 2):
        assert (stagger_rule(f, x) != stagger_rule(g, x)).mean() > 0.3


def test_hyperplane_weights_are_rivers_and_the_two_concepts_differ():
    from river.datasets import synth

    a, b = river_concepts("hyperplane")
    for seed, c in ((7, a), (8, b)):  # River's own labels (no noise) follow our weights
        items = list(itertools.islice(synth.Hyperplane(seed=seed, n_features=10,
                                                       noise_percentage=0.0), 300))
        x = np.array([[xi[i] for i in range(10)] for xi, _ in items])
        np.testing.assert_array_equal(c.label(x), [y for _, y in items])
    batch = rng(5).random((5000, 10))
    assert (a.label(batch) != b.label(batch)).mean() > 0.3
    x, y = a.sample(4000, rng(6))
    assert 0.03 < (y != a.label(x)).mean() < 0.07  # 5% label noise


def test_only_the_hyperplane_and_the_drifting_rbf_have_intermediate_concepts():
    a, b = river_concepts("hyperplane")
    mid = a.interpolate(b, 0.5)
    assert isinstance(mid, HyperplaneConcept)
    np.testing.assert_allclose(mid.weights, (np.array(a.weights) + b.weights) / 2)
    start, end = river_concepts("rbf-drift")
    assert start.interpolate(end, 0.25).position == end.position // 4
    for variant in ("stagger", "agrawal", "rbf"):
        c0, c1 = river_concepts(variant)[:2]
        assert c0.interpolate(c1, 0.5) is None
    assert isinstance(river_concepts("agrawal")[0], AgrawalConcept)
    assert isinstance(river_concepts("stagger")[0], StaggerConcept)


@pytest.mark.parametrize("variant", sorted(FAMILIES))
def test_a_model_learns_concept_0_and_fails_on_the_others(variant):
    from sklearn.neural_network import MLPClassifier

    concepts = river_concepts(variant)
    x, y = concepts[0].sample(800, rng(10))
    model = MLPClassifier(hidden_layer_sizes=(max(16, 2 * concepts[0].dim),), max_iter=300,
                          random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence warnings of the short fit
        model.fit(x, y)
    xt, yt = concepts[0].sample(400, rng(11))
    same = model.score(xt, yt)
    chance = np.bincount(yt).max() / len(yt)
    assert same > max(0.85, chance + 0.3), (variant, same, chance)
    for j, c in enumerate(concepts[1:], start=1):
        xo, yo = c.sample(400, rng(12, j))
        assert model.score(xo, yo) < same - 0.15, (variant, j)


# ------------------------------------------------------------------------------- schedules


def test_sudden_changes_the_rule_at_the_drift_step():
    s = build_scenario("stagger3", samples_per_step=100, test_samples=50)  # its own: sudden
    assert s.drift_events() == [(3, k, 0, 1 + k % 2) for k in range(5)]
    for k in (0, 1):
        before, after = s.step_data(k, 2), s.step_data(k, 3)
        np.testing.assert_array_equal(before.y_train, stagger_rule(0, before.x_train))
        np.testing.assert_array_equal(after.y_train, stagger_rule(1 + k % 2, after.x_train))
        np.testing.assert_array_equal(after.y_test, stagger_rule(1 + k % 2, after.x_test))
    moved = build_scenario("hyperplane2", drift_pattern="sudden", drift_step=5)
    assert moved.drift_events() == [(5, k, 0, 1) for k in range(5)]


def test_incremental_goes_through_intermediate_hyperplanes():
    s = build_scenario("hyperplane2", drift_pattern="incremental", drift_step=3, num_steps=6,
                       samples_per_step=50, test_samples=20)
    path = [s.concept(0, t) for t in range(1, 7)]
    assert path == [0, 0, 2, 3, 1, 1] and s.num_concepts == 4
    assert s.concept(9, 6) == 0  # the second half does not drift
    concepts = s.realisation.concepts
    batch = rng(7).random((4000, 10))
    base = concepts[0].label(batch)
    gaps = [(concepts[c].label(batch) != base).mean() for c in (2, 3, 1)]
    assert 0 < gaps[0] < gaps[1] < gaps[2]  # each step moves further from A
    d = s.step_data(0, 3)
    assert (d.y_train == concepts[2].label(d.x_train)).mean() > 0.85
    # no intermediate concept: incremental = sudden
    inc = build_scenario("stagger3", drift_pattern="incremental").concept_matrix()
    sudden = build_scenario("stagger3", drift_pattern="sudden").concept_matrix()
    np.testing.assert_array_equal(inc, sudden)


def test_none_recurring_staggered_and_cp_files(tmp_path):
    assert build_scenario("rbf4", drift_pattern="none").concept_matrix().max() == 0
    rec = build_scenario("agrawal4", drift_pattern="recurring", drift_step=4, num_steps=11)
    assert [rec.concept(0, t) for t in range(1, 12)] == [0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0]
    assert rec.concept(2, 4) == 3
    stag = build_scenario("rbf4", seed=2, drift_pattern="staggered").concept_matrix()
    assert (stag[:2] == 0).all() and set(np.unique(stag)) <= {0, 1, 2, 3} and stag.max() > 0
    cp = tmp_path / "three.cp"
    cp.write_text("0 0 0\n1 2 0\n2 2 1\n")
    s = build_scenario("stagger3", schedule=str(cp), samples_per_step=40, test_samples=20)
    assert s.num_clients == 3 and s.concept(1, 2) == 2
    d = s.step_data(1, 2)
    np.testing.assert_array_equal(d.y_train, stagger_rule(2, d.x_train))
    bad = tmp_path / "bad.cp"
    bad.write_text("0 3\n")
    with pytest.raises(ValueError, match="only 3 concepts"):
        build_scenario("stagger3", schedule=str(bad))
