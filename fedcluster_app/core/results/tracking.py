"""Where else a run is logged, beside its own files: MLflow, TensorBoard, a CSV file.

The run-config key ``tracking`` names the backends (comma-separated); the recorder
(``recorder.py``) is still the one place metrics are written: it hands each round record it
appends to ``metrics.jsonl`` to every tracker, and the summary and the run's files at the end.
Every backend mirrors ``metrics.jsonl``: a number of a round record is a metric at step
``round``; nested values (assignments, per-client accuracies) stay in the files (and in the
CSV, as JSON text).

* ``mlflow``: one MLflow run per run directory, named after it, in the experiment
  ``fedcluster``; the resolved config as parameters, strategy / scenario / seed / run directory
  as tags, the summary's numbers as metrics, ``summary.json``, ``metrics.jsonl``, the plot and the
  checkpoint as artefacts. ``tracking-uri`` is the store; "" = a local SQLite store in the run
  directory (``mlflow.db``, artefacts in ``mlartifacts/``), MLflow's own local backend, no
  server. Read it with ``MlflowClient(tracking_uri="sqlite:///RUN/mlflow.db")`` or ``mlflow ui
  --backend-store-uri sqlite:///RUN/mlflow.db``.
* ``tensorboard``: event files in ``RUN/tensorboard/`` (PyTorch's ``SummaryWriter``): every
  number of a round as a scalar, the config as hyper-parameters and text, the plot as an image.
* ``csv``: ``RUN/metrics.csv``, one row per round, one column per key of any round.

A resumed run rewrites each destination from the kept rounds (the MLflow run of the earlier
attempt is deleted, MLflow's soft delete), so none holds a round twice. Whether a backend is
installed and its URI answers is checked before round 1 (:func:`check`): a run never skips one
silently.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from fedcluster_app.core.atomic import atomic_write_bytes
from fedcluster_app.core.config import ConfigError
from fedcluster_app.core.results.files import (
    CSV_FILE,
    MLFLOW_ARTIFACTS,
    MLFLOW_DB,
    TENSORBOARD_DIR,
    is_number,
)
MLFLOW_EXPERIMENT = "fedcluster"
#: the tag that names an MLflow run's run directory (how a resumed run finds its earlier one)
RUN_DIR_TAG = "fedcluster.run_dir"
#: the Python package each backend needs (the extra ``fedcluster[tracking]`` installs them)
PACKAGES = {"mlflow": "mlflow", "tensorboard": "tensorboard"}
CONNECT_TIMEOUT_S = 5.0


def numbers(record: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of a round record (booleans, nulls and nested values left out)."""
    return {k: float(v) for k, v in record.items() if is_number(v) and k != "round"}


def local_mlflow_uri(out_dir: Path) -> str:
    return f"sqlite:///{(Path(out_dir) / MLFLOW_DB).resolve()}"


def check(backends: tuple[str, ...], uri: str) -> None:
    """Refuse (``ConfigError`` naming the key) a backend whose package is not installed, and
    an MLflow server that does not answer: before round 1, never a silent skip."""
    for name in backends:
        package = PACKAGES.get(name)
        if package and importlib.util.find_spec(package) is None:
            raise ConfigError(
                f"tracking = {name!r}: the {package} package is not installed in this "
                f"environment (pip install 'fedcluster[tracking]'), or drop {name} from tracking")
    if "mlflow" in backends and uri.strip():
        _check_uri(uri.strip())


def _check_uri(uri: str) -> None:
    parsed = urlparse(uri)
    if parsed.scheme in ("http", "https"):
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        try:
            with socket.create_connection((parsed.hostname or "", port), CONNECT_TIMEOUT_S):
                pass
        except OSError as exc:
            raise ConfigError(f"tracking-uri = {uri!r}: no MLflow server answers at "
                              f"{parsed.hostname}:{port} ({exc})") from None
    elif parsed.scheme == "sqlite":
        path = Path(uri.split(":///", 1)[-1]) if ":///" in uri else None
        if path is not None and not path.parent.is_dir():
            raise ConfigError(f"tracking-uri = {uri!r}: the directory {path.parent} does not "
                              f"exist")
    elif parsed.scheme in ("", "file"):
        raise ConfigError(f"tracking-uri = {uri!r}: MLflow's file store is retired; give a "
                          f"database (sqlite:///PATH/mlflow.db) or a server (http://HOST:PORT), "
                          f"or leave it \"\" for a local store in the run directory")


