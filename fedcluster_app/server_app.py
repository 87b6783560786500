"""Flower ServerApp: run config -> experiment -> strategy -> rounds -> results."""

from __future__ import annotations

import time
import traceback
from logging import ERROR, INFO
from pathlib import Path

from flwr.app import Context
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from fedcluster_app.core.config import ConfigValue
from fedcluster_app.core.experiment import load_experiment
from fedcluster_app.core.results import RunRecorder
from fedcluster_app.api import build_strategy

app = ServerApp()


def resolve_out_dir(run_config: dict[str, ConfigValue]) -> Path:
    out = str(run_config.get("out-dir", "") or "")
    if not out:
        out = f"runs/{run_config['strategy']}-{run_config['scenario']}-s{run_config['seed']}"
    return Path(out).expanduser().resolve()


def run_server(grid: Grid, run_config: dict[str, ConfigValue]) -> dict:
    """Run a whole experiment on ``grid``; returns the summary (also in summary.json).

    Bad configuration fails here, before the first round. A failure during the run still
    writes summary.json with status "failed" before the exception propagates.
    """
    t0 = time.monotonic()
    exp = load_experiment(run_config, server=True)
    strategy = build_strategy(exp)
    cfg = exp.cfg
    out_dir = resolve_out_dir(cfg.raw)
    recorder = RunRecorder(
        out_dir, strategy=cfg.strategy, scenario=cfg.scenario, seed=cfg.seed,
        config=dict(cfg.raw), resume=bool(cfg.resume_from),
    )
    log(INFO, "fedcluster: %s on %s, %d rounds; results in %s", cfg.strategy, cfg.scenario,
        exp.num_rounds, out_dir)
    resumed_after = {}
    try:
        if cfg.resume_from:
            strategy.load_checkpoint(Path(cfg.resume_from))
            resumed_after = {"resumed_after_round": strategy.round}
            log(INFO, "resuming %s after round %d (%s)", strategy.name, strategy.round, cfg.resume_from)
        strategy.start(grid, recorder, checkpoint_dir=out_dir)
    except Exception as ex:
        log(ERROR, "run failed: %s", traceback.format_exc())
        recorder.finish(status="failed", error=f"{type(ex).__name__}: {ex}", plot=False,
                        extra={"wall_time_s": time.monotonic() - t0})
        raise
    summary = recorder.finish(
        plot=cfg.plot,
        extra={"wall_time_s": time.monotonic() - t0, "out_dir": str(out_dir),
               "num_clients": exp.scenario.num_clients, "num_steps": exp.scenario.num_steps,
               **resumed_after, **strategy.summary_extra()},
    )
    log(INFO, "fedcluster: done: mean accuracy %.4f, final %.4f; summary in %s",
        summary["mean_accuracy"] or 0.0, summary["final_accuracy"] or 0.0, out_dir / "summary.json")
    return summary


@app.main()
def main(grid: Grid, context: Context) -> None:
    run_server(grid, context.run_config)
