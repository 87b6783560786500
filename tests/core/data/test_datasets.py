"""Tests of fedcluster_app.core.data: schedules, generators, concept realisations, scenarios."""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import pickle
from pathlib import Path

import numpy as np
import pytest

from fedcluster_app.core.data import (
    DRIFT_PATTERNS,
    SCENARIO_NAMES,
    Scenario,
    ScenarioSpec,
    StepData,
    build_scenario,
    bundled_schedule,
    bundled_schedule_names,
    incremental,
    list_scenarios,
    load_cp,
    recurring,
    scenario_names,
    staggered_random,
    sudden,
)
from fedcluster_app.core.data import scenarios as scen_mod
from fedcluster_app.core.data.drift import FEDCCFA_SWAP_PAIRS, fedccfa_group
from fedcluster_app.core.data.generators import (
    CIRCLE_CONCEPTS,
    SEA_THRESHOLDS,
    SeaConcept,
    digits_pools,
)
from tests.support import ROOT

SHARED_CP = ROOT.parent / "shared" / "data" / "feddrift-changepoints"
# the standard catalogue: the core's scenarios and FedDrift's (defined by its family)
STANDARD = sorted({*SCENARIO_NAMES, "sine2", "circle2", "sea2", "sea4"})
# torchvision files and a user's dataset (tests/core/data/test_user_data.py) are not part of the
# checkout
OFFLINE = [n for n in STANDARD
           if n.split("-")[0] not in ("mnist", "fmnist", "cifar10", "dataset")]

# first step on concept B per client under schedule Y (docs/feddrift/README.md, "Data and drift
# schedules")
Y_FIRST_B = [7, 4, 5, 5, 9, 5, 7, 4, 6, 9]


def fresh(s: Scenario) -> Scenario:
    """An uncached rebuild of ``s`` (as another process would build it)."""
    return scen_mod._build_cached.__wrapped__(s.spec)


def write_cp(path: Path, rows: list[str]) -> Path:
    path.write_text("\n".join(rows) + "\n")
    return path


# ------------------------------------------------------------------------------ bundled schedules


def test_bundled_json_matches_shared_cp_files():
    if not SHARED_CP.is_dir():
        pytest.skip("shared/ reference data not present")
    files = sorted(SHARED_CP.glob("*.cp"))
    assert files
    bundled = json.loads(
        (Path(scen_mod.__file__).with_name("feddrift_changepoints.json")).read_text())
    assert sorted(bundled) == sorted(f.stem for f in files)
    for f in files:
        expected = load_cp(f)
        assert expected.shape == (11, 10)
        np.testing.assert_array_equal(np.asarray(bundled[f.stem]), expected)
        np.testing.assert_array_equal(bundled_schedule(f.stem), expected)


def test_bundled_schedule_names_and_aliases():
    assert bundled_schedule_names() == ["A", "B", "C", "D", "E", "F", "W", "X", "Y", "Z"]
    np.testing.assert_array_equal(bundled_schedule("y.cp"), bundled_schedule("Y"))
    y = bundled_schedule("Y")
    y[0, 0] = 7  # a copy: the bundled table is not affected
    assert bundled_schedule("Y")[0, 0] == 0
    first_b = [int(np.argmax(bundled_schedule("Y")[:, k] == 1)) + 1 for k in range(10)]
    assert first_b == Y_FIRST_B
    with pytest.raises(ValueError, match="valid names: A, B"):
        bundled_schedule("Q")


# --------------------------------------------------------------------------- programmatic patterns


def test_sudden():
    m = sudden(4, 5, 3, [0, 2], to_concept=2)
    assert m.shape == (5, 4) and m.dtype == np.int64
    np.testing.assert_array_equal(m[:, 0], [0, 0, 2, 2, 2])
    np.testing.assert_array_equal(m[:, 1], [0] * 5)
    np.testing.assert_array_equal(m[:, 2], m[:, 0])
    with pytest.raises(ValueError, match="at_step"):
        sudden(4, 5, 6, [0])
    with pytest.raises(ValueError, match="client ids"):
        sudden(4, 5, 2, [4])


def test_incremental():
    m = incremental(3, 7, 2, [1], [5, 6, 1])
    np.testing.assert_array_equal(m[:, 1], [0, 5, 6, 1, 1, 1, 1])
    np.testing.assert_array_equal(m[:, 0], [0] * 7)
    np.testing.assert_array_equal(incremental(2, 3, 2, [0], [4, 5, 6])[:, 0], [0, 4, 5])


