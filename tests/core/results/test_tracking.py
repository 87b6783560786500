"""Tracking (run-config ``tracking``): what MLflow's store, TensorBoard's event files and
metrics.csv hold, read back with each tool's own reader, equals metrics.jsonl; a backend that
cannot be used refuses the run before round 1."""

from __future__ import annotations

import json
import math
import socket
from pathlib import Path

import pytest

from fedcluster_app.core.config import ConfigError
from fedcluster_app.core.results import load_run, tracking
from fedcluster_app.engine import run_inprocess
from tests.core.server.test_checkpoint import CrashingGrid
from tests.support import FAST

ALL = "mlflow,tensorboard,csv"


def numbers_by_key(records: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """key -> [(round, value)] of every number of metrics.jsonl (what a tracker logs)."""
    out: dict[str, list[tuple[int, float]]] = {}
    for r in records:
        for k, v in tracking.numbers(r).items():
            out.setdefault(k, []).append((r["round"], v))
    return out


def mlflow_client(out: Path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking.local_mlflow_uri(out))


def mlflow_history(client, run_id: str, keys) -> dict[str, list[tuple[int, float]]]:
    return {k: sorted((m.step, m.value) for m in client.get_metric_history(run_id, k))
            for k in keys}


def tensorboard_scalars(log_dir: Path) -> tuple[dict[str, list[tuple[int, float]]], object]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}, acc


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory):
    """One seeded run logged to every backend (module-scoped: each test reads it)."""
    out = tmp_path_factory.mktemp("tracked") / "run"
    summary = run_inprocess({**FAST, "out-dir": str(out), "plot": True, "tracking": ALL})
    return out, summary, load_run(out)[1]


def test_mlflow_store_holds_metrics_jsonl_config_and_artefacts(tracked_run):
    out, summary, records = tracked_run
    expected = numbers_by_key(records)
    assert {"accuracy", "train_loss", "num_clusters", "ari", "bytes_up", "drifted_clients"} <= set(
        expected)
    client = mlflow_client(out)
    run_id = summary["tracking"]["mlflow_run_id"]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == out.name
    assert mlflow_history(client, run_id, expected) == expected      # every value, exactly
    logged = set(run.data.metrics)
    assert {k for k in logged if not k.startswith("summary.")} == set(expected)
    assert run.data.metrics["summary.mean_accuracy"] == summary["mean_accuracy"]
    # the resolved config as parameters (strings), e.g. the scenario's own sample count
    params = run.data.params
    assert params["samples-per-step"] == "100" and params["num-clients"] == "10"
    assert params["hidden"] == str(summary["resolved_config"]["hidden"]) != "0"
    assert len(params) == len(summary["resolved_config"])
    assert run.data.tags["strategy"] == "ifca" and run.data.tags["seed"] == "0"
    assert run.data.tags["status"] == "completed"
    assert {f.path for f in client.list_artifacts(run_id)} == {
        "summary.json", "metrics.jsonl", "plot.png", "checkpoint.npz"}
    # the local store lies in the run directory, its artefacts beside it: no server, no cwd file
    assert summary["tracking"]["mlflow_uri"] == f"sqlite:///{(out / 'mlflow.db').resolve()}"
    assert (out / "mlartifacts").is_dir() and not Path("mlartifacts").exists()


def test_tensorboard_event_files_hold_metrics_jsonl(tracked_run):
    out, summary, records = tracked_run
    expected = numbers_by_key(records)
    scalars, acc = tensorboard_scalars(out / "tensorboard")
    per_round = {k: v for k, v in scalars.items() if not k.startswith("summary/")}
    assert set(per_round) == set(expected)
    for key, points in expected.items():   # TensorBoard keeps 32-bit floats
        got = per_round[key]
        assert [s for s, _ in got] == [s for s, _ in points], key
        assert [v for _, v in got] == pytest.approx([v for _, v in points], rel=1e-6), key
    assert scalars["summary/final_accuracy"][0][1] == pytest.approx(summary["final_accuracy"])
    assert "plot" in acc.Tags()["images"]
    text = acc.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert 'samples-per-step = 100' in text and 'strategy = "ifca"' in text


def test_csv_holds_metrics_jsonl(tracked_run):
    import pandas as pd

    out, _, records = tracked_run
    table = pd.read_csv(out / "metrics.csv")
    assert len(table) == len(records)
    for row, rec in zip(table.to_dict("records"), records):
        for key, value in rec.items():
            cell = row[key]
            if isinstance(value, (dict, list)):
                assert json.loads(cell) == value, key
            elif value is None:
                assert isinstance(cell, float) and math.isnan(cell), key
            else:
                assert cell == pytest.approx(value, rel=1e-12), key
        assert all(isinstance(row[k], float) and math.isnan(row[k]) for k in row if k not in rec)


def test_a_resumed_run_leaves_each_destination_with_every_round_once(fast_config, tmp_path):
    """The server dies in round 7 after the checkpoint of round 4; resumed, the earlier MLflow
    run is deleted and one run holds rounds 1-12 once, as do the event files and the CSV."""
    out = tmp_path / "crashed"
    cfg = fast_config(out_dir=str(out), checkpoint_every=4, tracking=ALL)
    with pytest.raises(RuntimeError, match="server crashed"):
        run_inprocess(cfg, grid_cls=CrashingGrid)
    client = mlflow_client(out)
    (first,) = client.search_runs([client.get_experiment_by_name("fedcluster").experiment_id])
    assert first.info.status == "FAILED"
    assert [m.step for m in client.get_metric_history(first.info.run_id, "accuracy")] == [
        1, 2, 3, 4, 5, 6]

    summary = run_inprocess(cfg | {"resume-from": str(out)})
    records = load_run(out)[1]
    expected = numbers_by_key(records)
    assert [r for r, _ in expected["accuracy"]] == list(range(1, 13))
    live = client.search_runs([first.info.experiment_id])
    assert [r.info.run_id for r in live] == [summary["tracking"]["mlflow_run_id"]]
    assert client.get_run(first.info.run_id).info.lifecycle_stage == "deleted"
    assert mlflow_history(client, live[0].info.run_id, expected) == expected
    scalars, _ = tensorboard_scalars(out / "tensorboard")
    assert [s for s, _ in scalars["accuracy"]] == list(range(1, 13))
    import pandas as pd

    assert pd.read_csv(out / "metrics.csv")["round"].tolist() == list(range(1, 13))


