"""Run results: per-round metrics, run summary, plots and run comparison.

Every run writes three files to its output directory (the results contract; other tools read
only these files):

``metrics.jsonl``
    One JSON object per round. Required keys: ``round``, ``time_step``, ``accuracy`` (mean
    client test accuracy in [0, 1], ``null`` when the round was not evaluated) and
    ``num_clusters``; ``ari`` when the scenario has ground truth. The server also logs
    ``bytes_up``, ``bytes_down`` (this round), ``failures``, ``drifted_clients``,
    ``round_time_s`` and strategy-specific extra keys (any JSON value).
``summary.json``
    Run-level totals and means computed from the logged rounds (see :meth:`RunRecorder.finish`),
    written atomically.
``plot.png``
    Accuracy (left axis) and number of clusters (right axis) over rounds, drift events as
    vertical dashed lines.

NaN and infinities are never written: they become ``null``. NumPy scalars and arrays (and
anything else with a ``tolist()`` method, such as torch tensors) are converted to plain JSON.

This module is imported by the server on start-up, so it only imports the standard library at
module level; matplotlib is imported lazily by the plotting functions (Agg canvas only, pyplot
and the global backend are never touched).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fedcluster_app.core.atomic import atomic_open, atomic_write_bytes

__all__ = [
    "METRICS_FILE",
    "SUMMARY_FILE",
    "PLOT_FILE",
    "REQUIRED_ROUND_KEYS",
    "REQUIRED_SUMMARY_KEYS",
    "RunRecorder",
    "load_run",
    "plot_run",
    "compare_runs",
    "format_round_line",
    "compute_summary",
    "to_json",
]

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
PLOT_FILE = "plot.png"

REQUIRED_ROUND_KEYS = ("round", "time_step", "accuracy", "num_clusters")
REQUIRED_SUMMARY_KEYS = (
    "strategy",
    "scenario",
    "seed",
    "rounds",
    "mean_accuracy",
    "final_accuracy",
    "ari_final",
    "bytes_up",
    "bytes_down",
    "wall_time_s",
)
STATUSES = ("completed", "failed")

# Optional per-round keys whose type the recorder checks when they are present.
_COUNT_KEYS = ("bytes_up", "bytes_down", "failures", "drifted_clients")


# --------------------------------------------------------------------------------------------
# JSON conversion and validation
# --------------------------------------------------------------------------------------------


def to_json(value: Any, *, where: str = "value") -> Any:
    """Return ``value`` as plain JSON data (dict/list/str/int/float/bool/None).

    NaN and +-inf become ``None``; numpy scalars/arrays (anything with ``tolist()``) become
    Python numbers/lists; tuples and sets become lists; paths become strings; mapping keys
    become strings. Raises ``TypeError`` naming ``where`` for anything else.
    """
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            key = _json_key(k, where)
            out[key] = to_json(v, where=f"{where}.{key}")
        return out
    if isinstance(value, (list, tuple)):
        return [to_json(v, where=f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, (set, frozenset)):
        items = [to_json(v, where=f"{where}[]") for v in value]
        try:
            return sorted(items)
        except TypeError:
            return items
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    tolist = getattr(value, "tolist", None)
    if callable(tolist):  # numpy scalar/array, torch tensor, ...
        return to_json(tolist(), where=where)
    raise TypeError(f"{where}: cannot convert {type(value).__name__} to JSON")


def _json_key(key: Any, where: str) -> str:
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, (bool, int, float)):
        return json.dumps(key)
    item = getattr(key, "item", None)  # numpy scalar key, e.g. a cluster id
    if callable(item):
        return _json_key(item(), where)
    raise TypeError(f"{where}: mapping key {key!r} ({type(key).__name__}) is not a JSON key")


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _check_round_record(rec: Any, where: str) -> None:
    """Validate an already JSON-converted round record; raise ``ValueError`` naming ``where``."""
    if not isinstance(rec, dict):
        raise ValueError(f"{where}: a round record must be a JSON object, got {type(rec).__name__}")
    missing = [k for k in REQUIRED_ROUND_KEYS if k not in rec]
    if missing:
        raise ValueError(f"{where}: missing required key(s) {', '.join(missing)}")
    for key in ("round", "time_step", "num_clusters"):
        v = rec[key]
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"{where}: {key!r} must be a non-negative integer, got {v!r}")
    acc = rec["accuracy"]
    if acc is not None and (not _is_number(acc) or not 0.0 <= acc <= 1.0):
        raise ValueError(f"{where}: 'accuracy' must be null or a number in [0, 1], got {acc!r}")
    ari = rec.get("ari")
    if ari is not None and (not _is_number(ari) or not -1.0 <= ari <= 1.0):
        raise ValueError(f"{where}: 'ari' must be null or a number in [-1, 1], got {ari!r}")
    for key in _COUNT_KEYS:
        v = rec.get(key)
        if v is not None and (not _is_number(v) or v < 0):
            raise ValueError(f"{where}: {key!r} must be a non-negative number, got {v!r}")
    v = rec.get("round_time_s")
    if v is not None and (not _is_number(v) or v < 0):
        raise ValueError(f"{where}: 'round_time_s' must be a non-negative number, got {v!r}")


def _normalise_counts(rec: dict) -> None:
    """Integral floats in count keys (e.g. 1.2e6 bytes) become ints."""
    for key in _COUNT_KEYS:
        v = rec.get(key)
        if isinstance(v, float) and v.is_integer():
            rec[key] = int(v)


# --------------------------------------------------------------------------------------------
# File helpers
# --------------------------------------------------------------------------------------------


def _dump_line(rec: dict) -> str:
    return json.dumps(rec, allow_nan=False, ensure_ascii=False) + "\n"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def _read_metrics(path: Path, *, tolerate_partial_last_line: bool = False) -> list[dict]:
    """Parse and validate ``metrics.jsonl``; errors name the file and the line number.

    With ``tolerate_partial_last_line`` a malformed *final* line (a line cut short by a crash)
    is dropped instead of raising.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: metrics file not found") from None
    lines = text.splitlines()
    last = max((i for i, ln in enumerate(lines) if ln.strip()), default=-1)
    records: list[dict] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        where = f"{path}, line {i + 1}"
        try:
            rec = json.loads(line, parse_constant=_reject_constant)
        except ValueError as exc:
            if tolerate_partial_last_line and i == last:
                break
            raise ValueError(f"{where}: malformed JSON ({exc})") from None
        _check_round_record(rec, where)
        if records and rec["round"] <= records[-1]["round"]:
            raise ValueError(
                f"{where}: round {rec['round']} does not follow round {records[-1]['round']}"
            )
        records.append(rec)
    return records