def test_recurring():
    m = recurring(2, 9, 3, 2, [0])
    np.testing.assert_array_equal(m[:, 0], [0, 0, 1, 1, 0, 0, 1, 1, 0])
    np.testing.assert_array_equal(m[:, 1], [0] * 9)
    m = recurring(1, 6, 2, 1, [0], concepts=(0, 1, 2))
    np.testing.assert_array_equal(m[:, 0], [0, 1, 2, 0, 1, 2])
    with pytest.raises(ValueError, match="period"):
        recurring(2, 9, 3, 0, [0])


def test_staggered_random():
    m = staggered_random(50, 11, 4, seed=3, first_step=3, every=2)
    assert m.shape == (11, 50)
    assert (m[:2] == 0).all()
    for t in (3, 5, 7, 9, 11):  # draws at 3, 5, 7, 9, 11; kept for the step after
        if t + 1 <= 11:
            np.testing.assert_array_equal(m[t - 1], m[t])
    assert set(np.unique(m[2:])) == {0, 1, 2, 3}
    assert not np.array_equal(m[2], m[4])
    np.testing.assert_array_equal(m, staggered_random(50, 11, 4, seed=3))
    assert not np.array_equal(m, staggered_random(50, 11, 4, seed=4))


# ----------------------------------------------------------------------------------- registry


def test_list_scenarios_and_names():
    listed = list_scenarios()
    names = [n for n, _ in listed]
    assert names == sorted(names) == list(scenario_names())
    assert set(SCENARIO_NAMES) <= set(names)      # built-ins, plus the registered families
    required = {"circle2", "sine2", "sea2", "sea4", "mixture-swap", "mixture-prior"}
    for fam in ("digits", "mnist", "fmnist", "cifar10"):
        required |= {f"{fam}-static", f"{fam}-swap", f"{fam}-rotate", f"{fam}-noise"}
    assert required <= set(names)
    for _, desc in listed:
        assert desc and "\n" not in desc


@pytest.mark.parametrize("name", OFFLINE)
def test_offline_scenarios_shapes(name):
    s = build_scenario(name, samples_per_step=20, test_samples=10)
    assert s.name == name and "\n" not in s.description
    assert s.model in ("mlp", "cnn")
    m = s.concept_matrix()
    assert m.shape == (s.num_steps, s.num_clients) and m.dtype.kind == "i"
    assert s.num_concepts == m.max() + 1
    for client, step in ((0, 1), (s.num_clients - 1, s.num_steps)):
        d = s.step_data(client, step)
        assert isinstance(d, StepData)
        assert d.x_train.shape == (20, *s.input_shape) and d.x_train.dtype == np.float32
        assert d.y_train.shape == (20,) and d.y_train.dtype == np.int64
        assert d.x_test.shape == (10, *s.input_shape) and d.x_test.dtype == np.float32
        assert d.y_test.dtype == np.int64
        assert d.y_train.min() >= 0 and d.y_train.max() < s.num_classes
        assert d.concept == s.concept(client, step) == m[step - 1, client]
        assert not d.x_train.flags.writeable  # shared cache


def test_model_defaults():
    assert (build_scenario("circle2").hidden, build_scenario("sine2").hidden) == (4, 4)
    sea = build_scenario("sea2")
    assert sea.input_shape == (3,) and sea.hidden == 6 and sea.model == "mlp"
    mix = build_scenario("mixture-swap")
    assert (mix.model, mix.hidden, mix.input_shape, mix.num_classes) == ("mlp", 32, (8,), 4)
    dig = build_scenario("digits-swap")
    assert (dig.model, dig.hidden, dig.input_shape, dig.num_classes) == ("cnn", 0, (1, 8, 8), 10)
    assert (dig.num_clients, dig.num_steps, dig.drift_step) == (10, 6, 3)
    assert (dig.samples_per_step, dig.test_samples) == (200, 100)
    c = build_scenario("circle2")
    assert (c.num_clients, c.num_steps, c.samples_per_step, c.test_samples) == (10, 11, 500, 200)


# -------------------------------------------------------------------------------- determinism