def open_trackers(backends: tuple[str, ...], uri: str, out_dir: Path, *, params: dict,
                  tags: dict[str, str]) -> list[Tracker]:
    """One tracker per backend, connected (errors name the key); nothing logged yet."""
    check(backends, uri)
    kinds = {"mlflow": MLflowTracker, "tensorboard": TensorBoardTracker, "csv": CsvTracker}
    return [kinds[name](Path(out_dir), uri=uri, params=params, tags=tags) for name in backends]


class Tracker:
    """What the recorder calls: :meth:`begin` once with the rounds already logged (a resumed
    run's kept rounds, else none), :meth:`log_round` per round, :meth:`finish` at the end."""

    name = ""

    def __init__(self, out_dir: Path, *, uri: str, params: dict, tags: dict[str, str]) -> None:
        self.out_dir, self.params, self.tags = out_dir, params, tags

    def begin(self, records: list[dict]) -> None:
        for rec in records:
            self.log_round(rec)

    def log_round(self, record: dict) -> None:
        raise NotImplementedError

    def finish(self, summary: dict, files: list[Path]) -> None:
        pass

    def where(self) -> dict[str, str]:
        """What summary.json says about this destination."""
        return {}


class CsvTracker(Tracker):
    """``metrics.csv`` (pandas), rewritten atomically each round: a key that first appears in a
    later round (``accuracy_next``) becomes a column like any other."""

    name = "csv"

    def __init__(self, out_dir: Path, **kwargs: Any) -> None:
        super().__init__(out_dir, **kwargs)
        self.path = out_dir / CSV_FILE
        self.records: list[dict] = []

    def begin(self, records: list[dict]) -> None:
        self.records = []
        super().begin(records)
        if not records:
            self._write()

    def log_round(self, record: dict) -> None:
        self.records.append(record)
        self._write()

    def _write(self) -> None:
        import pandas as pd

        rows = [{k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in r.items()}
                for r in self.records]
        # convert_dtypes: a count column with gaps stays integers (Int64), not 0.0, 1.0, ...
        table = pd.DataFrame(rows).convert_dtypes()
        atomic_write_bytes(self.path, table.to_csv(index=False).encode())

    def where(self) -> dict[str, str]:
        return {"csv": str(self.path)}


