"""Bring your own model, strategy and device: run by import path, refused clearly when wrong."""

from __future__ import annotations

import logging
import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import RecordDict

from fedcluster_app import api, launcher
from fedcluster_app.cli import main
from fedcluster_app.core import models
from fedcluster_app.core.config import ConfigError, default_run_config, merge_overrides
from fedcluster_app.core.experiment import load_experiment
from fedcluster_app.core.plugins import module_files
from fedcluster_app.core.results import load_run
from fedcluster_app.core.client.stream_client import StreamClient
from fedcluster_app.engine import run_inprocess

MODEL = "tests.plugins.my_model:build"
STRATEGY = "tests.plugins.my_strategy:ServerStepFedAvg"


def _summary(fast_config, **kw) -> tuple[dict, list[dict]]:
    summary = run_inprocess(fast_config(**kw))
    return summary, load_run(Path(summary["out_dir"]))[1]


# ------------------------------------------------------------------------------ models
def test_a_users_model_trains_with_fedavg_and_its_batchnorm_buffers_travel(fast_config):
    summary, rounds = _summary(fast_config, strategy="fedavg", model=MODEL)
    assert summary["status"] == "completed" and summary["failures"] == 0
    # 4 classes (chance 0.25); from step 3 half the clients permute their labels, one model
    assert rounds[3]["accuracy"] > 0.9 and rounds[-1]["accuracy"] > 0.4
    exp = load_experiment(merge_overrides(default_run_config(), {"model": MODEL,
                                                                  "scenario": "mixture-swap"}))
    names = list(models.build_model(exp.spec, 0).state_dict())
    assert "features.2.running_mean" in names and len(models.weight_shapes(exp.spec)) == len(names)


def test_a_users_model_with_features_and_classifier_serves_the_personalised_strategies(
        fast_config):
    summary, _ = _summary(fast_config, strategy="fedrep", model=MODEL, **{"num-steps": 2})
    assert summary["status"] == "completed" and summary["failures"] == 0


def test_a_users_model_is_built_once_per_process_and_copied(tmp_path):
    """An 8-round FedCCFA run called the user's callable 165 times (once per message); now
    once, and ``build_model(spec, seed)`` still gives the seed's weights, in a module of its
    own."""
    from tests.plugins import counting_model

    models._constructed.cache_clear()
    counting_model.CALLS = 0
    summary = run_inprocess({"strategy": "fedccfa", "scenario": "digits-ccfa", "num-steps": 4,
                             "rounds-per-step": 2, "model": "tests.plugins.counting_model:build",
                             "progress": False, "plot": False, "out-dir": str(tmp_path / "run")})
    assert summary["status"] == "completed" and summary["rounds"] == 8
    assert counting_model.CALLS == 1
    spec = load_experiment(merge_overrides(default_run_config(), {
        "model": "tests.plugins.counting_model:build", "scenario": "digits-ccfa"})).spec
    a, b = models.build_model(spec, 7), models.build_model(spec, 7)
    assert a is not b and counting_model.CALLS == 2     # seed 7: built once, then copied
    direct = models._construct(spec, 7).state_dict()   # what building it anew gives
    for name, tensor in a.state_dict().items():
        assert torch.equal(tensor, b.state_dict()[name]) and torch.equal(tensor, direct[name])
    with torch.no_grad():
        next(a.parameters()).add_(1.0)                  # a copy is the caller's own
    again = models.build_model(spec, 7).state_dict()
    assert all(torch.equal(again[name], tensor) for name, tensor in direct.items())
    assert not torch.equal(models.build_model(spec, 8).state_dict()["classifier.weight"],
                           direct["classifier.weight"])


@pytest.mark.parametrize("path, message", [
    ("tests.plugins.my_model:wrong_output", r"outputs \(2, 5\) for a batch of 2, expected \(2, 4\)"),
    ("tests.plugins.my_model:not_a_module", "returned a str, expected a torch.nn.Module"),
    ("tests.plugins.my_model:uncopyable", "cannot be copied with copy.deepcopy"),
    ("tests.plugins.my_model:no_arguments", r"must accept \(input_shape, num_classes\)"),
    ("tests.plugins.my_model:missing", "has no attribute 'missing'"),
    ("tests.plugins.not_there:build", "cannot import module 'tests.plugins.not_there'"),
    ("mlp2", "model must be '', 'mlp', 'cnn' or 'package.module:callable'"),
])
def test_a_bad_model_is_refused_before_round_one_naming_the_key(path, message):
    with pytest.raises(ValueError, match=message) as info:
        load_experiment(merge_overrides(default_run_config(), {"model": path,
                                                               "scenario": "mixture-swap"}))
    assert str(info.value).startswith("model")