def test_cached_object_and_determinism():
    s = build_scenario("circle2", seed=5)
    assert build_scenario("circle2", seed=5) is s
    assert build_scenario(" Circle2 ", seed=5, samples_per_step=500) is s  # normalised defaults
    other = fresh(s)
    assert other is not s
    for k, t in ((0, 1), (3, 7)):
        a, b = s.step_data(k, t), other.step_data(k, t)
        for f in ("x_train", "y_train", "x_test", "y_test"):
            np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
    assert s.step_data(0, 1) is s.step_data(0, 1)  # LRU cache


def test_concatenated_steps_are_cached_read_only_and_bounded(monkeypatch):
    s = fresh(build_scenario("circle2", seed=5))
    x, y = s.train_steps(2, [3, 1, 4])
    parts = [s.step_data(2, t) for t in (3, 1, 4)]
    np.testing.assert_array_equal(x, np.concatenate([p.x_train for p in parts]))
    np.testing.assert_array_equal(y, np.concatenate([p.y_train for p in parts]))
    assert s.train_steps(2, (3, 1, 4))[0] is x                  # cached, whatever the sequence
    assert not x.flags.writeable and not y.flags.writeable     # callers copy before changing
    assert s.train_steps(2, [5])[0] is s.step_data(2, 5).x_train
    np.testing.assert_array_equal(s.window(2, 4, 3)[0], s.train_steps(2, [2, 3, 4])[0])
    with pytest.raises(ValueError, match="no time steps"):
        s.train_steps(2, [])
    with pytest.raises(ValueError, match="out of range"):
        s.train_steps(2, [1, 99])
    # bounded: by entries and by bytes (the oldest go first)
    monkeypatch.setattr(s, "STEP_CACHE_SIZE", 3)
    for c in range(s.num_clients):
        for t in (1, 2, 3):
            s.train_steps(c, [t, t + 1])
    assert len(s._steps_cache) == 2 * s.num_clients
    assert (9, (3, 4)) in s._steps_cache and (2, (3, 1, 4)) not in s._steps_cache
    monkeypatch.setattr(s, "STEPS_CACHE_BYTES", 3 * x.nbytes)
    s.train_steps(1, [1, 2, 3, 4, 5, 6])
    assert s._steps_cache.bytes <= 3 * x.nbytes or len(s._steps_cache) == 1
    assert s._steps_cache.bytes == sum(a.nbytes + b.nbytes
                                       for a, b in s._steps_cache.entries.values())


@pytest.mark.parametrize("name", ["circle2", "mixture-swap", "digits-swap"])
def test_different_seed_client_step_give_different_data(name):
    s = build_scenario(name, seed=0)
    base = s.step_data(1, 2).x_train
    assert not np.array_equal(base, build_scenario(name, seed=1).step_data(1, 2).x_train)
    assert not np.array_equal(base, s.step_data(2, 2).x_train)
    assert not np.array_equal(base, s.step_data(1, 3).x_train)
    d = s.step_data(1, 2)
    assert not np.array_equal(d.x_train[: len(d.x_test)], d.x_test)  # independent test draw


def test_pickle_roundtrip_returns_same_scenario():
    s = build_scenario("mixture-prior", seed=3)
    t = pickle.loads(pickle.dumps(s))
    assert t.params == s.params
    np.testing.assert_array_equal(t.step_data(4, 4).x_train, s.step_data(4, 4).x_train)


def test_scenario_spec_names_the_resolved_build_arguments():
    s = build_scenario("digits-swap", seed=1, partition="pathological")
    spec = s.spec
    assert isinstance(spec, ScenarioSpec) and s.params == spec.arguments()
    # the scenario defaults resolved: sizes, alpha, and 2 classes per client for pathological
    assert (spec.samples_per_step, spec.test_samples) == (s.samples_per_step, s.test_samples)
    assert spec.dirichlet_alpha == 1.0 and spec.pool.classes_per_client == 2
    assert spec.pool.test_fraction == 0.0      # digits has its own test split
    assert scen_mod._build_cached(spec) is s
    same = build_scenario(" Digits-Swap ", seed=1, partition="Pathological", classes_per_client=2,
                          samples_per_step=s.samples_per_step)
    assert same.spec == spec and hash(same.spec) == hash(spec) and same is s
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.seed = 2   # type: ignore[misc]


