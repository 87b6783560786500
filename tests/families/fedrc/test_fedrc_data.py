"""FedRC's client populations (data only): the small experiment of docs/fedrc/README.md ("The small
experiment and its acceptance checks") and the single-shift ablations of the paper's Table 8.
Everything here is numpy-only and fast."""

from __future__ import annotations

import math
import pickle
from collections import Counter

import numpy as np
import pytest

from fedcluster_app.core.data import build_scenario, list_scenarios
from fedcluster_app.families.fedrc.scenarios import (
    DIGIT_STYLES,
    build_fedrc,
    class_means,
    corrupt_digits,
    role_table,
)

PERMS = [np.arange(10), 9 - np.arange(10), (np.arange(10) + 1) % 10]
NAMES = ("shifts-3", "shifts-3-mild", "digits-shifts-3", "shifts-feature-only",
         "shifts-label-only", "shifts-concept-only")


def true_labels(y: np.ndarray, concept: int) -> np.ndarray:
    inv = np.argsort(PERMS[concept])
    return inv[y]


def role_counts(s) -> Counter:
    return Counter((r["concept"], r["corrupted"]) for r in s.client_roles if not r["holdout"])


# ----------------------------------------------------------------------------- registry
def test_every_variant_is_registered_with_a_description():
    listed = dict(list_scenarios())
    for name in NAMES:
        assert name in listed and listed[name]
        s = build_scenario(name)
        assert s.name == name and s.num_steps == 1 and s.drift_events() == []


# ----------------------------------------------------------------------------- determinism
def test_same_arguments_give_identical_data_and_pickling_round_trips():
    a = build_fedrc("shifts-3", seed=3)
    b = build_fedrc("shifts-3", seed=3)   # uncached: an independent rebuild
    assert a is not b
    for cid in (0, 7, 29, 30, 32):
        da, db = a.step_data(cid, 1), b.step_data(cid, 1)
        for f in ("x_train", "y_train", "x_test", "y_test"):
            np.testing.assert_array_equal(getattr(da, f), getattr(db, f))
    assert a.client_roles == b.client_roles
    other = build_fedrc("shifts-3", seed=4)
    assert not np.array_equal(other.step_data(0, 1).x_train, a.step_data(0, 1).x_train)

    s = build_scenario("shifts-3", seed=3)
    s2 = pickle.loads(pickle.dumps(s))
    assert s2.name == "shifts-3" and s2.holdout_clients == s.holdout_clients
    np.testing.assert_array_equal(s2.step_data(5, 1).x_train, a.step_data(5, 1).x_train)
    np.testing.assert_array_equal(s2.concept_matrix(), a.concept_matrix())


# ----------------------------------------------------------------------------- roles
def test_roles_for_thirty_clients_follow_the_block_table():
    s = build_scenario("shifts-3")
    assert s.num_clients == 33 and s.num_participants == 30
    assert role_counts(s) == Counter({(0, False): 6, (0, True): 6, (1, False): 6, (1, True): 3,
                                      (2, False): 6, (2, True): 3})
    m = s.concept_matrix()
    assert m.shape == (1, 33)
    assert [int(v) for v in m[0]] == [r["concept"] for r in s.client_roles]
    # ids are shuffled: the roles are not in block order
    assert [r["concept"] for r in s.client_roles[:12]] != [0] * 12
    for r in s.client_roles:
        assert set(r) == {"concept", "corrupted", "style", "severity", "holdout"}
        if r["corrupted"]:
            assert 1 <= r["severity"] <= 5 and r["style"] == "gaussian"
        else:
            assert r["severity"] == 0 and r["style"] == "clean"
    assert s.model == "mlp" and s.hidden == 32 and s.input_shape == (20,)
    assert (s.samples_per_step, s.test_samples) == (135, 15)
    d = s.step_data(0, 1)
    assert d.x_train.shape == (135, 20) and d.x_test.shape == (15, 20)


@pytest.mark.parametrize("m,expected", [
    (3, {0: (1, 0), 1: (1, 0), 2: (1, 0)}),
    (10, {0: (4, 2), 1: (3, 1), 2: (3, 1)}),
    (100, {0: (40, 20), 1: (30, 10), 2: (30, 10)}),
])
def test_roles_scale_with_the_number_of_clients(m, expected):
    table = role_table(m)
    assert len(table) == m
    for concept, (count, bad) in expected.items():
        assert sum(1 for c, _ in table if c == concept) == count
        assert sum(1 for c, k in table if c == concept and k) == bad
    s = build_scenario("shifts-3", num_clients=m)
    assert s.num_clients == m + 3 and s.holdout_clients == (m, m + 1, m + 2)


