"""The recorder: ``metrics.jsonl`` written round by round, ``summary.json`` (and the plot) at
the end, a resumed run continuing the same files."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fedcluster_app.core.atomic import atomic_write_bytes
from fedcluster_app.core.results.files import (CHECKPOINT_FILE, METRICS_FILE, PLOT_FILE, STATUSES,
                                               SUMMARY_FILE, check_round_record, dump_line,
                                               normalise_counts, read_metrics, to_json)
from fedcluster_app.core.results.plots import plot_history, title_of
from fedcluster_app.core.results.provenance import git_commit, package_versions
from fedcluster_app.core.results.tracking import Tracker, open_trackers

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
    counts are totals (missing keys count as 0); ``num_clusters_final`` (clusters in use) and
    ``models_allocated_final`` and ``assignments_final`` (client -> cluster) are the last
    round's.
    With held-out clients (FedRC's test clients) the same for ``global_accuracy``, plus
    ``last5_*``: the mean of the last five evaluated rounds (docs/fedrc/README.md, D4).
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
        "models_allocated_final": records[-1].get("models_allocated") if records else None,
        "assignments_final": records[-1].get("assignments") if records else None,
        "last5_accuracy": _mean(accs[-5:]),
        "final_weighted_accuracy": weighted[-1] if weighted else None,
        **({"mean_global_accuracy": _mean(globs), "final_global_accuracy": globs[-1],
            "last5_global_accuracy": _mean(globs[-5:])} if globs else {}),
    }




class RunRecorder:
    """Writes ``metrics.jsonl`` round by round and ``summary.json`` + ``plot.png`` at the end.

    ``resume=False`` starts a fresh ``metrics.jsonl`` (and removes a stale ``summary.json`` /
    ``plot.png`` / ``checkpoint.npz`` of an earlier run in the same directory: whether that
    may happen is decided before, by ``files.check_out_dir``). ``resume=True`` keeps the existing
    records; the first :meth:`log_round` call with round ``r`` drops the kept records with
    round >= ``r`` (rewriting the file atomically) before appending. A malformed last line left
    by a crash is ignored on resume.

    What the run was made with goes into the summary: ``resolved_config`` (the values the run
    used where ``config`` says "the scenario's default"), ``data_fingerprint``, the packages'
    ``versions`` and the ``git`` commit. ``tracking`` names backends (``tracking.py``) that get
    every round too; they are connected here, before any file of the run is touched, so a
    backend that cannot be used refuses the run before round 1.
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
        resolved_config: dict | None = None,
        data_fingerprint: str | None = None,
        tracking: tuple[str, ...] = (),
        tracking_uri: str = "",
    ) -> None:
        if not isinstance(config, Mapping):
            raise TypeError(f"config must be a dict, got {type(config).__name__}")
        self.out_dir = Path(out_dir)
        self.strategy = str(strategy)
        self.scenario = str(scenario)
        self.seed = int(seed)
        self.config = to_json(dict(config), where="config")
        self.resolved_config = to_json(dict(resolved_config or config), where="resolved_config")
        self.data_fingerprint = data_fingerprint
        self.metrics_path = self.out_dir / METRICS_FILE
        self.summary_path = self.out_dir / SUMMARY_FILE
        self.plot_path = self.out_dir / PLOT_FILE
        self._t0 = time.monotonic()
        self._started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")

        # first: a store that cannot be used refuses the run before the directory is made
        self._trackers: list[Tracker] = open_trackers(
            tuple(tracking), tracking_uri, self.out_dir, params=self.resolved_config,
            tags={"strategy": self.strategy, "scenario": self.scenario, "seed": str(self.seed)})
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._trackers_begun = False
        self._records: list[dict] = []
        self._pending_truncation = False
        if resume and self.metrics_path.exists():
            self._records = read_metrics(self.metrics_path, tolerate_partial_last_line=True)
            self._pending_truncation = True
        else:
            self.metrics_path.write_text("", encoding="utf-8")
            if not resume:
                for stale in (self.summary_path, self.plot_path,
                              self.out_dir / CHECKPOINT_FILE):
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
        normalise_counts(rec)
        where = f"round record {rec.get('round')!r}"
        check_round_record(rec, where)

        if self._pending_truncation:
            kept = [r for r in self._records if r["round"] < rec["round"]]
            if len(kept) != len(self._records) or self._file_needs_rewrite():
                data = "".join(dump_line(r) for r in kept).encode("utf-8")
                atomic_write_bytes(self.metrics_path, data)
            self._records = kept
            self._pending_truncation = False
        if self._records and rec["round"] <= self._records[-1]["round"]:
            raise ValueError(
                f"{where}: round {rec['round']} does not follow round {self._records[-1]['round']}"
            )
        self._begin_trackers()

        with open(self.metrics_path, "a", encoding="utf-8") as f:
            f.write(dump_line(rec))
            f.flush()
            os.fsync(f.fileno())
        self._records.append(rec)
        for tracker in self._trackers:
            tracker.log_round(rec)

    def _begin_trackers(self) -> None:
        """Once, with the rounds kept so far (a resumed run's): each backend starts from them."""
        if not self._trackers_begun:
            for tracker in self._trackers:
                tracker.begin(self.rounds)
            self._trackers_begun = True

    def _file_needs_rewrite(self) -> bool:
        """True if the file on disk is not exactly the kept records (e.g. a partial last line)."""
        expected = "".join(dump_line(r) for r in self._records)
        try:
            return self.metrics_path.read_text(encoding="utf-8") != expected
        except FileNotFoundError:
            return True

    def finish(
        self,
        *,
        status: str = "completed",
        error: str | None = None,
        reason: str | None = None,
        extra: dict | None = None,
        plot: bool = True,
    ) -> dict:
        """Write ``plot.png`` (if ``plot``) and then ``summary.json`` atomically; return the summary.

        ``extra`` keys are added last and may override computed fields (e.g. a resumed run's
        total ``wall_time_s``). ``reason`` says why the status is not "completed" (default: the
        ``error``). A plotting failure does not lose the summary: it is reported
        as ``plot_error`` in it. May be called again (e.g. from a ``finally`` block); the last
        call wins.
        """
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
        if self._pending_truncation and self._file_needs_rewrite():
            # resumed but nothing logged since: drop a partial last line left by a crash
            data = "".join(dump_line(r) for r in self._records).encode("utf-8")
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
        summary["reason"] = reason if reason is not None else error
        summary["error"] = error
        summary["config"] = self.config
        summary["resolved_config"] = self.resolved_config
        summary["data_fingerprint"] = self.data_fingerprint
        summary["versions"] = package_versions()
        summary["git"] = git_commit()
        summary["started_at"] = self._started_at
        summary["finished_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        if extra:
            summary.update(to_json(dict(extra), where="extra"))

        self._begin_trackers()
        if self._trackers:
            summary["tracking"] = {k: v for t in self._trackers for k, v in t.where().items()}
        if plot:
            try:
                plot_history(self._records, title_of(summary), self.plot_path)
            except Exception as exc:  # never lose the summary because of a plot
                summary["plot_error"] = f"{type(exc).__name__}: {exc}"

        summary = to_json(summary, where="summary")
        data = json.dumps(summary, indent=2, allow_nan=False, ensure_ascii=False) + "\n"
        atomic_write_bytes(self.summary_path, data.encode("utf-8"))
        files = [self.summary_path, self.metrics_path, self.out_dir / CHECKPOINT_FILE,
                 *([self.plot_path] if plot and "plot_error" not in summary else [])]
        for tracker in self._trackers:
            tracker.finish(summary, files)
        return summary