def test_build_scenario_takes_the_run_configs_data_settings(tmp_path):
    """The run path hands over the config's data group: the same spec, and so the same cached
    object, as the keywords, although DataSettings states classes-per-client 2 and
    test-fraction 0.25 where the keywords leave 0 ("the scenario's default")."""
    from fedcluster_app.core.config import DataSettings

    path = tmp_path / "user.npz"
    rng = np.random.default_rng(0)
    np.savez(path, x=rng.normal(size=(120, 4)).astype(np.float32), y=np.arange(120) % 3)
    for name, given in (("mixture-swap", dict(num_clients=7, samples_per_step=50)),
                        ("digits-swap", dict(partition="pathological")),
                        ("dataset-permute", dict(dataset=f"npz:{path}")),
                        ("digits-ccfa", dict(num_steps=4)), ("shifts-3", {})):
        s = build_scenario(name, seed=2, **given)
        assert build_scenario(name, DataSettings(**given), seed=2) is s, name
    assert build_scenario("dataset-permute", DataSettings(dataset=f"npz:{path}")
                          ).spec.pool.test_fraction == 0.25


def test_build_scenario_refuses_keywords_beside_data_settings():
    from fedcluster_app.core.config import DataSettings

    with pytest.raises(ValueError, match="and also num_clients; set it in the data settings"):
        build_scenario("mixture-swap", DataSettings(num_clients=4), num_clients=5)
    with pytest.raises(TypeError, match="must be a DataSettings .*got dict"):
        build_scenario("mixture-swap", {"num_clients": 5})


def test_data_settings_are_build_scenarios_keywords():
    """One list of data settings: the run config's data group holds build_scenario's keywords
    (the data seed is the run's, given beside it)."""
    from fedcluster_app.core.config import DataSettings

    keywords = set(inspect.signature(build_scenario).parameters) - {"name", "data", "seed"}
    assert {f.name for f in dataclasses.fields(DataSettings)} == keywords


# ----------------------------------------------------------------------------------- schedules


def test_concepts_follow_y_and_f():
    for name in ("circle2", "sine2", "sea2"):
        s = build_scenario(name)
        np.testing.assert_array_equal(s.concept_matrix(), bundled_schedule("Y"))
        assert s.num_concepts == 2 and (s.num_clients, s.num_steps) == (10, 11)
    s = build_scenario("sea4")
    np.testing.assert_array_equal(s.concept_matrix(), bundled_schedule("F"))
    assert s.num_concepts == 4
    assert [s.concept(0, t) for t in range(1, 12)] == [0, 0, 1, 1, 2, 2, 2, 3, 3, 0, 0]


def test_drift_events():
    s = build_scenario("circle2")
    events = s.drift_events()
    assert len(events) == 10  # everybody switches A -> B exactly once
    assert sorted((k, t) for t, k, _, _ in events) == [(k, Y_FIRST_B[k]) for k in range(10)]
    assert all((old, new) == (0, 1) for _, _, old, new in events)
    assert [e[0] for e in events] == sorted(e[0] for e in events)
    mix = build_scenario("mixture-swap")
    assert mix.drift_events() == [(3, k, 0, 1) for k in range(5)]
    assert build_scenario("digits-static").drift_events() == []
    sea4 = build_scenario("sea4")
    m = sea4.concept_matrix()
    for t, k, old, new in sea4.drift_events():
        assert (m[t - 2, k], m[t - 1, k]) == (old, new) and old != new


def test_schedule_file_replaces_schedule(tmp_path):
    p = write_cp(tmp_path / "s.cp", ["0 0 0", "0 1 0", "1 1  0", "", "1 0 1"])
    s = build_scenario("sine2", schedule=str(p))
    assert (s.num_steps, s.num_clients) == (4, 3)
    np.testing.assert_array_equal(s.concept_matrix(), load_cp(p))
    assert s.drift_step == 2
    assert build_scenario("sine2", schedule=str(p), num_clients=3) is not None
    s6 = build_scenario("sine2", schedule=str(p), num_steps=6)  # last row repeated
    np.testing.assert_array_equal(s6.concept_matrix()[4:], [[1, 0, 1], [1, 0, 1]])
    # a bundled schedule by name: digits-swap on FedDrift's 4-concept schedule (MNIST-4)
    d4 = build_scenario("digits-swap", schedule="F")
    np.testing.assert_array_equal(d4.concept_matrix(), bundled_schedule("F"))


