"""`fedcluster bench`: the scoring rule, ranks, the matrix, and a tiny matrix end to end."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from fedcluster_app.bench import matrix as M
from fedcluster_app.bench import report as R
from fedcluster_app.bench.scores import drift_steps, score_run
from tests.support import ROOT


def _records(current: dict[int, float], nxt: dict[int, float], rps: int, steps: int) -> list[dict]:
    """metrics.jsonl rows of a base-protocol run: ``current`` by round, ``nxt`` by step t
    (the score on step t+1 at the end of step t)."""
    rows = []
    for rnd in range(1, steps * rps + 1):
        t = (rnd - 1) // rps + 1
        r = {"round": rnd, "time_step": t, "accuracy_current": current[rnd], "num_clusters": 2,
             "assignments": {"0": 0, "1": 1}}
        if rnd == t * rps and t in nxt:
            r.update(accuracy_next=nxt[t], next_step=t + 1)
        rows.append(r)
    return rows


def test_drift_steps_are_the_steps_where_a_concept_changes():
    concepts = np.array([[0, 0], [0, 0], [1, 0], [1, 0], [0, 0]])
    assert drift_steps(concepts) == [3, 5]
    assert drift_steps(np.zeros((4, 3), dtype=int)) == []


def test_score_run_drop_recovery_and_the_scored_steps():
    # 4 steps of 3 rounds; a drift into step 3; step 4 (the last) is not scored
    concepts = np.array([[0, 0], [0, 0], [1, 0], [1, 0]])
    current = {1: .5, 2: .7, 3: .8, 4: .85, 5: .9, 6: .9, 7: .6, 8: .89, 9: .95,
               10: .1, 11: .1, 12: .1}
    nxt = {1: .8, 2: .4, 3: .9}
    s = score_run({"bytes_up": 10, "bytes_down": 20, "wall_time_s": 1.5},
                  _records(current, nxt, 3, 4), concepts, 3)
    assert s["acc_current"] == pytest.approx(np.mean([current[r] for r in range(1, 10)]))
    assert s["acc_next"] == pytest.approx(np.mean([.8, .4, .9]))
    assert s["acc_final"] == pytest.approx(.95)            # end of step T = 3, not round 12
    assert s["drift_events"] == [{"step": 3, "drop": pytest.approx(.5), "recovered": 2}]
    assert s["drop"] == pytest.approx(.5) and s["recover_rounds"] == 2
    assert s["not_recovered"] == 0
    assert s["clusters"] == 2 and s["bytes_up"] == 10
    assert s["series"]["round"] == list(range(1, 10))


def test_score_run_counts_a_drift_not_recovered_within_its_step():
    concepts = np.array([[0], [0], [1], [1]])
    current = {r: .9 for r in range(1, 7)} | {7: .3, 8: .5, 9: .8, 10: .9, 11: .9, 12: .9}
    s = score_run({}, _records(current, {1: .9, 2: .2, 3: .8}, 3, 4), concepts, 3)
    assert s["drift_events"][0]["recovered"] is None
    assert s["not_recovered"] == 1 and s["recover_rounds"] is None


def test_the_global_accuracy_is_the_familys_own_measure_else_the_balanced_sample():
    concepts = np.array([[0], [0], [1]])
    rows = _records({r: .9 for r in range(1, 7)}, {1: .8, 2: .3}, 2, 3)
    assert score_run({}, rows, concepts, 2)["acc_global_current"] is None   # none logged
    for r in rows:
        r["balanced_accuracy_current"] = r["round"] / 10
        if "next_step" in r:
            r["balanced_accuracy_next"] = r["round"] / 100
    s = score_run({}, rows, concepts, 2)
    assert s["acc_global_current"] == pytest.approx(np.mean([.1, .2, .3, .4]))   # steps 1, 2
    assert s["acc_global_next"] == pytest.approx(np.mean([.02, .04]))
    assert s["global_measures"] == {"current": "balanced_accuracy_current",
                                    "next": "balanced_accuracy_next"}
    assert s["series"]["global_next"] == {"2": .02, "3": .04}
    # FedCCFA's generalised accuracy (of the current step only) wins where it is logged
    for r in rows:
        r["generalized_accuracy"] = .5 if r["round"] % 2 else None
    s = score_run({}, rows, concepts, 2)
    assert s["acc_global_current"] == pytest.approx(.5)
    assert s["global_measures"] == {"current": "generalized_accuracy",
                                    "next": "balanced_accuracy_next"}


def test_score_run_needs_the_common_scoring_rule():
    rows = [{"round": 1, "time_step": 1, "accuracy": .9}]
    with pytest.raises(ValueError, match="ran without score-next-step"):
        score_run({}, rows, np.zeros((2, 1), dtype=int), 1)


def test_a_run_that_diverged_before_its_first_next_step_score_says_so():
    """With score-next-step on, missing next-step scores mean the run never got one (every
    evaluation failed once it diverged), not that the rule was off: the reason says which."""
    rows = [{"round": 1, "time_step": 1, "accuracy_current": .3}, {"round": 2, "time_step": 1}]
    summary = {"config": {"score-next-step": True}, "status": "degraded",
               "reason": "1 of 2 rounds had no usable evaluation reply"}
    with pytest.raises(ValueError) as err:
        score_run(summary, rows, np.zeros((2, 1), dtype=int), 1)
    assert str(err.value) == ("no scored round of the run recorded accuracy_next "
                              "(1 of 2 rounds had no usable evaluation reply)")


def test_matrix_names_are_checked_with_a_suggestion():
    with pytest.raises(ValueError, match=r"unknown shift 'consept'.*did you mean 'concept'"):
        M.check_names("shift", ["consept"], M.SHIFTS)
    scs = M.scenarios(("digits",), ("label", "mix"), ("sudden", "recurring"))
    # label skew is an axis of its own: sudden drift and no drift only
    assert [s.key for s in scs] == [
        "digits/mix/none/uniform", "digits/label/sudden/uniform", "digits/label/recurring/uniform",
        "digits/mix/sudden/uniform", "digits/mix/recurring/uniform",
        "digits/mix/none/dirichlet", "digits/label/sudden/dirichlet",
        "digits/mix/sudden/dirichlet"]
    assert scs[1].scenario == "digits-prior"
    assert scs[1].run_config()["dirichlet-alpha"] == float("inf")
    assert scs[-1].run_config()["dirichlet-alpha"] == 1.0
    assert M.BenchScenario("mixture", "concept", "sudden").scenario == "mixture-swap"


def test_every_matrix_scenario_is_in_the_catalogue():
    from fedcluster_app.core.data import scenario_names

    names = set(scenario_names())
    missing = {s.scenario for s in M.scenarios() if s.scenario not in names}
    assert not missing, missing


@pytest.fixture(scope="module")
def tiny_bench(tmp_path_factory):
    """A 2-scenario x 3-strategy x 1-seed matrix of very short runs, through the CLI."""
    from fedcluster_app.cli import main

    root = tmp_path_factory.mktemp("bench")
    argv = ["bench", "--datasets", "mixture", "--shifts", "concept", "--patterns", "sudden",
            "--priors", "uniform", "--strategies", "fedavg", "oracle", "feddrift", "--seeds", "0",
            "--runs-dir", str(root / "runs"), "--report", str(root / "doc" / "bench.md"),
            "--set", "num-steps=4", "--set", "rounds-per-step=2", "--set", "local-steps=5",
            "--lr-grid", "0.003", "0.1"]
    assert main(argv) == 0
    return root, argv


def test_bench_writes_the_leaderboard_data_and_plots(tiny_bench):
    root, _ = tiny_bench
    rows = R.read_rows(root / "doc" / "bench" / "runs.jsonl")
    assert {(r["scenario"], r["strategy"]) for r in rows} == {
        (sc, s) for sc in ("mixture/mix/none/uniform", "mixture/concept/sudden/uniform")
        for s in ("fedavg", "oracle", "feddrift")}
    assert all(r["status"] == "completed" for r in rows), rows
    drifted = {r["strategy"]: r for r in rows if r["scenario"] == "mixture/concept/sudden/uniform"}
    assert [e["step"] for e in drifted["fedavg"]["drift_events"]] == [3]
    # the Oracle knows the concepts: its clusters are the truth, FedAvg's one cluster is not
    assert drifted["oracle"]["ari"] > drifted["fedavg"]["ari"]
    assert all(r["drift_events"] == [] for r in rows if r["scenario"] == "mixture/mix/none/uniform")
    doc = (root / "doc" / "bench.md").read_text()
    assert "fedcluster bench --datasets mixture" in doc
    assert "## Leaderboard" in doc and "### mixture/concept/sudden/uniform" in doc
    # the Oracle is a reference beside the ranking: two strategies are ranked, too few for
    # Friedman, enough for the pairwise test
    board = doc.split("## Leaderboard", 1)[1].split("## References", 1)[0]
    assert "| fedavg |" in board and "| feddrift |" in board and "oracle" not in board
    assert "| oracle |" in doc.split("## References", 1)[1].split("## Statistics", 1)[0]
    # the global accuracy (a class-balanced test set) beside the personalised one
    assert all(0 <= r["acc_global_next"] <= 1 for r in rows)
    assert "acc global next step" in board and "**Global, next step**" in doc
    assert "### Convergence: rounds and time to a target" in doc
    assert "### Learning rates" in doc and "| fedavg | 0.1 (" in doc
    assert "the Friedman test needs at least 3 ranked strategies" in doc
    assert "0 of 1 pairs separated" in doc     # 2 scenarios: Wilcoxon p >= 0.5
    for png in ("accuracy-mixture.png", "clusters-mixture.png", "bytes.png",
                "assignments-mixture-concept-sudden-uniform.png",
                "confusion-mixture-concept-sudden-uniform.png"):
        assert (root / "doc" / "bench" / png).stat().st_size > 0, png
        assert f"bench/{png}" in doc


def test_bench_reuses_finished_runs(tiny_bench, capsys):
    from fedcluster_app.cli import main

    root, argv = tiny_bench
    row = next(r for r in R.read_rows(root / "doc" / "bench" / "runs.jsonl")
               if r["strategy"] == "oracle" and r["scenario"] == "mixture/concept/sudden/uniform")
    summary = (root / "runs" / "mixture" / "concept" / "sudden" / "uniform" / "oracle"
               / f"lr{row['lr']}" / "seed0" / "summary.json")
    before = summary.read_text()
    first = (root / "doc" / "bench" / "runs.jsonl").read_text()
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "bench: 6 runs: 6 finished before" in out     # the tuning runs
    assert "bench: 6 runs: 6 finished before" in out.split("tuning", 1)[1].split("\n", 2)[2]
    assert summary.read_text() == before
    assert (root / "doc" / "bench" / "runs.jsonl").read_text() == first


def test_the_dry_run_lists_the_scored_runs_at_the_rates_the_tuning_chose(tiny_bench, tmp_path,
                                                                       capsys):
    """Once the tuning has run, a dry run names the scored runs' directories at the tuned
    rates (those the bench fills), so finished runs are listed as finished; before, it says
    the tuning will choose."""
    from fedcluster_app.cli import main

    root, argv = tiny_bench
    tuned = {r["strategy"]: r["lr"] for r in R.read_rows(root / "doc" / "bench" / "runs.jsonl")}
    assert main([*argv, "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    scored = [line for line in lines if "(lr: tuned)" in line]
    assert len(scored) == 6 and all(line.endswith(": finished") for line in scored), lines
    for strategy, lr in tuned.items():
        assert any(f"/{strategy}/lr{lr}/seed0 (lr: tuned)" in line for line in scored), lines
    fresh = list(argv)
    fresh[fresh.index("--runs-dir") + 1] = str(tmp_path / "none")
    assert main([*fresh, "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert sum("(lr: chosen by the tuning, 6 of its runs still to run): to run" in line
               for line in lines) == 6, lines
    assert not (tmp_path / "none").exists()


def test_the_dry_run_tells_a_kept_failed_run_from_a_finished_one(tiny_bench, tmp_path, capsys):
    """A failed run is kept (not run again) unless --retry-failed: the dry run says so, and
    never lists it as finished."""
    import json
    import shutil

    from fedcluster_app.cli import main

    root, argv = tiny_bench
    runs = tmp_path / "runs"
    shutil.copytree(root / "runs", runs)
    summary = next(runs.glob("mixture/concept/sudden/uniform/fedavg/lr*/seed0/summary.json"))
    summary.write_text(json.dumps({**json.loads(summary.read_text()), "status": "failed"}))
    name = "/".join(summary.parent.relative_to(runs).parts)
    argv = list(argv)
    argv[argv.index("--runs-dir") + 1] = str(runs)

    def state(*extra: str) -> str:
        assert main([*argv, "--dry-run", *extra]) == 0
        return next(line for line in capsys.readouterr().out.splitlines()
                    if line.startswith(name + " ")).split("): ", 1)[1]

    assert state() == "failed (kept: --retry-failed runs it again)"
    assert state("--retry-failed") == "to run"


def test_a_run_stopped_midway_goes_on_from_its_checkpoint(tiny_bench, tmp_path, capsys):
    """A bench stopped in the middle of a run (its worker killed) loses at most the rounds
    since the run's last checkpoint: the next bench resumes the run, and the resumed run's
    records are those of the run never stopped."""
    import shutil
    import signal

    from fedcluster_app.cli import main
    from fedcluster_app.client_app import app as default_app
    from fedcluster_app.core import stopping
    from fedcluster_app.core.results import load_run
    from fedcluster_app.core.server.checkpoint import read_checkpoint
    from fedcluster_app.engine import run_inprocess

    root, argv = tiny_bench
    runs = tmp_path / "runs"
    shutil.copytree(root / "runs", runs)
    out = next(runs.glob("mixture/concept/sudden/uniform/fedavg/lr*/seed0"))
    untimed = lambda records: [{k: v for k, v in r.items() if k != "round_time_s"}
                               for r in records]
    whole = untimed(load_run(out)[1])
    config = read_checkpoint(out)[0]["config"]   # as run (the summary writes inf as null)

    def stops_in_round_2(msg, ctx):   # as a signal would: the round ends, with a checkpoint
        if msg.metadata.message_type.startswith("train") and msg.metadata.group_id == "2":
            stopping._State.requested = signal.SIGTERM
        return default_app(msg, ctx)

    try:
        with pytest.raises(stopping.Interrupted):
            run_inprocess({**config, "out-dir": str(out), "overwrite": True},
                          client_app=stops_in_round_2)
    finally:
        stopping._State.requested = None
    assert [r["round"] for r in load_run(out)[1]] == [1, 2]
    argv = list(argv)
    argv[argv.index("--runs-dir") + 1] = str(runs)
    name = "/".join(out.relative_to(runs).parts)
    assert main([*argv, "--dry-run"]) == 0
    assert f"{name} (lr: tuned): to run (goes on from its checkpoint)" in capsys.readouterr().out
    assert main(argv) == 0
    assert "1 to run" in capsys.readouterr().out
    got = untimed(load_run(out)[1])
    assert [r["round"] for r in got] == [r["round"] for r in whole]
    # rounds 1-2 ran here with the client app one client at a time, whose training loss sums
    # in another order than the batched bench's (the last digits); everything else is equal
    assert [r.pop("train_loss") for r in got] == pytest.approx([r.pop("train_loss")
                                                                for r in whole], rel=1e-7)
    assert got == whole


def test_rows_of_an_earlier_bench_stand_for_runs_whose_directories_are_gone(tiny_bench, capsys):
    from fedcluster_app.cli import main

    root, argv = tiny_bench
    first = R.read_rows(root / "doc" / "bench" / "runs.jsonl")
    assert all(r["protocol"]["rounds-per-step"] == 2 for r in first)
    out = root / "regrown"
    argv2 = list(argv) + ["--reuse-rows", str(root / "doc" / "bench" / "runs.jsonl")]
    argv2[argv2.index("--runs-dir") + 1] = str(out / "runs")
    argv2[argv2.index("--report") + 1] = str(out / "bench.md")
    assert main(argv2) == 0
    log = capsys.readouterr().out
    # the tuning rows beside the page's count as well: nothing runs again
    assert log.count("0 finished before, 6 from earlier rows, 0 cannot run, 0 to run") == 2
    assert not (out / "runs").exists()
    assert R.read_rows(out / "bench" / "runs.jsonl") == first


def test_an_earlier_failed_row_stands_until_retry_failed(tiny_bench, tmp_path, capsys):
    """A failed row of --reuse-rows is kept like a failed run directory: the bench does not
    run it again (a run that fails the same way every time would rerun at every render)
    unless --retry-failed says so."""
    import json

    from fedcluster_app.cli import main

    root, argv = tiny_bench
    rows = R.read_rows(root / "doc" / "bench" / "runs.jsonl")
    rows[0] = {**rows[0], "status": "failed", "reason": "no scored round recorded accuracy_next"}
    earlier = tmp_path / "runs.jsonl"
    earlier.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # the tuning's rows beside them, so that the rates are known and nothing else is to run
    (tmp_path / "tuning.jsonl").write_text((root / "doc" / "bench" / "tuning.jsonl").read_text())
    argv = list(argv) + ["--reuse-rows", str(earlier)]
    argv[argv.index("--runs-dir") + 1] = str(tmp_path / "none")
    name = f"{rows[0]['scenario']}/{rows[0]['strategy']}/"

    def states(*extra: str) -> list[str]:
        assert main([*argv, "--dry-run", *extra]) == 0
        return [line.split(" (lr: tuned): ", 1)[1] for line in capsys.readouterr().out.splitlines()
                if line.startswith(name) and f"/seed{rows[0]['seed']} " in line]

    assert states() == ["failed, from earlier rows (--retry-failed runs it again)"]
    assert states("--retry-failed") == ["to run"]
    assert not (tmp_path / "none").exists()


def test_an_earlier_row_counts_only_for_its_own_protocol():
    from fedcluster_app.bench.runner import reusable_rows

    sc = M.BenchScenario("mixture", "label", "sudden")
    protocol = tuple(sorted(M.PROTOCOL.items()))
    cell = M.Cell(sc, "fedavg", 0, protocol)
    row = {"scenario": sc.key, "strategy": "fedavg", "seed": 0, "status": "completed",
           "protocol": dict(protocol), "lr": M.PROTOCOL["lr"]}
    assert reusable_rows([row], [cell]) == {cell: row}
    # a run at another learning rate is another run
    assert reusable_rows([row], [M.Cell(sc, "fedavg", 0, protocol, lr=0.1)]) == {}
    longer = M.Cell(sc, "fedavg", 0, tuple(sorted({**M.PROTOCOL, "rounds-per-step": 6}.items())))
    assert reusable_rows([row], [longer]) == {}
    assert reusable_rows([{**row, "seed": 1}], [cell]) == {}
    # a failed row stands, as a failed run directory does (--retry-failed drops it first)
    failed = {**row, "status": "failed"}
    assert reusable_rows([failed], [cell]) == {cell: failed}
    assert reusable_rows([{**row, "status": "interrupted"}], [cell]) == {}
    # a row that does not say what it was run with stands for nothing
    assert reusable_rows([{k: v for k, v in row.items() if k != "protocol"}], [cell]) == {}


def test_bench_refuses_a_bad_protocol_before_running_anything(tmp_path, capsys):
    from fedcluster_app.cli import main

    code = main(["bench", "--quick", "--runs-dir", str(tmp_path / "r"),
                 "--set", "rounds-per-stepp=3"])
    assert code == 2
    assert "'rounds-per-stepp'" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_rows_round_trip(tmp_path):
    rows = [{"scenario": "a", "strategy": "x", "acc_next": 0.5, "series": {"round": [1]}}]
    R.write_rows(rows, tmp_path / "d" / "runs.jsonl")
    assert R.read_rows(tmp_path / "d" / "runs.jsonl") == rows
    assert json.loads((tmp_path / "d" / "runs.jsonl").read_text().splitlines()[0]) == rows[0]


def test_the_process_pool_runs_every_cell(tmp_path):
    from fedcluster_app.bench.runner import run_matrix

    protocol = tuple(sorted({**M.PROTOCOL, "num-steps": 3, "rounds-per-step": 1,
                             "local-steps": 2}.items()))
    sc = M.BenchScenario("mixture", "label", "sudden")
    cells = [M.Cell(sc, s, seed, protocol) for s in ("fedavg", "local") for seed in (0, 1)]
    logs: list[str] = []
    rows, ran = run_matrix(cells, tmp_path, workers=2, log=logs.append)
    assert [r["status"] for r in rows] == ["completed"] * 4, logs
    assert [(r["strategy"], r["seed"]) for r in rows] == [("fedavg", 0), ("fedavg", 1),
                                                          ("local", 0), ("local", 1)]
    assert ran == 4 and sum(line.startswith("[") for line in logs) == 4
    # a second call finds them finished and runs nothing
    again, ran = run_matrix(cells, tmp_path, workers=2, log=logs.append)
    assert ran == 0 and again == rows


def test_a_row_reports_the_global_accuracy_beside_the_personalised_one(tmp_path):
    from fedcluster_app.bench.runner import run_matrix

    protocol = tuple(sorted({**M.PROTOCOL, "num-steps": 3, "rounds-per-step": 1,
                             "local-steps": 2, "balanced-test": True}.items()))
    sc = M.BenchScenario("digits", "label", "sudden")
    cells = [M.Cell(sc, s, 0, protocol) for s in ("fedavg", "fedccfa")]
    rows, _ = run_matrix(cells, tmp_path, workers=1, log=lambda line: None)
    fedavg, fedccfa = rows
    for row in rows:
        assert row["status"] == "completed"
        assert 0 <= row["acc_global_current"] <= 1 and 0 <= row["acc_global_next"] <= 1
        assert row["global_measures"]["next"] == "balanced_accuracy_next"
    assert fedavg["global_measures"]["current"] == "balanced_accuracy_current"
    assert fedccfa["global_measures"]["current"] == "generalized_accuracy"


def test_a_strategy_that_refuses_a_scenario_is_listed_with_its_reason(tmp_path):
    protocol = tuple(sorted({**M.PROTOCOL, "num-steps": 1, "rounds-per-step": 1}.items()))
    sc = M.BenchScenario("mixture", "label", "sudden")
    refusing, running = (M.Cell(sc, s, 0, protocol) for s in ("feddrift", "fedavg"))
    why = M.cannot_run(refusing, refusing.run_config(1))
    assert "at least 2 time steps" in why
    assert M.cannot_run(running, running.run_config(1)) is None
    # in the tables: the row says why, the list at the end names it, it is never ranked
    rows = [{"scenario": sc.key, "data": "mixture", "shift": "label", "pattern": "sudden",
             "catalogue": sc.scenario, "strategy": "feddrift", "seed": 0,
             "status": "cannot run", "reason": why}]
    table = "\n".join(R.scenario_table({"feddrift": rows}, ["feddrift"]))
    assert "| feddrift | cannot run: " in table and "at least 2 time steps" in table
    assert "at least 2 time steps" in "\n".join(R.cannot_run_list(rows))
    assert R.leaderboard(rows) == [
        "Not ranked: no finished run has a value of 'acc_next_no_return'."]


def test_a_cell_scores_against_the_scenario_its_run_builds():
    # keys of the common protocol that move the drift (here drift-step) count when the bench
    # rebuilds the scenario to find the drifts and the number of concepts
    sc = M.BenchScenario("mixture", "mix", "sudden")
    late = M.Cell(sc, "fedavg", 0, tuple(sorted({**M.PROTOCOL, "drift-step": 5}.items())))
    default = M.Cell(sc, "fedavg", 0, tuple(sorted(M.PROTOCOL.items())))
    assert drift_steps(M.bench_scenario(default).concept_matrix()) == [3]
    assert drift_steps(M.bench_scenario(late).concept_matrix()) == [5]
    assert M.num_concepts(default) == 4          # original + the three kinds of shift
    assert M.num_concepts(M.Cell(M.BenchScenario("mixture", "mix", "none"), "fedavg", 0,
                                 default.protocol)) == 1


def test_concept_by_cluster_mass_comes_from_the_log_or_the_assignments():
    # a protocol that logs no mass (FedDrift's): counted from the last scored round's clusters
    # against that round's step's true concepts (round 4 of 2 per step is in step 2)
    row = {"concepts": [[0, 0, 0], [0, 0, 0], [0, 1, 1]], "rounds_per_step": 2,
           "series": {"round": [1, 2, 3, 4], "assignments": [[0, 0, 0]] * 3 + [[0, 2, None]],
                      "concept_cluster_mass": None}}
    assert R.concept_cluster_mass(row) == {"0": {"0": 1.0}, "1": {"2": 1.0}}
    logged = {"0": {"0": 0.7, "1": 0.3}}
    assert R.concept_cluster_mass({**row, "series": {**row["series"],
                                                     "concept_cluster_mass": logged}}) == logged
    # no clusters at all: nothing to draw
    unassigned = {**row, "series": {**row["series"], "assignments": [[None] * 3] * 4,
                                    "concept_cluster_mass": {"0": {}}}}
    assert R.concept_cluster_mass(unassigned) is None


def test_bench_writes_under_the_runs_directory_unless_a_report_is_named(tmp_path, monkeypatch):
    """Nothing a bench writes lands outside its runs directory unless --report names a page:
    run from a checkout, the default never touches the committed docs/benchmark/README.md."""
    from fedcluster_app.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["bench", "--datasets", "mixture", "--shifts", "label", "--patterns", "sudden",
                 "--priors", "uniform", "--skip-static", "--strategies", "fedavg", "--seeds", "0", "--set", "num-steps=3",
                 "--set", "rounds-per-step=1", "--set", "local-steps=2"]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["runs"]
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["bench"]
    page = tmp_path / "runs" / "bench" / "benchmark.md"
    assert "fedcluster bench --datasets mixture" in page.read_text()
    rows = R.read_rows(tmp_path / "runs" / "bench" / "benchmark" / "runs.jsonl")
    assert [(r["scenario"], r["status"]) for r in rows] == [
        ("mixture/label/sudden/uniform", "completed")]
    assert (tmp_path / "runs" / "bench" / "benchmark" / "bytes.png").stat().st_size > 0
    assert "## Reading" not in page.read_text()   # the hand-written reading is docs/'s own


def test_the_smoke_matrix_has_its_own_runs_directory_and_a_named_report_wins():
    from fedcluster_app.bench.command import output_paths
    from fedcluster_app.cli import _parser

    def paths(*argv: str) -> tuple[str, str]:
        return tuple(p.as_posix() for p in output_paths(_parser().parse_args(["bench", *argv])))

    assert paths() == ("runs/bench", "runs/bench/benchmark.md")
    # the quick runs are shorter: they must never stand for the full matrix's runs
    assert paths("--quick") == ("runs/bench-quick", "runs/bench-quick/benchmark.md")
    assert paths("--runs-dir", "/x/r") == ("/x/r", "/x/r/benchmark.md")
    assert paths("--report", "docs/benchmark/README.md") == ("runs/bench", "docs/benchmark/README.md")


def test_a_page_named_readme_keeps_its_rows_and_plots_beside_it():
    from pathlib import Path

    from fedcluster_app.bench.command import report_folder

    assert report_folder(Path("runs/bench/benchmark.md")) == Path("runs/bench/benchmark")
    assert report_folder(Path("docs/benchmark/README.md")) == Path("docs/benchmark")


def test_the_committed_page_names_its_own_path_in_its_regenerate_command():
    """docs/benchmark/README.md is rewritten only by a command that names it; the page says which."""
    page = (ROOT / "docs" / "benchmark" / "README.md").read_text()
    command = page.split("```bash\n", 1)[1].split("\n", 1)[0]
    assert command.startswith("fedcluster bench ") and "--report docs/benchmark/README.md" in command
    assert "--reuse-rows docs/benchmark/runs.jsonl" in command


def _stats_rows() -> list[dict]:
    """Four strategies and the Oracle on six scenarios of two shifts, three seeds each."""
    rng = np.random.default_rng(1)
    level = {"ifca": .9, "fedavg": .8, "cfl": .79, "fedem": .7, "oracle": .95}
    return [{"scenario": f"d/{shift}/p{b}", "data": "d", "shift": shift, "pattern": f"p{b}",
             "strategy": s, "seed": seed, "status": "completed",
             "acc_next": v + rng.normal(0, .01), "acc_current": v + rng.normal(0, .01)}
            for shift in ("label", "concept") for b in range(3) for s, v in level.items()
            for seed in range(3)]


def test_the_statistics_section_and_its_critical_difference_diagrams(tmp_path):
    rows = _stats_rows()
    paths = R.plot_critical_differences(rows, tmp_path)
    assert [p.name for p in paths] == ["cd-next-step.png", "cd-current-step.png"]
    assert all(p.stat().st_size > 0 for p in paths)
    text = "\n".join(R.statistics_section(rows, ["cd-next-step.png"]))
    assert "below the 5 seeds the protocol asks" in text
    assert "| all | 6 | 4 |" in text and "| label | 3 | 4 |" in text
    assert "![cd-next-step](cd-next-step.png)" in text
    assert "oracle" not in text                          # a reference is never tested
    board = "\n".join(R.leaderboard(rows))
    assert board.index("| ifca |") < board.index("| fedavg |") < board.index("| fedem |")
    assert "oracle" not in board
    refs = "\n".join(R.references_table(rows))
    assert "| oracle |" in refs and "6 / 6" in refs       # above every ranked one everywhere


def test_critical_difference_bars_join_the_strategies_no_test_tells_apart():
    assert R._cliques(np.array([1.0, 1.5, 3.0, 3.2]), 1.0) == [(0, 1), (2, 3)]
    assert R._cliques(np.array([1.0, 1.9, 2.5]), 1.0) == [(0, 1), (1, 2)]
    assert R._cliques(np.array([1.0, 3.0]), 1.0) == []


def test_each_method_runs_with_its_own_settings_and_a_bad_entry_is_refused_before_any_run():
    """The benchmark's methods table: FedCCFA's eps and align-start, FedRC's initialisation,
    Fielding's two representations reach their runs' configs, rows record them (so a row run
    with other settings is never reused), and an unknown method, key or value is refused by
    name before anything runs."""
    from fedcluster_app.bench import matrix as M
    from fedcluster_app.bench.runner import _row, reusable_rows

    sc = M.BenchScenario("mixture", "concept", "sudden")
    protocol = tuple(sorted(M.PROTOCOL.items()))
    ccfa = M.Cell(sc, "fedccfa", 0, protocol).config()
    assert ccfa["strategy"] == "fedccfa" and ccfa["fedccfa.eps"] == 0.05
    assert ccfa["fedccfa.align-start"] == M.PROTOCOL["rounds-per-step"]
    grad = M.Cell(sc, "fielding-gradient", 0, protocol).config()
    assert grad["strategy"] == "fielding" and grad["fielding.rep"] == "gradient"
    assert M.Cell(sc, "fedrc", 0, protocol).config()["init"] == "normal"
    assert "init" not in M.Cell(sc, "fedavg", 0, protocol).config()   # the shared recipe's
    assert all(m.source for m in M.METHODS.values())
    M.check_methods([*M.STRATEGIES, "fedprox"], M.PROTOCOL)   # any registered strategy too

    cell = M.Cell(sc, "fedccfa", 0, protocol)
    row = _row(cell, "completed", acc_next=0.5)
    assert row["settings"] == {"fedccfa.eps": 0.05,
                               "fedccfa.align-start": M.PROTOCOL["rounds-per-step"]}
    assert reusable_rows([row], [cell]) == {cell: row}
    old = {k: v for k, v in row.items() if k != "settings"}   # run before the table
    assert reusable_rows([old], [cell]) == {}

    with pytest.raises(ValueError, match="unknown method 'fieldng'.*did you mean 'fielding'"):
        M.check_methods(["fieldng"], M.PROTOCOL)
    for bad, message in (((("fedccfa.eps", -1.0),), "fedccfa.eps must be > 0"),
                         ((("fedccfa.epz", 1.0),), "unknown run-config key 'fedccfa.epz'"),
                         ((("init", "gaussian"),), "init")):
        M.METHODS["bad-entry"] = M.Method("fedccfa", bad, "a test")
        try:
            with pytest.raises(ValueError, match=rf"bench method 'bad-entry'.*{message}"):
                M.check_methods(["bad-entry"], M.PROTOCOL)
        finally:
            del M.METHODS["bad-entry"]


def test_a_row_states_the_recipe_and_the_steps_each_method_actually_took(fast_config):
    """metrics.jsonl's gradient_steps counts every optimizer step the accepted replies took
    (FlexCFL's pre-training and FedCCFA's extra phases included); a bench row states them
    with the resolved training settings."""
    from fedcluster_app.bench.runner import effective_recipe
    from fedcluster_app.core.results import load_run
    from fedcluster_app.engine import run_inprocess

    per_client_round = {}
    for strategy, extra in (("fedavg", {}), ("flexcfl", {}),
                            ("fedccfa", {"scenario": "digits-swap", "hidden": 16})):
        summary = run_inprocess(fast_config(strategy=strategy, num_steps=2,
                                            out_dir=fast_config()["out-dir"] + strategy, **extra))
        recipe = effective_recipe(*load_run(Path(summary["out_dir"])))
        assert recipe["local-steps"] == 5 and recipe["optimizer"] == "adam"
        per_client_round[strategy] = recipe["steps_per_client_round"]
    assert per_client_round["fedavg"] == 5.0                  # 5 local steps, every client
    assert per_client_round["flexcfl"] > 5.0                  # + its group cold start
    assert per_client_round["fedccfa"] > 5.0                  # + classifier phases


def test_the_learning_rate_is_tuned_per_data_set_on_a_seed_never_scored():
    """Every method's rate is the grid's best mean next-step accuracy over the tuning scenarios
    of its data set, on the validation seed; a failed run scores nothing, an equal mean goes
    to the smaller rate, a method whose every rate failed keeps the protocol's."""
    cells = M.tuning_cells(("mixture", "digits"), ("fedavg",), (), (0.01, 0.1))
    assert {c.seed for c in cells} == {M.VALIDATION_SEED}
    assert sorted((c.scenario.key, c.lr) for c in cells) == sorted(
        [("mixture/mix/sudden/uniform", 0.01), ("mixture/mix/sudden/uniform", 0.1),
         ("mixture/mix/sudden/dirichlet", 0.01), ("mixture/mix/sudden/dirichlet", 0.1),
         ("digits/mix/sudden/uniform", 0.01), ("digits/mix/sudden/uniform", 0.1),
         ("digits/mix/sudden/dirichlet", 0.01), ("digits/mix/sudden/dirichlet", 0.1)])
    assert all(c.scenario.prior == "uniform"
               for c in M.tuning_cells(("digits",), ("fedavg",), (), (0.1,), ("uniform",)))

    def row(data, strategy, lr, acc, status="completed"):
        return {"data": data, "strategy": strategy, "lr": lr, "acc_next": acc, "status": status}

    rows = [row("digits", "fedavg", 0.01, 0.6), row("digits", "fedavg", 0.01, 0.8),   # 0.7
            row("digits", "fedavg", 0.1, 0.9), row("digits", "fedavg", 0.1, None, "failed"),
            row("digits", "ifca", 0.01, 0.5), row("digits", "ifca", 0.1, 0.5),        # equal
            row("mixture", "fedavg", 0.01, None, "failed")]
    lrs = M.tuned_lrs(rows)
    assert lrs == {("digits", "fedavg"): 0.01, ("digits", "ifca"): 0.01}
    sc = M.BenchScenario("digits", "label", "sudden")
    tuned = M.with_tuned_lrs([M.Cell(sc, "fedavg", 0, (("lr", 0.03),)),
                              M.Cell(M.BenchScenario("mixture", "label", "sudden"), "fedavg", 0,
                                     (("lr", 0.03),))], lrs)
    assert [c.config()["lr"] for c in tuned] == [0.01, 0.03]
    assert tuned[0].name == "digits/label/sudden/uniform/fedavg/lr0.01/seed0"