# --------------------------------------------------------------------------------------------
# Summary
# --------------------------------------------------------------------------------------------


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _last_not_none(records: list[dict], key: str) -> Any:
    for rec in reversed(records):
        if rec.get(key) is not None:
            return rec[key]
    return None


def _total(records: list[dict], key: str) -> int | float:
    total = sum(rec.get(key) or 0 for rec in records)
    return int(total) if float(total).is_integer() else total


def compute_summary(records: list[dict]) -> dict:
    """The summary fields that are computed from round records (in round order).

    ``rounds`` is the number of logged rounds; ``mean_accuracy`` averages the evaluated rounds
    (accuracy not null); ``final_accuracy`` / ``ari_final`` are the last non-null values;
    ``mean_accuracy_after_drift`` averages the evaluated rounds from the first round with
    ``drifted_clients > 0`` on (inclusive), null if there is no such round; byte and failure
    counts are totals (missing keys count as 0); ``num_clusters_final`` is the last round's.
    With held-out clients (FedRC's test clients) the same for ``global_accuracy``, plus
    ``last5_*``: the mean of the last five evaluated rounds (spec fedrc.md 4.4).
    """
    accs = [r["accuracy"] for r in records if r.get("accuracy") is not None]
    globs = [r["global_accuracy"] for r in records if r.get("global_accuracy") is not None]
    weighted = [r["weighted_accuracy"] for r in records if r.get("weighted_accuracy") is not None]
    drift_at = next(
        (i for i, r in enumerate(records) if (r.get("drifted_clients") or 0) > 0), None
    )
    after = None
    if drift_at is not None:
        after = _mean([r["accuracy"] for r in records[drift_at:] if r.get("accuracy") is not None])
    return {
        "rounds": len(records),
        "mean_accuracy": _mean(accs),
        "final_accuracy": accs[-1] if accs else None,
        "ari_final": _last_not_none(records, "ari"),
        "bytes_up": _total(records, "bytes_up"),
        "bytes_down": _total(records, "bytes_down"),
        "mean_accuracy_after_drift": after,
        "failures": _total(records, "failures"),
        "num_clusters_final": records[-1].get("num_clusters") if records else None,
        "last5_accuracy": _mean(accs[-5:]),
        "final_weighted_accuracy": weighted[-1] if weighted else None,
        **({"mean_global_accuracy": _mean(globs), "final_global_accuracy": globs[-1],
            "last5_global_accuracy": _mean(globs[-5:])} if globs else {}),
    }