def test_num_clients_and_steps_overrides():
    s = build_scenario("circle2", num_clients=20, num_steps=12)
    m = s.concept_matrix()
    assert m.shape == (12, 20)
    np.testing.assert_array_equal(m[:11, 10:], bundled_schedule("Y"))  # tiled columns
    np.testing.assert_array_equal(m[11], m[10])
    s = build_scenario("mixture-swap", num_clients=7, num_steps=4)
    assert s.concept_matrix().shape == (4, 7)
    assert [k for _, k, _, _ in s.drift_events()] == [0, 1, 2]


# ---------------------------------------------------------------------------------- generators


def test_circle_labels_follow_the_rule():
    s = build_scenario("circle2")
    for client, step, concept in ((0, 1, 0), (1, 4, 1)):
        d = s.step_data(client, step)
        assert d.concept == concept
        c = CIRCLE_CONCEPTS[concept]
        for x, y in ((d.x_train, d.y_train), (d.x_test, d.y_test)):
            assert x.min() >= 0 and x.max() <= 1
            x64 = x.astype(np.float64)
            d2 = (x64[:, 0] - c.centre[0]) ** 2 + (x64[:, 1] - c.centre[1]) ** 2
            np.testing.assert_array_equal(y, (d2 > c.radius**2).astype(np.int64))
    assert CIRCLE_CONCEPTS[0].centre == (0.2, 0.5) and CIRCLE_CONCEPTS[0].radius == 0.15
    assert CIRCLE_CONCEPTS[1].centre == (0.6, 0.5) and CIRCLE_CONCEPTS[1].radius == 0.25
    # class-0 (inside) share: ~7% for A, ~20% for B
    ya = np.concatenate([s.step_data(k, 1).y_train for k in range(10)])
    yb = np.concatenate([s.step_data(k, 11).y_train for k in range(10)])
    assert abs((ya == 0).mean() - math.pi * 0.15**2) < 0.02
    assert abs((yb == 0).mean() - math.pi * 0.25**2) < 0.03


def test_sine_b_is_flipped_a():
    s = build_scenario("sine2")
    a = s.step_data(0, 1)  # concept A
    b = s.step_data(1, 5)  # concept B
    assert (a.concept, b.concept) == (0, 1)
    for d, flip in ((a, False), (b, True)):
        x = d.x_train.astype(np.float64)
        rule = (x[:, 1] <= np.sin(x[:, 0])).astype(np.int64)
        np.testing.assert_array_equal(d.y_train, 1 - rule if flip else rule)


def test_sea_thresholds_and_noise_rate():
    assert SEA_THRESHOLDS == (9.0, 8.0, 7.0, 9.5)
    s = build_scenario("sea4")
    for concept in range(4):
        xs, ys = [], []
        for t in range(1, 12):
            for k in range(10):
                if s.concept(k, t) == concept:
                    d = s.step_data(k, t)
                    xs.append(d.x_train)
                    ys.append(d.y_train)
        x, y = np.concatenate(xs), np.concatenate(ys)
        assert x.shape[1] == 3 and x.min() >= 0 and x.max() <= 10
        clean = (x[:, 0].astype(np.float64) + x[:, 1] <= SEA_THRESHOLDS[concept])
        noise = (y != clean).mean()
        assert 0.08 < noise < 0.12, (concept, noise)
    # x3 is pure noise: labels do not depend on it
    x = np.concatenate([s.step_data(k, 1).x_train for k in range(10)])
    assert SeaConcept(9.0).label(x).tolist() == SeaConcept(9.0).label(
        np.c_[x[:, :2], np.zeros(len(x))]).tolist()


def test_mixture_is_learnable_but_not_trivial():
    s = build_scenario("mixture-swap", samples_per_step=2000)
    means = s.realisation.source.means
    d = s.step_data(9, 1)
    pred = ((d.x_train[:, None, :] - means[None]) ** 2).sum(-1).argmin(1)
    acc = (pred == d.y_train).mean()
    assert 0.92 < acc < 0.99


# ----------------------------------------------------------------------------- concept realisations


