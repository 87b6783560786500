"""End to end through `flwr run` on Ray (slow: Ray starts in 15-20 s)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fedcluster_app.core.results import load_run
from fedcluster_app.engine import run_inprocess
from tests.support import ROOT, fedcluster, superlinks

pytestmark = pytest.mark.slow
QUICK = ROOT / "presets" / "quick.toml"
FEDRC = ROOT / "presets" / "fedrc-shifts3.toml"
CASES = {
    # strategy: (preset, extra run-config keys, the last round line, metrics compared)
    "ifca": (QUICK, {}, "[round  12/12 | step  6]", ("accuracy", "ari")),
    # FedRC's own message kinds (train.fedrc, evaluate.fedrc) and held-out test clients
    "fedrc": (FEDRC, {"num-clients": 6, "rounds-per-step": 3}, "[round   3/3 | step  1]",
              ("accuracy", "global_accuracy", "concept_cluster_mass")),
}


@pytest.mark.parametrize("strategy", sorted(CASES))
def test_flwr_run_on_ray_gives_the_inprocess_metrics(tmp_path, strategy):
    preset, extra, last_line, keys = CASES[strategy]
    before = superlinks()
    out = tmp_path / "ray"
    sets = [a for k, v in extra.items() for a in ("--set", f"{k}={v}")]
    proc = fedcluster("run", "--engine", "ray", "--strategy", strategy, "--run-config", str(preset),
                      "--out", str(out), *sets)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert last_line in proc.stdout                        # the per-round lines reach the user
    summary, rounds = load_run(out)
    assert summary["status"] == "completed"

    reference = run_inprocess({**_toml(preset), **extra, "strategy": strategy,
                               "out-dir": str(tmp_path / "inproc"), "progress": False})
    _, ref_rounds = load_run(Path(reference["out_dir"]))
    assert len(rounds) == len(ref_rounds)
    for key in keys:
        assert [r.get(key) for r in rounds] == [r.get(key) for r in ref_rounds], key
    assert superlinks() <= before                          # the SuperLink it started is gone


PLUGINS = {"strategy": "tests.plugins.my_strategy:ServerStepFedAvg", "server-step.lr": 0.9,
           "model": "tests.plugins.my_model:build", "scenario": "dataset-permute",
           "dataset": "tests.plugins.my_data:load", "num-steps": 4, "rounds-per-step": 2,
           "local-steps": 5, "samples-per-step": 60, "test-samples": 30}


def test_a_users_model_data_and_strategy_run_on_ray_as_in_process(tmp_path):
    """The user's modules under tests/ reach the Ray workers inside the staged app; the user's
    strategy's table reaches `flwr run`, which accepts only declared keys."""
    out = tmp_path / "ray"
    sets = [a for k, v in PLUGINS.items() if k != "strategy" for a in ("--set", f"{k}={v}")]
    proc = fedcluster("run", "--engine", "ray", "--strategy", PLUGINS["strategy"],
                      "--out", str(out), *sets)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary, rounds = load_run(out)
    assert summary["status"] == "completed" and summary["failures"] == 0
    assert summary["strategy"] == "server-step-fedavg" and len(rounds) == 8
    reference = run_inprocess({**PLUGINS, "out-dir": str(tmp_path / "inproc"), "progress": False})
    _, ref_rounds = load_run(Path(reference["out_dir"]))
    assert [r["accuracy"] for r in rounds] == [r["accuracy"] for r in ref_rounds]
    assert max(r["accuracy"] for r in rounds) > 0.8          # 3 blobs: chance is 1/3


def test_a_run_refused_before_ray_starts_exits_2(tmp_path):
    # a checkpoint that is not there is refused before Ray starts and before anything is
    # written (exit 2: refused)
    proc = fedcluster("run", "--engine", "ray", "--run-config", str(QUICK), "--out",
                      str(tmp_path / "x"), "--set", f'resume-from="{tmp_path / "missing"}"')
    assert proc.returncode == 2
    assert f"no checkpoint at {tmp_path / 'missing'}" in proc.stderr
    assert not (tmp_path / "x").exists()


def _toml(path: Path) -> dict:
    import tomllib

    return tomllib.loads(path.read_text())


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_stops_every_process_of_a_ray_run_and_marks_it_interrupted(tmp_path, sig):
    """SIGINT / SIGTERM to `fedcluster run --engine ray` stop the whole tree it started (the
    SuperLink, its SuperExec and the simulation run in sessions of their own; Ray's processes
    under the simulation), by PID; summary.json says "interrupted" with the resume command."""
    import json
    import signal
    import time

    from fedcluster_app.core.server.checkpoint import read_checkpoint
    from fedcluster_app.launcher import process_tree

    out = tmp_path / "ray"
    proc = subprocess.Popen(
        [sys.executable, "-m", "fedcluster_app.cli", "run", "--engine", "ray", "--run-config",
         str(QUICK), "--set", "rounds-per-step=300", "--set", "checkpoint-every-s=1",
         "--out", str(out)], cwd=ROOT, text=True, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 240
    while True:   # running rounds, with a checkpoint
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no checkpoint in time"
        try:
            if read_checkpoint(out)[0]["round"] >= 2:
                break
        except (FileNotFoundError, ValueError, KeyError):
            pass
        time.sleep(0.2)
    tree = process_tree(proc.pid)

    def command(pid: int) -> str:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            return ""

    commands = " | ".join(command(p) for p in tree)
    for name in ("flower-superlink", "flwr-simulation", "raylet"):   # the tree is the run's
        assert name in commands, commands
    proc.send_signal(getattr(signal, sig))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + getattr(signal, sig), err[-3000:]
    time.sleep(1)
    left = [(p, command(p)) for p in tree if Path(f"/proc/{p}").exists()
            and Path(f"/proc/{p}/stat").read_text().split(")")[-1].split()[0] != "Z"]
    assert left == []
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted", summary
    assert summary["resume_command"] == f"fedcluster run --resume {out}"
    assert f"stopped by {sig}" in summary["reason"]
    assert err.strip().splitlines()[-1].endswith(f"continue it with: fedcluster run --resume {out}")
    with open(out / ".fedcluster.lock") as fh:   # released
        import fcntl

        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
