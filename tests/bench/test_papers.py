"""`fedcluster bench --tier papers`: each paper's preset combined with every method, the papers'
metrics, and a tiny run of two papers end to end."""

from __future__ import annotations

import numpy as np
import pytest

from fedcluster_app.bench import matrix as M
from fedcluster_app.bench import papers as P
from fedcluster_app.bench import report as R


def test_a_preset_combined_with_another_method_keeps_the_protocol_and_drops_other_keys():
    fedrc = P.preset_config("fedrc-shifts3")
    avg = P.combine(P.PAPERS["fedrc"], "fedavg")
    # the paper's data, protocol and recipe hold for every method ...
    for key in ("scenario", "rounds-per-step", "num-clusters", "init", "optimizer", "lr",
                "momentum", "local-epochs", "batch-size", "drop-last"):
        assert avg[key] == fedrc[key], key
    assert avg["strategy"] == "fedavg"
    # ... FeSEM's settings (a table fedavg does not read) are dropped, not passed on to be ignored
    assert not [k for k in avg if k.startswith("fesem.")]

    drift = P.PAPERS["feddrift"]
    assert "feddrift.delta" not in P.combine(drift, "fedavg")
    assert P.combine(drift, "feddrift")["feddrift.delta"] == 0.10
    cfl = P.combine(drift, "cfl")   # FedDrift's CFL reads the baselines' table, not FedDrift's
    assert "feddrift.delta" not in cfl and cfl["feddrift-baselines.driftsurf-delta"] == 0.05
    assert all(P.combine(drift, m)["score-next-step"] is True for m in ("fedavg", "feddrift"))

    # the paper's own settings of its algorithm win over the benchmark's (align-start there is
    # the headline's rounds per step); a method's setting the preset leaves alone still holds
    ccfa = P.combine(P.PAPERS["fedccfa"], "fedccfa")
    assert ccfa["fedccfa.align-start"] == 6 and ccfa["fedccfa.eps"] == 0.05
    assert dict(M.METHODS["fedccfa"].settings)["fedccfa.align-start"] != 6
    grad = P.combine(P.PAPERS["fielding"], "fielding-gradient")
    assert grad["fielding.rep"] == "gradient" and grad["fielding.participants"] == 9
    assert "fielding.participants" not in P.combine(P.PAPERS["fielding"], "ifca")
    assert P.combine(P.PAPERS["fielding"], "oracle")["oracle.warm-start"] is True

    # the paper's participation for the methods outside its family; its own selection for it
    flex = P.PAPERS["flexcfl"]
    assert P.combine(flex, "fedavg")["fraction-train"] == 0.2
    own = P.combine(flex, "flexcfl")
    assert "fraction-train" not in own and own["flexcfl.pretrain-scale"] == 4
    assert "fedgroup.pretrain-scale" not in own

    # --set: every method, a table's key only where the strategy reads it; a table key no
    # chosen method reads would be ignored: refused
    assert P.combine(drift, "fedavg", {"feddrift.delta": 0.2, "lr": 0.1})["lr"] == 0.1
    assert "feddrift.delta" not in P.combine(drift, "fedavg", {"feddrift.delta": 0.2})
    with pytest.raises(ValueError, match="feddrift.delta: read only by .*feddrift"):
        P.plan(["feddrift"], ["fedavg"], [0], {"feddrift.delta": 0.2})


def test_every_method_on_every_paper_is_a_valid_run_config_and_duplicates_run_once():
    plan = P.plan(seeds=[0, 1])          # checks every combined config, runs nothing
    assert plan.papers == list(P.PAPERS) and plan.methods == list(M.STRATEGIES)
    assert {c.paper for c in plan.cells} == set(P.PAPERS)
    assert len(plan.cells) == 2 * (len(P.PAPERS) * len(M.STRATEGIES) - len(plan.same_as))
    # every paper's metrics are read against quotes with a source, on metrics it has
    for entry in P.PAPERS.values():
        keys = {m.key for m in entry.metrics}
        assert entry.references and all(r.source and r.metric in keys for r in entry.references)
    # Fielding's preset names no representation: both of its rows run
    assert ("fielding", "fielding") not in plan.same_as


def test_an_unknown_paper_is_refused_with_a_suggestion(tmp_path, capsys):
    from fedcluster_app.cli import main

    with pytest.raises(ValueError, match="unknown paper 'feddrfit'.*did you mean 'feddrift'"):
        P.paper("feddrfit")
    runs = tmp_path / "r"
    assert main(["bench", "--tier", "papers", "--papers", "fedrcc", "--runs-dir", str(runs)]) == 2
    assert "unknown paper 'fedrcc'" in capsys.readouterr().err
    assert main(["bench", "--tier", "paper", "--runs-dir", str(runs)]) == 2
    assert "did you mean 'papers'" in capsys.readouterr().err
    # an option of the matrix would be ignored on a paper's protocol
    assert main(["bench", "--tier", "papers", "--datasets", "digits",
                 "--runs-dir", str(runs)]) == 2
    assert "--datasets" in capsys.readouterr().err
    assert not runs.exists()


