"""The bench's statistics: intervals, ranks with ties within noise, Friedman and Nemenyi,
Wilcoxon with Holm, the references beside the ranking, the return of an old concept."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from fedcluster_app.bench import stats as S
from fedcluster_app.bench.scores import return_scores, return_steps


def _rows(values: dict[str, dict[str, list[float]]], key: str = "acc_next",
          shift: str = "concept", pattern: str = "sudden") -> list[dict]:
    """Finished rows: scenario -> strategy -> one value per seed (both scores the same)."""
    return [{"scenario": sc, "strategy": s, "seed": i, "status": "completed", "shift": shift,
             "pattern": pattern, "acc_next": v, "acc_current": v, key: v}
            for sc, by in values.items() for s, vs in by.items() for i, v in enumerate(vs)]


def test_the_interval_is_the_t_interval_over_seeds():
    # mean 0.9, sd 0.1, n 3: t(0.975, 2) = 4.302653 -> half-width 4.302653 * 0.1 / sqrt(3)
    mean, half, n = S.interval([0.8, 0.9, 1.0])
    assert (mean, n) == (pytest.approx(0.9), 3)
    assert half == pytest.approx(0.248414, abs=1e-6)
    assert S.interval([0.7, None, float("nan")]) == (pytest.approx(0.7), None, 1)  # no interval
    rows = _rows({"b": {"x": [0.8, 0.9, 1.0], "y": [0.5]}})
    cells = S.cell_stats(S.seed_values(rows, "acc_next"))
    assert cells.loc[("b", "x"), "half"] == pytest.approx(0.248414, abs=1e-6)
    assert math.isnan(cells.loc[("b", "y"), "half"]) and cells.loc[("b", "y"), "n"] == 1


def test_equal_means_share_their_places_and_a_run_that_did_not_finish_is_not_ranked():
    rows = _rows({"a": {"x": [.9], "y": [.9], "z": [.5]}})
    rows.append({"scenario": "a", "strategy": "w", "seed": 0, "status": "cannot run",
                 "acc_next": None, "acc_current": None})
    r = S.ranking(rows, "acc_next")
    assert r.ranks.loc["a"].to_dict() == {"x": 1.5, "y": 1.5, "z": 3.0}
    assert r.strategies == ["x", "y", "z"]          # w has no finished run


def test_means_within_one_standard_error_of_the_group_best_tie():
    # every sd 0.02, 3 seeds: the noise of a difference is 0.02 * sqrt(2/3) = 0.0163
    near = {"x": [.90, .92, .94], "y": [.89, .91, .93], "z": [.88, .90, .92], "u": [.50, .52, .54]}
    r = S.ranking(_rows({"a": near}), "acc_next")
    # y is 0.01 below x: a tie; z is 0.02 below the group's best (x): a group of its own, even
    # though it is within noise of y
    assert r.ranks.loc["a"].to_dict() == {"x": 1.5, "y": 1.5, "z": 3.0, "u": 4.0}
    apart = {"x": [.90, .92, .94], "y": [.86, .88, .90], "u": [.50, .52, .54]}
    assert S.ranking(_rows({"a": apart}), "acc_next").ranks.loc["a"].to_dict() == {
        "x": 1.0, "y": 2.0, "u": 3.0}
    # one seed: no noise estimate, so only equal means tie
    assert S.ranking(_rows({"a": {"x": [.92], "y": [.91]}}), "acc_next").ranks.loc["a"].to_dict() \
        == {"x": 1.0, "y": 2.0}


def test_average_rank_and_mean_gap_to_the_best():
    rows = _rows({"a": {"x": [.9], "y": [.8], "z": [.7]}, "b": {"x": [.6], "y": [.7], "z": [.5]}})
    s = S.summary(S.ranking(rows, "acc_next"))
    assert s.loc["x", "avg_rank"] == 1.5 and s.loc["y", "avg_rank"] == 1.5
    assert s.loc["z", "avg_rank"] == 3.0
    assert s.loc["x", "gap"] == pytest.approx(5.0)           # (0 + 10 points) / 2
    assert s.loc["z", "gap"] == pytest.approx(20.0)          # (20 + 20) / 2
    assert s.loc["x", "top"] == 1 and s.loc["y", "top"] == 1


def test_friedman_on_the_ranks_is_scipys_on_the_scores():
    rng = np.random.default_rng(3)
    data = rng.uniform(0.5, 1.0, size=(8, 5))
    data[2, 1] = data[2, 3]                               # an exact tie: scipy's correction
    rows = _rows({f"b{i}": {f"s{j}": [data[i, j]] for j in range(5)} for i in range(8)})
    f = S.friedman(S.ranking(rows, "acc_next"))
    expected = sps.friedmanchisquare(*data.T)
    assert f.statistic == pytest.approx(expected.statistic)
    assert f.p == pytest.approx(expected.pvalue)
    assert (f.k, f.n) == (5, 8)


def test_friedman_per_group_of_scenarios_and_its_refusals():
    rows = (_rows({f"c{i}": {"x": [.9 + .01 * i], "y": [.8], "z": [.7]} for i in range(4)},
                  shift="concept")
            + _rows({f"l{i}": {"x": [.7 + .01 * i], "y": [.8], "z": [.9]} for i in range(3)},
                    shift="label")
            + _rows({"n0": {"x": [.5], "y": [.6], "z": [.4]}}, shift="mix", pattern="none"))
    r = S.ranking(rows, "acc_next")
    assert S.groups(r) == ["label", "concept", S.NO_DRIFT]
    assert S.friedman(r, "concept").n == 4
    assert S.friedman(r, "concept").avg_ranks.to_dict() == {"x": 1.0, "y": 2.0, "z": 3.0}
    assert S.friedman(r, "label").avg_ranks.index[0] == "z"
    with pytest.raises(ValueError, match="at least 2 blocks"):
        S.friedman(r, S.NO_DRIFT)
    two = S.ranking(_rows({"a": {"x": [.9], "y": [.8]}, "b": {"x": [.7], "y": [.6]}}), "acc_next")
    with pytest.raises(ValueError, match="at least 3 ranked strategies"):
        S.friedman(two)


def test_nemenyi_critical_difference_is_demsars():
    # Demšar (2006), Table 5(a), alpha = 0.05
    for k, q in [(2, 1.960), (3, 2.343), (4, 2.569), (10, 3.164)]:
        assert S.q_alpha(k) == pytest.approx(q, abs=1e-3)
    # his example: 4 classifiers over 14 data sets, CD = 2.569 * sqrt(4*5 / (6*14)) = 1.25
    assert S.nemenyi_cd(4, 14) == pytest.approx(1.25, abs=5e-3)


def test_holm_adjusts_in_steps_and_keeps_the_order():
    # sorted: 0.005*4 = 0.02, 0.01*3 = 0.03, 0.03*2 = 0.06, 0.04*1 = 0.04 -> 0.06 (monotone)
    assert S.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # capped at 1, and a later step never below an earlier one
    assert S.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert S.holm([0.02, 0.01]) == pytest.approx([0.02, 0.02])


def _paired_rows(blocks: int = 12) -> list[dict]:
    """a is 5 points above b in every block; c equals b; d is the best and a reference name."""
    rng = np.random.default_rng(0)
    base = rng.uniform(0.6, 0.8, size=blocks)
    return _rows({f"b{i}": {"a": [base[i] + .05], "b": [base[i]], "c": [base[i]],
                            "oracle": [base[i] + .1]} for i in range(blocks)})


def test_beats_needs_a_significant_paired_difference():
    rows = _paired_rows()
    won, p, n = S.beats(rows, "a", "b")
    # exact Wilcoxon, 12 positive differences: 2 / 2**12; Holm over the 3 pairs
    assert won and n == 12 and p == pytest.approx(3 * 2 / 2 ** 12)
    assert S.beats(rows, "b", "a")[0] is False
    assert S.beats(rows, "b", "c") == (False, 1.0, 12)
    # too few blocks to tell even a difference in every one of them
    assert S.beats(_paired_rows(3), "a", "b")[0] is False


def test_pairwise_reports_every_pair_with_its_shift():
    t = S.pairwise(S.ranking(_paired_rows(), "acc_next"))
    assert len(t) == 3 and set(map(tuple, t[["a", "b"]].to_numpy())) == {
        ("a", "b"), ("a", "c"), ("b", "c")}
    ab = t[(t["a"] == "a") & (t["b"] == "b")].iloc[0]
    assert ab["shift"] == pytest.approx(5.0) and ab["a_better"] == 12 and ab["winner"] == "a"
    assert t[(t["a"] == "b") & (t["b"] == "c")].iloc[0]["winner"] is None


def test_the_references_are_beside_the_ranking_not_in_it():
    rows = _paired_rows()
    r = S.ranking(rows, "acc_next")
    assert r.references == ["oracle"] and "oracle" not in r.strategies
    assert "oracle" not in r.ranks.columns and S.friedman(r).k == 3
    assert S.summary(r).loc["a", "avg_rank"] == 1.0       # first, though the Oracle is above
    ref = S.references(r).loc["oracle"]
    assert ref["gap"] == pytest.approx(-5.0) and ref["above"] == 12 == ref["blocks"]
    with pytest.raises(ValueError, match="'oracle' is a reference"):
        S.beats(rows, "oracle", "a")
    # any strategy of the rows may be named a reference
    assert S.ranking(rows, "acc_next", references=["oracle", "c"]).strategies == ["a", "b"]


def test_bad_input_is_refused_with_what_is_wrong():
    with pytest.raises(ValueError, match=r"at least two strategies.*the rows have fedavg"):
        S.ranking(_rows({"a": {"fedavg": [.9], "oracle": [.95]}}), "acc_next")
    with pytest.raises(ValueError, match=r"unknown reference 'oracel'.*did you mean 'oracle'"):
        S.ranking(_paired_rows(), "acc_next", references=["oracel"])
    with pytest.raises(ValueError, match=r"unknown strategy 'bb'.*did you mean 'b'"):
        S.beats(_paired_rows(), "a", "bb")
    with pytest.raises(ValueError, match="no finished run has a value of 'acc_nxt'"):
        S.ranking(_paired_rows(), "acc_nxt")


def test_a_duplicate_scenario_counts_once_and_an_incomplete_one_is_left_out():
    rows = _rows({"a": {"x": [.9], "y": [.8]}, "b": {"x": [.7], "y": [.6]},
                  "a-again": {"x": [.9], "y": [.8]}, "c": {"x": [.5]}})
    r = S.ranking(rows, "acc_next")
    assert r.left_out == {"a-again": "repeats a", "c": "no finished run of y"}
    assert list(r.ranks.index) == ["a", "b"]
    assert S.pairwise(r).iloc[0]["blocks"] == 2          # the duplicate counted once
    assert r.all_ranks.loc["a-again"].to_dict() == {"x": 1.0, "y": 2.0}   # still shown


RECURRING = [[0, 0, 0], [0, 0, 0], [1, 1, 0], [1, 1, 0], [0, 0, 0], [0, 0, 0]]


def test_a_return_is_a_drift_back_to_a_concept_the_clients_held_before():
    assert return_steps(np.array(RECURRING)) == [5]
    sudden = [[0, 0], [0, 0], [1, 0], [1, 0]]
    assert return_steps(np.array(sudden)) == []
    # one client returns while another drifts for the first time: not a return
    staggered = [[0, 0], [0, 0], [1, 0], [1, 0], [0, 1], [0, 1]]
    assert return_steps(np.array(staggered)) == []


def test_a_return_is_scored_apart_from_the_next_step_average():
    # scored steps 1-5 of 2 rounds; the next-step score of step t is keyed by t + 1
    row = {"status": "completed", "concepts": RECURRING, "rounds_per_step": 2, "acc_next": .8,
           "series": {"round": list(range(1, 11)), "accuracy_current": [.9] * 8 + [.7, .95],
                      "accuracy_next": {"2": .9, "3": .5, "4": .9, "5": .7, "6": .9}}}
    s = return_scores(row)
    assert s["acc_next_no_return"] == pytest.approx(np.mean([.9, .5, .9, .9]))
    assert s["acc_at_return"] == pytest.approx(.7)
    assert s["acc_return_first_round"] == pytest.approx(.7)   # round 9: step 5's first
    flat = {**row, "concepts": [[0, 0]] * 6}
    assert return_scores(flat) == {"acc_next_no_return": .8, "acc_at_return": None,
                                   "acc_return_first_round": None}
    assert S.with_event_scores([row])[0][S.HEADLINE] == s["acc_next_no_return"]


def test_the_priors_table_sets_label_skew_beside_drift():
    """The scenarios run under both priors, compared prior by prior: under label skew Local
    leads on the clients' own splits and trails on the class-balanced set."""
    from fedcluster_app.bench import report as R

    rows = []
    for prior, local_own, local_global in (("uniform", .70, .70), ("dirichlet", .95, .60)):
        for i in range(4):
            for strategy, own, glob in (("a", .80, .80), ("b", .75, .75),
                                        ("local", local_own, local_global)):
                for seed in range(2):
                    v = own + .01 * i + .002 * seed
                    rows.append({"scenario": f"d/concept/p{i}/{prior}", "data": "d",
                                 "shift": "concept", "pattern": f"p{i}", "prior": prior,
                                 "strategy": strategy, "seed": seed, "status": "completed",
                                 "acc_next_no_return": v, "acc_current": v,
                                 "acc_global_next": glob + .01 * i + .002 * seed})
    # a scenario under one prior only is not compared
    rows += [{**r, "scenario": "d/label/p0/uniform", "shift": "label"} for r in rows[:6]]
    lines = R.prior_section(rows)
    assert lines[0].startswith("The 4 scenarios run under every class prior (uniform, dirichlet")
    header, _, *body = lines[2:]
    assert header.split(" | ")[1:] == ["uniform, next step: acc; gap",
                                       "uniform, global, next step: acc; gap",
                                       "dirichlet, next step: acc; gap",
                                       "dirichlet, global, next step: acc; gap |"]
    table = {line.split(" | ")[0].strip("| "): line.split(" | ")[1:] for line in body}
    assert list(table) == ["a", "b", "local"]
    gaps = {name: [float(c.split("; ")[1].strip(" |")) for c in cells]
            for name, cells in table.items()}
    assert gaps["a"] == [0.0, 0.0, 0.0, 0.0] and gaps["b"] == pytest.approx([5.0] * 4)
    # Local: 10 points behind under uniform priors; 15 ahead on its own split under label skew,
    # 20 behind on the balanced set
    assert gaps["local"] == pytest.approx([10.0, 10.0, -15.0, 20.0])
    assert R.prior_section([r for r in rows if r["prior"] == "uniform"]) == [
        "No scenario of these rows runs under more than one class prior."]


def test_the_learning_rates_table_tells_a_refused_method_from_one_whose_rates_failed():
    from fedcluster_app.bench import report as R

    def row(strategy, lr, status, acc=None):
        return {"data": "mixture", "strategy": strategy, "lr": lr, "status": status,
                "acc_next": acc, "reason": None}

    rows = [row("ifca", 0.1, "completed", 0.8), row("ifca", 0.3, "completed", 0.9),
            row("feddrift", 0.1, "cannot run"), row("feddrift", 0.3, "cannot run"),
            row("fedem", 0.1, "failed"), row("fedem", 0.3, "failed")]
    table = "\n".join(R.learning_rates_table(rows))
    assert "| ifca | 0.3 (0.900) |" in table
    assert "| feddrift | cannot run |" in table
    assert "| fedem | every rate failed |" in table