def test_personalised_strategies_refuse_a_model_without_the_two_parts():
    for name in ("fedccfa", "fedrep", "fedbabu"):
        with pytest.raises(ConfigError, match=f"{name} needs a `features` submodule"):
            api.make_strategy(name, model="tests.plugins.my_model:headless",
                              scenario="digits-swap")
    for name in ("fedavg", "flash"):
        api.make_strategy(name, model="tests.plugins.my_model:headless", scenario="digits-swap")


def test_any_strategy_that_declares_it_needs_the_two_parts_is_refused_before_round_one():
    class SplitFedAvg(api.FedAvg):
        needs_split_model = True

    exp = load_experiment(merge_overrides(default_run_config(), {
        "model": "tests.plugins.my_model:headless", "scenario": "digits-swap"}))
    with pytest.raises(ConfigError, match="fedavg needs a `features` submodule with parameters "
                                          "and a `classifier` submodule"):
        SplitFedAvg(exp)
    api.FedAvg(exp)


def test_the_numpy_kernel_serves_only_the_built_in_mlp(fast_config):
    """A user's model whose arrays have the built-in MLP's shapes (tanh, not ReLU) must not be
    trained by the NumPy ReLU kernel: FedDrift's torch and numpy engines then agree exactly."""
    from fedcluster_app.families.feddrift import client as fd_client

    rc = merge_overrides(default_run_config(), {"scenario": "circle2",
                                                "model": "tests.plugins.my_model:headless"})
    client = StreamClient(0, load_experiment(rc), state=RecordDict())
    weights = models.initial_weights(client.exp.spec, 0)
    assert not fd_client._use_numpy(client, {}, weights)
    builtin = StreamClient(0, load_experiment(merge_overrides(default_run_config(),
                                                              {"scenario": "circle2"})),
                           state=RecordDict())
    assert fd_client._use_numpy(builtin, {}, models.initial_weights(builtin.exp.spec, 0))


# -------------------------------------------------------------------------- strategies
def test_a_users_strategy_runs_with_its_typed_hyper_parameters(fast_config):
    strategy = api.make_strategy(STRATEGY, lr=0.5, scenario="mixture-swap")
    assert strategy.params.lr == 0.5 and strategy.name == "server-step-fedavg"
    full, full_rounds = _summary(fast_config, strategy=STRATEGY, **{"server-step.lr": 1.0})
    small, small_rounds = _summary(fast_config, strategy=STRATEGY, **{"server-step.lr": 0.05,
                                                                      "out-dir": full["out_dir"] + "-b"})
    fedavg, fedavg_rounds = _summary(fast_config, strategy="fedavg",
                                     **{"out-dir": full["out_dir"] + "-c"})
    assert full["status"] == small["status"] == "completed"
    # lr = 1 is FedAvg (up to float rounding); a small server step learns much more slowly
    assert np.allclose([r["accuracy"] for r in full_rounds],
                       [r["accuracy"] for r in fedavg_rounds], atol=0.03)
    assert small_rounds[2]["accuracy"] < full_rounds[2]["accuracy"] - 0.1


@pytest.mark.parametrize("overrides, message", [
    ({"server-step.lr": 5}, r"server-step.lr must be in \(0, 2\], got 5"),
    ({"server-step.lx": 1}, r"unknown run-config key 'server-step.lx' \(did you mean "
                            r"'server-step.lr'\?\); valid keys of server-step: server-step.lr"),
])
def test_a_users_strategy_settings_are_checked_like_the_built_in_ones(overrides, message):
    with pytest.raises(ConfigError, match=message):
        config = {"strategy": STRATEGY, **overrides}
        api.build_strategy(load_experiment(merge_overrides(api.run_config_defaults(config),
                                                           config), server=True))


def test_a_class_that_is_not_a_strategy_is_refused(tmp_path, capsys):
    rc = main(["run", "--strategy", "tests.plugins.my_strategy:NotAStrategy",
               "--out", str(tmp_path / "x")])
    assert rc == 2
    assert "not a subclass of fedcluster_app.api.ClusteredStrategy" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="or your own as 'package.module:Class'"):
        api.strategy_class("fedavgg")


def test_list_params_prints_a_users_strategy_table_for_pyproject(capsys):
    assert main(["list", "params", "--strategy", STRATEGY, "--toml"]) == 0
    table = tomllib.loads(capsys.readouterr().out)
    assert table == {"tool": {"flwr": {"app": {"config": {"server-step": {"lr": 1.0}}}}}}


def test_the_staged_app_carries_the_users_modules_and_strategy_table(tmp_path):
    app = launcher.stage_app(tmp_path / "app", {"strategy": STRATEGY, "model": MODEL,
                                                "dataset": ""})
    assert (app / "tests" / "plugins" / "my_model.py").is_file()
    assert (app / "tests" / "plugins" / "my_strategy.py").is_file()
    with (app / "pyproject.toml").open("rb") as fh:
        table = tomllib.load(fh)["tool"]["flwr"]["app"]["config"]["server-step"]
    assert table == {"lr": 1.0}
    assert module_files("numpy:array") == []                  # installed: nothing to ship