def test_no_scored_seed_is_the_validation_seed_and_a_fixed_rate_is_not_tuned(tmp_path, capsys):
    from fedcluster_app.cli import main

    runs = ["--runs-dir", str(tmp_path / "r")]
    assert main(["bench", "--seeds", "0", str(M.VALIDATION_SEED), *runs]) == 2
    assert "validation seed" in capsys.readouterr().err
    assert main(["bench", "--set", "lr=0.05", "--lr-grid", "0.01", "0.1", *runs]) == 2
    assert "--lr-grid tunes the learning rate, which --set lr fixes" in capsys.readouterr().err
    assert main(["bench", "--tier", "scal", *runs]) == 2
    assert "did you mean 'scale'" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_the_matrix_leaves_out_what_repeats_another_scenario_and_a_skew_it_cannot_have():
    keys = {s.key for s in M.scenarios()}
    assert not any(k.startswith(("mixture/", "digits/")) and "/concept/incremental/" in k
                   for k in keys)
    assert "mixture/mix/none/dirichlet" in keys     # the mixture's priors can be skewed too
    assert "digits/feature/sudden/dirichlet" in keys
    assert "digits/feature/staggered/dirichlet" not in keys        # skew: sudden and none only
    scale = M.TIERS["scale"]
    assert dict(scale.protocol) == {"num-clients": 100, "fraction-train": 0.2}


