"""Scenarios carry their papers' protocols; presets run documented experiments in one command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedcluster_app.cli import main
from fedcluster_app.core.config import default_run_config, merge_overrides
from fedcluster_app.core.data.catalogue import scenario_names, scenario_protocol
from fedcluster_app.core.experiment import load_experiment
from fedcluster_app.core.config import list_presets, preset_file
from fedcluster_app.engine import run_inprocess


def _exp(**overrides):
    return load_experiment(merge_overrides(default_run_config(), overrides), server=True)


def test_a_papers_scenario_runs_its_protocol_where_the_user_left_the_defaults():
    exp = _exp(strategy="feddrift", scenario="circle2")
    assert (exp.cfg.rounds_per_step, exp.cfg.train.local_steps) == (100, 50)   # R, K
    assert exp.cfg.train.weight_decay == 0.001 and exp.cfg.num_clusters == 2
    assert dict(exp.protocol)["rounds-per-step"] == 100
    assert _exp(scenario="sea4").cfg.num_clusters == 4

    mine = _exp(scenario="circle2", **{"rounds-per-step": 3, "weight-decay": 0.01})
    assert (mine.cfg.rounds_per_step, mine.cfg.train.weight_decay) == (3, 0.01)   # the user wins
    assert mine.cfg.train.local_steps == 50                                       # the rest stays

    plain = _exp(scenario="circle2", protocol="none")
    defaults = default_run_config()
    assert plain.protocol == () and plain.cfg.rounds_per_step == defaults["rounds-per-step"]
    assert _exp(scenario="mixture-swap").protocol == ()        # no paper, no protocol


@pytest.mark.parametrize("name", [n for n in scenario_names() if scenario_protocol(n)])
def test_every_declared_protocol_is_valid_run_config(name):
    protocol = scenario_protocol(name)
    assert set(protocol) <= set(default_run_config()), name
    exp = _exp(scenario=name)
    raw = exp.cfg.raw
    assert all(raw[k] == v for k, v in protocol.items()), name


def test_the_protocol_reaches_the_clients_and_the_summary(tmp_path):
    summary = run_inprocess({"strategy": "fedavg", "scenario": "labels-small-large",
                             "out-dir": str(tmp_path / "run"),
                             "progress": False, "plot": False})
    assert summary["status"] == "completed" and summary["failures"] == 0
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())["config"]
    assert (saved["optimizer"], saved["lr"], saved["batch-size"]) == ("sgd", 0.3, 20)


@pytest.mark.parametrize("name", [n for n, _ in list_presets()])
def test_every_preset_is_a_valid_experiment(name):
    import tomllib

    values = tomllib.loads(preset_file(name).read_text())
    exp = load_experiment(merge_overrides(default_run_config(), values), server=True)
    assert exp.scenario.name == values["scenario"]
    assert dict(list_presets())[name], f"preset {name} needs a leading comment saying what it is"


def test_list_presets_and_protocols_and_bad_presets(tmp_path, capsys):
    assert main(["list", "presets"]) == 0
    out = capsys.readouterr().out
    assert "feddrift-circle2" in out and "fedrc-shifts3" in out
    assert main(["list", "protocols"]) == 0
    assert "rounds-per-step=100, local-steps=50" in capsys.readouterr().out
    assert main(["run", "--preset", "feddrift-circle", "--out", str(tmp_path / "x")]) == 2
    assert "did you mean 'feddrift-circle2'?" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text("lr = = 1\n")
    assert main(["run", "--run-config", str(bad), "--out", str(tmp_path / "y")]) == 2
    assert f"{bad}: not valid TOML" in capsys.readouterr().err
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_a_preset_runs_with_flags_winning_over_it(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "--preset", "fielding-small-large", "--strategy", "fedavg",
                 "--set", "plot=false", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["strategy"] == "fedavg" and summary["scenario"] == "labels-small-large"
    assert Path(summary["out_dir"]) == out.resolve()
