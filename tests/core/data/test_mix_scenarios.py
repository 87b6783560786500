"""The ``mix`` variant (label, feature and concept shift in one scenario) and ``mixture-noise``.

``<data>-mix``: concepts 0 original, 1 concentrated (as ``-prior``), 2 noise (as ``-noise``),
3 permuted (as ``-permute``); the first half of the clients drift, client k to 1 + k % 3.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import fedcluster_app.core.data.scenarios as scen_mod
from fedcluster_app.core.data import build_scenario, list_scenarios, scenario_names
from fedcluster_app.core.data.catalogue import POOL_VARIANTS, RIVER_TABLE_POOLS
from fedcluster_app.core.data.generators import mixture_means
from fedcluster_app.core.data.scenarios import MIXTURE_NOISE_STD, NOISE_STD
from fedcluster_app.core.data.schedules import staggered_random

POOLS = ["digits", "mnist", "fmnist", "cifar10", "dataset",
         *(t.lower() for t in RIVER_TABLE_POOLS)]
# what builds without files outside the checkout (the user's dataset: tests/plugins/my_data.py)
OFFLINE_MIX = ["digits-mix", "mixture-mix", "shuttle-mix", "imagesegments-mix"]
MY_DATA = "tests.plugins.my_data:load"
LABELS = ("original", "concentrated", "noise", "permuted")


def fresh(s):
    """An uncached rebuild of ``s`` (as another process would build it)."""
    return scen_mod._build_cached.__wrapped__(s.spec)


def expected_sudden(p: int, t: int, d: int) -> np.ndarray:
    m = np.zeros((t, p), dtype=np.int64)
    for k in range(max(1, p // 2)):
        m[d - 1:, k] = 1 + k % 3
    return m


# ---------------------------------------------------------------------------------- catalogue


def test_every_pool_and_the_mixture_have_a_mix_variant():
    assert "mix" in POOL_VARIANTS
    listed = dict(list_scenarios())
    for name in [f"{p}-mix" for p in POOLS] + ["mixture-mix", "mixture-noise"]:
        assert name in scenario_names()
        assert listed[name]
    for p in POOLS:
        text = listed[f"{p}-mix"]
        assert "label, feature and concept shift mixed: of the first half of the clients" in text
        assert f"std {NOISE_STD:g}" in text and text.endswith("from step 3")
    # the descriptions (catalogue.py) quote the noise std that scenarios.py applies
    assert f"std {MIXTURE_NOISE_STD:g}" in listed["mixture-noise"]
    assert f"std {MIXTURE_NOISE_STD:g}" in listed["mixture-mix"]


@pytest.mark.parametrize("name", OFFLINE_MIX)
def test_mix_concepts_and_labels(name):
    s = build_scenario(name)
    c = s.num_classes
    concepts = s.realisation.concepts
    assert [lab.split()[0] for lab in s.concept_labels] == list(LABELS)
    assert concepts[0].perm is None and concepts[0].prior_weights is None
    assert concepts[1].perm is None and concepts[1].noise_std == 0
    half = max(1, c // 2)
    w = np.asarray(concepts[1].prior_weights)
    assert w[:half].sum() / w.sum() == pytest.approx(0.9)   # of a uniform prior
    std = MIXTURE_NOISE_STD if name.startswith("mixture") else NOISE_STD
    assert concepts[2].noise_std == std and concepts[2].perm is None
    assert concepts[2].prior_weights is None
    assert concepts[3].perm == tuple((y + 1) % c for y in range(c))
    assert concepts[3].noise_std == 0 and concepts[3].prior_weights is None


# ------------------------------------------------------------------------ who drifts, and when


@pytest.mark.parametrize("name", OFFLINE_MIX)
def test_mix_default_schedule_is_sudden_over_the_first_half(name):
    s = build_scenario(name)
    assert (s.num_clients, s.num_steps, s.drift_step) == (10, 6, 3)
    m = s.concept_matrix()
    np.testing.assert_array_equal(m, expected_sudden(10, 6, 3))
    # clients 0..4: targets 1, 2, 3, 1, 2: every kind of shift occurs
    np.testing.assert_array_equal(m[-1, :5], [1, 2, 3, 1, 2])
    np.testing.assert_array_equal(build_scenario(name, drift_pattern="sudden").concept_matrix(), m)
    assert [e[:2] for e in s.drift_events()] == [(3, k) for k in range(5)]


@pytest.mark.parametrize("p, t, d", [(7, 5, 2), (4, 8, 5), (2, 4, 4), (13, 6, 3)])
def test_mix_sudden_for_other_sizes(p, t, d):
    s = build_scenario("mixture-mix", num_clients=p, num_steps=t, drift_step=d)
    np.testing.assert_array_equal(s.concept_matrix(), expected_sudden(p, t, d))


def test_mixture_noise_schedule():
    s = build_scenario("mixture-noise")
    assert s.concept_labels == ("original", f"noise {MIXTURE_NOISE_STD:g}")
    m = s.concept_matrix()
    np.testing.assert_array_equal(m, np.minimum(expected_sudden(10, 6, 3), 1))
    assert s.realisation.concepts[1].noise_std == MIXTURE_NOISE_STD


@pytest.mark.parametrize("name", ["digits-mix", "mixture-mix", "shuttle-mix"])
def test_mix_pattern_none(name):
    s = build_scenario(name, drift_pattern="none")
    assert not s.concept_matrix().any() and s.num_concepts == 1


@pytest.mark.parametrize("name", ["digits-mix", "mixture-mix", "shuttle-mix"])
def test_mix_pattern_recurring(name):
    # 6 steps, drift at 3: period (6 - 3 + 1) // 2 = 2, so target at 3-4 and back at 5-6
    m = build_scenario(name, drift_pattern="recurring").concept_matrix()
    for k in range(10):
        tgt = 1 + k % 3 if k < 5 else 0
        np.testing.assert_array_equal(m[:, k], [0, 0, tgt, tgt, 0, 0])


@pytest.mark.parametrize("name", ["digits-mix", "mixture-mix", "shuttle-mix"])
def test_mix_pattern_staggered(name):
    s = build_scenario(name, drift_pattern="staggered", seed=3)
    m = s.concept_matrix()
    # every client draws one of the 4 base concepts at steps 3 and 5 (FedDrift's MNIST-R)
    np.testing.assert_array_equal(m, staggered_random(10, 6, 4, 3, first_step=3, every=2))
    assert not m[:2].any() and set(np.unique(m)) <= {0, 1, 2, 3}
    assert len(s.concept_labels) == s.num_concepts <= 4


@pytest.mark.parametrize("name", ["digits-mix", "mixture-mix", "shuttle-mix"])
def test_mix_pattern_incremental_walks_prior_and_noise_and_switches_the_permutation(name):
    s = build_scenario(name, drift_pattern="incremental", num_steps=7)
    m = s.concept_matrix()
    concepts = s.realisation.concepts
    labels = s.concept_labels
    noise = concepts[2].noise_std
    w_end = np.asarray(concepts[1].prior_weights)
    for k in range(10):
        col = m[:, k]
        assert (col[:2] == 0).all()
        if k >= 5:
            assert not col.any()
        elif k % 3 == 2:
            # a permutation has no intermediate: these clients switch at the drift step
            np.testing.assert_array_equal(col, [0, 0, 3, 3, 3, 3, 3])
        else:
            tgt = 1 + k % 3
            mids = col[2:4]
            assert (mids >= 4).all() and col[4:].tolist() == [tgt] * 3
            assert [labels[i] for i in mids] == [
                f"original->{labels[tgt]} {f:.2f}" for f in (1 / 3, 2 / 3)]
            for i, f in zip(mids, (1 / 3, 2 / 3)):
                assert concepts[i].perm is None
                if tgt == 1:    # the prior weights move from uniform towards concentrated
                    assert concepts[i].noise_std == 0
                    np.testing.assert_allclose(concepts[i].prior_weights, 1 + f * (w_end - 1))
                else:           # the noise grows
                    assert concepts[i].prior_weights is None
                    assert concepts[i].noise_std == pytest.approx(f * noise)
    # two intermediates each for the prior and the noise target, none for the permutation
    assert s.num_concepts == 8


def test_mixture_noise_incremental():
    s = build_scenario("mixture-noise", drift_pattern="incremental")
    m = s.concept_matrix()
    np.testing.assert_array_equal(m[:, 0], [0, 0, 2, 3, 1, 1])
    stds = [s.realisation.concepts[i].noise_std for i in m[:, 0]]
    assert stds == pytest.approx([0, 0, MIXTURE_NOISE_STD / 3, 2 * MIXTURE_NOISE_STD / 3,
                                  MIXTURE_NOISE_STD, MIXTURE_NOISE_STD])


def test_dataset_mix_on_a_users_data():
    s = build_scenario("dataset-mix", dataset=MY_DATA)
    assert s.num_classes == 3 and s.short_clients()[0] == (135, 45)
    np.testing.assert_array_equal(s.concept_matrix(), expected_sudden(10, 6, 3))
    assert s.realisation.concepts[3].perm == (1, 2, 0)
    d = s.step_data(2, 4)   # a permuted client
    assert d.concept == 3 and d.x_train.shape[1:] == (2,)
    # 200 samples per step from 135 rows: the client's prior share of them, each used once
    assert s.samples_per_step == 200 and s.rows_held(2) == 135
    assert len(np.unique(d.x_train, axis=0)) == len(d.x_train) <= 135


# -------------------------------------------------------------- each concept does what it says


def _label_shares(y: np.ndarray, c: int) -> np.ndarray:
    return np.bincount(y, minlength=c) / len(y)


@pytest.mark.parametrize("name", ["digits-mix", "mixture-mix", "shuttle-mix"])
def test_mix_concepts_on_generated_data(name):
    n = 4000    # drawn with replacement from a pool (oversample), to measure the priors
    pool = {} if name == "mixture-mix" else {"oversample": True}
    s = build_scenario(name, samples_per_step=n, test_samples=10, dirichlet_alpha=math.inf,
                       **pool)
    c, half = s.num_classes, max(1, s.num_classes // 2)
    before = {k: s.step_data(k, 1) for k in range(3)}
    after = {k: s.step_data(k, 3) for k in range(3)}
    assert [after[k].concept for k in range(3)] == [1, 2, 3]
    assert all(before[k].concept == 0 for k in range(3))

    # 1 (label shift): 90% of the labels on the first half of the classes, from ~half before
    assert _label_shares(before[0].y_train, c)[:half].sum() == pytest.approx(half / c, abs=0.03)
    assert _label_shares(after[0].y_train, c)[:half].sum() == pytest.approx(0.9, abs=0.02)

    # 2 (feature shift): the label distribution stays, the inputs move
    np.testing.assert_allclose(_label_shares(after[1].y_train, c),
                               _label_shares(before[1].y_train, c), atol=0.03)
    real = s.realisation
    np.testing.assert_array_equal(real.class_prior(2, 1), real.class_prior(0, 1))
    # the same draw as concept 0 plus N(0, std^2) noise (images clipped back to [0, 1])
    y_true = np.arange(400) % c
    x0, y0 = real.realise(0, y_true, np.random.default_rng(5), train=True)
    x2, y2 = real.realise(2, y_true, np.random.default_rng(5), train=True)
    np.testing.assert_array_equal(y2, y0)
    std = MIXTURE_NOISE_STD if name.startswith("mixture") else NOISE_STD
    if real.source.is_image:
        assert x2.min() >= 0.0 and x2.max() <= 1.0
        assert np.mean(x2 != x0) > 0.5 and np.abs(x2 - x0).mean() > 0.1
    else:
        assert (x2 - x0).std() == pytest.approx(std, rel=0.05)

    # 3 (concept shift): the same inputs as concept 0, every label y -> (y+1) % C
    x3, y3 = real.realise(3, y_true, np.random.default_rng(5), train=True)
    np.testing.assert_array_equal(x3, x0)
    np.testing.assert_array_equal(y0, y_true)
    np.testing.assert_array_equal(y3, (y_true + 1) % c)
    np.testing.assert_allclose(_label_shares(after[2].y_train, c),
                               np.roll(_label_shares(before[2].y_train, c), 1), atol=0.03)


def test_mixture_mix_concepts_against_the_class_means():
    """On the mixture the true class is known up to the Bayes error (~4%): the nearest mean."""
    s = build_scenario("mixture-mix", samples_per_step=2000, test_samples=10,
                       dirichlet_alpha=math.inf)
    means = mixture_means(4, 8, s.data_seed)

    def nearest(x):
        return np.argmin(((x[:, None, :] - means[None]) ** 2).sum(-1), axis=1)

    clean, noisy, permuted = (s.step_data(k, 4) for k in range(3))
    # concept 1 skews which classes occur, not how a class looks: labels stay the true classes
    assert np.mean(clean.y_train < 2) == pytest.approx(0.9, abs=0.03)
    assert np.mean(nearest(clean.x_train) == clean.y_train) > 0.9
    assert np.mean(nearest(permuted.x_train) == permuted.y_train) < 0.1
    assert np.mean((nearest(permuted.x_train) + 1) % 4 == permuted.y_train) > 0.9
    # the noise: x = mean_y + N(0, I) + N(0, std^2 I)
    resid = noisy.x_train - means[noisy.y_train]
    assert resid.var() == pytest.approx(1 + MIXTURE_NOISE_STD ** 2, rel=0.05)
    x0, _ = s.realisation.realise(0, noisy.y_train, np.random.default_rng(1), train=True)
    x2, _ = s.realisation.realise(2, noisy.y_train, np.random.default_rng(1), train=True)
    assert (x2 - x0).std() == pytest.approx(MIXTURE_NOISE_STD, rel=0.05)


def test_mixture_noise_is_a_real_shift():
    """A classifier fitted on concept 0 loses accuracy on the noisy concept (scenarios.py,
    MIXTURE_NOISE_STD, quotes the measurement: about 0.95 -> 0.86)."""
    from sklearn.linear_model import LogisticRegression

    s = build_scenario("mixture-noise", samples_per_step=2000, test_samples=4000)
    train = s.step_data(0, 1)
    clean, noisy = s.step_data(0, 2), s.step_data(0, 3)
    assert (train.concept, clean.concept, noisy.concept) == (0, 0, 1)
    clf = LogisticRegression(max_iter=1000).fit(train.x_train, train.y_train)
    acc_clean = clf.score(clean.x_test, clean.y_test)
    acc_noisy = clf.score(noisy.x_test, noisy.y_test)
    assert acc_clean > 0.9
    assert acc_clean - acc_noisy > 0.05
    # the labels' distribution does not move: only the inputs do
    np.testing.assert_array_equal(s.realisation.class_prior(1, 0), s.realisation.class_prior(0, 0))


# --------------------------------------------------------------------------------- determinism


@pytest.mark.parametrize("name", ["digits-mix", "mixture-mix", "mixture-noise", "shuttle-mix"])
@pytest.mark.parametrize("pattern", ["", "incremental", "staggered"])
def test_mix_is_deterministic(name, pattern):
    a = build_scenario(name, seed=4, drift_pattern=pattern)
    assert build_scenario(name, seed=4, drift_pattern=pattern) is a   # cached
    b = fresh(a)
    assert b is not a
    np.testing.assert_array_equal(a.concept_matrix(), b.concept_matrix())
    assert a.concept_labels == b.concept_labels
    for k, t in [(0, 1), (0, 4), (1, 5), (2, 3), (9, 6)]:
        da, db = a.step_data(k, t), b.step_data(k, t)
        for field in ("x_train", "y_train", "x_test", "y_test"):
            np.testing.assert_array_equal(getattr(da, field), getattr(db, field))
        assert da.concept == db.concept
    other = build_scenario(name, seed=5, drift_pattern=pattern)
    assert not np.array_equal(other.step_data(1, 4).x_train, a.step_data(1, 4).x_train)


# ------------------------------------------------------------------------------------ a run


def test_a_short_run_on_digits_mix(tmp_path):
    import json

    from fedcluster_app.engine import run_inprocess

    summary = run_inprocess({"strategy": "fedavg", "scenario": "digits-mix", "seed": 0,
                             "num-steps": 4, "rounds-per-step": 1, "local-steps": 5,
                             "out-dir": str(tmp_path / "r"), "progress": False, "plot": False})
    assert summary["status"] == "completed" and summary["rounds"] == 4
    lines = (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert [r["time_step"] for r in rows] == [1, 2, 3, 4]
    # the last step has all four concepts: 5 clients on 0, then 1, 2, 3, 1, 2
    assert sorted(rows[-1]["concept_cluster_mass"]) == ["0", "1", "2", "3"]
    assert 0.0 <= summary["final_accuracy"] <= 1.0