def test_feddrifts_accuracy_omits_the_pairs_whose_concept_changes():
    concepts = np.array([[0, 0], [0, 1], [0, 1]])      # client 1 drifts into step 2
    records = [{"round": 1, "next_step": 2, "client_accuracy_next": {"0": 0.9, "1": 0.1}},
               {"round": 2, "next_step": 3, "client_accuracy_next": {"0": 0.8, "1": 0.7}},
               {"round": 3}]
    omit = P.next_step_pairs(omit_drift=True)({}, records, concepts)
    include = P.next_step_pairs(omit_drift=False)({}, records, concepts)
    assert omit == pytest.approx((0.9 + 0.8 + 0.7) / 3)
    assert include == pytest.approx((0.9 + 0.1 + 0.8 + 0.7) / 4)
    # FlexCFL's scores leave out the round-robin rounds
    rounds = [{"round": r, "weighted_accuracy": 1.0 if r <= 5 else r / 100} for r in range(1, 21)]
    assert P.after_round_robin("max")({}, rounds, None) == pytest.approx(0.20)
    assert P.after_round_robin("last10")({}, rounds, None) == pytest.approx(0.155)


def test_fedccfas_protocol_gives_every_method_its_generalised_measure():
    """FedCCFA's generalised accuracy is its family's own; every method on its protocol is also
    scored on a class-balanced sample of its clients' concepts, read from the last round."""
    entry = P.PAPERS["fedccfa"]
    for method in M.STRATEGIES:
        config = P.combine(entry, method)
        assert config["balanced-test"] is True and config["score-next-step"] is True
    metric = next(m for m in entry.metrics if m.key == "final_balanced_accuracy")
    records = [{"round": 1, "balanced_accuracy_current": 0.5},
               {"round": 2, "balanced_accuracy_current": 0.7}, {"round": 3}]
    assert metric.compute({}, records, None) == pytest.approx(0.7)
    assert metric.compute({}, [{"round": 1}], None) is None


@pytest.fixture(scope="module")
def tiny_papers(tmp_path_factory):
    """FedRC's and FedDrift's protocols, shortened to 2 rounds a step, through the CLI."""
    from fedcluster_app.cli import main

    root = tmp_path_factory.mktemp("papers")
    argv = ["bench", "--tier", "papers", "--papers", "fedrc", "feddrift",
            "--strategies", "fedavg", "fedrc", "feddrift", "--seeds", "0", "1",
            "--set", "rounds-per-step=2", "--set", "local-steps=5",
            "--runs-dir", str(root / "runs"), "--report", str(root / "doc" / "papers.md")]
    assert main(argv) == 0
    return root


def test_a_tiny_paper_run_is_scored_by_the_papers_metric_with_its_numbers_beside(tiny_papers):
    rows = R.read_rows(tiny_papers / "doc" / "papers" / "runs.jsonl")
    by = {(r["paper"], r["strategy"], r["seed"]): r for r in rows}
    assert len(by) == 12
    for seed in (0, 1):
        for method in ("fedavg", "fedrc"):
            fedrc = by[("fedrc", method, seed)]
            assert fedrc["status"] == "completed"
            assert 0 <= fedrc["final_global_accuracy"] <= 1      # the held-out clients'
            assert fedrc["config"]["scenario"] == "shifts-3"
            assert fedrc["config"]["rounds-per-step"] == 2 and fedrc["rounds"] == 2
        for method in ("fedavg", "feddrift"):
            drift = by[("feddrift", method, seed)]
            assert drift["status"] == "completed"
            assert drift["acc_omit"] >= drift["acc_include"] - 0.2
            assert drift["config"]["scenario"] == "circle2"
        # FedDrift's protocol needs time steps: it cannot run on FedRC's single step
        assert by[("fedrc", "feddrift", seed)]["status"] == "cannot run"
        assert "at least 2 time steps" in by[("fedrc", "feddrift", seed)]["reason"]

    page = (tiny_papers / "doc" / "papers.md").read_text()
    assert "fedcluster bench --tier papers --papers fedrc feddrift" in page
    fedrc = page.split("## FedRC", 1)[1]
    line = next(x for x in fedrc.splitlines() if x.startswith("| fedrc |"))
    assert "0.593 ± 0.115" in line                              # the docs' number beside ours
    assert "docs/fedrc/README.md" in fedrc
    drift = page.split("## FedDrift", 1)[1].split("## FedRC", 1)[0]
    line = next(x for x in drift.splitlines() if x.startswith("| feddrift |"))
    assert "97.82 ± 0.19" in line and "the paper's Table 2" in drift
    assert "| feddrift | cannot run: " in fedrc
    assert "Compute:" in drift