# ----------------------------------------------------------------------------- held-out
def test_holdout_clients_are_clean_balanced_and_mapped_by_concept():
    s = build_scenario("shifts-3", seed=1)
    assert s.holdout_clients == (30, 31, 32)
    assert [s.concept(c, 1) for c in s.holdout_clients] == [0, 1, 2]
    means = class_means(1)
    for cid in s.holdout_clients:
        r = s.client_roles[cid]
        assert r["holdout"] and not r["corrupted"]
        d = s.step_data(cid, 1)
        assert d.x_train.shape == (120, 20) and d.x_test.shape == (180, 20)
        assert np.bincount(d.y_train, minlength=10).tolist() == [12] * 10
        assert np.bincount(d.y_test, minlength=10).tolist() == [18] * 10
        # the true class is the nearest mean (mostly); the reported label is its image
        for x, y in ((d.x_train, d.y_train), (d.x_test, d.y_test)):
            nearest = np.argmin(((x[:, None, :] - means[None]) ** 2).sum(-1), axis=1)
            assert np.mean(PERMS[d.concept][nearest] == y) > 0.75
            resid = x - means[true_labels(y, d.concept)]
            assert abs(resid.var() - 1.0) < 0.15 and np.linalg.norm(resid.mean(0)) < 0.8
    # concept 1: the same draw under concept 0 and 1 gives labels y and 9 - y
    real = s.realisation
    x0, y0 = real.sample(0, 50, np.random.default_rng(9), client=31, train=False)
    x1, y1 = real.sample(1, 50, np.random.default_rng(9), client=31, train=False)
    np.testing.assert_array_equal(x0, x1)
    np.testing.assert_array_equal(y1, 9 - y0)
    x2, y2 = real.sample(2, 50, np.random.default_rng(9), client=31, train=False)
    np.testing.assert_array_equal(y2, (y0 + 1) % 10)


# ----------------------------------------------------------------------------- label skew
def test_label_skew_is_strong_at_0_1_and_mild_at_0_5():
    def max_share(s):
        out = []
        for cid in range(s.num_participants):
            y = s.step_data(cid, 1).y_train
            out.append(np.bincount(y, minlength=10).max() / len(y))
        return float(np.mean(out))

    strong, mild = build_scenario("shifts-3"), build_scenario("shifts-3-mild")
    assert strong.dirichlet_alpha == 0.1 and mild.dirichlet_alpha == 0.5
    s_strong, s_mild = max_share(strong), max_share(mild)
    assert s_strong > 0.5 and s_strong - s_mild > 0.15
    top3 = np.sort(strong.class_priors[:30], axis=1)[:, ::-1][:, :3].sum(1)
    assert np.mean(top3 > 0.9) > 0.6   # most clients are dominated by 1-3 classes
    flat = build_scenario("shifts-3", dirichlet_alpha=math.inf)
    np.testing.assert_allclose(flat.class_priors, 0.1)
    assert not flat.shifts["label"]


# ----------------------------------------------------------------------------- feature shift
def test_corrupted_clients_are_shifted_and_clean_clients_are_not():
    s = build_scenario("shifts-3", seed=2)
    means = class_means(2)
    real = s.realisation
    var = {True: [], False: []}
    for cid in range(s.num_participants):
        r = s.client_roles[cid]
        d = s.step_data(cid, 1)
        resid = d.x_train - means[true_labels(d.y_train, r["concept"])]
        var[r["corrupted"]].append(resid.var())
        if r["corrupted"]:
            std = 0.2 * r["severity"]
            offset = real.client_shifts[cid].offset
            assert np.linalg.norm(resid.mean(0) - offset) < 0.8
            assert abs(resid.var(axis=0).mean() / (1 + std ** 2) - 1) < 0.15
        else:
            assert np.linalg.norm(resid.mean(0)) < 0.8
            assert abs(resid.var() - 1.0) < 0.15
    assert np.mean(var[True]) > np.mean(var[False]) + 0.1


# ----------------------------------------------------------------------------- single shifts
def test_single_shift_variants_switch_exactly_one_shift_on():
    feat = build_scenario("shifts-feature-only")
    lab = build_scenario("shifts-label-only")
    conc = build_scenario("shifts-concept-only")
    assert feat.shifts == {"feature": True, "label": False, "concept": False}
    assert lab.shifts == {"feature": False, "label": True, "concept": False}
    assert conc.shifts == {"feature": False, "label": False, "concept": True}

    assert feat.num_concepts == 1 and role_counts(feat) == Counter({(0, False): 18,
                                                                    (0, True): 12})
    np.testing.assert_allclose(feat.class_priors, 0.1)

    assert lab.num_concepts == 1 and role_counts(lab) == Counter({(0, False): 30})
    assert lab.class_priors[:30].max(axis=1).mean() > 0.5

    assert conc.num_concepts == 3
    assert role_counts(conc) == Counter({(0, False): 12, (1, False): 9, (2, False): 9})
    np.testing.assert_allclose(conc.class_priors, 0.1)

    for s, concepts in ((feat, [0, 0, 0]), (lab, [0, 0, 0]), (conc, [0, 1, 2])):
        assert s.holdout_clients == (30, 31, 32)
        assert [s.concept(c, 1) for c in s.holdout_clients] == concepts
    # concept-0 held-out clients draw independent samples
    assert not np.array_equal(lab.step_data(30, 1).x_test, lab.step_data(31, 1).x_test)