def test_digits_swap_groups():
    swap = build_scenario("digits-swap")
    static = build_scenario("digits-static")
    assert swap.num_concepts == 4
    for k in range(10):
        g = fedccfa_group(k)
        assert g == (0 if k in (0, 1, 2) else 1 if k in (3, 4, 5) else 2)
        assert [swap.concept(k, t) for t in range(1, 7)] == [0, 0, g + 1, g + 1, g + 1, g + 1]
        a_, b_ = FEDCCFA_SWAP_PAIRS[g]
        perm = np.arange(10)
        perm[[a_, b_]] = [b_, a_]
        for t in (1, 3, 6):
            ds, d0 = swap.step_data(k, t), static.step_data(k, t)
            np.testing.assert_array_equal(ds.x_train, d0.x_train)  # inputs unchanged
            expected = perm[d0.y_train] if t >= 3 else d0.y_train
            np.testing.assert_array_equal(ds.y_train, expected)
            np.testing.assert_array_equal(ds.y_test, perm[d0.y_test] if t >= 3 else d0.y_test)
    assert FEDCCFA_SWAP_PAIRS == ((1, 2), (3, 4), (5, 6))


def test_rotation_changes_images():
    rot = build_scenario("digits-rotate")
    static = build_scenario("digits-static")
    assert rot.concept(0, 3) == 1 and rot.concept(1, 3) == 0 and rot.concept(0, 2) == 0
    r, s0 = rot.step_data(0, 3), static.step_data(0, 3)
    assert not np.allclose(r.x_train, s0.x_train)
    np.testing.assert_array_equal(r.y_train, s0.y_train)
    np.testing.assert_allclose(r.x_train, np.rot90(s0.x_train, k=1, axes=(2, 3)), atol=1e-6)
    np.testing.assert_array_equal(rot.step_data(1, 3).x_train, static.step_data(1, 3).x_train)
    np.testing.assert_array_equal(rot.step_data(0, 2).x_train, static.step_data(0, 2).x_train)


def test_noise_feature_shift():
    noisy = build_scenario("digits-noise")
    static = build_scenario("digits-static")
    n, s0 = noisy.step_data(2, 4), static.step_data(2, 4)
    assert n.concept == 1
    assert n.x_train.min() >= 0 and n.x_train.max() <= 1
    assert np.abs(n.x_train - s0.x_train).mean() > 0.1
    np.testing.assert_array_equal(noisy.step_data(3, 4).x_train, static.step_data(3, 4).x_train)


def test_test_data_come_from_held_out_pool():
    train_pool, test_pool = digits_pools(0)
    d = build_scenario("digits-static").step_data(0, 1)
    test_imgs = test_pool.get(np.arange(len(test_pool))).reshape(len(test_pool), -1)
    train_imgs = train_pool.get(np.arange(len(train_pool))).reshape(len(train_pool), -1)
    xt = d.x_test.reshape(len(d.x_test), -1)
    assert all((test_imgs == row).all(1).any() for row in xt)
    xr = d.x_train.reshape(len(d.x_train), -1)
    assert all((train_imgs == row).all(1).any() for row in xr[:50])
    assert len(train_pool) + len(test_pool) == 1797 and len(test_pool) == 450


def test_label_prior_shift():
    s = build_scenario("mixture-prior", samples_per_step=1000)
    for k in range(10):
        before = np.isin(s.step_data(k, 2).y_train, [0, 1]).mean()
        after = np.isin(s.step_data(k, 4).y_train, [0, 1]).mean()
        assert abs(before - 0.5) < 0.06
        if k < 5:
            assert s.concept(k, 4) == 1 and abs(after - 0.9) < 0.04
        else:
            assert s.concept(k, 4) == 0 and abs(after - 0.5) < 0.06


def test_mixture_swap_permutes_labels_only():
    swap = build_scenario("mixture-swap")
    none = build_scenario("mixture-swap", drift_pattern="none")
    assert none.drift_events() == []
    a, b = swap.step_data(0, 3), none.step_data(0, 3)
    np.testing.assert_array_equal(a.x_train, b.x_train)
    np.testing.assert_array_equal(a.y_train, (b.y_train + 1) % 4)