def test_tune_only_chooses_the_rates_and_runs_no_scored_seed(tmp_path, capsys):
    from fedcluster_app.cli import main

    assert main(["bench", "--tune-only", "--datasets", "mixture", "--priors", "uniform",
                 "--strategies", "fedavg",
                 "--lr-grid", "0.001", "0.1", "--runs-dir", str(tmp_path / "r"),
                 "--report", str(tmp_path / "page" / "README.md"),
                 "--set", "num-steps=3", "--set", "rounds-per-step=2",
                 "--set", "local-steps=5"]) == 0
    out = capsys.readouterr().out
    rows = R.read_rows(tmp_path / "page" / "tuning.jsonl")
    assert sorted(r["lr"] for r in rows) == [0.001, 0.1]
    assert {r["seed"] for r in rows} == {M.VALIDATION_SEED}
    # SGD with momentum at 0.001 for 4 rounds barely moves: the larger rate is chosen
    assert M.tuned_lrs(rows) == {("mixture", "fedavg"): 0.1}
    assert "| fedavg | 0.1 (" in out
    assert not (tmp_path / "page" / "runs.jsonl").exists()
    assert sorted(p.name for p in (tmp_path / "r" / "mixture" / "mix" / "sudden" / "uniform"
                                   / "fedavg").iterdir()) == ["lr0.001", "lr0.1"]