def test_a_finished_paper_run_is_not_run_again(tiny_papers, capsys):
    from fedcluster_app.cli import main

    argv = ["bench", "--tier", "papers", "--papers", "fedrc", "--strategies", "fedavg",
            "--seeds", "0", "--set", "rounds-per-step=2", "--set", "local-steps=5",
            "--runs-dir", str(tiny_papers / "runs"), "--report",
            str(tiny_papers / "again" / "papers.md")]
    assert main(argv) == 0
    assert "1 finished before" in capsys.readouterr().out


def test_an_earlier_pages_rows_stand_for_runs_the_runs_directory_lacks(tiny_papers, tmp_path,
                                                                      capsys):
    """A page grows by a paper without running the others again: the committed rows of the
    same paper, method, seed and run config are taken as they are; another config is run."""
    from fedcluster_app.cli import main

    earlier = tiny_papers / "doc" / "papers" / "runs.jsonl"
    common = ["bench", "--tier", "papers", "--papers", "fedrc", "feddrift", "--strategies",
              "fedavg", "fedrc", "feddrift", "--seeds", "0", "1", "--set", "local-steps=5",
              "--runs-dir", str(tmp_path / "empty"), "--reuse-rows", str(earlier)]
    assert main(common + ["--set", "rounds-per-step=2",
                          "--report", str(tmp_path / "doc" / "papers.md")]) == 0
    out = capsys.readouterr().out
    assert "10 from earlier rows, 2 cannot run, 0 to run" in out
    assert R.read_rows(tmp_path / "doc" / "papers" / "runs.jsonl") == R.read_rows(earlier)
    assert not (tmp_path / "empty").exists() or not any((tmp_path / "empty").rglob("summary.json"))
    # another protocol is another run: none of the rows stands for it
    assert main(common + ["--set", "rounds-per-step=3", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "from earlier rows" not in out and "fedrc/fedavg/seed0: to run" in out


def test_render_only_writes_the_page_of_what_has_finished_and_runs_nothing(tiny_papers,
                                                                          tmp_path, capsys):
    """A long bench's page while it goes on (or its rows kept to go on from later): the
    finished runs scored, the others listed as not run yet, and not one run started."""
    from fedcluster_app.cli import main

    argv = ["bench", "--tier", "papers", "--papers", "fedrc", "--strategies", "fedavg",
            "fedrc", "--seeds", "0", "1", "2", "--set", "rounds-per-step=2",
            "--set", "local-steps=5", "--runs-dir", str(tiny_papers / "runs"), "--render-only",
            "--report", str(tmp_path / "doc" / "papers.md")]
    before = sorted((tiny_papers / "runs").rglob("*"))
    assert main(argv) == 0
    assert "4 finished before, 0 cannot run, 2 not run yet (--render-only)" in \
        capsys.readouterr().out
    assert sorted((tiny_papers / "runs").rglob("*")) == before        # nothing ran
    rows = R.read_rows(tmp_path / "doc" / "papers" / "runs.jsonl")
    assert sorted((r["strategy"], r["seed"], r["status"]) for r in rows if r["seed"] == 2) == [
        ("fedavg", 2, "not run yet"), ("fedrc", 2, "not run yet")]
    page = (tmp_path / "doc" / "papers.md").read_text()
    assert "**2 runs are not run yet**" in page
    line = next(x for x in page.splitlines() if x.startswith("| fedrc |"))
    assert "| 2 (1 not run yet) |" in line
    # the matrix's rates come from its tuning: a page of part of it is refused
    assert main(["bench", "--datasets", "digits", "--render-only",
                 "--runs-dir", str(tmp_path / "m")]) == 2
    assert "--render-only writes the page of --tier papers" in capsys.readouterr().err


def test_the_dry_run_lists_the_runs_which_cannot_run_and_the_cost(tmp_path, capsys):
    from fedcluster_app.cli import main

    runs = tmp_path / "r"
    assert main(["bench", "--tier", "papers", "--papers", "fedrc", "--strategies", "fedavg",
                 "feddrift", "--seeds", "0", "1", "--runs-dir", str(runs), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "fedrc/fedavg/seed1: to run" in out
    assert "fedrc/feddrift/seed0: cannot run: feddrift needs at least 2 time steps" in out
    # the estimate counts the 2 runs that can run, at the CPU seconds measured for fedavg
    minutes = 2 * P.PAPERS["fedrc"].measured_cpu_s / 60
    assert "papers: fedrc: 2 runs to run; one fedavg run took" in out and f"{minutes:.0f} min" in out
    assert not runs.exists()
