"""Run results: per-round metrics, run summary, plots and run comparison.

Every run writes to its output directory (the results contract; other tools read only these
files): ``metrics.jsonl`` (one JSON object per round), ``summary.json`` (run-level totals and
means, written atomically) and ``plot.png`` (accuracy and number of clusters over rounds, drift
events marked). By concern: ``files`` (the contract, JSON, reading), ``recorder`` (writing a
run), ``tracking`` (MLflow, TensorBoard, CSV: where else the recorder logs a run),
``provenance`` (versions and commit), ``console`` (the progress line), ``plots`` and
``compare`` (several runs).
"""

from fedcluster_app.core.results.compare import (FORMATS, GLOBAL_BASELINES, accuracy_rule,
                                                 compare_runs, held_accuracy, round_seconds,
                                                 rounds_to_target, time_to_target,
                                                 time_to_target_rows)
from fedcluster_app.core.results.console import format_round_line, progress_bar
from fedcluster_app.core.results.files import (METRICS_FILE, PLOT_FILE, REQUIRED_ROUND_KEYS,
                                               REQUIRED_SUMMARY_KEYS, STATUSES, SUMMARY_FILE,
                                               check_out_dir, finished_run, load_run,
                                               read_summary, to_json)
from fedcluster_app.core.results.plots import plot_run
from fedcluster_app.core.results.recorder import RunRecorder, compute_summary

__all__ = [
    "FORMATS", "GLOBAL_BASELINES", "METRICS_FILE", "PLOT_FILE", "REQUIRED_ROUND_KEYS",
    "REQUIRED_SUMMARY_KEYS", "STATUSES", "SUMMARY_FILE", "RunRecorder", "accuracy_rule",
    "check_out_dir", "compare_runs", "compute_summary", "finished_run", "format_round_line",
    "held_accuracy", "load_run", "plot_run", "progress_bar", "read_summary", "round_seconds",
    "rounds_to_target", "time_to_target", "time_to_target_rows", "to_json",
]
