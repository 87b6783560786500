"""The one round loop under every protocol: checkpoint-every counts rounds, a resume in the
middle of a time step continues exactly, and the rounds announced are the rounds run."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from fedcluster_app.engine import run_inprocess
from tests.core.server.test_checkpoint import CrashingGrid
from tests.support import WALL_CLOCK


class CrashAt5(CrashingGrid):
    """The server 'dies' when it sends the first message of round 5 (a step's first round)."""

    crash_round = 5


def rounds(out: Path) -> list[dict]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(x).items() if k not in WALL_CLOCK} for x in lines]


# one strategy per protocol: FedDrift's time steps, FlexCFL's selection, plain rounds
@pytest.mark.parametrize("strategy, extra", [
    ("feddrift", {"scenario": "sea4", "num-steps": 5, "local-steps": 10}),
    ("kue", {"scenario": "sea4", "num-steps": 5, "local-steps": 10}),
    ("flexcfl", {"scenario": "synthetic-1-1-swap", "num-steps": 8, "rounds-per-step": 1,
                 "num-clusters": 3, "flexcfl.pretrain-scale": 2, "local-steps": 5,
                 "drift-pattern": "swap-all@0.3"}),
    ("fielding", {}),
])
def test_a_checkpoint_in_the_middle_of_a_step_resumes_exactly(fast_config, tmp_path, strategy,
                                                               extra):
    full = run_inprocess(fast_config(strategy=strategy, out_dir=str(tmp_path / "full"), **extra))
    cfg = fast_config(strategy=strategy, out_dir=str(tmp_path / "crash"), checkpoint_every=3,
                      **extra)
    with pytest.raises(RuntimeError, match="server crashed"):
        run_inprocess(cfg, grid_cls=CrashAt5)
    meta_round = json.loads((tmp_path / "crash" / "summary.json").read_text())["status"]
    assert meta_round == "failed"
    resumed = run_inprocess(cfg | {"resume-from": str(tmp_path / "crash")})
    assert resumed["resumed_after_round"] == 3       # every 3 rounds, whatever the protocol
    assert rounds(tmp_path / "crash") == rounds(Path(full["out_dir"]))
    assert resumed["rounds"] == full["rounds"]


@pytest.mark.parametrize("strategy, extra, expected", [
    ("feddrift", {"scenario": "sea4", "num-steps": 4}, (4 - 1) * 2),   # the last step tests only
    ("fedavg", {}, 6 * 2),
    ("flexcfl-fedavg", {}, 6 * 2),
])
def test_the_rounds_announced_are_the_rounds_run(fast_config, caplog, strategy, extra, expected):
    caplog.set_level(logging.INFO, logger="flwr")
    summary = run_inprocess(fast_config(strategy=strategy, **extra))
    announced = [r.getMessage() for r in caplog.records if r.getMessage().startswith("fedcluster:")
                 and " rounds; results in " in r.getMessage()]
    assert announced and f", {expected} rounds;" in announced[0]
    assert summary["rounds"] == expected
