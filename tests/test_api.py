"""The public API: strategies by name with keyword hyper-parameters, as Flower strategies in a
ServerApp that is not fedcluster's own (examples/own_server_app)."""

from __future__ import annotations

import importlib
import json
import sys

import numpy as np
import pytest
from flwr.app import ArrayRecord, Context, MetricRecord

from fedcluster_app import api
from fedcluster_app.api import ConfigError, make_strategy
from fedcluster_app.core import codec
from fedcluster_app.engine import InProcessGrid
from tests.support import FAST, ROOT


def test_make_strategy_configures_by_keyword():
    s = make_strategy("feddrift", delta=0.04, subsample=500, scenario="sea4", seed=3)
    assert isinstance(s, api.FedDrift) and isinstance(s, api.ClusteredStrategy)
    assert (s.params.delta, s.params.subsample, s.params.loss) == (0.04, 500, "error")
    assert s.exp.scenario.name == "sea4" and s.cfg.seed == 3
    assert s.protocol.name == "time-step" and s.num_rounds == 10 * s.cfg.rounds_per_step
    fielding = make_strategy("fielding", k_max=4, **{"eps-drift": 0.1})   # either spelling
    assert (fielding.params.k_max, fielding.params.eps_drift) == (4, 0.1)
    ifca = make_strategy("ifca", num_clusters=3, run_config={"scenario": "mixture-prior"})
    assert ifca.cfg.num_clusters == 3 and ifca.exp.scenario.name == "mixture-prior"


def test_a_field_whose_key_is_not_its_name_takes_either():
    # FedSoft's proximal coefficient: field ``lam``, run-config key ``lambda`` (a Python keyword)
    assert make_strategy("fedsoft", lam=0.5).params.lam == 0.5
    assert make_strategy("fedsoft", **{"lambda": 0.25}).params.lam == 0.25
    with pytest.raises(ConfigError, match=r"fedsoft\.lambda must be >= 0, got -1"):
        make_strategy("fedsoft", lam=-1)
    with pytest.raises(ConfigError, match=r"'lamb' \(did you mean 'lam'\?\)"):
        make_strategy("fedsoft", lamb=0.5)


def test_a_keyword_of_a_table_the_strategy_does_not_read_is_refused():
    with pytest.raises(ConfigError, match=r"feddrift\.delta is read only by feddrift, .*; this "
                                          r"run's strategy ifca would ignore it"):
        make_strategy("ifca", **{"feddrift.delta": 0.2})
    assert make_strategy("feddrift", **{"feddrift.delta": 0.2}).params.delta == 0.2


def test_every_strategy_class_is_importable_by_name():
    for name, cls in api.STRATEGIES.items():
        assert getattr(api, cls.__name__) is cls and cls.__name__ in api.__all__
        assert cls.description and cls.name == name
    assert {"FedAvg", "IFCA", "Oracle", "FedDrift", "Fielding", "FlexCFL", "FedRC",
            "FedCCFA"} <= set(api.__all__)


@pytest.mark.parametrize("call, message", [
    (lambda: make_strategy("feddirft"), "unknown strategy 'feddirft' (did you mean 'feddrift'?); "
                                        "valid strategies: adaptive-fedavg"),
    (lambda: make_strategy("feddrift", dleta=0.1), "unknown keyword 'dleta' (did you mean "
                                                   "'delta'?)"),
    (lambda: make_strategy("feddrift", delta="big"), "feddrift.delta must be of type float, got "
                                                     "'big'"),
    (lambda: make_strategy("feddrift", delta=1.5), "feddrift.delta must be in (0, 1], got 1.5"),
    (lambda: make_strategy("feddrift", loss="hinge"), "feddrift.loss must be one of 'error', "
                                                      "'cross-entropy', got 'hinge'"),
    (lambda: make_strategy("fielding", k_min=1),
     "fielding.k-min must be an integer in [2, 1000], got 1"),
    (lambda: make_strategy("ifca", num_clusters=0), "num-clusters must be an integer in [1, 1000]"),
    (lambda: make_strategy("fedavg", delta=0.1), "unknown keyword 'delta'"),
])
def test_bad_names_and_keywords_are_named_before_anything_runs(call, message):
    with pytest.raises(ConfigError) as err:
        call()
    assert message in str(err.value)


def test_start_is_flowers_strategy_start(tmp_path):
    """start(grid, initial_arrays, num_rounds, timeout, train_config, evaluate_config,
    evaluate_fn) -> Result, with the clustered models and assignments."""
    cfg = {**FAST, "out-dir": str(tmp_path / "run")}
    s = make_strategy("ifca", run_config=cfg, num_clusters=2)
    grid = InProcessGrid({**api.default_run_config(), **cfg, "strategy": "ifca"}, 10)
    w0 = s.initial_weights()
    seen = []

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        seen.append(server_round)
        return MetricRecord({"norm": float(sum(np.abs(a.numpy()).sum() for a in arrays.values()))})

    result = s.start(grid, initial_arrays=codec.pack_arrays([a + 1.0 for a in w0]), num_rounds=4,
                     train_config={"lr": 0.05}, evaluate_fn=evaluate_fn)
    assert sorted(result.train_metrics_clientapp) == [1, 2, 3, 4]   # stopped after 4 of 12
    assert result.summary["rounds"] == 4 and result.summary["status"] == "completed"
    assert sorted(result.models) == [0, 1] and set(result.assignments.values()) <= {0, 1}
    assert len(result.arrays) == 4 and 0 < result.evaluate_metrics_clientapp[4]["accuracy"] <= 1
    assert sorted(set(seen)) == [1, 2, 3, 4]                     # every cluster in use, each round
    in_use = {m for m in result.assignments.values()}
    assert set(result.evaluate_metrics_serverapp[4]) == {f"model{m}.norm" for m in in_use}
    with pytest.raises(ConfigError, match="initial_arrays have shapes"):
        make_strategy("ifca", run_config=cfg).start(grid, initial_arrays=codec.pack_arrays([w0[0]]))
    with pytest.raises(ConfigError, match="num_rounds must be in 1..12"):
        make_strategy("ifca", run_config=cfg).start(grid, num_rounds=13)


def test_initial_arrays_replace_the_common_initialisation(tmp_path):
    cfg = {**FAST, "out-dir": str(tmp_path / "run")}
    s = make_strategy("fedavg", run_config=cfg)
    w0 = s.initial_weights()
    s._initial = [np.zeros_like(a) for a in w0]
    assert all((a == 0).all() for a in s.initial_weights())
    assert not all((a == 0).all() for a in s.initial_weights(salt=1))   # others stay seeded


def test_the_example_server_app_runs_in_process(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    module = importlib.import_module("examples.own_server_app.server_app")
    cfg = {**api.default_run_config(), "scenario": "sea4", "rounds-per-step": 2,
           "local-steps": 5, "num-steps": 4, "progress": False, "plot": False,
           "out-dir": str(tmp_path / "example")}
    module.app(InProcessGrid(cfg, 10), Context(run_id=1, node_id=0, node_config={}, state=None,
                                               run_config=cfg))
    out = capsys.readouterr().out
    assert "feddrift on sea4: 6 rounds" in out
    summary = json.loads((tmp_path / "example" / "summary.json").read_text())
    assert summary["strategy"] == "feddrift" and summary["config"]["feddrift.delta"] == 0.04
    rounds = [json.loads(line) for line in
              (tmp_path / "example" / "metrics.jsonl").read_text().splitlines()]
    assert all("central_accuracy" in m for r in rounds for m in r["server_evaluation"].values())
    sys.modules.pop("examples.own_server_app.server_app", None)