# ------------------------------------------------------------------------------ devices
def test_device_auto_falls_back_to_the_cpu_with_one_log_line(monkeypatch, caplog):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(models, "_fallback_logged", False)
    with caplog.at_level(logging.INFO, logger=models.__name__):
        assert models.resolve_device("auto") == "cpu"
        assert models.resolve_device("auto") == "cpu"
    assert [r.getMessage() for r in caplog.records].count(
        "device = auto: no GPU visible to this process, training on the CPU") == 1
    assert models.resolve_device("cpu") == "cpu"


def test_device_picks_the_gpu_the_process_is_given(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert models.resolve_device("auto") == "cuda:0"      # under Ray: the GPU of its share
    assert models.resolve_device("cuda") == "cuda:0"
    assert models.resolve_device("cuda:1") == "cuda:1"
    with pytest.raises(ValueError, match=r"device = 'cuda:2', but this process sees 2 GPU"):
        models.resolve_device("cuda:2")


def test_cuda_without_a_gpu_is_a_clear_error_before_round_one(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    rc = main(["run", "--set", "device=cuda", "--out", str(tmp_path / "x")])
    assert rc == 2 and not (tmp_path / "x").exists()
    assert "device = 'cuda', but this process sees no GPU" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="device must be 'auto', 'cpu', 'cuda' or 'cuda:N'"):
        load_experiment(merge_overrides(default_run_config(), {"device": "gpu"}))


def test_clients_train_on_the_resolved_device(fast_config):
    rc = merge_overrides(default_run_config(), {"scenario": "mixture-swap", "device": "cpu"})
    client = StreamClient(1, load_experiment(rc), state=RecordDict())
    assert client.device == "cpu"
    model = client.scratch(models.initial_weights(client.exp.spec, 0))
    assert next(model.parameters()).device.type == "cpu"


def test_fedcluster_run_with_a_users_model_and_dataset_in_process(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "--scenario", "dataset-permute", "--set", f"model={MODEL}",
                 "--set", "dataset=tests.plugins.my_data:load", "--set", "num-steps=4",
                 "--set", "rounds-per-step=2", "--set", "plot=false", "--out", str(out)]) == 0
    summary, rounds = load_run(out)
    assert summary["status"] == "completed" and summary["failures"] == 0
    assert summary["config"]["model"] == MODEL and len(rounds) == 8
    assert rounds[1]["accuracy"] > 0.9          # three separable blobs (chance 1/3) before the drift


def test_a_gpu_client_uses_deterministic_cudnn_unless_told_otherwise(monkeypatch):
    """Two FedCCFA runs on an H200 differed by 1.5e-8 with cuDNN's fastest algorithms and
    repeated bit for bit with its deterministic ones (docs/operations/performance.md, GPU)."""
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", False)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    models.prepare_device("cpu", True)                # the CPU: nothing to set
    assert torch.backends.cudnn.deterministic is False
    models.prepare_device("cuda:0", True)
    assert torch.backends.cudnn.deterministic is True and torch.backends.cudnn.benchmark is False
    models.prepare_device("cuda:1", False)
    assert torch.backends.cudnn.deterministic is False
    cfg = load_experiment(merge_overrides(default_run_config(), {"deterministic": "false"})).cfg
    assert cfg.deterministic is False


def test_feddrift_mlps_take_the_compiled_kernel_unless_a_gpu_is_asked_for():
    """On an H200 FedDrift's MLPs trained 2.4-6.4x faster in the CPU kernel than in PyTorch on
    the GPU: ``auto`` keeps them there; ``cuda`` is honoured."""
    from types import SimpleNamespace

    from fedcluster_app.core.config import TrainConfig
    from fedcluster_app.families.feddrift.client import _use_numpy

    spec = models.ModelSpec("mlp", (2,), 2, hidden=4)
    weights = models.initial_weights(spec, 0)

    def client(device, setting):
        return SimpleNamespace(device=device, exp=SimpleNamespace(
            spec=spec, cfg=SimpleNamespace(device=setting, train=TrainConfig())))

    assert _use_numpy(client("cpu", "auto"), {}, weights)
    assert _use_numpy(client("cuda:0", "auto"), {}, weights)
    assert not _use_numpy(client("cuda:0", "cuda"), {}, weights)
    assert _use_numpy(client("cpu", "cpu"), {}, weights)
    assert not _use_numpy(client("cpu", "auto"), {"fd.engine": "torch"}, weights)
    assert not _use_numpy(client("cpu", "auto"), {"prox-mu": 0.1}, weights)   # no proximal term
