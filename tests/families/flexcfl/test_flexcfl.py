"""FlexCFL family: the Synthetic(a,b) data and shifts, the strategies, the implementation checks
listed in docs/flexcfl/README.md ("Tests") and the bad inputs. Tiny configs: 20 clients, a few
rounds."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from fedcluster_app.api import build_strategy
from fedcluster_app.client_app import app as client_app
from fedcluster_app.core import wire as P
from fedcluster_app.core.config import ConfigError, default_run_config, merge_overrides
from fedcluster_app.core.data import build_scenario
from fedcluster_app.core.experiment import load_experiment
from fedcluster_app.core.results import load_run
from fedcluster_app.core.server.strategy import read_checkpoint
from fedcluster_app.engine import InProcessGrid, run_inprocess
from fedcluster_app.families.flexcfl import flexcfl as flexcfl_module
from fedcluster_app.families.flexcfl.flexcfl import FlexCFL
from fedcluster_app.families.flexcfl.grouping import (
    cosine_matrix,
    edc_embedding,
    edc_kmeans,
    flatten,
    inter_group_aggregate,
    madc_cluster,
    madc_matrix,
    nearest_model,
    rac_group,
    shift_distance,
)
from fedcluster_app.families.flexcfl.scenarios import ShiftSpec, synthetic_users
from tests.core.server.test_checkpoint import CrashingGrid
from tests.test_bad_input import CountingApp

N = 20


def tiny(tmp_path, name="run", **over):
    cfg = {
        "scenario": "synthetic-1-1-swap", "num-clients": N, "num-steps": 6,
        "samples-per-step": 150, "rounds-per-step": 1, "window": 1, "num-clusters": 3,
        "optimizer": "sgd", "lr": 0.05, "local-steps": 5, "batch-size": 10,
        "progress": False, "plot": False, "out-dir": str(tmp_path / name),
        "flexcfl.pretrain-scale": 2, "flexcfl.clients-per-round": 5,
        "fedgroup.pretrain-scale": 2, "fedgroup.clients-per-round": 5,
        "fesem.clients-per-round": 5, "flexcfl-ifca.clients-per-round": 5,
        "flexcfl-fedavg.clients-per-round": 5, "flexcfl-ifca-mig.clients-per-round": 5,
        "fesem-mig.clients-per-round": 5,
    }
    cfg.update(over)
    return cfg


def rounds_of(summary):
    return load_run(Path(summary["out_dir"]))[1]


# ----------------------------------------------------------------------------- data
def test_synthetic_generator_follows_the_fedprox_recipe():
    users = synthetic_users(1.0, 1.0, 30, seed=5)
    sizes = np.random.RandomState(5).lognormal(4, 2, 30).astype(int) + 50
    assert [len(u.y_train) + len(u.y_test) for u in users] == sizes.tolist()
    assert [len(u.y_train) for u in users] == [int(0.9 * n) for n in sizes]
    assert users[0].x_train.shape[1] == 60
    assert all(set(np.unique(u.y_train)) <= set(range(10)) for u in users)
    again = synthetic_users(1.0, 1.0, 30, seed=5)
    assert all(np.array_equal(a.x_train, b.x_train) for a, b in zip(users, again))
    # skewed labels: most users have one dominant class
    dominant = [np.bincount(u.y_train, minlength=10).max() / len(u.y_train) for u in users]
    assert np.median(dominant) > 0.4


def _all_labels(s, step):
    return np.sort(np.concatenate([s.step_data(k, step).y_train for k in range(s.num_clients)]))


def test_swap_all_exchanges_whole_datasets_and_keeps_the_union():
    s = build_scenario("synthetic-1-1-swap", num_clients=N, num_steps=30, seed=2)
    assert s.num_clients == N and s.num_steps == 30 and s.swap_events > 0
    m = s.concept_matrix()
    assert (m[0] == np.arange(N)).all()            # step 1: client k holds user k's data
    for t in range(1, 30):
        assert sorted(m[t]) == list(range(N))      # a permutation of the users' datasets
        assert np.array_equal(_all_labels(s, t + 1), _all_labels(s, 1))
    moved = np.flatnonzero(m[-1] != np.arange(N))
    k = int(moved[0])
    assert np.array_equal(s.step_data(k, 30).y_test, s.step_data(int(m[-1, k]), 1).y_test)
    assert (build_scenario("synthetic-1-1", num_clients=N, num_steps=30, seed=2)
            .concept_matrix() == np.arange(N)).all()


def test_swap_part_moves_one_label_each_way():
    s = build_scenario("synthetic-1-1-swap-part", num_clients=N, num_steps=40, seed=3)
    assert s.swap_events > 0
    m = s.concept_matrix()
    for t in range(1, 40):
        assert np.array_equal(_all_labels(s, t + 1), _all_labels(s, 1))
        changed = np.flatnonzero(m[t] != m[t - 1])
        assert len(changed) % 2 == 0
        for k in changed:
            before = set(np.unique(np.concatenate([s.step_data(k, t).y_train,
                                                   s.step_data(k, t).y_test])))
            after = set(np.unique(np.concatenate([s.step_data(k, t + 1).y_train,
                                                  s.step_data(k, t + 1).y_test])))
            # every sample of one label left (it may have been present only in train or test
            # of the partner, so the partner's label need not be new here)
            assert len(before - after) == 1
            assert len(s.step_data(k, t + 1).y_train) != len(s.step_data(k, t).y_train) or \
                len(s.step_data(k, t + 1).y_test) != len(s.step_data(k, t).y_test) or \
                len(after - before) == 1


def test_incremental_releases_quarters_of_the_original_set():
    s = build_scenario("synthetic-1-1-incremental", num_clients=N, num_steps=12, seed=1,
                       drift_step=5)
    full = build_scenario("synthetic-1-1", num_clients=N, num_steps=1, seed=1)
    n = len(full.step_data(0, 1).y_train)
    sizes = [len(s.step_data(0, t).y_train) for t in (1, 5, 6, 10, 11, 12)]
    assert sizes == [int(np.ceil(f * n)) for f in (0.25, 0.25, 0.5, 0.5, 0.75, 0.75)]
    assert len(s.step_data(0, 12).y_test) == len(full.step_data(0, 1).y_test)


def test_digits_pairs_clients_hold_two_classes():
    s = build_scenario("digits-pairs", num_steps=3)
    assert s.num_clients == 50 and s.input_shape == (64,) and s.hidden == 0
    for k in range(s.num_clients):
        assert set(np.unique(s.step_data(k, 1).y_train)) == {k % 10, (k + 1) % 10}
    assert build_scenario("digits-pairs-swap", num_steps=20).swap_events > 0


@pytest.mark.parametrize("pattern", ["swap-all@1.5", "swap-all@-0.1", "swap-part@nan"])
def test_swap_probability_outside_unit_interval_is_rejected(pattern, tmp_path):
    with pytest.raises(ValueError, match=r"swap probability .* must be in \[0, 1\]"):
        build_scenario("synthetic-1-1-swap", num_clients=N, drift_pattern=pattern)
    with pytest.raises(ValueError, match="swap probability"):
        ShiftSpec("swap-all", 2.0)
    app = CountingApp()
    with pytest.raises(ValueError, match="swap probability"):
        run_inprocess(tiny(tmp_path, strategy="flexcfl", **{"drift-pattern": pattern}),
                      num_nodes=N, client_app=app)
    assert app.calls == 0


# ----------------------------------------------------------------------------- pieces
def test_edc_embedding_and_kmeans_recover_update_directions():
    rng = np.random.default_rng(0)
    base = rng.standard_normal((3, 200))
    truth = np.repeat([0, 1, 2], 8)
    updates = base[truth] * rng.uniform(0.5, 2.0, (24, 1)) + 0.05 * rng.standard_normal((24, 200))
    md = edc_embedding(updates, 3)
    assert md.shape == (24, 3) and np.all(np.abs(md) <= 1 + 1e-9)
    labels = edc_kmeans(md, 3, seed=1)
    assert np.array_equal(labels, edc_kmeans(md, 3, seed=1))        # deterministic
    from sklearn.metrics import adjusted_rand_score

    assert adjusted_rand_score(truth, labels) == 1.0


def test_inter_group_aggregation_identity_and_convex():
    rng = np.random.default_rng(1)
    models = {g: rng.standard_normal(50) * (g + 1) for g in range(3)}
    same = inter_group_aggregate(models, 0.0)
    assert all(np.array_equal(same[g], models[g]) for g in models)
    mixed = inter_group_aggregate(models, 5.0)
    mat = np.stack([models[g] for g in range(3)], axis=1)
    for g in range(3):
        coef, *_ = np.linalg.lstsq(mat, mixed[g], rcond=None)
        assert abs(coef.sum() - 1.0) < 1e-9 and np.all(coef > 0)
        norms = {l: np.linalg.norm(models[l]) for l in models}
        a = {l: 1.0 if l == g else 5.0 / norms[l] for l in models}
        assert np.allclose(coef, [a[l] / sum(a.values()) for l in range(3)])


def test_shift_distances():
    ref = np.array([50, 0, 0, 10])
    swapped = np.array([0, 50, 0, 10])       # same count profile, other labels
    assert shift_distance("scipy_counts", swapped, ref) == 0.0    # the paper's metric misses it
    assert shift_distance("tv", swapped, ref) > 0.8                # the label-aware one does not
    assert shift_distance("scipy_counts", np.array([10, 0, 0, 10]), ref) == pytest.approx(10.0)
    assert nearest_model(np.zeros(3), {4: np.ones(3), 2: np.full(3, 2.0), 7: -np.ones(3)}) == 4


def _strategy(tmp_path, strategy="flexcfl", **over):
    rc = merge_overrides(default_run_config(), tiny(tmp_path, strategy=strategy, **over))
    exp = load_experiment(rc)
    strat = build_strategy(exp)
    grid = InProcessGrid(rc, exp.scenario.num_clients)
    strat.discover(grid)
    strat.on_start()
    strat.round = 1
    return strat, grid


def test_group_cold_start_is_deterministic_with_nonempty_groups(tmp_path):
    a, grid = _strategy(tmp_path, scenario="synthetic-1-1")
    a.group_cold_start(grid)
    assert isinstance(a, FlexCFL) and a.embedding.shape == (2 * 3, 3)   # (alpha*m) x m
    sizes = [len(a.members(g)) for g in a.group_ids]
    assert sum(sizes) == 6 and min(sizes) >= 1
    assert set(a.directions) == set(a.group_ids)
    for g in a.group_ids:   # w^(g) = w0 + mean of the members' updates
        assert np.allclose(flatten(a.models[g]), flatten(a.models[a.w0_id]) + a.directions[g],
                           atol=1e-6)
    b, grid_b = _strategy(tmp_path, scenario="synthetic-1-1")
    b.group_cold_start(grid_b)
    assert a.pre_clients == b.pre_clients and a.pre_labels == b.pre_labels
    assert np.array_equal(a.embedding, b.embedding)
    # a newcomer joins the group whose fixed initial direction is closest
    for g in a.group_ids:
        assert a.nearest_group(a.directions[g] * 3.0) == g


# ----------------------------------------------------------------------------- runs
def test_flexcfl_with_one_group_at_w0_is_fedavg_exactly(tmp_path):
    common = dict(scenario="synthetic-1-1-swap", **{"fraction-train": 0.5, "num-steps": 5})
    ref = run_inprocess(tiny(tmp_path, "fedavg", strategy="fedavg", **common))
    flex = run_inprocess(tiny(
        tmp_path, "flex", strategy="flexcfl", **common,
        **{"flexcfl.num-groups": 1, "flexcfl.eta-g": 0.0, "flexcfl.group-init": "w0",
           "flexcfl.cold-start": "eager", "flexcfl.selection": "fraction",
           "flexcfl.pretrain-scale": 0}))
    ra, rb = rounds_of(ref), rounds_of(flex)
    assert [r["accuracy"] for r in ra] == [r["accuracy"] for r in rb]
    assert [r["client_accuracy"] for r in ra] == [r["client_accuracy"] for r in rb]
    x, y = read_checkpoint(Path(ref["out_dir"]))[1][0], read_checkpoint(Path(flex["out_dir"]))[1][0]
    assert x and len(x) == len(y) and all(np.array_equal(a, b) for a, b in zip(x, y))
    # and on the paper's selection, against flexcfl-fedavg
    a = run_inprocess(tiny(tmp_path, "pf", strategy="flexcfl-fedavg", **{"num-steps": 5}))
    b = run_inprocess(tiny(tmp_path, "pflex", strategy="flexcfl", **{"num-steps": 5,
        "flexcfl.num-groups": 1, "flexcfl.group-init": "w0", "flexcfl.cold-start": "eager"}))
    assert [r["weighted_accuracy"] for r in rounds_of(a)] == \
        [r["weighted_accuracy"] for r in rounds_of(b)]


def test_no_migration_without_shift_and_newcomers_all_placed(tmp_path):
    s = run_inprocess(tiny(tmp_path, strategy="flexcfl", scenario="synthetic-1-1"))
    rounds = rounds_of(s)
    assert s["status"] == "completed" and all(r["failures"] == 0 for r in rounds)
    assert sum(r["migrations"] + r["shift_cold_starts"] for r in rounds) == 0
    # round-robin: every client is cold-started within N/K = 4 rounds, then stays put
    assert sum(rounds[0]["group_sizes"]) >= 6
    assert all(sum(r["group_sizes"]) == N for r in rounds[3:])
    assert sum(r["newcomers"] for r in rounds) == N - 6
    # only the client's own group model goes down: one model per trained client
    assert all(r["models_down"] == r["trained_clients"] + r["newcomers"] for r in rounds[1:])
    assert all(0 < r["weighted_accuracy"] <= 1 for r in rounds)


@pytest.mark.parametrize("metric", ["tv", "scipy_counts"])
def test_migrations_are_exactly_the_warm_clients_whose_counts_moved(tmp_path, metric):
    steps = 10
    s = run_inprocess(tiny(tmp_path, strategy="flexcfl", **{
        "num-steps": steps, "drift-pattern": "swap-all@0.3", "flexcfl.cold-start": "eager",
        "flexcfl.shift-metric": metric}))
    rounds = rounds_of(s)
    scen = build_scenario("synthetic-1-1-swap", num_clients=N, num_steps=steps, seed=0,
                          samples_per_step=150, drift_pattern="swap-all@0.3")

    def counts(k, t):
        return np.bincount(scen.step_data(k, t).y_train, minlength=10)

    ref = {k: counts(k, 1) for k in range(N)}        # eager: every client warm from round 1
    n_orig = {k: len(scen.step_data(k, 1).y_train) for k in range(N)}
    expected = []
    for t in range(1, steps + 1):
        hit = []
        for k in range(N):
            tau = 0.2 * n_orig[k] / 10 if metric == "scipy_counts" else 0.2
            if shift_distance(metric, counts(k, t), ref[k]) > tau:
                hit.append(k)
                ref[k] = counts(k, t)
        expected.append(hit)
    assert [r["shifted_clients"] for r in rounds] == expected
    assert sum(map(len, expected)) > 0
    assert [r["shift_cold_starts"] for r in rounds] == [len(e) for e in expected]
    assert sum(r["migrations"] for r in rounds) <= sum(map(len, expected))
    # fedgroup never migrates on the same data
    g = run_inprocess(tiny(tmp_path, "fg", strategy="fedgroup", **{
        "num-steps": 4, "drift-pattern": "swap-all@0.3"}))
    assert all("migrations" in r and r["migrations"] == 0 for r in rounds_of(g))


def test_inter_group_aggregation_runs_and_mixes(tmp_path):
    s = run_inprocess(tiny(tmp_path, strategy="flexcfl", **{"flexcfl.eta-g": 5.0,
                                                            "num-steps": 4}))
    assert s["status"] == "completed"
    models = read_checkpoint(Path(s["out_dir"]))[1]
    w = [np.concatenate([models[g][i].ravel() for i in range(2)]) for g in range(3)]
    # eta-g = 5 pulls the groups together: they end much closer than without it
    s0 = run_inprocess(tiny(tmp_path, "e0", strategy="flexcfl", **{"num-steps": 4}))
    models = read_checkpoint(Path(s0["out_dir"]))[1]
    w0 = [np.concatenate([models[g][i].ravel() for i in range(2)]) for g in range(3)]
    spread = lambda ws: max(np.linalg.norm(a - b) for a in ws for b in ws)  # noqa: E731
    assert spread(w) < 0.5 * spread(w0)


@pytest.mark.parametrize("strategy", ["fesem", "flexcfl-ifca", "flexcfl-fedavg"])
def test_baselines_run_and_count_models(tmp_path, strategy):
    s = run_inprocess(tiny(tmp_path, strategy=strategy, **{"num-steps": 4}))
    rounds = rounds_of(s)
    assert s["status"] == "completed" and all(r["failures"] == 0 for r in rounds)
    per_client = 3 if strategy == "flexcfl-ifca" else 1      # IFCA: all m models go down
    assert all(r["models_down"] == per_client * r["trained_clients"] == per_client * 5
               for r in rounds)
    assert all(r["models_up"] == r["trained_clients"] for r in rounds)


def _corrupt_pretrain(bad_cid):
    from flwr.app import ArrayRecord

    def app(msg, ctx):
        reply = client_app(msg, ctx)
        if msg.metadata.message_type == "query.pretrain" and \
                int(ctx.node_config["partition-id"]) == bad_cid:
            for key in list(reply.content.array_records):
                arrays = reply.content.array_records[key].to_numpy_ndarrays()
                arrays[0] = np.full_like(arrays[0], np.nan)
                reply.content[key] = ArrayRecord(arrays)
        return reply

    return app


def test_non_finite_pretraining_update_is_left_out_and_the_run_goes_on(tmp_path, caplog):
    rc = merge_overrides(default_run_config(), tiny(tmp_path, strategy="flexcfl",
                                                    scenario="synthetic-1-1"))
    exp = load_experiment(rc)
    pre = build_strategy(exp)
    grid = InProcessGrid(rc, N)
    pre.discover(grid)
    pre.on_start()
    pre.round = 1
    pre.group_cold_start(grid)
    bad = pre.pre_clients[0]
    s = run_inprocess(tiny(tmp_path, "bad", strategy="flexcfl", scenario="synthetic-1-1"),
                      client_app=_corrupt_pretrain(bad))
    rounds = rounds_of(s)
    assert s["status"] == "completed" and len(rounds) == 6
    assert "1 of 6 pre-training updates left out of the SVD" in caplog.text
    assert rounds[0]["pretrain_left_out"] >= 1 and rounds[0]["failures"] >= 1
    assert sum(rounds[0]["group_sizes"]) == 6 - 1 + rounds[0]["newcomers"]
    # it is retried (and left out again) whenever it is selected while cold
    assert sum(r["pretrain_left_out"] for r in rounds) == sum(r["failures"] for r in rounds)
    # the bad client never joins a group (its every pre-training is rejected); others do
    assert all(sum(r["group_sizes"]) == N - 1 for r in rounds[4:])


@pytest.mark.parametrize(
    "over, expected",
    [
        ({"flexcfl.num-groups": -1}, "flexcfl.num-groups must be an integer in [0, 1000], got -1"),
        ({"flexcfl.num-groups": 25}, "larger than the number of clients"),
        ({"flexcfl.num-groups": 5, "flexcfl.pretrain-scale": 5},
         "alpha x m = 5 x 5 = 25) is larger than the number of clients (20)"),
        ({"flexcfl.eta-g": -0.5}, "flexcfl.eta-g must be >= 0, got -0.5"),
        ({"flexcfl.shift-metric": "kl"}, "shift-metric must be one of 'scipy_counts', 'tv'"),
        ({"flexcfl.clients-per-round": 0}, "clients-per-round must be an integer in [1, 100,000]"),
        ({"strategy": "fedgroup", "fedgroup.eta-g": -1.0}, "fedgroup.eta-g must be"),
        ({"strategy": "fesem", "fesem.num-groups": -2},
         "fesem.num-groups must be an integer in [0, 1000]"),
        ({"flexcfl.measure": "cosine"}, "flexcfl.measure must be one of 'edc', 'madc'"),
        ({"flexcfl.rcc": "maybe"}, "flexcfl.rcc must be of type bool"),
        ({"flexcfl.rac": "sometimes"}, "flexcfl.rac must be of type bool"),
        ({"flexcfl.rcc": True, "flexcfl.measure": "MADC"}, "with flexcfl.rcc = true"),
        ({"flexcfl.eval-model": "latest"}, "flexcfl.eval-model must be one of 'current_group', "
                                           "'last_received'"),
        ({"strategy": "fesem", "fesem.eval-model": "x"}, "fesem.eval-model must be one of"),
        ({"strategy": "flexcfl-ifca-mig", "flexcfl-ifca-mig.shift-metric": "kl"},
         "flexcfl-ifca-mig.shift-metric must be one of 'scipy_counts', 'tv'"),
        ({"strategy": "fesem-mig", "fesem-mig.shift-threshold": -1},
         "fesem-mig.shift-threshold must be >= 0, got -1"),
        ({"strategy": "flexcfl-fedavg", "flexcfl-fedavg.eval-model": "last_received"},
         "unknown run-config key 'flexcfl-fedavg.eval-model'"),   # FedAvg: current model
    ],
)
def test_bad_hyper_parameters_fail_before_the_first_round(tmp_path, over, expected):
    app = CountingApp()
    cfg = tiny(tmp_path, strategy="flexcfl")
    cfg.update(over)
    with pytest.raises(ConfigError) as err:
        run_inprocess(cfg, num_nodes=N, client_app=app)
    assert expected in str(err.value)
    assert app.calls == 0


class CrashAt5(CrashingGrid):
    crash_round = 5


@pytest.mark.parametrize("strategy", ["flexcfl", "fesem", "flexcfl-ifca-mig"])
def test_resume_continues_exactly(tmp_path, strategy):
    over = {"drift-pattern": "swap-all@0.3", "checkpoint-every": 2}
    if strategy == "flexcfl-ifca-mig":    # also the shift references and last_received snapshots
        over[f"{strategy}.eval-model"] = "last_received"
    full = rounds_of(run_inprocess(tiny(tmp_path, "full", strategy=strategy, **over)))
    cfg = tiny(tmp_path, "crash", strategy=strategy, **over)
    with pytest.raises(RuntimeError, match="server crashed"):
        run_inprocess(cfg, grid_cls=CrashAt5)
    resumed = run_inprocess(cfg | {"resume-from": cfg["out-dir"]})
    assert resumed["status"] == "completed"
    keys = ("weighted_accuracy", "group_sizes", "shifted_clients", "migrations", "models_down",
            "shift_reassignments", "client_accuracy")
    strip = lambda rs: [tuple(r.get(k) for k in keys) for r in rs]  # noqa: E731
    assert strip(rounds_of(resumed)) == strip(full)


# ------------------------------------------------------------------------- the ablation options:
# MADC, RCC, RAC, the -MIG baselines and the last_received evaluation
def test_madc_on_a_hand_made_similarity_matrix():
    s = np.array([[1.0, 0.5, 0.2, 0.0],
                  [0.5, 1.0, 0.4, 0.1],
                  [0.2, 0.4, 1.0, 0.9],
                  [0.0, 0.1, 0.9, 1.0]])
    d = madc_matrix(s)
    # MADC(i, j) = 1/(n-2) sum_{z != i, j} |S(i, z) - S(j, z)|, n = 4
    assert d[0, 1] == pytest.approx((abs(0.2 - 0.4) + abs(0.0 - 0.1)) / 2)      # 0.15
    assert d[0, 3] == pytest.approx((abs(0.5 - 0.1) + abs(0.2 - 0.9)) / 2)      # 0.55
    assert d[2, 3] == pytest.approx((abs(0.2 - 0.0) + abs(0.4 - 0.1)) / 2)      # 0.25
    assert d[1, 2] == pytest.approx((abs(0.5 - 0.2) + abs(0.1 - 0.9)) / 2)      # 0.55
    assert np.allclose(d, d.T) and np.all(np.diag(d) == 0)
    labels = madc_cluster(d, 2)             # complete linkage: {0, 1} and {2, 3}
    assert labels[0] == labels[1] != labels[2] == labels[3]
    # against a direct triple loop on random updates
    rng = np.random.default_rng(3)
    sim = cosine_matrix(rng.standard_normal((7, 30)))
    assert np.allclose(np.diag(sim), 1.0)
    brute = np.array([[sum(abs(sim[i, z] - sim[j, z]) for z in range(7) if z not in (i, j)) / 5
                       if i != j else 0.0 for j in range(7)] for i in range(7)])
    assert np.allclose(madc_matrix(sim), brute)


def _no_edc(*args, **kwargs):
    raise AssertionError("the EDC path (SVD / k-means) must not run")


def test_madc_group_cold_start_clusters_without_the_svd(tmp_path, monkeypatch):
    monkeypatch.setattr(flexcfl_module, "edc_embedding", _no_edc)
    monkeypatch.setattr(flexcfl_module, "edc_kmeans", _no_edc)
    a, grid = _strategy(tmp_path, scenario="synthetic-1-1", **{"flexcfl.measure": "MADC"})
    a.group_cold_start(grid)
    n_pre = 2 * 3
    assert a.measure == "madc" and a.embedding.shape == (n_pre, n_pre)   # the MADC matrix
    assert np.allclose(a.embedding, a.embedding.T) and np.all(np.diag(a.embedding) == 0)
    assert list(madc_cluster(a.embedding, 3)) == a.pre_labels
    sizes = [len(a.members(g)) for g in a.group_ids]
    assert sum(sizes) == n_pre and min(sizes) >= 1 and set(a.directions) == set(a.group_ids)


def test_rcc_uses_no_svd_and_makes_m_single_client_groups(tmp_path, monkeypatch):
    monkeypatch.setattr(flexcfl_module, "edc_embedding", _no_edc)
    monkeypatch.setattr(flexcfl_module, "edc_kmeans", _no_edc)
    monkeypatch.setattr(flexcfl_module, "madc_cluster", _no_edc)
    real_svd = np.linalg.svd

    def svd_not_from_flexcfl(*args, **kwargs):    # the data generator may use it, FlexCFL not
        if sys._getframe(1).f_globals.get("__name__") == flexcfl_module.__name__:
            _no_edc()
        return real_svd(*args, **kwargs)

    monkeypatch.setattr(np.linalg, "svd", svd_not_from_flexcfl)
    a, grid = _strategy(tmp_path, scenario="synthetic-1-1", **{"flexcfl.rcc": True})
    a.group_cold_start(grid)
    assert a.embedding is None and len(a.pre_clients) == 3          # m clients, not alpha*m
    assert [a.members(g) for g in a.group_ids] == [[c] for c in a.pre_clients]
    w0 = flatten(a.models[a.w0_id])
    again = a._pretrain(grid, a.pre_clients)        # same round: the same pre-training
    for g, c in zip(a.group_ids, a.pre_clients):
        # the group's model is that client's pre-trained model, its direction that update
        assert np.allclose(a.directions[g], again[c][0])
        assert np.allclose(flatten(a.models[g]), w0 + again[c][0], atol=1e-6)
    b, grid_b = _strategy(tmp_path, scenario="synthetic-1-1", **{"flexcfl.rcc": True})
    b.group_cold_start(grid_b)
    assert b.pre_clients == a.pre_clients                            # seeded draw
    # everybody else is cold and joins later by direction; a whole run completes
    s = run_inprocess(tiny(tmp_path, "rcc", strategy="flexcfl", scenario="synthetic-1-1",
                           **{"flexcfl.rcc": True, "num-steps": 4}))
    rounds = rounds_of(s)
    assert s["status"] == "completed" and sum(r["newcomers"] for r in rounds) == N - 3
    assert sum(rounds[-1]["group_sizes"]) == N and len(rounds[-1]["group_sizes"]) == 3


def test_rac_assigns_newcomers_uniformly_at_random_not_by_direction(tmp_path):
    a, grid = _strategy(tmp_path, scenario="synthetic-1-1", **{"flexcfl.rac": True})
    a.group_cold_start(grid)
    warm = {c: a.clients[c].cluster for c in a.pre_clients}
    cold = [c for c in sorted(a.clients) if c not in warm]
    a.cold_start(grid, cold, "newcomers")
    groups = sorted(a.directions)
    got = {c: a.clients[c].cluster for c in cold}
    assert got == {c: rac_group(a.cfg.seed, a.round, c, groups) for c in cold}
    assert {c: a.clients[c].cluster for c in a.pre_clients} == warm   # clustered ones stay
    # the same newcomers by direction (rac = false, same seed: same groups) land elsewhere
    b, grid_b = _strategy(tmp_path, scenario="synthetic-1-1")
    b.group_cold_start(grid_b)
    assert b.pre_labels == a.pre_labels and set(b.directions) == set(groups)
    b.cold_start(grid_b, cold, "newcomers")
    assert any(b.clients[c].cluster != got[c] for c in cold)
    # deterministic per seed, uniform over the groups, another seed draws otherwise
    c2, grid_c = _strategy(tmp_path, scenario="synthetic-1-1", **{"flexcfl.rac": True})
    c2.group_cold_start(grid_c)
    c2.cold_start(grid_c, cold, "newcomers")
    assert {c: c2.clients[c].cluster for c in cold} == got
    draws = np.bincount([rac_group(0, 1, c, [4, 7, 9]) for c in range(3000)], minlength=10)
    assert set(np.flatnonzero(draws)) == {4, 7, 9} and draws[[4, 7, 9]].min() > 900
    assert [rac_group(1, 1, c, groups) for c in range(40)] != \
        [rac_group(0, 1, c, groups) for c in range(40)]


@pytest.mark.parametrize("strategy", ["flexcfl-ifca-mig", "fesem-mig"])
def test_mig_variants_reassign_exactly_the_shifted_clients_and_count_models(tmp_path, strategy):
    steps, m = 10, 3
    s = run_inprocess(tiny(tmp_path, strategy=strategy, **{
        "num-steps": steps, "drift-pattern": "swap-all@0.3"}))
    rounds = rounds_of(s)
    assert s["status"] == "completed" and all(r["failures"] == 0 for r in rounds)
    scen = build_scenario("synthetic-1-1-swap", num_clients=N, num_steps=steps, seed=0,
                          samples_per_step=150, drift_pattern="swap-all@0.3")
    sel, _ = _strategy(tmp_path, strategy, **{"num-steps": steps})

    def counts(k, t):
        return np.bincount(scen.step_data(k, t).y_train, minlength=10)

    n_orig = {k: len(scen.step_data(k, 1).y_train) for k in range(N)}
    ref, expected = {}, []
    for t in range(1, steps + 1):
        hit = [k for k in sorted(ref)       # warm: assigned in an earlier round
               if shift_distance("scipy_counts", counts(k, t), ref[k]) > 0.2 * n_orig[k] / 10]
        for k in hit:
            ref[k] = counts(k, t)
        sel.round = t
        for k in sel.protocol.select_round():   # a client's first assignment sets its reference
            ref.setdefault(k, counts(k, t))
        expected.append(hit)
    assert [r["shifted_clients"] for r in rounds] == expected
    assert sum(map(len, expected)) > 0
    assert [r["shift_reassignments"] for r in rounds] == [len(e) for e in expected]
    assert all(0 <= r["migrations"] <= r["shift_reassignments"] for r in rounds)
    assert all(r["trained_clients"] == 5 and r["models_up"] == 5 for r in rounds)
    if strategy == "flexcfl-ifca-mig":     # (m+1)K per round, plus m per shifted client
        assert [r["models_down"] for r in rounds] == [m * 5 + m * len(e) for e in expected]
    else:                                  # FeSEM-MIG: nothing extra (2K per round)
        assert all(r["models_down"] == 5 for r in rounds)
    assert s["shift_reassignments_total"] == sum(map(len, expected))
    assert s["migrations_total"] == sum(r["migrations"] for r in rounds)


def _recording_app(seen):
    """The ClientApp, recording (kind, round, client, models received, model ids returned)."""
    def app(msg, ctx):
        reply = client_app(msg, ctx)
        kind = msg.metadata.message_type
        if kind in (P.TRAIN, P.EVALUATE):
            got = {k: msg.content.array_records[k].to_numpy_ndarrays()
                   for k in msg.content.array_records}
            back = [k for k in reply.content.array_records if k.startswith(P.MODEL_PREFIX)]
            rnd = int(msg.content.config_records[P.CONFIG][P.ROUND])
            seen.append((kind, rnd, int(ctx.node_config["partition-id"]), got, back))
        return reply

    return app


@pytest.mark.parametrize("strategy", ["flexcfl", "flexcfl-ifca"])
def test_last_received_evaluates_with_the_model_last_trained_from(tmp_path, strategy):
    over = {"num-steps": 5, f"{strategy}.eval-model": "last_received"}
    seen = []
    s = run_inprocess(tiny(tmp_path, strategy=strategy, **over), client_app=_recording_app(seen))
    assert s["status"] == "completed"
    w0, _ = _strategy(tmp_path, strategy)
    w0 = w0.initial_weights()
    last, checked, from_w0 = {}, 0, 0
    for kind, rnd, cid, got, back in seen:       # messages in the order they were answered
        if kind == P.TRAIN:
            (key,) = back                        # the model it trained (IFCA: its choice)
            last[cid] = got[key]
            continue
        (model,) = got.values()
        expect = last.get(cid, w0)
        from_w0 += cid not in last
        assert all(np.array_equal(x, y) for x, y in zip(model, expect)), (rnd, cid)
        checked += 1
    assert checked > 0 and checked - from_w0 > 0
    # current_group (the default) sends other models: the groups after aggregation
    seen_cur = []
    run_inprocess(tiny(tmp_path, "cur", strategy=strategy, **{"num-steps": 5}),
                  client_app=_recording_app(seen_cur))
    def ev(ss):
        return {(r, c): list(g.values())[0] for k, r, c, g, _ in ss if k == P.EVALUATE}

    a, b = ev(seen), ev(seen_cur)
    assert a.keys() == b.keys()
    assert any(not all(np.array_equal(x, y) for x, y in zip(a[k], b[k])) for k in a)
    # snapshots are dropped once no client refers to them
    models = read_checkpoint(Path(s["out_dir"]))[1]
    assert len(models) <= 3 + 1 + N