class TensorBoardTracker(Tracker):
    """Event files in ``RUN/tensorboard/``, flushed every round so TensorBoard follows it."""

    name = "tensorboard"

    def __init__(self, out_dir: Path, **kwargs: Any) -> None:
        super().__init__(out_dir, **kwargs)
        self.log_dir = out_dir / TENSORBOARD_DIR
        self.writer = None

    def begin(self, records: list[dict]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        shutil.rmtree(self.log_dir, ignore_errors=True)   # a resumed run writes them anew
        self.writer = SummaryWriter(log_dir=str(self.log_dir))
        self.writer.add_text("config", "\n".join(f"    {k} = {json.dumps(v)}"
                                                 for k, v in sorted(self.params.items())))
        super().begin(records)
        self.writer.flush()

    def log_round(self, record: dict) -> None:
        for key, value in numbers(record).items():
            self.writer.add_scalar(key, value, global_step=record["round"])
        self.writer.flush()

    def finish(self, summary: dict, files: list[Path]) -> None:
        from torch.utils.tensorboard.summary import hparams

        if self.writer is None:
            return
        final = {f"summary/{k}": float(v) for k, v in summary.items() if is_number(v)}
        step = int(summary.get("rounds") or 0)
        for key, value in final.items():
            self.writer.add_scalar(key, value, global_step=step)
        plain = {k: v for k, v in self.params.items() if isinstance(v, (bool, int, float, str))}
        for event in hparams(plain, {k: v for k, v in final.items() if "accuracy" in k}):
            self.writer.file_writer.add_summary(event)
        plot = next((f for f in files if f.suffix == ".png"), None)
        if plot is not None:
            import matplotlib.image as mpimg

            self.writer.add_image("plot", mpimg.imread(plot)[..., :3], global_step=step,
                                  dataformats="HWC")
        self.writer.close()
        self.writer = None

    def where(self) -> dict[str, str]:
        return {"tensorboard": str(self.log_dir)}


class MLflowTracker(Tracker):
    """One MLflow run per run directory (module docstring)."""

    name = "mlflow"

    def __init__(self, out_dir: Path, *, uri: str, **kwargs: Any) -> None:
        from mlflow.tracking import MlflowClient

        super().__init__(out_dir, uri=uri, **kwargs)
        self.uri = uri.strip() or local_mlflow_uri(out_dir)
        self.run_id: str | None = None
        if not uri.strip():
            out_dir.mkdir(parents=True, exist_ok=True)   # the local store's folder
        try:
            self.client = MlflowClient(tracking_uri=self.uri)
            found = self.client.get_experiment_by_name(MLFLOW_EXPERIMENT)
            self.experiment_id = found.experiment_id if found is not None else (
                self.client.create_experiment(MLFLOW_EXPERIMENT,
                                              artifact_location=self._artifact_location()))
        except Exception as exc:   # any failure to reach the store: refused before round 1
            raise ConfigError(f"tracking-uri = {self.uri!r}: MLflow cannot use this store "
                              f"({type(exc).__name__}: {exc})") from None

    def _artifact_location(self) -> str | None:
        """A SQLite store keeps its artefacts beside it (MLflow's default is ``./mlartifacts``
        of the current directory, wherever a run is started); a server decides itself."""
        if not self.uri.startswith("sqlite:///"):
            return None
        db = Path(self.uri[len("sqlite:///"):]).resolve()
        return (db.parent / MLFLOW_ARTIFACTS).as_uri()

    def begin(self, records: list[dict]) -> None:
        from mlflow.entities import Param

        run_dir = str(self.out_dir.resolve())
        earlier = self.client.search_runs(
            [self.experiment_id], filter_string=f"tags.`{RUN_DIR_TAG}` = '{run_dir}'")
        for run in earlier:   # this directory's earlier attempt (resumed) or replaced run
            self.client.delete_run(run.info.run_id)
        run = self.client.create_run(self.experiment_id, run_name=self.out_dir.name,
                                     tags={**self.tags, RUN_DIR_TAG: run_dir})
        self.run_id = run.info.run_id
        params = [Param(k, json.dumps(v) if not isinstance(v, str) else v)
                  for k, v in sorted(self.params.items())]
        for i in range(0, len(params), 100):   # MLflow takes at most 100 parameters a batch
            self.client.log_batch(self.run_id, params=params[i:i + 100])
        super().begin(records)

    def log_round(self, record: dict) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, int(record["round"])) for k, v in numbers(record).items()]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])

    def finish(self, summary: dict, files: list[Path]) -> None:
        from mlflow.entities import Metric, RunTag

        if self.run_id is None:
            return
        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[
            Metric(f"summary.{k}", float(v), now, 0) for k, v in summary.items() if is_number(v)],
            tags=[RunTag("status", str(summary.get("status")))])   # completed / degraded / failed
        for path in files:
            if path.is_file():
                self.client.log_artifact(self.run_id, str(path))
        status = "FAILED" if summary.get("status") == "failed" else "FINISHED"
        self.client.set_terminated(self.run_id, status=status)

    def where(self) -> dict[str, str]:
        return {"mlflow_uri": self.uri, **({"mlflow_run_id": self.run_id} if self.run_id else {})}


def log_export(summary: Mapping[str, Any], export_dir: Path) -> None:
    """Add a run's export (``export = true``) to its MLflow run's artefacts, under ``export/``.
    The export is written after the run's trackers have finished (it rebuilds the strategy from
    the final checkpoint), so it is added to the finished run here; nothing without MLflow."""
    where = summary.get("tracking") or {}
    if "mlflow_run_id" not in where:
        return
    from mlflow.tracking import MlflowClient

    MlflowClient(tracking_uri=where["mlflow_uri"]).log_artifacts(
        where["mlflow_run_id"], str(export_dir), artifact_path="export")