def test_dirichlet_label_skew():
    skewed = build_scenario("digits-static", dirichlet_alpha=0.05, samples_per_step=500)
    flat = build_scenario("digits-static", dirichlet_alpha=math.inf, samples_per_step=500)
    top_skewed = [np.bincount(skewed.step_data(k, 1).y_train, minlength=10).max() / 500
                  for k in range(10)]
    top_flat = [np.bincount(flat.step_data(k, 1).y_train, minlength=10).max() / 500
                for k in range(10)]
    assert np.mean(top_skewed) > 0.6 > 0.2 > np.mean(top_flat)
    # the prior is a per-client constant: steps share it
    h1 = np.bincount(skewed.step_data(0, 1).y_train, minlength=10)
    h2 = np.bincount(skewed.step_data(0, 2).y_train, minlength=10)
    assert h1.argmax() == h2.argmax()


# -------------------------------------------------------------------------------- drift patterns


def test_drift_patterns_per_family():
    s = build_scenario("digits-rotate", drift_pattern="incremental", drift_step=2)
    assert s.num_concepts == 4 and s.drift_step == 2
    assert [s.concept(0, t) for t in range(1, 7)] == [0, 2, 3, 1, 1, 1]
    assert [s.concept(1, t) for t in range(1, 7)] == [0] * 6
    x = [s.step_data(0, t).x_train for t in (2, 3, 4)]
    static = build_scenario("digits-static").step_data(0, 2).x_train
    assert not np.allclose(x[0], static) and not np.allclose(x[0], np.rot90(static, 1, (2, 3)))
    sw = build_scenario("digits-swap", drift_pattern="incremental")
    assert [sw.concept(k, 3) for k in (0, 3, 6)] == [1, 0, 0]
    assert [sw.concept(k, 4) for k in (0, 3, 6)] == [1, 2, 0]
    assert [sw.concept(k, 5) for k in (0, 3, 6)] == [1, 2, 3]
    rec = build_scenario("digits-swap", drift_pattern="recurring")
    assert [rec.concept(6, t) for t in range(1, 7)] == [0, 0, 3, 3, 0, 0]
    circ = build_scenario("circle2", drift_pattern="incremental")
    assert circ.num_concepts == 4 and [circ.concept(0, t) for t in (3, 4, 5, 6)] == [0, 2, 3, 1]
    sine = build_scenario("sine2", drift_pattern="incremental")  # no intermediate: sudden
    np.testing.assert_array_equal(sine.concept_matrix(),
                                  build_scenario("sine2", drift_pattern="sudden").concept_matrix())
    assert sine.drift_step == 4
    st = build_scenario("sea4", drift_pattern="staggered", seed=2)
    assert (st.concept_matrix()[:3] == 0).all() and st.concept_matrix().max() <= 3
    for p in DRIFT_PATTERNS:
        m = build_scenario("mixture-prior", drift_pattern=p).concept_matrix()
        assert m.shape == (6, 10) and (m[:2] == 0).all()


# ----------------------------------------------------------------------------------- window


def test_window_concatenation_and_bound():
    s = build_scenario("mixture-swap", samples_per_step=30)
    x, y = s.window(2, 4, 3)
    parts = [s.step_data(2, t) for t in (2, 3, 4)]
    np.testing.assert_array_equal(x, np.concatenate([p.x_train for p in parts]))
    np.testing.assert_array_equal(y, np.concatenate([p.y_train for p in parts]))
    x, y = s.window(2, 2, 10)  # bounded below by step 1
    assert x.shape == (60, 8) and y.shape == (60,)
    x, _ = s.window(2, 5, 1)
    np.testing.assert_array_equal(x, s.step_data(2, 5).x_train)
    with pytest.raises(ValueError, match="window size"):
        s.window(2, 5, 0)


# ---------------------------------------------------------------------------------- bad input


def test_unknown_scenario_lists_valid_names():
    with pytest.raises(ValueError) as exc:
        build_scenario("circle3")
    msg = str(exc.value)
    assert "circle3" in msg and all(n in msg for n in STANDARD)


