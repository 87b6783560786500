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
from fedcluster_app.core.results import read_summary, tracking
from fedcluster_app.core.results.files import FINISHED
from fedcluster_app.core.server.runner import resolve_out_dir
from fedcluster_app.core.server.strategy import ClusteredStrategy

app = ServerApp()

__all__ = ["app", "prepare", "run_server"]


def prepare(run_config: dict[str, ConfigValue]) -> tuple[ClusteredStrategy, dict | None]:
    """The run's strategy, resumed from its checkpoint when the run config says so, and the
    summary of the run when it had already finished (nothing left to do), else None.

    Every refusal happens here, before any file is written or touched: bad configuration (a
    tracking backend not installed or not answering included); a
    checkpoint that is corrupt, of another strategy or scenario, or of another run config
    (``check_same_run``); an ``out-dir`` that holds another finished run (``overwrite``).
    The CLI calls this too, before it starts anything.
    """
    exp = load_experiment(run_config, server=True)
    tracking.check(exp.cfg.tracking_backends, exp.cfg.tracking_uri)
    strategy = build_strategy(exp)
    if exp.cfg.resume_from:
        strategy.load_checkpoint(Path(exp.cfg.resume_from))
    strategy.check_writable(resolve_out_dir(run_config))
    finished = finished_summary(strategy)
    if finished is not None:
        log(INFO, "%s already finished (round %d of %d, status %s): nothing to do, no file "
            "changed", strategy.resumed_from.parent, strategy.round, strategy.num_rounds,
            finished["status"])
    elif strategy.resumed_from is not None:
        log(INFO, "resuming %s after round %d (%s)", strategy.name, strategy.round,
            strategy.resumed_from)
    return strategy, finished


def finished_summary(strategy: ClusteredStrategy) -> dict | None:
    """The summary of the resumed run when it had run all of this run's rounds to the end
    (completed, or degraded: running it again would only rewrite its files)."""
    if strategy.resumed_from is None or strategy.round < strategy.num_rounds:
        return None
    summary = read_summary(strategy.resumed_from.parent) or {}
    return summary if summary.get("status") in FINISHED else None


def run_server(grid: Grid, run_config: dict[str, ConfigValue]) -> dict:
    """Run a whole experiment on ``grid``; returns the summary (also in summary.json).

    Refusals (``prepare``) happen before the first round and before any file is written; a
    run that already finished is left as it is. A failure during the run still writes
    summary.json with status "failed" before the exception propagates.
    """
    strategy, finished = prepare(run_config)
    if finished is not None:
        return finished
    summary = strategy.run(grid)   # results in the run config's out-dir
    if strategy.cfg.export and summary.get("status") != "failed":
        from fedcluster_app.export import export_run

        out = Path(summary["out_dir"])
        path = export_run(out, out / "export", overwrite=True)   # this run's own export
        tracking.log_export(summary, out / "export")
        log(INFO, "exported the cluster models: %s", path)
    return summary


@app.main()
def main(grid: Grid, context: Context) -> None:
    run_server(grid, context.run_config)
