"""Flower ServerApp: run config -> experiment -> strategy -> rounds -> results."""

from __future__ import annotations

from logging import INFO
from pathlib import Path

from flwr.app import Context
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from fedcluster_app.api import build_strategy
from fedcluster_app.core.config import ConfigValue
from fedcluster_app.core.experiment import load_experiment

app = ServerApp()

__all__ = ["app", "run_server"]


def run_server(grid: Grid, run_config: dict[str, ConfigValue]) -> dict:
    """Run a whole experiment on ``grid``; returns the summary (also in summary.json).

    Bad configuration, and a checkpoint that does not fit the run, fail here, before the
    first round and before any file is written. A failure during the run still writes
    summary.json with status "failed" before the exception propagates.
    """
    exp = load_experiment(run_config, server=True)
    strategy = build_strategy(exp)
    if exp.cfg.resume_from:
        strategy.load_checkpoint(Path(exp.cfg.resume_from))
        log(INFO, "resuming %s after round %d (%s)", strategy.name, strategy.round,
            exp.cfg.resume_from)
    return strategy.run(grid)   # results in the run config's out-dir


@app.main()
def main(grid: Grid, context: Context) -> None:
    run_server(grid, context.run_config)