def test_a_tracking_uri_is_where_mlflow_logs(fast_config, tmp_path, monkeypatch):
    """A shared SQLite store gets the run, its artefacts beside it: nothing in the run
    directory's own store, nothing in the current directory."""
    store, cwd = tmp_path / "team", tmp_path / "cwd"
    store.mkdir()
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    uri = f"sqlite:///{store / 'mlflow.db'}"
    summary = run_inprocess(fast_config(tracking="mlflow", tracking_uri=uri))
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    run_id = summary["tracking"]["mlflow_run_id"]
    run = client.get_run(run_id)
    assert run.data.metrics["accuracy"] == load_run(summary["out_dir"])[1][-1]["accuracy"]
    assert "summary.json" in {f.path for f in client.list_artifacts(run_id)}
    assert (store / "mlartifacts").is_dir()
    assert not (Path(summary["out_dir"]) / "mlflow.db").exists()
    assert list(cwd.iterdir()) == []


# ------------------------------------------------------------------------------- bad input
def test_an_unknown_backend_is_refused_with_the_valid_ones(fast_config):
    with pytest.raises(ConfigError, match=r"tracking: unknown backend 'mlfow' \(did you mean "
                                          r"'mlflow'\?\); valid: mlflow, tensorboard, csv"):
        run_inprocess(fast_config(tracking="csv, mlfow"))


def test_a_tracking_uri_without_mlflow_is_refused(fast_config):
    with pytest.raises(ConfigError, match="tracking-uri = 'http://x:5000' is MLflow's and "
                                          "would be ignored"):
        run_inprocess(fast_config(tracking="csv", tracking_uri="http://x:5000"))


def test_a_backend_not_installed_refuses_the_run_before_round_1(fast_config, tmp_path,
                                                                monkeypatch):
    real = tracking.importlib.util.find_spec
    monkeypatch.setattr(tracking.importlib.util, "find_spec",
                        lambda name, *a: None if name == "tensorboard" else real(name, *a))
    cfg = fast_config(tracking="csv,tensorboard")
    with pytest.raises(ConfigError, match=r"tracking = 'tensorboard': the tensorboard package "
                                          r"is not installed .*fedcluster\[tracking\]"):
        run_inprocess(cfg)
    assert not Path(cfg["out-dir"]).exists()          # nothing written


def test_an_mlflow_server_that_does_not_answer_refuses_the_run_before_round_1(fast_config):
    with socket.socket() as s:   # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = fast_config(tracking="mlflow", tracking_uri=f"http://127.0.0.1:{port}")
    with pytest.raises(ConfigError, match=rf"tracking-uri = 'http://127.0.0.1:{port}': no "
                                          rf"MLflow server answers at 127.0.0.1:{port}"):
        run_inprocess(cfg)
    assert not Path(cfg["out-dir"]).exists()


def test_the_cli_refuses_a_bad_backend_with_exit_2(tmp_path, capsys):
    from fedcluster_app.cli import main

    code = main(["run", "--out", str(tmp_path / "r"), "--set", "tracking=tensorbord"])
    assert code == 2
    assert "did you mean 'tensorboard'?" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("uri, why", [
    ("file:///tmp/mlruns", "MLflow's file store is retired"),
    ("./mlruns", "MLflow's file store is retired"),
    ("sqlite:////no/such/folder/mlflow.db", "the directory /no/such/folder does not exist"),
])
def test_a_tracking_uri_mlflow_cannot_use_is_refused(uri, why):
    with pytest.raises(ConfigError, match=f"tracking-uri = {uri!r}: {why}"):
        tracking.check(("mlflow",), uri)


def test_a_server_that_is_not_mlflow_refuses_the_run_before_round_1(fast_config):
    """Something answers at the URI, but not MLflow's API: refused, naming the key."""
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    uri = f"http://127.0.0.1:{server.server_address[1]}"
    cfg = fast_config(tracking="mlflow", tracking_uri=uri)
    try:
        with pytest.raises(ConfigError, match=f"tracking-uri = '{uri}': MLflow cannot use this "
                                              f"store .*404"):
            run_inprocess(cfg)
    finally:
        server.shutdown()
        server.server_close()
    assert not Path(cfg["out-dir"]).exists()          # nothing written


def test_an_exported_run_logs_its_models_as_mlflow_artefacts(fast_config):
    """export = true: the exported models and manifest join the run's MLflow artefacts."""
    cfg = fast_config(**{"num-steps": 2, "tracking": "mlflow", "export": True})
    summary = run_inprocess(cfg)
    out = Path(cfg["out-dir"])
    client = mlflow_client(out)
    logged = {a.path for a in client.list_artifacts(summary["tracking"]["mlflow_run_id"],
                                                    "export")}
    assert "export/manifest.json" in logged and "export/models" in logged
    assert (out / "export" / "manifest.json").is_file()
