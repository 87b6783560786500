"""Fielding end to end (in-process ServerApp + ClientApp): moves, triggers, representations, bad
replies, bad configs, malicious clients, baselines, scenarios."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from flwr.app import RecordDict

from fedcluster_app.api import STRATEGIES
from fedcluster_app.client_app import app as client_app
from fedcluster_app.core import wire as P
from fedcluster_app.core.config import ConfigError, default_run_config, merge_overrides
from fedcluster_app.core.data import build_scenario, scenario_names
from fedcluster_app.core.experiment import load_experiment
from fedcluster_app.core.results import load_run
from fedcluster_app.core.client.stream_client import StreamClient
from fedcluster_app.engine import InProcessGrid, run_inprocess
from fedcluster_app.families.fielding import client as fcl
from fedcluster_app.families.fielding import wire as fw
from fedcluster_app.families.fielding.distances import distance
from fedcluster_app.families.fielding.params import FieldingParams
from fedcluster_app.families.fielding.fielding import Fielding, split_budget

# labels-small-large with one round per time step: 12 rounds, small drift at step 5, large at 9
SL = {
    "scenario": "labels-small-large",
    "rounds-per-step": 1,
    "optimizer": "sgd",
    "lr": 0.3,
    "local-steps": 3,
    "batch-size": 20,
    "fraction-train": 0.3,
    "fielding.n-init": 3,
    "test-samples": 50,
    "progress": False,
    "plot": False,
}


def _run(tmp_path, name, **overrides):
    cfg = {**SL, "out-dir": str(tmp_path / name)}
    cfg.update(overrides)
    summary = run_inprocess(cfg)
    return summary, load_run(Path(summary["out_dir"]))[1]


def _movers(step: int, num_steps: int = 0) -> set[int]:
    m = build_scenario("labels-small-large", num_steps=num_steps).concept_matrix()
    return {int(k) for k in np.flatnonzero(m[step - 1] != m[step - 2])}


def test_scenarios_are_registered_and_match_the_spec():
    for name in ("digits-buckets", "mixture-buckets", "labels-small-large",
                 "labels-frequent-small", "digits-concept-swap"):
        assert name in scenario_names()
    sc = build_scenario("labels-small-large")
    m = sc.concept_matrix()
    assert (sc.num_clients, sc.num_steps) == (30, 12)
    assert set(m[0]) == {0, 1, 2} and len(_movers(5)) == 9 and not _movers(6)
    assert set(m[8]) == {3, 4} and set(m[-1]) == {3, 4}
    # exact label counts: the same distribution gives the same label vector at every step
    a = np.bincount(sc.step_data(0, 1).y_train, minlength=10)
    b = np.bincount(sc.step_data(0, 2).y_train, minlength=10)
    assert np.array_equal(a, b) and set(np.flatnonzero(a)) <= {0, 1, 2, 3}
    buckets = build_scenario("digits-buckets")
    y = buckets.step_data(3, 1).y_train
    assert len(set(y.tolist())) <= 4           # window = 2 buckets of 2 labels
    swap = build_scenario("digits-concept-swap")
    assert (swap.concept_matrix()[-1] > 0).sum() == swap.num_clients // 2
    with pytest.raises(ValueError, match="own drift trace"):
        build_scenario("labels-small-large", drift_pattern="sudden")


def test_small_drift_moves_clients_and_large_drift_reclusters_exactly_once(tmp_path):
    summary, rounds = _run(tmp_path, "fielding", strategy="fielding")
    by_round = {r["round"]: r for r in rounds}
    assert by_round[1]["fielding_recluster"] == "initial"
    assert by_round[1]["num_clusters"] == 3 and by_round[1]["ari"] == 1.0
    # small drift (step 5): the 9 movers, and only they, report and move; no re-clustering
    small = by_round[5]
    assert small["fielding_drifted"] == 9
    assert {m[0] for m in small["fielding_moved"]} == _movers(5)
    assert "fielding_recluster" not in small and small["num_clusters"] == 3
    assert small["ari"] == 1.0
    assert small["fielding_max_shift"] < small["fielding_threshold"]
    # large drift (step 9): exactly one global re-clustering, K 3 -> 2, clusters recovered
    large = by_round[9]
    assert large["fielding_recluster"] == "center_shift"
    assert (large["fielding_k_before"], large["fielding_k_after"]) == (3, 2)
    assert [r["round"] for r in rounds if r.get("fielding_recluster") not in (None, "initial")] == [9]
    assert rounds[-1]["fielding_reclusters"] == 1 and summary["ari_final"] == 1.0
    # no drift, no report: steps without drift are silent
    assert all(by_round[r]["fielding_drifted"] == 0 for r in (2, 3, 4, 6, 7, 8, 10, 11, 12))


def test_fielding_beats_global_and_static_cfl_after_the_drifts(tmp_path):
    acc = {}
    for strategy in ("fielding", "fedavg", "static-cfl"):
        _, rounds = _run(tmp_path, strategy, strategy=strategy, **{"rounds-per-step": 2})
        acc[strategy] = np.mean([r["accuracy"] for r in rounds if r["time_step"] >= 5])
    assert acc["fielding"] > acc["fedavg"] + 0.03
    assert acc["fielding"] > acc["static-cfl"] + 0.03


def test_tau_ablations_and_static_cfl(tmp_path):
    _, tau0 = _run(tmp_path, "tau0", strategy="fielding-tau0")
    _, tauinf = _run(tmp_path, "tauinf", strategy="fielding-tauinf")
    _, static = _run(tmp_path, "static", strategy="static-cfl")
    # tau = 0: a global re-clustering at both drifts; tau = inf: moves only, K stays 3
    assert [r["round"] for r in tau0 if r.get("fielding_recluster") == "center_shift"] == [5, 9]
    assert tauinf[-1]["fielding_reclusters"] == 0
    assert {r["num_clusters"] for r in tauinf} == {3}
    assert tauinf[8]["fielding_moves"] > 0 and "fielding_recluster" not in tauinf[8]
    # static CFL: clustered once, never queried again
    assert static[0]["fielding_recluster"] == "initial"
    assert all("fielding_drifted" not in r for r in static[1:])
    assert {r["num_clusters"] for r in static} == {3}


def test_adjust_sampled_moves_a_drifted_client_only_once_it_is_sampled(tmp_path):
    # the paper's ablation "re-cluster the selected clients only" (docs/fielding/README.md, Baselines and
    # ablations)
    _, rounds = _run(tmp_path, "sampled", strategy="fielding", **{"fielding.adjust": "sampled"})
    by_round = {r["round"]: r for r in rounds}
    movers = _movers(5)
    small = by_round[5]
    assert small["fielding_drifted"] == 9
    moved = {m[0] for m in small.get("fielding_moved", [])}
    assert moved <= movers and small["fielding_pending"] == 9 - len(moved) > 0
    # later rounds without drift: pending movers move as they get sampled, nobody else moves
    pending = [by_round[r]["fielding_pending"] for r in range(5, 9)]
    assert pending == sorted(pending, reverse=True) and pending[-1] < pending[0]
    for r in range(6, 9):
        later = {m[0] for m in by_round[r].get("fielding_moved", [])}
        assert later <= movers - moved
        moved |= later
    assert pending[-1] == 9 - len(moved)
    assert all(r["trained_clients"] == 9 for r in rounds)


def test_budget_floor_m_over_k_and_remainder_to_the_largest():
    # floor(M/K) each, capped at the cluster's size; only M - K*floor(M/K) goes to the largest
    assert split_budget({1: 10, 2: 5, 3: 2}, 9) == {1: 3, 2: 3, 3: 2}
    assert split_budget({1: 10, 2: 5, 3: 2}, 11) == {1: 4, 2: 4, 3: 2}
    assert split_budget({1: 10, 2: 10}, 5, "proportional") == {1: 2, 2: 2}
    assert split_budget({1: 3}, 100) == {1: 3}


def test_participants_per_round(tmp_path):
    _, rounds = _run(tmp_path, "m9", strategy="fielding", **{"fielding.participants": 9})
    assert [r["num_clusters"] for r in rounds] == [3] * 8 + [2] * 4
    assert all(r["trained_clients"] == 9 for r in rounds)  # 3 clusters x 3, then 4 + 5


@pytest.mark.parametrize("overrides, match", [
    ({"fielding.k-min": 5, "fielding.k-max": 3}, "K range fielding.k-min..k-max = 5..3 is empty"),
    ({"fielding.k-min": 30, "fielding.k-max": 40}, "larger than the 30 clients allow"),
    ({"fielding.k-min": 1}, r"fielding.k-min must be an integer in \[2, 1000\], got 1"),
    ({"fielding.rep": "pixels"}, "fielding.rep must be one of 'label', 'embedding', 'gradient', "
                                "got 'pixels'"),
    ({"fielding.distance": "js", "fielding.rep": "gradient"}, "js"),
    ({"fielding.tau": -1.0}, "fielding.tau"),
    ({"fielding.trigger": "always"}, "fielding.trigger"),
    ({"fielding.malicious-fraction": 1.5}, "fielding.malicious-fraction"),
    ({"fielding.n-keep": -1}, "fielding.n-keep"),
    ({"fielding.adjust": "some"}, "fielding.adjust"),
])
def test_bad_config_fails_before_the_first_round(tmp_path, overrides, match):
    sent = []

    def spy(msg, ctx):
        sent.append(msg)
        return client_app(msg, ctx)

    cfg = {**SL, "strategy": "fielding", "out-dir": str(tmp_path / "bad"), **overrides}
    with pytest.raises(ConfigError, match=match.replace(".", r"\.").replace("(", r"\(")):
        run_inprocess(cfg, client_app=spy)
    assert sent == []


BAD_REPLIES = {
    "length": ([0.1] * 7, "length 7, expected 10"),
    "negative": ([-0.2, 0.6, 0.6] + [0.0] * 7, "negative entries"),
    "sum": ([0.05] * 10, "sums to 0.5"),
    "nan": ([float("nan")] + [0.0] * 9, "not finite"),
}


def test_bad_representation_replies_are_rejected_and_the_client_keeps_its_cluster(
        tmp_path, monkeypatch):
    drift = build_scenario("labels-small-large", num_steps=6).drift_step   # small drift
    movers = _movers(drift, 6)
    # corrupt the small-drift reports of four movers
    victims = sorted(movers)[:4]
    replace = dict(zip(victims, BAD_REPLIES.values()))

    def corrupt(msg, ctx):
        reply = client_app(msg, ctx)
        cid = int(ctx.node_config["partition-id"])
        step = int(msg.content.config_records[P.CONFIG][P.STEP])
        if msg.metadata.message_type == fw.KIND and step == drift and cid in replace:
            reply.content.metric_records[P.METRICS][fw.REP] = replace[cid][0]
        return reply

    clusters: list[dict[int, int]] = []
    original = Fielding.round_metrics

    def spy(self):
        clusters.append({c: r.cluster for c, r in self.clients.items()})
        return original(self)

    monkeypatch.setattr(Fielding, "round_metrics", spy)
    cfg = {**SL, "strategy": "fielding", "out-dir": str(tmp_path / "corrupt"),
           "rounds-per-step": 1, "num-steps": 6}
    summary = run_inprocess(cfg, client_app=corrupt)
    rounds = load_run(Path(summary["out_dir"]))[1]
    assert summary["status"] == "completed"
    small = rounds[drift - 1]
    assert small["failures"] == 4
    rejected = {c: why for c, why in small["fielding_rejected"]} if "fielding_rejected" in small else {}
    for cid, (_, reason) in replace.items():
        if reason != "not finite":          # the base rejects non-finite metrics before Fielding
            assert reason in rejected[cid]
        assert clusters[drift - 1][cid] == clusters[drift - 2][cid]   # previous assignment kept
    moved = {m[0] for m in small["fielding_moved"]}
    assert moved == movers - set(victims)
    assert small["fielding_drifted"] == len(movers) - 4


def _client(scenario: str, cid: int, **overrides) -> StreamClient:
    cfg = merge_overrides(default_run_config(), {"scenario": scenario, **overrides})
    return StreamClient(cid, load_experiment(cfg), RecordDict())


def test_client_reports_on_registration_and_on_drift_only():
    client = _client("labels-small-large", sorted(_movers(5))[0])
    cfg = {P.STEP: 1, **FieldingParams().to_message(fw.PARAMS, fw.CLIENT_KEYS), fw.METRIC: "l1",
           fw.REGISTER: False}    # the label representation, eps-drift 0
    first, _, _ = fcl.report(client, cfg, {})
    assert first[fw.DRIFTED] == 1 and first[fw.REGISTERED] == 1
    assert sum(first[fw.REP]) == pytest.approx(1.0)
    assert fcl.report(client, {**cfg, P.STEP: 4}, {})[0] == {fw.DRIFTED: 0}
    drift, _, _ = fcl.report(client, {**cfg, P.STEP: 5}, {})
    assert drift[fw.DRIFTED] == 1 and drift[fw.REGISTERED] == 0
    assert distance(np.array(drift[fw.REP]), np.array(first[fw.REP]), "l1") > 1.0
    # the server can ask for a registration report at any time
    assert fcl.report(client, {**cfg, P.STEP: 6, fw.REGISTER: True}, {})[0][fw.DRIFTED] == 1


def test_malicious_clients_permute_their_registration_vector_only():
    n = 30
    bad = fcl.malicious_clients(n, 0.2, seed=0)
    assert len(bad) == 6 and fcl.malicious_clients(n, 0.0, 0) == set()
    liar = min(bad)
    honest = min(set(range(n)) - bad)
    cfg = {P.STEP: 1, **FieldingParams().to_message(fw.PARAMS, fw.CLIENT_KEYS), fw.METRIC: "l1",
           fw.REGISTER: False}    # the label representation, eps-drift 0
    for cid, lies in ((liar, True), (honest, False)):
        client = _client("labels-small-large", cid, **{"fielding.malicious-fraction": 0.2})
        sent = np.array(fcl.report(client, cfg, {})[0][fw.REP])
        true = fcl.label_vector(client, cfg)
        assert np.allclose(np.sort(sent), np.sort(true))
        assert (not np.allclose(sent, true)) == lies
        # afterwards it keeps its true vector as r_last: no spurious drift report
        assert fcl.report(client, {**cfg, P.STEP: 2}, {})[0][fw.DRIFTED] == 0


def test_malicious_clients_do_not_stop_fielding_from_beating_the_global_model(tmp_path):
    acc = {}
    for name, strategy, frac in (("bad", "fielding", 0.3), ("global", "fedavg", 0.0)):
        _, rounds = _run(tmp_path, name, strategy=strategy, **{"fielding.malicious-fraction": frac,
                                                               "num-steps": 4, "rounds-per-step": 3})
        acc[name] = np.mean([r["accuracy"] for r in rounds[3:]])
    assert acc["bad"] > acc["global"]


def test_gradient_representation_sees_concept_drift_the_label_vector_does_not(tmp_path):
    sc = build_scenario("digits-concept-swap")
    swapped = {int(k) for k in np.flatnonzero(sc.concept_matrix()[-1] > 0)}
    drift = sc.drift_step
    common = {"scenario": "digits-concept-swap", "rounds-per-step": 1, "num-steps": drift + 1,
              "local-steps": 2, "fielding.n-init": 2, "fielding.probe-steps": 200}
    _, label = _run(tmp_path, "label", strategy="fielding", **common)
    _, grad = _run(tmp_path, "grad", strategy="fielding", **common,
                   **{"fielding.rep": "gradient", "fielding.distance": "sqeuclidean",
                      "fielding.eps-drift": 0.3})
    assert all(r["fielding_drifted"] == 0 for r in label[1:])
    assert grad[drift - 1]["fielding_drifted"] == len(swapped)
    assert all(grad[s - 1]["fielding_drifted"] == 0 for s in range(2, drift + 2) if s != drift)
    reported = {m[0] for m in grad[drift - 1].get("fielding_moved", [])}
    assert reported <= swapped


def test_embedding_representation_runs_and_rejects_nothing(tmp_path):
    summary, rounds = _run(tmp_path, "emb", strategy="fielding",
                           **{"fielding.rep": "embedding", "num-steps": 5,
                              "fielding.probe-steps": 50})
    assert summary["status"] == "completed" and summary["failures"] == 0
    assert rounds[0]["num_clusters"] >= 2


def test_auxo_reclusters_only_sampled_clients(tmp_path):
    summary, rounds = _run(tmp_path, "auxo", strategy="auxo", **{"rounds-per-step": 2,
                                                                 "auxo.split-threshold": 0.3})
    assert summary["status"] == "completed"
    assert rounds[-1]["auxo_splits"] >= 1 and max(r["num_clusters"] for r in rounds) >= 2
    assert all(r["trained_clients"] <= 10 for r in rounds)


class CrashingGrid(InProcessGrid):
    """The server 'dies' when it starts round 4 (after the drift at step 3 of 6)."""

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        if any(m.metadata.group_id == "4" for m in messages):
            raise RuntimeError("server crashed")
        return super().send_and_receive(messages, timeout=timeout)


def test_fielding_resumes_from_its_checkpoint(tmp_path):
    cfg = {**SL, "strategy": "fielding", "num-steps": 6, "checkpoint-every": 1}
    full = run_inprocess({**cfg, "out-dir": str(tmp_path / "full")})
    out = tmp_path / "crashed"
    with pytest.raises(RuntimeError, match="server crashed"):
        run_inprocess({**cfg, "out-dir": str(out)}, grid_cls=CrashingGrid)
    resumed = run_inprocess({**cfg, "out-dir": str(out), "resume-from": str(out)})
    assert resumed["status"] == "completed"
    strip = lambda rs: [(r["accuracy"], r["num_clusters"], r["ari"], r.get("fielding_moves"),  # noqa: E731
                         r.get("fielding_reclusters")) for r in rs]
    assert strip(load_run(out)[1]) == strip(load_run(Path(full["out_dir"]))[1])


def test_every_fielding_strategy_is_registered():
    for name in ("fielding", "fielding-tau0", "fielding-tauinf", "static-cfl", "auxo"):
        assert name in STRATEGIES


class LateGrid(InProcessGrid):
    """Client 29's node connects only after round 1 (it is discovered when round 2 starts)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.current = 0

    def get_node_ids(self):
        return [n for n, c in self.contexts.items()
                if self.current >= 1 or c.node_config["partition-id"] != 29]

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        for m in messages:
            if m.metadata.group_id.isdigit():
                self.current = max(self.current, int(m.metadata.group_id))
        return super().send_and_receive(messages, timeout=timeout)


@pytest.mark.parametrize("strategy", ["fielding", "static-cfl"])
def test_a_client_joining_later_goes_to_the_nearest_cluster(tmp_path, strategy):
    # 6 steps: the small drift comes at step 3, after client 29 joined at step 2
    cfg = {**SL, "strategy": strategy, "num-steps": 6, "min-nodes": 29, "node-wait-s": 0.0,
           "out-dir": str(tmp_path / strategy)}
    summary = run_inprocess(cfg, grid_cls=LateGrid)
    rounds = load_run(Path(summary["out_dir"]))[1]
    assert [r["evaluated_clients"] for r in rounds] == [29] + [30] * 5
    assert rounds[0]["ari"] == rounds[1]["ari"] == 1.0 and summary["failures"] == 0
    assert "fielding_recluster" not in rounds[1]          # joining is not a re-clustering
    if strategy == "fielding":
        assert [m[:2] for m in rounds[1]["fielding_moved"]] == [[29, None]]