def test_a_runs_directory_of_another_protocol_is_refused_not_scored(tiny_bench, capsys):
    """A finished run directory stands for its cell only with the cell's own run config: the
    runs directory of an earlier protocol is refused before anything runs or is rewritten."""
    from fedcluster_app.cli import main

    root, argv = tiny_bench
    before = sorted(p.stat().st_mtime_ns for p in (root / "runs").rglob("summary.json"))
    argv2 = [a if a != "local-steps=5" else "local-steps=6" for a in argv]
    assert main(argv2) == 2
    err = capsys.readouterr().err
    assert "holds a finished run of" in err and "local-steps = 5 there, 6 here" in err
    assert sorted(p.stat().st_mtime_ns for p in (root / "runs").rglob("summary.json")) == before


def test_a_finished_run_that_only_drew_its_plot_or_progress_still_counts(tiny_bench):
    """Settings that cannot change a run's numbers (QUIET_RUN: the progress bar, plot.png) do
    not make a finished run of another protocol: a runs directory made before bench runs
    stopped drawing plots is scored, not refused."""
    from fedcluster_app.bench.matrix import QUIET_RUN
    from fedcluster_app.bench.runner import RunsDirMismatch, _check_same_run

    root, _ = tiny_bench
    out = next((root / "runs").rglob("summary.json")).parent
    summary = json.loads((out / "summary.json").read_text())
    assert {k: summary["config"][k] for k in QUIET_RUN} == QUIET_RUN   # what bench runs set
    config = dict(summary["config"])
    drew = {**summary, "config": {**config, "plot": True, "progress": True}}
    _check_same_run(SimpleNamespace(name="cell"), config, drew, out)    # no refusal
    with pytest.raises(RunsDirMismatch, match="local-steps"):
        _check_same_run(SimpleNamespace(name="cell"), {**config, "local-steps": 99}, drew, out)


