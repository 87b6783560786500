"""summary.json says what a run was made with: the resolved config, the packages' versions, the
git commit, a fingerprint of the data spec and the final assignments; older summaries without
them still load, report and resume."""

from __future__ import annotations

import json
import subprocess
from importlib.metadata import version
from pathlib import Path

import pytest

from fedcluster_app.core.results import compare_runs, load_run
from fedcluster_app.core.results.provenance import SOURCE, git_commit
from fedcluster_app.engine import run_inprocess
from tests.support import FAST


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("prov") / "run"
    # samples-per-step and test-samples left at 0: the scenario's own 200 and 100
    cfg = {k: v for k, v in FAST.items() if k not in ("samples-per-step", "test-samples")}
    return out, run_inprocess({**cfg, "out-dir": str(out)})


def test_the_summary_holds_the_resolved_config_not_the_placeholders(run):
    _, summary = run
    config, resolved = summary["config"], summary["resolved_config"]
    assert config["samples-per-step"] == 0 and resolved["samples-per-step"] == 200
    assert config["test-samples"] == 0 and resolved["test-samples"] == 100
    assert (config["num-clients"], config["num-steps"]) == (0, 0)
    assert (resolved["num-clients"], resolved["num-steps"]) == (10, 6)
    assert (resolved["model"], resolved["hidden"], resolved["num-classes"]) == ("mlp", 32, 4)
    assert resolved["data-seed"] == 0 and resolved["drift-step"] == 3
    assert resolved["out-dir"] == summary["out_dir"]
    # every other key as the run was configured
    assert {k: v for k, v in resolved.items() if config.get(k) == v} == {
        k: v for k, v in config.items() if resolved[k] == v}
    assert set(resolved) == set(config)


def test_a_scenarios_paper_protocol_is_in_the_resolved_config(tmp_path):
    """circle2's protocol sets rounds-per-step and local-steps: the resolved values say so."""
    from fedcluster_app.core.data.catalogue import scenario_protocol
    from fedcluster_app.core.experiment import load_experiment, resolved_config

    exp = load_experiment({"scenario": "circle2", "strategy": "fedavg"})
    resolved = resolved_config(exp)
    for key, value in scenario_protocol("circle2").items():
        assert resolved[key] == value, key


def test_versions_commit_and_assignments(run):
    out, summary = run
    assert summary["versions"] == {"fedcluster": version("fedcluster"), "flwr": "1.41.0",
                                   "torch": version("torch"), "numpy": version("numpy"),
                                   "python": summary["versions"]["python"]}
    records = load_run(out)[1]
    assert summary["assignments_final"] == records[-1]["assignments"]
    assert set(summary["assignments_final"]) == {str(c) for c in range(10)}
    head = subprocess.run(["git", "-C", str(SOURCE), "rev-parse", "HEAD"], capture_output=True,
                          text=True)
    if head.returncode == 0 and Path(subprocess.run(
            ["git", "-C", str(SOURCE), "rev-parse", "--show-toplevel"], capture_output=True,
            text=True).stdout.strip()).resolve() == SOURCE:
        assert summary["git"]["commit"] == head.stdout.strip()
        assert isinstance(summary["git"]["dirty"], bool)
    else:   # an installed copy: no commit to name
        assert summary["git"] is None


def test_no_commit_outside_a_checkout_or_below_another_projects_root(tmp_path):
    assert git_commit(tmp_path) is None                       # not a repository
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "vendor").mkdir()
    assert git_commit(tmp_path / "vendor") is None            # inside someone else's tree


def test_the_data_fingerprint_follows_the_data_spec_only(fast_config):
    from fedcluster_app.core.experiment import data_fingerprint, load_experiment

    def fingerprint(**overrides):
        return data_fingerprint(load_experiment(fast_config(**overrides)).scenario)

    base = fingerprint()
    assert base == fingerprint(lr=0.5, strategy="fedavg")         # training, not data
    assert base != fingerprint(data_seed=7)
    assert base != fingerprint(samples_per_step=60)
    assert base != fingerprint(scenario="mixture-prior")
    assert len(base) == 64 and int(base, 16) >= 0


def test_an_older_summary_without_the_new_fields_still_loads_and_reports(run, tmp_path):
    out, summary = run
    old = tmp_path / "old"
    old.mkdir()
    (old / "metrics.jsonl").write_text((out / "metrics.jsonl").read_text())
    stripped = {k: v for k, v in summary.items() if k not in (
        "resolved_config", "versions", "git", "data_fingerprint", "assignments_final")}
    (old / "summary.json").write_text(json.dumps(stripped))
    assert load_run(old)[0] == stripped
    assert "| old |" in compare_runs([old, out])


@pytest.mark.parametrize("strategy, extra, rule", [
    ("fedavg", {}, "current step"),
    ("feddrift", {}, "next step"),
    ("flexcfl", {"flexcfl.eval-model": "last_received"}, "current step, model last received"),
])
def test_the_summary_names_the_protocol_and_what_its_accuracy_measures(fast_config, strategy,
                                                                       extra, rule):
    summary = run_inprocess(fast_config(strategy=strategy, **extra))
    assert summary["accuracy_rule"] == rule
    assert summary["round_protocol"] == {"fedavg": "rounds", "feddrift": "time-step",
                                         "flexcfl": "flexcfl-selection"}[strategy]