def test_bad_schedule_files(tmp_path):
    with pytest.raises(ValueError, match="not found"):
        build_scenario("circle2", schedule=str(tmp_path / "missing.cp"))
    ragged = write_cp(tmp_path / "ragged.cp", ["0 0 0", "0 1"])
    with pytest.raises(ValueError, match="ragged.*line 2"):
        build_scenario("circle2", schedule=str(ragged))
    nonint = write_cp(tmp_path / "nonint.cp", ["0 0 0", "0 x 1"])
    with pytest.raises(ValueError, match="'x' is not an integer"):
        build_scenario("circle2", schedule=str(nonint))
    floaty = write_cp(tmp_path / "float.cp", ["0 0.5 0"])
    with pytest.raises(ValueError, match="not an integer"):
        load_cp(floaty)
    empty = write_cp(tmp_path / "empty.cp", [""])
    with pytest.raises(ValueError, match="empty"):
        load_cp(empty)
    big = write_cp(tmp_path / "big.cp", ["0 0 0", "0 2 0"])
    with pytest.raises(ValueError, match=r"concept id 2 .*step 2, client 1.*only 2 concepts"):
        build_scenario("circle2", schedule=str(big))
    build_scenario("sea4", schedule=str(big))  # SEA has four concepts: fine
    ok = write_cp(tmp_path / "ok.cp", ["0 0 0", "0 1 0"])
    with pytest.raises(ValueError) as exc:
        build_scenario("circle2", schedule=str(ok), num_clients=10)
    msg = str(exc.value)
    assert "ok.cp" in msg and "expected 10" in msg and "found 3" in msg
    with pytest.raises(ValueError, match="not both"):
        build_scenario("circle2", schedule=str(ok), drift_pattern="sudden")


@pytest.mark.parametrize("kwargs, match", [
    ({"num_clients": -1}, "num_clients must be >= 0"),
    ({"num_steps": -2}, "num_steps must be >= 0"),
    ({"samples_per_step": -5}, "samples_per_step must be >= 0"),
    ({"test_samples": -1}, "test_samples must be >= 0"),
    ({"seed": -1}, "seed must be >= 0"),
    ({"dirichlet_alpha": -0.5}, "dirichlet_alpha must be >= 0"),
    ({"dirichlet_alpha": float("nan")}, "dirichlet_alpha"),
    ({"drift_pattern": "sometimes"}, "unknown drift_pattern.*none, sudden, incremental, "
                                     "recurring, staggered"),
    ({"drift_pattern": "sudden", "drift_step": 7}, r"drift_step 7 outside 1\.\.6"),
    ({"drift_step": 9}, r"drift_step 9 outside 1\.\.6"),
    ({"num_clients": 2.5}, "num_clients must be an integer"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        build_scenario("mixture-swap", **kwargs)


def test_drift_step_bounds_follow_num_steps():
    with pytest.raises(ValueError, match=r"outside 1\.\.4"):
        build_scenario("mixture-swap", num_steps=4, drift_pattern="sudden", drift_step=5)
    s = build_scenario("circle2", num_steps=3, drift_pattern="sudden")  # default clamped
    assert s.drift_step == 3


def test_client_and_step_out_of_range():
    s = build_scenario("mixture-swap")
    for client, step in ((10, 1), (-1, 1), (0, 0), (0, 7)):
        with pytest.raises(ValueError, match="out of range"):
            s.step_data(client, step)
        with pytest.raises(ValueError, match="out of range"):
            s.concept(client, step)
    with pytest.raises(ValueError, match="out of range"):
        s.window(0, 7, 2)


@pytest.mark.parametrize("name", ["mnist-swap", "fmnist-static", "cifar10-rotate"])
def test_torchvision_scenarios_need_data_dir(name):
    with pytest.raises(ValueError, match="data-dir"):
        build_scenario(name)


def test_registered_scenarios_are_listed_built_and_cached():
    from fedcluster_app.core.data import (
        build_scenario,
        list_scenarios,
        register_scenario,
        scenario_names,
    )
    from fedcluster_app.core.data.catalogue import _EXTRA

    calls = []

    def builder(**kwargs):
        calls.append(kwargs)
        return build_scenario("mixture-swap", seed=kwargs["seed"])

    register_scenario("test-extra", "a registered test scenario", builder)
    try:
        assert "test-extra" in scenario_names()
        assert ("test-extra", "a registered test scenario") in list_scenarios()
        a = build_scenario("test-extra", seed=3)
        assert a is build_scenario("test-extra", seed=3) and len(calls) == 1
        with pytest.raises(ValueError, match="already defined"):
            register_scenario("test-extra", "again", builder)
        with pytest.raises(ValueError, match="test-extra"):
            build_scenario("nope")
    finally:
        _EXTRA.pop("test-extra")