def _children(pid: int) -> set[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    kids = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.add(int(stat.parent.name))
    return kids


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
def test_sigterm_stops_the_bench_with_its_workers_and_the_same_command_goes_on(tmp_path):
    """SIGTERM to `fedcluster bench --workers 2` alone (a job scheduler's stop): exit 143 and
    its worker processes gone with it (they went on running the queue before), no row file
    written; the same command then finishes the matrix, running again what was stopped."""
    import os
    import signal
    import subprocess
    import sys
    import time

    runs = tmp_path / "runs"
    argv = ["bench", "--datasets", "mixture", "--shifts", "concept", "--patterns", "sudden",
            "--priors", "uniform", "--strategies", "fedavg", "local", "--seeds", "0", "--runs-dir", str(runs), "--report", str(tmp_path / "doc" / "bench.md"),
            "--set", "lr=0.1", "--set", "num-steps=3", "--set", "rounds-per-step=30",
            "--workers", "2"]
    proc = subprocess.Popen([sys.executable, "-m", "fedcluster_app.cli", *argv], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not list(runs.rglob("metrics.jsonl")):          # the workers are running runs
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-3000:]
        time.sleep(0.1)
    workers = _children(proc.pid)
    assert len(workers) >= 2
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err[-3000:]
    assert "bench: stopped by SIGTERM" in err and "Traceback" not in err
    deadline = time.monotonic() + 20
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in workers), "a worker outlived the bench"
    assert not (tmp_path / "doc" / "bench" / "runs.jsonl").exists()
    from fedcluster_app.cli import main

    assert main(argv) == 0
    rows = R.read_rows(tmp_path / "doc" / "bench" / "runs.jsonl")
    assert len(rows) == 2 * 2 and all(r["status"] == "completed" for r in rows)
