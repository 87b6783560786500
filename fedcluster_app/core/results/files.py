"""The files of a run: what they must hold, JSON conversion, reading and validating them.

``metrics.jsonl`` holds one JSON object per round; required keys ``round``, ``time_step``,
``accuracy`` (mean client test accuracy in [0, 1], ``null`` when the round was not evaluated)
and ``num_clusters`` (the clusters in use); ``models_allocated`` and ``assignments`` (client ->
cluster) from the strategies; ``ari`` when the scenario has ground truth; any strategy-specific
key.
``summary.json`` holds the run-level totals and means (``recorder.py``). NaN and infinities are
never written: they become ``null``; NumPy scalars and arrays (anything with ``tolist()``) become
plain JSON. Standard library only: the server imports this on start-up.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
PLOT_FILE = "plot.png"
CHECKPOINT_FILE = "checkpoint.npz"   # written and read by core/server/checkpoint.py
LOCK_FILE = ".fedcluster.lock"       # one writer per run directory: core/run_lock.py
FLWR_LOG_FILE = "flwr.log"           # the SuperLink's log of a `flwr run` that failed
# what the tracking backends write into the run directory (core/results/tracking.py)
CSV_FILE = "metrics.csv"
TENSORBOARD_DIR = "tensorboard"
MLFLOW_DB = "mlflow.db"
MLFLOW_ARTIFACTS = "mlartifacts"
EXPORT_DIR = "export"                # export = true: the run's models (fedcluster_app/export.py)
#: the folders a run writes into its directory
RUN_DIRS = frozenset({TENSORBOARD_DIR, MLFLOW_ARTIFACTS, EXPORT_DIR})
#: every file a run writes into its directory, besides atomic writes' temporary files
#: (``.<name>.<hex>.tmp``) and the backups a resume's repair keeps (``metrics.jsonl.<time>.bak``)
RUN_FILES = frozenset({METRICS_FILE, SUMMARY_FILE, PLOT_FILE, CHECKPOINT_FILE, LOCK_FILE,
                       FLWR_LOG_FILE, CSV_FILE, TENSORBOARD_DIR,
                       MLFLOW_DB, MLFLOW_ARTIFACTS, EXPORT_DIR})

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
#: a run's ``status`` in summary.json: completed; degraded (it ran to the end but lost something
#: on the way, ``reason`` says what); failed (it stopped, ``error`` / ``reason`` say why);
#: interrupted (stopped by a signal, ``resume_command`` continues it)
STATUSES = ("completed", "degraded", "failed", "interrupted")
#: the statuses of a run that ran to its end: what is scored and never run again
FINISHED = STATUSES[:2]

# Optional per-round keys whose type the recorder checks when they are present.
_COUNT_KEYS = ("bytes_up", "bytes_down", "failures", "drifted_clients", "models_allocated")




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


def is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def check_round_record(rec: Any, where: str) -> None:
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
    if acc is not None and (not is_number(acc) or not 0.0 <= acc <= 1.0):
        raise ValueError(f"{where}: 'accuracy' must be null or a number in [0, 1], got {acc!r}")
    ari = rec.get("ari")
    if ari is not None and (not is_number(ari) or not -1.0 <= ari <= 1.0):
        raise ValueError(f"{where}: 'ari' must be null or a number in [-1, 1], got {ari!r}")
    for key in _COUNT_KEYS:
        v = rec.get(key)
        if v is not None and (not is_number(v) or v < 0):
            raise ValueError(f"{where}: {key!r} must be a non-negative number, got {v!r}")
    v = rec.get("round_time_s")
    if v is not None and (not is_number(v) or v < 0):
        raise ValueError(f"{where}: 'round_time_s' must be a non-negative number, got {v!r}")
    v = rec.get("train_loss")
    if v is not None and not is_number(v):
        raise ValueError(f"{where}: 'train_loss' must be null or a number, got {v!r}")


def normalise_counts(rec: dict) -> None:
    """Integral floats in count keys (e.g. 1.2e6 bytes) become ints."""
    for key in _COUNT_KEYS:
        v = rec.get(key)
        if isinstance(v, float) and v.is_integer():
            rec[key] = int(v)




def dump_line(rec: dict) -> str:
    return json.dumps(rec, allow_nan=False, ensure_ascii=False) + "\n"


def reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def read_metrics(path: Path, *, tolerate_partial_last_line: bool = False) -> list[dict]:
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
            rec = json.loads(line, parse_constant=reject_constant)
        except ValueError as exc:
            if tolerate_partial_last_line and i == last:
                break
            raise ValueError(f"{where}: malformed JSON ({exc})") from None
        check_round_record(rec, where)
        if records and rec["round"] <= records[-1]["round"]:
            raise ValueError(
                f"{where}: round {rec['round']} does not follow round {records[-1]['round']}"
            )
        records.append(rec)
    return records





def read_summary(run_dir: str | os.PathLike) -> dict | None:
    """The summary.json of ``run_dir`` as a dict, or None when there is none (or it is not a
    JSON object): for deciding what a directory holds, not for validating it (``load_run``)."""
    try:
        summary = json.loads((Path(run_dir) / SUMMARY_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) else None


def finished_run(run_dir: str | os.PathLike) -> str | None:
    """Why ``run_dir`` holds a run that a new run must not write over (a summary.json with a
    status; a non-empty metrics.jsonl or a checkpoint: a run that was stopped), or None."""
    run_dir = Path(run_dir)
    status = (read_summary(run_dir) or {}).get("status")
    if status in STATUSES:
        return f"its {SUMMARY_FILE} says status {status!r}"
    for name in (METRICS_FILE, CHECKPOINT_FILE):
        try:
            if (run_dir / name).stat().st_size > 0:
                return f"its {name} holds a run that stopped before its summary"
        except OSError:
            pass
    return None


def is_run_file(name: str) -> bool:
    """Whether ``name`` is a file a run writes into its directory (:data:`RUN_FILES`, an atomic
    write's temporary file, a resume's backup of ``metrics.jsonl``)."""
    return (name in RUN_FILES or (name.startswith(".") and name.endswith(".tmp"))
            or (name.startswith(f"{METRICS_FILE}.") and name.endswith(".bak")))


def _protected_dirs() -> dict[Path, str]:
    """Directories a run never writes into, whatever they hold."""
    repo = Path(__file__).resolve().parents[3]   # the checkout (or site-packages) above the package
    return {Path("/"): "the filesystem root", Path.home().resolve(): "your home folder",
            repo: "the repository root" if (repo / "pyproject.toml").is_file() else
            "the folder the package is installed in"}


def check_out_dir(out_dir: str | os.PathLike, *, overwrite: bool = False,
                  continuing: bool = False) -> None:
    """Refuse, before any file of the run is written (so a refusal changes nothing):

    - the filesystem root, the home folder and the repository root (``ValueError``);
    - a directory holding anything that is not a run's file (``FileExistsError`` naming them):
      a run never deletes or overwrites a file it did not write;
    - the directory of a finished run (``FileExistsError``), unless ``overwrite`` (replace it)
      or ``continuing`` (this run resumes that directory's checkpoint).

    The advice names only what can work: ``--resume`` when the directory has a checkpoint."""
    out_dir = Path(out_dir)
    try:
        out_dir.exists()
    except OSError as ex:   # e.g. a name over the file-name limit
        raise ValueError(f"--out {out_dir}: {ex.strerror}") from None
    what = _protected_dirs().get(out_dir.resolve())
    if what:
        raise ValueError(f"--out {out_dir} is {what}: a run writes its files into a directory of "
                         f"its own; choose one, e.g. --out {out_dir / 'runs' / 'my-run'}")
    if out_dir.exists() and not out_dir.is_dir():
        raise FileExistsError(f"--out {out_dir} is a file, not a directory; choose another --out")
    foreign = sorted(entry.name for entry in (out_dir.iterdir() if out_dir.is_dir() else ())
                     if not (is_run_file(entry.name) and (entry.is_file() or entry.name in
                                                          RUN_DIRS and entry.is_dir())))
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise FileExistsError(
            f"--out {out_dir} holds files that are not a run's ({shown}); a run never writes "
            f"over or deletes files it did not write: choose an empty or new directory, e.g. "
            f"--out {out_dir / 'run'}")
    why = None if overwrite or continuing else finished_run(out_dir)
    if why:
        resume = (f"--resume {out_dir} to continue that run, "
                  if (out_dir / CHECKPOINT_FILE).is_file() else "")
        raise FileExistsError(
            f"{out_dir} holds a finished run's results ({why}); a new run does not write over "
            f"them: pass --overwrite (run-config key overwrite = true) to replace them, "
            f"{resume}or choose another --out"
        )


def reconcile_metrics(out_dir: str | os.PathLike, checkpoint_round: int, *,
                      repair: bool = False) -> str | None:
    """Check a resumed directory's ``metrics.jsonl`` against its checkpoint: its first lines
    must be rounds 1..``checkpoint_round`` in order (a line cut short at the end by a crash is
    allowed). Lines past them (rounds the run logged after its last checkpoint, or a second
    writer's) are what a resume drops: with ``repair`` they are cut, the whole file first
    copied to ``metrics.jsonl.<UTC time>.bak``. Returns a note of what was (or will be) cut,
    None when nothing; raises ``ValueError`` naming the file and line when the checkpoint's
    rounds are not all there in order (the summary would be wrong)."""
    path = Path(out_dir) / METRICS_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        text = ""
    lines = text.splitlines(keepends=True)
    kept = 0
    for i, line in enumerate(lines):
        if kept == checkpoint_round:
            break
        try:
            rnd = json.loads(line, parse_constant=reject_constant).get("round")
        except (ValueError, AttributeError):
            rnd = None
        if rnd != kept + 1:
            raise ValueError(
                f"{path}, line {i + 1}: round {rnd!r} where the checkpoint's run has round "
                f"{kept + 1}: the file does not hold the checkpoint's rounds 1..{checkpoint_round} "
                f"in order, so a resumed run's summary would be wrong; restore the file, or start "
                f"the run again with --overwrite")
        kept += 1
    if kept < checkpoint_round:
        raise ValueError(f"{path} holds rounds 1..{kept}, but the checkpoint is after round "
                         f"{checkpoint_round}: rounds {kept + 1}..{checkpoint_round} are missing, "
                         f"so a resumed run's summary would be wrong; restore the file, or start "
                         f"the run again with --overwrite")
    extra = lines[kept:]
    if not extra:
        return None
    note = (f"{path}: {len(extra)} line(s) after round {checkpoint_round}, the checkpoint's, "
            f"dropped on resume")
    if repair:
        from datetime import datetime, timezone

        from fedcluster_app.core.atomic import atomic_write_bytes

        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
        backup = path.with_name(f"{METRICS_FILE}.{stamp}.bak")
        atomic_write_bytes(backup, text.encode("utf-8"))
        atomic_write_bytes(path, "".join(lines[:kept]).encode("utf-8"))
        note += f" (the file as it was: {backup.name})"
    return note


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
        summary = json.loads(text, parse_constant=reject_constant)
    except ValueError as exc:
        raise ValueError(f"{summary_path}: malformed JSON ({exc})") from None
    if not isinstance(summary, dict):
        raise ValueError(f"{summary_path}: expected a JSON object, got {type(summary).__name__}")
    missing = [k for k in REQUIRED_SUMMARY_KEYS if k not in summary]
    if missing:
        raise ValueError(f"{summary_path}: missing required key(s) {', '.join(missing)}")
    records = read_metrics(run_dir / METRICS_FILE)
    return summary, records