# --------------------------------------------------------------------------------------------
# Recorder
# --------------------------------------------------------------------------------------------


class RunRecorder:
    """Writes ``metrics.jsonl`` round by round and ``summary.json`` + ``plot.png`` at the end.

    ``resume=False`` starts a fresh ``metrics.jsonl`` (and removes a stale ``summary.json`` /
    ``plot.png`` of an earlier run in the same directory). ``resume=True`` keeps the existing
    records; the first :meth:`log_round` call with round ``r`` drops the kept records with
    round >= ``r`` (rewriting the file atomically) before appending. A malformed last line left
    by a crash is ignored on resume.
    """

    def __init__(
        self,
        out_dir: str | os.PathLike,
        *,
        strategy: str,
        scenario: str,
        seed: int,
        config: dict,
        resume: bool = False,
    ) -> None:
        if not isinstance(config, Mapping):
            raise TypeError(f"config must be a dict, got {type(config).__name__}")
        self.out_dir = Path(out_dir)
        self.strategy = str(strategy)
        self.scenario = str(scenario)
        self.seed = int(seed)
        self.config = to_json(dict(config), where="config")
        self.metrics_path = self.out_dir / METRICS_FILE
        self.summary_path = self.out_dir / SUMMARY_FILE
        self.plot_path = self.out_dir / PLOT_FILE
        self._t0 = time.monotonic()
        self._started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")

        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._records: list[dict] = []
        self._pending_truncation = False
        if resume and self.metrics_path.exists():
            self._records = _read_metrics(self.metrics_path, tolerate_partial_last_line=True)
            self._pending_truncation = True
        else:
            self.metrics_path.write_text("", encoding="utf-8")
            if not resume:
                for stale in (self.summary_path, self.plot_path):
                    stale.unlink(missing_ok=True)

    @property
    def rounds(self) -> list[dict]:
        """The round records logged so far (JSON-converted copies, in round order)."""
        return [dict(r) for r in self._records]

    def log_round(self, record: dict) -> None:
        """Validate ``record``, convert it to JSON and append it to ``metrics.jsonl``.

        Raises ``ValueError`` for a missing required key, a bad value or a round number that
        does not increase, ``TypeError`` for a value that cannot be written as JSON. The line
        is flushed and fsynced, so a crash loses at most the line being written.
        """
        if not isinstance(record, Mapping):
            raise TypeError(f"record must be a dict, got {type(record).__name__}")
        rec = to_json(dict(record), where="record")
        _normalise_counts(rec)
        where = f"round record {rec.get('round')!r}"
        _check_round_record(rec, where)

        if self._pending_truncation:
            kept = [r for r in self._records if r["round"] < rec["round"]]
            if len(kept) != len(self._records) or self._file_needs_rewrite():
                data = "".join(_dump_line(r) for r in kept).encode("utf-8")
                atomic_write_bytes(self.metrics_path, data)
            self._records = kept
            self._pending_truncation = False
        if self._records and rec["round"] <= self._records[-1]["round"]:
            raise ValueError(
                f"{where}: round {rec['round']} does not follow round {self._records[-1]['round']}"
            )

        with open(self.metrics_path, "a", encoding="utf-8") as f:
            f.write(_dump_line(rec))
            f.flush()
            os.fsync(f.fileno())
        self._records.append(rec)

    def _file_needs_rewrite(self) -> bool:
        """True if the file on disk is not exactly the kept records (e.g. a partial last line)."""
        expected = "".join(_dump_line(r) for r in self._records)
        try:
            return self.metrics_path.read_text(encoding="utf-8") != expected
        except FileNotFoundError:
            return True

    def finish(
        self,
        *,
        status: str = "completed",
        error: str | None = None,
        extra: dict | None = None,
        plot: bool = True,
    ) -> dict:
        """Write ``plot.png`` (if ``plot``) and then ``summary.json`` atomically; return the summary.

        ``extra`` keys are added last and may override computed fields (e.g. a resumed run's
        total ``wall_time_s``). A plotting failure does not lose the summary: it is reported
        as ``plot_error`` in it. May be called again (e.g. from a ``finally`` block); the last
        call wins.
        """
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
        if self._pending_truncation and self._file_needs_rewrite():
            # resumed but nothing logged since: drop a partial last line left by a crash
            data = "".join(_dump_line(r) for r in self._records).encode("utf-8")
            atomic_write_bytes(self.metrics_path, data)
        if error is not None and not isinstance(error, str):
            error = str(error)
        summary: dict[str, Any] = {
            "strategy": self.strategy,
            "scenario": self.scenario,
            "seed": self.seed,
        }
        computed = compute_summary(self._records)
        summary["rounds"] = computed.pop("rounds")
        for key in ("mean_accuracy", "final_accuracy", "ari_final", "bytes_up", "bytes_down"):
            summary[key] = computed.pop(key)
        summary["wall_time_s"] = round(time.monotonic() - self._t0, 3)
        summary.update(computed)
        summary["status"] = status
        summary["error"] = error
        summary["config"] = self.config
        summary["started_at"] = self._started_at
        summary["finished_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        if extra:
            summary.update(to_json(dict(extra), where="extra"))

        if plot:
            try:
                _plot_history(self._records, _title(summary), self.plot_path)
            except Exception as exc:  # never lose the summary because of a plot
                summary["plot_error"] = f"{type(exc).__name__}: {exc}"

        summary = to_json(summary, where="summary")
        data = json.dumps(summary, indent=2, allow_nan=False, ensure_ascii=False) + "\n"
        atomic_write_bytes(self.summary_path, data.encode("utf-8"))
        return summary


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


def load_run(run_dir: str | os.PathLike) -> tuple[dict, list[dict]]:
    """Return ``(summary, round_records)`` of a run directory.

    Raises ``FileNotFoundError`` naming the missing directory/file and ``ValueError`` naming
    the file (and line, for ``metrics.jsonl``) when a file is malformed.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: run directory not found")
    summary_path = run_dir / SUMMARY_FILE
    try:
        text = summary_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"{summary_path}: summary file not found") from None
    try:
        summary = json.loads(text, parse_constant=_reject_constant)
    except ValueError as exc:
        raise ValueError(f"{summary_path}: malformed JSON ({exc})") from None
    if not isinstance(summary, dict):
        raise ValueError(f"{summary_path}: expected a JSON object, got {type(summary).__name__}")
    missing = [k for k in REQUIRED_SUMMARY_KEYS if k not in summary]
    if missing:
        raise ValueError(f"{summary_path}: missing required key(s) {', '.join(missing)}")
    records = _read_metrics(run_dir / METRICS_FILE)
    return summary, records


# --------------------------------------------------------------------------------------------
# Plotting (matplotlib imported lazily, Agg canvas only)
# --------------------------------------------------------------------------------------------


def _title(summary: Mapping) -> str:
    return f"{summary.get('strategy')} on {summary.get('scenario')} (seed {summary.get('seed')})"


def _new_figure(figsize: tuple[float, float]):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _save_png(fig, out_path: Path) -> Path:
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(out_path) as f:
        fig.savefig(f, format="png", bbox_inches="tight")
    return out_path


def _plot_history(records: list[dict], title: str, out_path: Path) -> Path:
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    fig = _new_figure((8.0, 4.5))
    ax = fig.add_subplot(1, 1, 1)
    ax.set_title(title)
    ax.set_xlabel("round")
    ax.set_ylabel("accuracy")
    ax.set_ylim(0.0, 1.0)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, alpha=0.3)
    handles = []

    if not records:
        ax.text(0.5, 0.5, "no rounds logged", ha="center", va="center", transform=ax.transAxes)
    else:
        evaluated = [(r["round"], r["accuracy"]) for r in records if r.get("accuracy") is not None]
        if evaluated:
            xs, ys = zip(*evaluated)
            (h,) = ax.plot(xs, ys, color="tab:blue", marker="." if len(xs) < 60 else None,
                           label="accuracy")
            handles.append(h)
        with_ari = [(r["round"], r["ari"]) for r in records if r.get("ari") is not None]
        if with_ari:
            xs, ys = zip(*with_ari)
            (h,) = ax.plot(xs, ys, color="tab:green", linestyle=":", linewidth=1.2, label="ARI")
            handles.append(h)

        ax2 = ax.twinx()
        xs = [r["round"] for r in records]
        ks = [r["num_clusters"] for r in records]
        (h,) = ax2.step(xs, ks, where="post", color="tab:orange", label="clusters")
        handles.append(h)
        ax2.set_ylabel("number of clusters")
        ax2.set_ylim(0, max(ks) + 1)
        ax2.yaxis.set_major_locator(MaxNLocator(integer=True))

        drift_rounds = [r["round"] for r in records if (r.get("drifted_clients") or 0) > 0]
        for x in drift_rounds:
            ax.axvline(x, color="tab:red", linestyle="--", linewidth=1.0, alpha=0.7)
        if drift_rounds:
            handles.append(Line2D([], [], color="tab:red", linestyle="--", label="drift"))
        lo, hi = min(xs), max(xs)
        ax.set_xlim(lo - 0.5, hi + 0.5)

    if handles:
        ax.legend(handles=handles, loc="lower right", fontsize="small")
    return _save_png(fig, out_path)


def plot_run(run_dir: str | os.PathLike, out_path: str | os.PathLike | None = None) -> Path:
    """(Re)draw a run's plot from its files; default ``<run_dir>/plot.png``. Returns the path."""
    summary, records = load_run(run_dir)
    out = Path(out_path) if out_path is not None else Path(run_dir) / PLOT_FILE
    return _plot_history(records, _title(summary), out)


# --------------------------------------------------------------------------------------------
# Comparison
# --------------------------------------------------------------------------------------------


def _fmt(x: Any, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    if _is_number(x):
        return f"{x:.{digits}f}"
    return _cell(x)


def _cell(x: Any) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ")


def _mean_std(values: list[Any], n_runs: int) -> str:
    """'mean ± std' (sample std, ddof=1) over the non-null values; '(n=k)' if some were null."""
    vals = [float(v) for v in values if _is_number(v) and math.isfinite(v)]
    if not vals:
        return "n/a"
    m = sum(vals) / len(vals)
    if len(vals) > 1:
        sd = math.sqrt(sum((v - m) ** 2 for v in vals) / (len(vals) - 1))
        text = f"{m:.4f} ± {sd:.4f}"
    else:
        text = f"{m:.4f}"
    if len(vals) < n_runs:
        text += f" (n={len(vals)})"
    return text


def _run_names(dirs: list[Path]) -> list[str]:
    """Directory names, with parent folders added where two runs share a name."""
    resolved = [d.resolve() for d in dirs]
    depth = 1
    while True:
        names = ["/".join(p.parts[-depth:]) for p in resolved]
        dup = {n for n in names if names.count(n) > 1}
        if not dup or depth >= max(len(p.parts) for p in resolved):
            break
        depth += 1
    # keep the short name where it is unique
    short = [p.name for p in resolved]
    return [s if short.count(s) == 1 else n for s, n in zip(short, names)]


def _table(header: list[str], rows: list[list[str]], align: list[str]) -> list[str]:
    sep = ["---:" if a == "r" else "---" for a in align]
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


# --------------------------------------------------------------------------------------------
# Time to target accuracy (fielding.md 4.4 and ambiguities 12-13)
# --------------------------------------------------------------------------------------------

GLOBAL_BASELINES = ("fedavg", "fedprox")   # the default reference of the time-to-target table


def rounds_to_target(rounds: list[dict], target: float) -> int | None:
    """First round after which the (evaluated) accuracy never drops below ``target`` again;
    None if it never gets there."""
    evaluated = [r for r in rounds if r.get("accuracy") is not None]
    for i, r in enumerate(evaluated):
        if all(e["accuracy"] >= target for e in evaluated[i:]):
            return r["round"]
    return None


def round_seconds(r: dict, local_steps: int, step_s: float = 0.05, bandwidth: float = 1e6) -> float:
    """Simulated seconds of one round: clients train in parallel, so a round costs one
    participant's model download + upload (bytes_up / trained clients, twice) over ``bandwidth``
    bytes/s, ``local_steps`` SGD steps of ``step_s`` s, and Fielding's drift reports."""
    trained = max(int(r.get("trained_clients") or 0), 1)
    model = (r.get("bytes_up") or 0) / trained
    reports = (r.get("fielding_report_bytes") or 0) / max(int(r.get("fielding_drifted") or 0), 1)
    return local_steps * step_s + (2 * model + reports) / bandwidth


def time_to_target(rounds: list[dict], target: float, local_steps: int, step_s: float = 0.05,
                   bandwidth: float = 1e6) -> float | None:
    """Simulated seconds until :func:`rounds_to_target`; None if the target is never held."""
    hit = rounds_to_target(rounds, target)
    if hit is None:
        return None
    return float(sum(round_seconds(r, local_steps, step_s, bandwidth) for r in rounds
                     if r["round"] <= hit))


def time_to_target_table(runs: list[tuple[Path, dict, list[dict]]], names: list[str],
                         baseline: str | None = None, target: float | None = None) -> list[str]:
    """Markdown lines: per run, rounds and simulated seconds until its accuracy stays above the
    target, and the speed-up over the baseline run of the same scenario and seed (target: that
    baseline's final accuracy unless given). Empty when no run has a baseline."""
    wanted = (baseline,) if baseline else GLOBAL_BASELINES
    refs = {(s["scenario"], s["seed"]): (s, r) for _, s, r in runs if s["strategy"] in wanted}
    rows = []
    for name, (_, summary, records) in zip(names, runs):
        ref = refs.get((summary["scenario"], summary["seed"]))
        if ref is None:
            continue
        goal = target if target is not None else ref[0].get("final_accuracy")
        if goal is None:
            continue
        steps = lambda s: int((s.get("config") or {}).get("local-steps") or 0)  # noqa: E731
        mine_r, ref_r = rounds_to_target(records, goal), rounds_to_target(ref[1], goal)
        mine_t = time_to_target(records, goal, steps(summary))
        ref_t = time_to_target(ref[1], goal, steps(ref[0]))
        rows.append([_cell(name), _cell(summary["strategy"]), _fmt(goal),
                     "never" if mine_r is None else str(mine_r),
                     _fmt(mine_t, 1), _fmt(ref_r / mine_r if mine_r and ref_r else None, 2),
                     _fmt(ref_t / mine_t if mine_t and ref_t else None, 2)])
    if not rows:
        return []
    what = baseline or "/".join(GLOBAL_BASELINES)
    lines = ["", f"## Time to target accuracy (target: the {what} run's final accuracy on the "
             "same scenario and seed, unless --target; simulated time: fielding.md 4.4)", ""]
    return lines + _table(["run", "strategy", "target", "rounds to target", "simulated s",
                           f"speed-up vs {what} (rounds)", "speed-up (simulated time)"], rows,
                          ["l", "l", "r", "r", "r", "r", "r"])


def compare_runs(run_dirs: list, out_path: str | os.PathLike | None = None,
                 baseline: str | None = None, target: float | None = None) -> str:
    """Markdown comparison of runs: a per-run table and a per-(strategy, scenario) table.

    The group table gives mean ± sample std (ddof=1) over the group's runs of each metric,
    ignoring null values (then "(n=k)" tells how many runs had one). If ``out_path`` is given a
    comparison plot is written there: one accuracy line per run when every group has a single
    run, else the mean per group with a ±1 std band.
    """
    dirs = [Path(d) for d in run_dirs]
    if not dirs:
        raise ValueError("compare_runs: no run directories given")
    runs = [(d, *load_run(d)) for d in dirs]
    names = _run_names(dirs)

    # runs with held-out clients (FedRC's populations) also report global accuracy
    extra = [k for k in ("last5_global_accuracy", "final_global_accuracy")
             if any(summary.get(k) is not None for _, summary, _ in runs)]
    header = ["run", "strategy", "scenario", "seed", "rounds", "mean_accuracy",
              "mean_accuracy_after_drift", "final_accuracy", "ari_final", *extra, "MB (up+down)",
              "wall_time_s", "status"]
    align = ["l", "l", "l", "r", "r", "r", "r", "r", "r", *["r"] * len(extra), "r", "r", "l"]
    rows = []
    groups: dict[tuple[str, str], list[dict]] = {}
    for name, (_, summary, _records) in zip(names, runs):
        mb = ((summary.get("bytes_up") or 0) + (summary.get("bytes_down") or 0)) / 1e6
        rows.append([
            _cell(name), _cell(summary["strategy"]), _cell(summary["scenario"]),
            _cell(summary["seed"]), _cell(summary["rounds"]),
            _fmt(summary.get("mean_accuracy")), _fmt(summary.get("mean_accuracy_after_drift")),
            _fmt(summary.get("final_accuracy")), _fmt(summary.get("ari_final")),
            *[_fmt(summary.get(k)) for k in extra], _fmt(mb, 2), _fmt(summary.get("wall_time_s"), 2),
            _cell(summary.get("status", "n/a")),
        ])
        groups.setdefault((str(summary["strategy"]), str(summary["scenario"])), []).append(summary)

    metrics = ["mean_accuracy", "mean_accuracy_after_drift", "final_accuracy", "ari_final", *extra]
    g_rows = []
    for (strategy, scenario), members in groups.items():
        n = len(members)
        g_rows.append([_cell(strategy), _cell(scenario), str(n)]
                      + [_mean_std([m.get(k) for m in members], n) for k in metrics])

    lines = ["## Runs", ""]
    lines += _table(header, rows, align)
    lines += ["", "## By strategy and scenario (mean ± sample std over seeds)", ""]
    lines += _table(["strategy", "scenario", "n seeds"] + metrics, g_rows,
                    ["l", "l", "r"] + ["r"] * len(metrics))
    lines += time_to_target_table(runs, names, baseline, target)
    text = "\n".join(lines) + "\n"

    if out_path is not None:
        _plot_comparison(runs, names, Path(out_path))
    return text


def _plot_comparison(runs: list[tuple[Path, dict, list[dict]]], names: list[str],
                     out_path: Path) -> Path:
    fig = _new_figure((9.0, 5.0))
    ax = fig.add_subplot(1, 1, 1)
    ax.set_xlabel("round")
    ax.set_ylabel("accuracy")
    ax.set_ylim(0.0, 1.0)
    ax.grid(True, alpha=0.3)

    groups: dict[tuple[str, str], list[list[dict]]] = {}
    for _, summary, records in runs:
        key = (str(summary["strategy"]), str(summary["scenario"]))
        groups.setdefault(key, []).append(records)

    if all(len(members) == 1 for members in groups.values()):
        ax.set_title("accuracy per run")
        for name, (_, summary, records) in zip(names, runs):
            pts = [(r["round"], r["accuracy"]) for r in records if r.get("accuracy") is not None]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, label=f"{name} ({summary['strategy']}, seed {summary['seed']})")
    else:
        ax.set_title("accuracy per strategy and scenario (mean ± std over seeds)")
        for (strategy, scenario), members in groups.items():
            by_round: dict[int, list[float]] = {}
            for records in members:
                for r in records:
                    if r.get("accuracy") is not None:
                        by_round.setdefault(r["round"], []).append(float(r["accuracy"]))
            if not by_round:
                continue
            xs = sorted(by_round)
            means, lo, hi = [], [], []
            for x in xs:
                v = by_round[x]
                m = sum(v) / len(v)
                sd = math.sqrt(sum((a - m) ** 2 for a in v) / (len(v) - 1)) if len(v) > 1 else 0.0
                means.append(m)
                lo.append(max(0.0, m - sd))
                hi.append(min(1.0, m + sd))
            (line,) = ax.plot(xs, means, label=f"{strategy} on {scenario} (n={len(members)})")
            ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="lower right", fontsize="small")
    return _save_png(fig, out_path)


