"""``balanced-test = true``: the common scoring rule's models are also scored on each client's
class-balanced test sample (``balanced_accuracy_current`` every evaluated round,
``balanced_accuracy_next`` at the end of every step but the last), by every family's client;
nothing else of a run changes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from flwr.app import RecordDict

from fedcluster_app.api import ConfigError, default_run_config
from fedcluster_app.core import wire as P
from fedcluster_app.core.client.stream_client import StreamClient
from fedcluster_app.core.experiment import load_experiment
from fedcluster_app.core.models import build_model, get_weights
from fedcluster_app.engine import run_inprocess
from tests.support import FAST, FEDCCFA_TINY

STEPS, R = 3, 2
SMALL = {**FAST, "seed": 0, "num-steps": STEPS, "rounds-per-step": R, "drift-step": 2,
         "score-next-step": True}
KEYS = {"balanced_accuracy_current", "client_balanced_accuracy_current",
        "balanced_accuracy_next", "client_balanced_accuracy_next"}


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def constant_model(exp, label: int) -> list[np.ndarray]:
    """Weights of the scenario's model that predict ``label`` for every input: the last layer's
    weights zero, its bias one-hot."""
    weights = [w.copy() for w in get_weights(build_model(exp.spec, 0))]
    weights[-2][:] = 0.0
    weights[-1][:] = 0.0
    weights[-1][label] = 10.0
    return weights


@pytest.mark.parametrize("scenario", ["mixture-swap", "digits-permute"])
def test_a_model_that_predicts_one_class_scores_one_over_the_classes(scenario):
    cfg = {**default_run_config(), **SMALL, "scenario": scenario, "balanced-test": True}
    exp = load_experiment(cfg)
    c = exp.scenario.num_classes
    for cid, step in ((0, 1), (0, STEPS), (exp.scenario.num_clients - 1, 2)):
        client = StreamClient(cid, exp, RecordDict())
        config = {P.STEP: step, P.ROUND: 1, P.BALANCED_TEST: True}
        for label in (0, c - 1):
            weights = constant_model(exp, label)
            _, _, metrics = client.evaluate(weights, config)
            assert metrics[P.BALANCED_ACCURACY] == pytest.approx(1.0 / c)
            # its own test split follows its class prior: the same model scores that share
            y = exp.scenario.step_data(cid, step).y_test
            assert metrics[P.ACCURACY] == pytest.approx(np.mean(y == label))
            _, _, mixed = client.evaluate_mixture([weights, weights], [0.3, 0.7], config)
            assert mixed[P.BALANCED_ACCURACY] == pytest.approx(1.0 / c)
        # not asked (or asked on the training batch): no balanced score
        assert P.BALANCED_ACCURACY not in client.evaluate(weights, {P.STEP: step})[2]
        assert P.BALANCED_ACCURACY not in client.evaluate(
            weights, {**config, P.TEST_SPLIT: "train"})[2]


def test_the_run_logs_the_balanced_scores_and_nothing_else_changes(tmp_path):
    on = records(Path(run_inprocess({**SMALL, "strategy": "fedavg", "balanced-test": True,
                                     "out-dir": str(tmp_path / "on")})["out_dir"]))
    off = records(Path(run_inprocess({**SMALL, "strategy": "fedavg",
                                      "out-dir": str(tmp_path / "off")})["out_dir"]))
    assert len(on) == STEPS * R
    for a, b in zip(on, off):
        assert 0 <= a["balanced_accuracy_current"] <= 1
        assert set(a["client_balanced_accuracy_current"]) == set(a["client_accuracy_current"])
        assert a["balanced_accuracy_current"] == pytest.approx(
            np.mean(list(a["client_balanced_accuracy_current"].values())), abs=1e-5)
        if a["round"] % R == 0 and a["time_step"] < STEPS:
            assert a["next_step"] == a["time_step"] + 1
            assert a["balanced_accuracy_next"] == pytest.approx(
                np.mean(list(a["client_balanced_accuracy_next"].values())), abs=1e-5)
        else:
            assert "balanced_accuracy_next" not in a
        assert not KEYS & set(b)
        volatile = {"round_time_s"} | KEYS
        assert {k: v for k, v in a.items() if k not in volatile} == \
            {k: v for k, v in b.items() if k not in volatile}
    # the drift at step 2 shows in the balanced next-step score too (a label permutation)
    end1 = on[R - 1]
    assert end1["balanced_accuracy_next"] < end1["balanced_accuracy_current"] - 0.2


@pytest.mark.parametrize("strategy", ["fedccfa", "fedrep", "fedbabu", "flash"])
def test_the_fedccfa_family_scores_its_own_models_on_the_balanced_sample(tmp_path, strategy):
    """Their clients evaluate with their own handler (personal classifier, FedBABU's
    fine-tuning, Flash's model): it reports the balanced accuracy as every other does."""
    cfg = {**FEDCCFA_TINY, "strategy": strategy, "out-dir": str(tmp_path / "run"),
           "score-next-step": True, "balanced-test": True}
    recs = records(Path(run_inprocess(cfg)["out_dir"]))
    assert all(0 <= r["balanced_accuracy_current"] <= 1 for r in recs)
    assert recs[R - 1]["next_step"] == 2 and 0 <= recs[R - 1]["balanced_accuracy_next"] <= 1
    # digits: the generalised accuracy (the whole test pool) is near the balanced sample's
    last = recs[-1]
    assert abs(last["generalized_accuracy"] - last["balanced_accuracy_current"]) < 0.2


def test_feddrifts_ensembles_report_it_too(tmp_path):
    recs = records(Path(run_inprocess({**SMALL, "strategy": "aue", "balanced-test": True,
                                       "out-dir": str(tmp_path / "aue")})["out_dir"]))
    assert all(r.get("balanced_accuracy_current") is not None for r in recs)
    assert any(r.get("balanced_accuracy_next") is not None for r in recs)


def test_a_setting_it_would_ignore_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="set score-next-step = true"):
        load_experiment({**default_run_config(), **FAST, "balanced-test": True})
    with pytest.raises(ConfigError, match="stagger3 draws its data from decision rules"):
        load_experiment({**default_run_config(), **FAST, "scenario": "stagger3",
                         "score-next-step": True, "balanced-test": True})
