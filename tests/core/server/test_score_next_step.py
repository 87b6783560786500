"""The common scoring rule ``score-next-step``: every protocol logs ``accuracy_current`` (the
current step's test split, every evaluated round) and, at the end of step t, ``accuracy_next``
(step t+1's test split with the model of the end of step t, before anything adapts); nothing
else of a run changes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fedcluster_app.api import ConfigError, default_run_config, make_strategy
from fedcluster_app.core import codec
from fedcluster_app.core.experiment import load_experiment
from fedcluster_app.core.models import build_model, set_weights
from fedcluster_app.core.training import evaluate
from fedcluster_app.engine import InProcessGrid, run_inprocess
from tests.support import FAST

STEPS, R = 4, 2
# mixture-swap: 10 clients, half of them get a label permutation at step 3
SMALL = {**FAST, "seed": 0, "num-steps": STEPS, "rounds-per-step": R}
NEW_KEYS = {"accuracy_current", "client_accuracy_current", "accuracy_next",
            "client_accuracy_next", "next_step"}
VOLATILE = {"round_time_s", "wall_time_s", "out_dir", "config", "resolved_config", "started_at",
            "finished_at"}
# the plain rounds protocol, FedDrift's time-step protocol, FlexCFL's and FedCCFA's strategies
TIME_STEP = {"feddrift", "window", "aue", "kue", "driftsurf", "cfl"}
FAMILIES = ["fedavg", "ifca", "local", "fedrep", "fedem", "fedrc", "fedsoft", "cfl-rounds",
            "cfl", "feddrift", "window", "aue", "kue", "driftsurf", "flexcfl", "fedgroup",
            "fedccfa", "fielding"]

_RUNS: dict[tuple, tuple[list[dict], dict]] = {}


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("score_next_step")


def run(runs_dir: Path, strategy: str, on: bool = True, **extra) -> tuple[list[dict], dict]:
    """(metrics.jsonl records, summary) of one small run; each run once per module."""
    key = (strategy, on, tuple(sorted(extra.items())))
    if key not in _RUNS:
        out = runs_dir / f"{strategy}-{int(on)}-{len(_RUNS)}"
        cfg = {**SMALL, "strategy": strategy, "out-dir": str(out), **extra}
        if on:
            cfg["score-next-step"] = True
        summary = run_inprocess(cfg)
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        _RUNS[key] = records, summary
    return _RUNS[key]


def ends(records: list[dict]) -> dict[int, dict]:
    """step -> the record of its last round."""
    return {t: r for t in range(1, STEPS + 1) for r in records if r["round"] == t * R}


# ------------------------------------------------------------------ behaviour at a drift
@pytest.mark.parametrize("strategy", ["fedavg", "ifca"])
def test_the_next_step_score_sees_the_drift_before_the_method_reacts(runs_dir, strategy):
    end = ends(run(runs_dir, strategy)[0])
    # the drift is at step 3: the models of the end of step 2 fail on it
    assert end[2]["next_step"] == 3
    assert end[2]["accuracy_next"] < end[2]["accuracy_current"] - 0.2
    # no drift ahead of steps 1 and 3: the next step is as well predicted as the current one
    for t in (1, 3):
        assert end[t]["next_step"] == t + 1
        assert abs(end[t]["accuracy_next"] - end[t]["accuracy_current"]) < 0.06


@pytest.mark.parametrize("strategy", ["fedavg", "ifca", "window"])
def test_the_next_step_score_is_the_model_of_the_step_on_the_next_test_split(tmp_path, strategy):
    """A run stopped at the end of step 2 holds the models its clients are scored with: each
    evaluated here on its client's test split of step 3 gives ``client_accuracy_next``."""
    cfg = {**default_run_config(), **SMALL, "strategy": strategy, "score-next-step": True,
           "out-dir": str(tmp_path / "cut")}
    strategy_obj = make_strategy(strategy, run_config=cfg)
    result = strategy_obj.start(InProcessGrid(cfg, 10), num_rounds=2 * R)
    records = [json.loads(line) for line in
               (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]
    last = records[-1]
    assert last["round"] == 2 * R and last["next_step"] == 3
    exp = load_experiment(cfg)
    mine = {}
    for cid in range(exp.scenario.num_clients):
        mid = result.assignments[cid]
        model = build_model(exp.spec, 0)
        set_weights(model, codec.unpack_arrays(result.models[mid]))
        data = exp.scenario.step_data(cid, 3)
        mine[cid] = evaluate(model, data.x_test, data.y_test)[1]
    assert last["client_accuracy_next"] == pytest.approx(
        {str(c): a for c, a in mine.items()}, abs=1e-5)
    assert last["accuracy_next"] == pytest.approx(float(np.mean(list(mine.values()))), abs=1e-6)
    # the cut run is the full run's first two steps
    whole = {r["round"]: r for r in _full(tmp_path, strategy)}
    for r in records:
        assert r.get("accuracy_next") == whole[r["round"]].get("accuracy_next")
        assert r["accuracy_current"] == whole[r["round"]]["accuracy_current"]


def _full(tmp_path: Path, strategy: str) -> list[dict]:
    out = tmp_path / "full"
    run_inprocess({**SMALL, "strategy": strategy, "score-next-step": True, "out-dir": str(out)})
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


# ------------------------------------------------------------------ every family logs both keys
@pytest.mark.parametrize("strategy", FAMILIES)
def test_every_family_logs_both_keys(runs_dir, strategy):
    records, summary = run(runs_dir, strategy)
    assert summary["status"] == "completed"
    last_step = STEPS - 1 if strategy in TIME_STEP else STEPS   # time-step: the last is test-only
    assert len(records) == last_step * R
    for r in records:
        assert r.get("accuracy_current") is not None, (strategy, r["round"])
        assert 0.0 <= r["accuracy_current"] <= 1.0
        assert r["client_accuracy_current"]
        step_end = r["round"] % R == 0
        if step_end and r["time_step"] < STEPS:
            assert r["next_step"] == r["time_step"] + 1
            assert 0.0 <= r["accuracy_next"] <= 1.0
            assert set(r["client_accuracy_next"]) == set(r["client_accuracy_current"])
            assert r["accuracy_next"] == pytest.approx(
                float(np.mean(list(r["client_accuracy_next"].values()))), abs=1e-4)
        else:
            assert "accuracy_next" not in r and "next_step" not in r
        if strategy not in TIME_STEP:     # the plain rule: its accuracy is the current one
            assert r["accuracy_current"] == r["accuracy"]


# ------------------------------------------------------------------ the flag changes no other number
@pytest.mark.parametrize("strategy", ["feddrift", "aue", "kue", "driftsurf", "fedavg",
                                      "flexcfl", "fedccfa", "fedsoft"])
def test_the_flag_only_adds_keys(runs_dir, strategy):
    """Training, the paper's metrics (FedDrift's acc_include / acc_omit / accuracy once per
    step), the byte and model counts and the summary are those of the run without the flag."""
    on, summary_on = run(runs_dir, strategy, True)
    off, summary_off = run(runs_dir, strategy, False)
    assert len(on) == len(off)
    for a, b in zip(on, off):
        assert not NEW_KEYS & set(b)                       # off by default: none of the keys
        assert {k: v for k, v in a.items() if k not in NEW_KEYS | VOLATILE} == \
               {k: v for k, v in b.items() if k not in VOLATILE}
    strip = lambda s: {k: v for k, v in s.items() if k not in VOLATILE}   # noqa: E731
    assert strip(summary_on) == strip(summary_off)


def test_the_time_step_protocol_scores_the_current_step_within_a_step(runs_dir):
    records = run(runs_dir, "feddrift")[0]
    inner = [r for r in records if r["round"] % R]
    assert inner and all(r["accuracy"] is None and r["accuracy_current"] is not None
                         for r in inner)
    assert all("acc_include" not in r for r in inner)          # the paper's keys once per step
    for r in records[R - 1::R]:
        assert r["acc_include"] == r["accuracy"] is not None
    # the paper scores the next step's training batch, the rule its test split: other data
    assert any(r["accuracy"] != r["accuracy_next"] for r in records[R - 1::R])


def test_every_step_end_is_scored_whatever_eval_every_says(runs_dir):
    """eval-every = 3 with 2 rounds per step: the step ends 2 and 4 are evaluated too, with
    clients sampled apart (fraction-evaluate < 1), so the rounds both runs evaluate agree."""
    extra = {"eval-every": 3, "fraction-evaluate": 0.5, "fraction-train": 0.5}
    on = run(runs_dir, "fedavg", True, **extra)[0]
    off = run(runs_dir, "fedavg", False, **extra)[0]
    evaluated = [r["round"] for r in on if r["accuracy"] is not None]
    assert evaluated == [2, 3, 4, 6, 8]
    assert [r["round"] for r in off if r["accuracy"] is not None] == [3, 6, 8]
    for a, b in zip(on, off):
        assert a["assignments"] == b["assignments"] and a["bytes_up"] == b["bytes_up"]
        if b["accuracy"] is not None:
            assert a["accuracy"] == b["accuracy"]
            assert a["client_accuracy"] == b["client_accuracy"]
    assert [r["next_step"] for r in on if "next_step" in r] == [2, 3, 4]


def test_fedccfa_keeps_its_generalised_accuracy_of_the_current_step(tmp_path):
    """digits-ccfa has a test pool: the generalised accuracy is unchanged by the rule."""
    cfg = {"strategy": "fedccfa", "scenario": "digits-ccfa", "num-clients": 4, "num-steps": 3,
           "rounds-per-step": 1, "model": "mlp", "hidden": 16, "samples-per-step": 60,
           "test-samples": 30, "local-steps": 1, "fedccfa.align-start": 1,
           "progress": False, "plot": False}
    out = {}
    for on in (True, False):
        out[on] = tmp_path / str(on)
        run_inprocess({**cfg, "score-next-step": on, "out-dir": str(out[on])})
    on, off = ([json.loads(x) for x in (out[f] / "metrics.jsonl").read_text().splitlines()]
               for f in (True, False))
    assert [r["generalized_accuracy"] for r in on] == [r["generalized_accuracy"] for r in off]
    assert [r["accuracy"] for r in on] == [r["accuracy"] for r in off]
    assert [r.get("next_step") for r in on] == [2, 3, None]


def test_a_strategy_with_only_its_own_evaluate_step_is_refused():
    from fedcluster_app.families.feddrift.baselines import Window

    class OwnScore(Window):
        def evaluate_step(self, grid, tau):
            return self.protocol.evaluate_step(grid, tau)

    cfg = {**default_run_config(), **SMALL, "strategy": "window", "score-next-step": True}
    with pytest.raises(ConfigError, match="score-next-step.*step_eval_tasks"):
        OwnScore(load_experiment(cfg))
    OwnScore(load_experiment({**cfg, "score-next-step": False}))       # without the rule it runs as before
