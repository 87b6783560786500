"""A run's models out of the run: ``fedcluster export``, ``load_run`` (predict, route) and
``fedcluster predict``; the exported files load in a Python process without fedcluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from fedcluster_app.cli import main as cli
from fedcluster_app.core.server.checkpoint import read_checkpoint, write_checkpoint
from fedcluster_app.engine import InProcessGrid, run_inprocess
from fedcluster_app.export import export_run
from fedcluster_app.serving import load_run
from tests.support import FAST, ROOT

#: clients 2 (it drifts to the swapped concept at step 3) and 7 (it stays) never join the run
HELD_OUT = (2, 7)


class WithoutHeldOut(InProcessGrid):
    """Every client of the scenario but HELD_OUT runs as a node."""

    def __init__(self, run_config, num_nodes, **kw):
        ids = [c for c in range(num_nodes) if c not in HELD_OUT]
        super().__init__(run_config, len(ids), node_config=lambda i: {
            "partition-id": ids[i], "num-partitions": num_nodes}, **kw)


@pytest.fixture(scope="module")
def ifca_run(tmp_path_factory):
    """IFCA on the tests' fast scenario (K = 2, seed 0: the two concepts recovered), clients
    2 and 7 withheld, exported at the end by the run-config switch."""
    out = tmp_path_factory.mktemp("ifca") / "run"
    summary = run_inprocess({**FAST, "strategy": "ifca", "out-dir": str(out), "export": True,
                             "min-nodes": 8}, grid_cls=WithoutHeldOut)
    assert summary["status"] == "completed"
    return out


def test_the_run_config_switch_exports_every_cluster_model_with_its_manifest(ifca_run):
    manifest = json.loads((ifca_run / "export" / "manifest.json").read_text())
    assert manifest["strategy"] == "ifca" and manifest["finished"] is True
    assert manifest["model"] == {**manifest["model"], "kind": "mlp", "input_shape": [8],
                                 "num_classes": 4}
    assert manifest["classes"] == [0, 1, 2, 3]
    assert manifest["preprocessing"] == {"kind": "none"}      # generated inputs
    assert sorted(manifest["models"]) == ["0", "1"]
    members = {m: e["members"] for m, e in manifest["models"].items()}
    # the clients drifting to the swapped concept (0-4 but the withheld 2) share a cluster
    assert sorted(members.values()) == [[0, 1, 3, 4], [5, 6, 8, 9]]
    assert manifest["assignments"]["2"] is None and manifest["assignments"]["7"] is None
    assert manifest["versions"]["torch"] and manifest["versions"]["safetensors"]
    for entry in manifest["models"].values():
        assert (ifca_run / "export" / entry["state_dict"]).is_file()
        assert (ifca_run / "export" / entry["torchscript"]).is_file()


def test_exported_models_predict_as_load_run_in_a_process_without_fedcluster(ifca_run, tmp_path):
    run = load_run(ifca_run)
    scenario = run.run.exp.scenario
    x = np.concatenate([scenario.step_data(c, 6).x_test for c in (0, 5)])
    np.save(tmp_path / "x.npy", x)
    expected = {m: run.predict(x, client_id=c).tolist() for c, m in ((0, run.assignments[0]),
                                                                        (5, run.assignments[5]))}
    script = textwrap.dedent("""
        import json, sys
        import numpy as np, torch
        from safetensors.torch import load_file
        export = sys.argv[1]
        manifest = json.load(open(f"{export}/manifest.json"))
        x = torch.from_numpy(np.load(sys.argv[2]))
        out = {}
        for mid, entry in manifest["models"].items():
            scripted = torch.jit.load(f"{export}/{entry['torchscript']}")
            # the state_dict into the same MLP written in plain torch
            m = manifest["model"]
            net = torch.nn.Module()
            net.features = torch.nn.Sequential(torch.nn.Flatten(),
                torch.nn.Linear(m["input_shape"][0], m["hidden"]), torch.nn.ReLU())
            net.classifier = torch.nn.Linear(m["hidden"], m["num_classes"])
            net.load_state_dict(load_file(f"{export}/{entry['state_dict']}"))
            with torch.no_grad():
                a = scripted(x).argmax(1)
                b = net.classifier(net.features(x)).argmax(1)
            assert torch.equal(a, b)
            out[mid] = a.tolist()
        assert not any(name.startswith("fedcluster") for name in sys.modules)
        print(json.dumps(out))
    """)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", script, str(ifca_run / "export"),
                           str(tmp_path / "x.npy")], capture_output=True, text=True, env=env,
                          cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    for mid, labels in expected.items():
        assert got[str(mid)] == labels


def test_route_sends_withheld_clients_to_the_cluster_of_their_concept(ifca_run):
    run = load_run(ifca_run)
    scenario = run.run.exp.scenario
    home = {0: run.assignments[5], 1: run.assignments[0]}    # concept -> its cluster
    assert home[0] != home[1]
    for cid in HELD_OUT:
        data = scenario.step_data(cid, 6)
        route = run.route(data.x_train[:20], data.y_train[:20])
        assert route.model_id == home[data.concept], (cid, route.evidence)
        assert route.rule == "lowest loss"
        losses = route.evidence["losses"]
        assert losses[str(route.model_id)] == min(losses.values())
        # the model handed back is that cluster's
        with torch.no_grad():
            mine = route.model(torch.from_numpy(np.array(data.x_test))).argmax(1).numpy()
        assert (mine == run.predict(data.x_test, client_id=5 if data.concept == 0 else 0)).all()


def test_bad_inputs_are_clear_errors_naming_the_file(ifca_run, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=f"no checkpoint at {empty}/checkpoint.npz"):
        load_run(empty)
    corrupt = tmp_path / "corrupt" / "checkpoint.npz"
    corrupt.parent.mkdir()
    corrupt.write_bytes(b"not a zip")
    with pytest.raises(ValueError, match=f"checkpoint {corrupt} is corrupt"):
        export_run(corrupt.parent, tmp_path / "x")
    meta, models = read_checkpoint(ifca_run)
    old = tmp_path / "old" / "checkpoint.npz"
    write_checkpoint(old, {k: v for k, v in meta.items() if k != "config"}, models)
    with pytest.raises(ValueError, match=f"checkpoint {old} is of an older layout: its "
                                         "metadata lacks config"):
        load_run(old.parent)
    with pytest.raises(FileExistsError, match="holds an export already"):
        export_run(ifca_run, ifca_run / "export")

    run = load_run(ifca_run)
    x = np.zeros((5, 8), np.float32)
    with pytest.raises(ValueError, match=r"inputs of shape \(5, 3\) do not fit this run's "
                                         r"model: expected \(n, 8\)"):
        run.route(np.zeros((5, 3)), np.zeros(5, int))
    with pytest.raises(ValueError, match=r"labels \[4, 9\] are outside this run's classes 0..3"):
        run.route(x, np.array([0, 1, 4, 9, 2]))
    with pytest.raises(ValueError, match=r"labels must be this run's class indices 0..3, got "
                                         r"values such as 'setosa'"):
        run.route(x, np.array(["setosa"] * 5))
    with pytest.raises(ValueError, match=r"labels of shape \(4,\) for 5 inputs"):
        run.route(x, np.zeros(4, int))
    with pytest.raises(ValueError, match=r"client 12 is not in this run: its clients are 0..9"):
        run.predict(x, client_id=12)
    with pytest.raises(ValueError, match="client 2 is in no cluster at the end"):
        run.predict(x, client_id=2)


def test_the_command_line_exports_and_predicts(ifca_run, tmp_path, capsys):
    assert cli(["export", str(ifca_run), "--out", str(tmp_path / "exp")]) == 0
    assert "ifca: 2 cluster models (0, 1)" in capsys.readouterr().out
    run = load_run(ifca_run)
    data = run.run.exp.scenario.step_data(7, 6)
    np.savez(tmp_path / "new.npz", x=data.x_train[:30], y=data.y_train[:30])
    assert cli(["predict", str(ifca_run), "--data", f"npz:{tmp_path / 'new.npz'}",
                "--out", str(tmp_path / "p.csv")]) == 0
    out = capsys.readouterr().out
    assert f"routed to cluster {run.assignments[5]} (lowest loss)" in out
    rows = (tmp_path / "p.csv").read_text().splitlines()
    assert rows[0] == "row,prediction,label" and len(rows) == 31
    np.savez(tmp_path / "x.npz", x=data.x_test)
    assert cli(["predict", str(ifca_run), "--data", f"npz:{tmp_path / 'x.npz'}",
                "--client-id", "5", "--out", str(tmp_path / "p.jsonl")]) == 0
    lines = [json.loads(r) for r in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert [r["prediction"] for r in lines] == run.predict(data.x_test, client_id=5).tolist()
    assert cli(["predict", str(ifca_run), "--data", f"npz:{tmp_path / 'x.npz'}",
                "--out", str(tmp_path / "p.jsonl")]) == 2
    assert "has no labels, and routing a new client needs labelled samples" in \
        capsys.readouterr().err
    assert cli(["predict", str(ifca_run), "--data", f"npz:{tmp_path / 'x.npz'}",
                "--client-id", "5", "--out", str(tmp_path / "p.txt")]) == 2
    assert "expected a .csv or .jsonl file name" in capsys.readouterr().err
    assert cli(["export", str(tmp_path / "nothing"), "--out", str(tmp_path / "e")]) == 2
    assert "no checkpoint at" in capsys.readouterr().err


def test_a_tables_standardisation_is_saved_and_applied_to_raw_inputs(tmp_path, fast_config):
    import pandas as pd

    rng = np.random.default_rng(0)
    x = rng.normal([5.0, -3.0, 100.0], [2.0, 0.5, 30.0], size=(400, 3))
    y = (x[:, 0] > 5).astype(int) + 2 * (x[:, 2] > 100)
    pd.DataFrame({"a": x[:, 0], "b": x[:, 1], "c": x[:, 2], "label": y}).to_csv(
        tmp_path / "t.csv", index=False)
    cfg = fast_config(strategy="fedavg", scenario="dataset-permute",
                      dataset=f"csv:{tmp_path / 't.csv'}", out_dir=str(tmp_path / "run"),
                      num_clients=4, num_steps=2)
    run_inprocess(cfg)
    manifest = json.loads(export_run(tmp_path / "run", tmp_path / "exp").read_text())
    rule = manifest["preprocessing"]
    assert rule["kind"] == "standardise"
    # the train split's statistics (75% of the rows, drawn from the data seed)
    assert np.allclose(rule["mean"], x.mean(0), rtol=0.05)
    assert np.allclose(rule["std"], x.std(0), rtol=0.1)
    run = load_run(tmp_path / "run")
    raw = x[:50]
    model_inputs = (raw.astype(np.float32) - np.float32(rule["mean"])) / np.float32(rule["std"])
    assert (run.predict(raw, client_id=0) ==
            run.predict(model_inputs, client_id=0, raw=False)).all()


@pytest.mark.parametrize("strategy", ["local", "fedccfa"])
def test_personal_parts_are_exported_and_predict_where_the_checkpoint_holds_them(
        strategy, fast_config, tmp_path):
    from fedcluster_app.core.models import build_model
    from fedcluster_app.core.training import predict_proba
    from fedcluster_app.families.fedccfa.client import STATE_CLASSIFIER

    run_inprocess(fast_config(strategy=strategy, out_dir=str(tmp_path / "run"), num_steps=2))
    manifest = json.loads(export_run(tmp_path / "run", tmp_path / "exp").read_text())
    record = "personal-model" if strategy == "local" else STATE_CLASSIFIER
    assert sorted(manifest["personal"]) == [str(c) for c in range(10)]
    assert all(record in parts for parts in manifest["personal"].values())
    run = load_run(tmp_path / "run")
    data = run.run.exp.scenario.step_data(4, 2)
    from safetensors.torch import load_file

    own = load_file(tmp_path / "exp" / manifest["personal"]["4"][record])   # sorted by name
    state = dict(run.models[0].state_dict()) if strategy == "fedccfa" else {}
    if strategy == "fedccfa":   # the global model with client 4's classifier
        assert set(own) == {"classifier.weight", "classifier.bias"}
    state.update(own)
    names = build_model(run.run.exp.spec, 0).state_dict()
    net = run.run.model([state[k].numpy() for k in names])
    with torch.no_grad():
        expected = predict_proba([net], [1.0], data.x_test).numpy().argmax(1)
    assert (run.predict(data.x_test, client_id=4) == expected).all()
    # without the clients' state the checkpoint cannot say what a client predicts with
    run_inprocess(fast_config(strategy=strategy, out_dir=str(tmp_path / "bare"), num_steps=2,
                              checkpoint_client_state=False))
    with pytest.raises(ValueError, match="does not hold client 4's .*checkpoint-client-state"):
        load_run(tmp_path / "bare").predict(data.x_test, client_id=4)


def test_the_personal_record_names_are_the_clients_own():
    from fedcluster_app.core.client.stream_client import PERSONAL_KEY
    from fedcluster_app.export import PERSONAL_CLASSIFIER, PERSONAL_MODEL
    from fedcluster_app.families.fedccfa.client import STATE_CLASSIFIER

    assert PERSONAL_MODEL == PERSONAL_KEY and STATE_CLASSIFIER.endswith(PERSONAL_CLASSIFIER)


def test_a_tables_class_names_are_saved_and_read_back(tmp_path, capsys):
    """The README's table of users (class names numbered in sorted order): the manifest names
    the classes, and raw rows of the file predict and route with their own labels."""
    table = ROOT / "examples" / "data" / "iris_users.csv"
    run_inprocess({"strategy": "fedavg", "scenario": "dataset-static", "dataset": f"csv:{table}",
                   "label-column": "species", "partition-column": "user",
                   "remap-labels": True, "rounds-per-step": 2, "num-steps": 2,
                   "progress": False, "plot": False, "out-dir": str(tmp_path / "run")})
    manifest = json.loads(export_run(tmp_path / "run", tmp_path / "exp").read_text())
    assert manifest["class_names"] == ["setosa", "versicolor", "virginica"]
    assert manifest["preprocessing"]["kind"] == "standardise"
    assert len(manifest["preprocessing"]["mean"]) == 4            # not the user column
    run = load_run(tmp_path / "run")
    assert run.labels(np.array(["virginica", "setosa"])).tolist() == [2, 0]
    with pytest.raises(ValueError, match=r"labels 'rose' are not among this run's classes"):
        run.labels(np.array(["rose", "setosa"]))
    assert cli(["predict", str(tmp_path / "run"), "--data", f"csv:{table}", "--client-id", "0",
                "--out", str(tmp_path / "p.csv")]) == 0
    accuracy = float(capsys.readouterr().out.split("accuracy on the given labels: ")[1].split()[0])
    assert accuracy > 0.5
    rows = (tmp_path / "p.csv").read_text().splitlines()
    assert rows[0] == "row,prediction,class,label"
    assert rows[1].split(",")[3] == "setosa" and rows[1].split(",")[2] in manifest["class_names"]
    assert cli(["predict", str(tmp_path / "run"), "--data", f"csv:{table}",
                "--out", str(tmp_path / "r.csv")]) == 0
    assert "routed to cluster 0 (lowest loss)" in capsys.readouterr().out


def test_a_model_that_does_not_trace_is_exported_without_torchscript_and_says_why(tmp_path):
    from fedcluster_app.export import _torchscript

    class Branchy(torch.nn.Module):          # the branch taken depends on the data
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(4, 2), torch.nn.Linear(4, 2)

        def forward(self, x):
            return self.a(x) if float(x.sum()) > 0 else self.b(x)

    entry = _torchscript(Branchy().eval(), torch.ones((1, 4)), tmp_path, "m.pt")
    assert entry["torchscript"] is None and "outputs differ" in entry["torchscript_skipped"]
    assert not (tmp_path / "m.pt").exists()
    entry = _torchscript(torch.nn.Linear(4, 2).eval(), torch.ones((1, 4)), tmp_path, "m.pt")
    assert entry == {"torchscript": "m.pt"} and (tmp_path / "m.pt").is_file()