# --------------------------------------------------------------------------------------------
# Progress line
# --------------------------------------------------------------------------------------------


def _fmt_bytes(n: float) -> str:
    if n < 1000:
        return f"{int(n)} B"
    for unit in ("kB", "MB", "GB", "TB"):
        n /= 1000.0
        if n < 1000 or unit == "TB":
            return f"{n:.1f} {unit}"
    raise AssertionError("unreachable")


def _scalar(v: Any) -> Any:
    """numpy/torch scalar -> Python scalar; anything else unchanged."""
    if isinstance(v, (str, bool, int, float)) or v is None:
        return v
    item = getattr(v, "item", None)
    if callable(item):
        try:
            return item()
        except (ValueError, TypeError, RuntimeError):  # not a single-element array
            return v
    return v


def format_round_line(record: dict, total_rounds: int) -> str:
    """One-line progress message for a round, e.g.

    ``[round  12/55 | step  3] acc 0.912 | clusters 2 | ari 1.000 | up 12.3 kB down 24.6 kB | 0.21 s``

    Parts whose value is missing or null are left out; ``drift <n>`` and ``fail <n>`` appear
    only when positive. ``total_rounds`` <= 0 or None leaves out the ``/total``.
    """
    record = {k: _scalar(v) for k, v in record.items()}
    rnd = record.get("round")
    head = "round"
    if rnd is not None:
        width = max(3, len(str(total_rounds))) if total_rounds else 0
        head += f" {rnd:>{width}}"
        if total_rounds:
            head += f"/{total_rounds}"
    step = record.get("time_step")
    if step is not None:
        head += f" | step {step:>2}"

    parts = []
    acc = record.get("accuracy")
    if _is_number(acc) and math.isfinite(acc):
        parts.append(f"acc {acc:.3f}")
    glob = record.get("global_accuracy")
    if _is_number(glob) and math.isfinite(glob):
        parts.append(f"global {glob:.3f}")
    k = record.get("num_clusters")
    if k is not None:
        parts.append(f"clusters {k}")
    ari = record.get("ari")
    if _is_number(ari) and math.isfinite(ari):
        parts.append(f"ari {ari:.3f}")
    drifted = record.get("drifted_clients")
    if _is_number(drifted) and drifted > 0:
        parts.append(f"drift {drifted}")
    failures = record.get("failures")
    if _is_number(failures) and failures > 0:
        parts.append(f"fail {failures}")
    up, down = record.get("bytes_up"), record.get("bytes_down")
    traffic = []
    if _is_number(up):
        traffic.append(f"up {_fmt_bytes(up)}")
    if _is_number(down):
        traffic.append(f"down {_fmt_bytes(down)}")
    if traffic:
        parts.append(" ".join(traffic))
    t = record.get("round_time_s")
    if _is_number(t):
        parts.append(f"{t:.2f} s")

    line = f"[{head}]"
    if parts:
        line += " " + " | ".join(parts)
    if total_rounds and total_rounds >= LONG_RUN_ROUNDS and _is_number(rnd):
        line += " " + progress_bar(rnd, total_rounds)
    return line


LONG_RUN_ROUNDS = 50   # runs this long get a progress bar on their round lines


def progress_bar(done: int, total: int, width: int = 20) -> str:
    """``|#######-------------|  35%``: plain ASCII, so it survives any log viewer."""
    frac = min(max(done / total, 0.0), 1.0)
    filled = int(round(frac * width))
    return f"|{'#' * filled}{'-' * (width - filled)}| {frac * 100:3.0f}%"