# ----------------------------------------------------------------------------- digits
def test_digits_variant_shapes_range_and_styles():
    s = build_scenario("digits-shifts-3")
    assert s.model == "cnn" and s.input_shape == (1, 8, 8) and s.num_clients == 33
    assert role_counts(s) == role_counts(build_scenario("shifts-3"))
    styles = {r["style"] for r in s.client_roles if r["corrupted"]}
    assert styles <= set(DIGIT_STYLES) and len(styles) >= 2
    for cid in (0, 13, 30, 32):
        d = s.step_data(cid, 1)
        n_tr, n_te = (120, 180) if cid >= 30 else (135, 15)
        assert d.x_train.shape == (n_tr, 1, 8, 8) and d.x_test.shape == (n_te, 1, 8, 8)
        assert d.x_train.dtype == np.float32 and d.y_train.dtype == np.int64
        assert 0.0 <= d.x_train.min() and d.x_train.max() <= 1.0
        assert 0.0 <= d.x_test.min() and d.x_test.max() <= 1.0
    d = s.step_data(31, 1)
    assert np.bincount(d.y_test, minlength=10).tolist() == [18] * 10
    # a held-out client's adaptation and evaluation images are disjoint
    a = {row.tobytes() for row in d.x_train.reshape(120, -1)}
    assert sum(row.tobytes() in a for row in d.x_test.reshape(180, -1)) <= 5


def test_digit_corruption_styles():
    rng = np.random.default_rng(0)
    x = rng.random((40, 1, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(corrupt_digits(x, "invert", 3, rng), 1 - x)
    t = corrupt_digits(x, "translate", 1, rng, direction=3)   # one pixel right
    np.testing.assert_array_equal(t[..., 1:], x[..., :-1])
    assert not t[..., 0].any()
    b = corrupt_digits(x, "blur", 1, rng)
    assert np.isclose(b[0, 0, 3, 3], x[0, 0, 2:5, 2:5].mean())
    drop = corrupt_digits(x, "dropout", 3, rng)
    assert 0.2 < np.mean(drop == 0) < 0.4
    noisy = corrupt_digits(x, "noise", 5, rng)
    assert noisy.min() >= 0 and noisy.max() <= 1 and not np.allclose(noisy, x)
    with pytest.raises(ValueError, match="style"):
        corrupt_digits(x, "fog", 1, rng)


# ----------------------------------------------------------------------------- arguments
def test_overrides_and_more_steps():
    s = build_scenario("shifts-3", seed=5, samples_per_step=200, test_samples=10, num_steps=3,
                       drift_pattern="none")
    assert (s.samples_per_step, s.test_samples, s.num_steps) == (180, 10, 3)
    assert s.drift_events() == [] and (s.concept_matrix() == s.concept_matrix()[0]).all()
    assert s.step_data(30, 2).x_train.shape == (120, 20)   # held-out sizes do not follow n
    means, real = class_means(5), s.realisation
    cid = next(k for k in range(30) if s.client_roles[k]["corrupted"])
    concept = s.client_roles[cid]["concept"]
    d1, d2 = s.step_data(cid, 1), s.step_data(cid, 3)
    assert d1.x_train.shape == (180, 20) and d1.x_test.shape == (10, 20)
    assert not np.array_equal(d1.x_train, d2.x_train)          # fresh samples ...
    for d in (d1, d2):                                         # ... same offset and prior
        y = true_labels(d.y_train, concept)
        resid = d.x_train - means[y]
        assert np.linalg.norm(resid.mean(0) - real.client_shifts[cid].offset) < 0.8
        assert np.argmax(np.bincount(y, minlength=10)) == np.argmax(s.class_priors[cid])


@pytest.mark.parametrize("kwargs,word", [
    (dict(num_clients=2), "num_clients"),
    (dict(num_clients=-1), "num_clients"),
    (dict(samples_per_step=-5), "samples_per_step"),
    (dict(samples_per_step=1), "samples_per_step"),
    (dict(test_samples=-1), "test_samples"),
    (dict(num_steps=-1), "num_steps"),
    (dict(seed=-1), "seed"),
    (dict(dirichlet_alpha=-0.5), "dirichlet_alpha"),
    (dict(dirichlet_alpha="many"), "dirichlet_alpha"),
    (dict(schedule="Y"), "schedule"),
    (dict(drift_pattern="sudden"), "drift_pattern"),
    (dict(drift_step=2), "drift_step"),
])
def test_bad_arguments_are_rejected_by_name(kwargs, word):
    with pytest.raises(ValueError, match=word):
        build_scenario("shifts-3", **kwargs)
