"""Shared helpers of the Fielding benchmarks: run a configuration in-process, windows of mean
accuracy, time-to-target-accuracy in rounds and in simulated time.

Time-to-target (docs/fielding/README.md, D11; computed in fedcluster_app.core.results, which
`fedcluster report` also uses): the first round after which a run's mean client
accuracy never drops below the target again; the target defaults to the final accuracy of the
global model (FedAvg/FedProx). Simulated time uses a simple cost model (docs/fielding/README.md, D11): clients
train in parallel, so a round costs one participant's model download + upload
(bytes_up / trained_clients of the round, twice) over ``bandwidth`` bytes/s, plus ``local-steps``
SGD steps of ``step_s`` seconds, plus Fielding's drift reports (4 bytes per reported coordinate,
``fielding_report_bytes`` per round, spread over the clients that reported).

Raw rows (``--jsonl FILE`` of every Fielding benchmark): ``record`` builds one JSON line per run
-- the run's seed, variant, strategy, scenario and config overrides, the numbers its table shows,
the summary's final accuracy and the run's wall time -- and ``harness.write_rows`` writes them.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np

from fedcluster_app.core.results import (  # noqa: F401  (re-exported for the benchmarks)
    load_run,
    round_seconds,
    rounds_to_target,
    time_to_target,
)

OUT = Path(os.environ.get("FIELDING_BENCH_OUT", "/tmp/fielding-bench"))


def run(strategy: str, scenario: str, seed: int, **overrides) -> tuple[dict, list[dict], float]:
    tag = "-".join(f"{k}={v}" for k, v in sorted(overrides.items()) if k.startswith("fielding.")
                   or k.startswith("auxo."))
    out = OUT / f"{scenario}-{strategy}-s{seed}{'-' + tag if tag else ''}"
    cfg = {"strategy": strategy, "scenario": scenario, "seed": seed, "overwrite": True, "out-dir": str(out),
           "progress": False, "plot": False, "protocol": "none", **overrides}
    # imported here, not at the top: the timing benchmarks import this module too
    from fedcluster_app.engine import run_inprocess

    t0 = time.perf_counter()
    summary = run_inprocess(cfg)
    return summary, load_run(out)[1], time.perf_counter() - t0


def window(rounds: list[dict], first: int, last: int) -> float:
    """Mean accuracy over rounds first..last (1-based, inclusive)."""
    return float(np.mean([r["accuracy"] for r in rounds if first <= r["round"] <= last]))


def fmt(x, nd=3) -> str:
    return "-" if x is None else (f"{x:.{nd}f}" if isinstance(x, float) else str(x))


def record(seed, variant: str, config: dict, summary: dict | None = None, secs: float | None = None,
           **numbers) -> dict:
    """One raw row of a benchmark's table: the run's seed, variant (method), config overrides and
    the numbers the table shows (``numbers``: strategy, scenario, windows, counts, times), then the
    summary's final accuracy and the run's wall time in seconds."""
    row = {"seed": seed, "variant": variant, "config": config, **numbers}
    if summary is not None:
        row["final_accuracy"] = summary.get("final_accuracy")
    if secs is not None:
        row["wall_s"] = round(secs, 1)
    return row

