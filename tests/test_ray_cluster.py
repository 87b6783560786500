"""`fedcluster run --engine ray` on an existing Ray cluster (a profile's ``ray-address``).

Flower 1.41 calls ``ray.init()`` without an address, so the launcher hands the address to the
simulation as ``RAY_ADDRESS`` (see ``launcher.simulation_env``). The slow test starts a one-node
cluster of its own and checks that the run's ClientApp actors ran on it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from fedcluster_app.cli import main
from fedcluster_app.core.results import load_run
from fedcluster_app.engine import run_inprocess
from fedcluster_app.launcher import (check_ray_address, free_port, profile, simulation_env,
                                     stop_process_group)
from tests.support import ROOT

QUICK = ROOT / "presets" / "quick.toml"
RAY = str(Path(sys.executable).parent / "ray")
SMALL = {"strategy": "fedavg", "num-clients": 4, "num-steps": 2}   # 4 rounds of 4 clients


def test_the_cluster_profile_names_a_ray_address():
    kind, settings = profile("cluster")
    assert kind == "simulation" and settings["ray-address"] == "auto"


def test_only_a_ray_address_attaches_the_simulation(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.9:6379")      # a stray one is not used
    monkeypatch.setenv("RAY_TMPDIR", "/tmp/mine")
    env = simulation_env(tmp_path)
    assert "RAY_ADDRESS" not in env and env["RAY_TMPDIR"] == str(tmp_path / "ray")
    env = simulation_env(tmp_path, "auto")
    # "auto" finds the cluster in the user's Ray temp dir, so that one is kept
    assert env["RAY_ADDRESS"] == "auto" and env["RAY_TMPDIR"] == "/tmp/mine"
    monkeypatch.delenv("RAY_TMPDIR")
    assert "RAY_TMPDIR" not in simulation_env(tmp_path, "127.0.0.1:6379")


def test_an_address_nothing_listens_on_is_refused_before_anything_starts(tmp_path, capsys):
    check_ray_address("auto")                                 # Ray resolves it itself
    port = free_port()
    with pytest.raises(ValueError, match=f"no Ray cluster answers at 127.0.0.1:{port}"):
        check_ray_address(f"127.0.0.1:{port}")
    out = tmp_path / "r"
    args = ["run", "--run-config", str(QUICK), "--out", str(out), "--ray-address",
            f"127.0.0.1:{port}"]
    assert main(args) == 2 and "--ray-address needs --engine ray" in capsys.readouterr().err
    assert main([*args, "--engine", "ray"]) == 2
    assert f"no Ray cluster answers at 127.0.0.1:{port}" in capsys.readouterr().err
    assert not out.exists()


# ------------------------------------------------------------------------------ slow
def _group(pgid: int) -> list[str]:
    """The live processes of process group ``pgid`` (a zombie has exited)."""
    ps = subprocess.run(["ps", "-eo", "pid,pgid,stat,args"], capture_output=True, text=True,
                        check=True)
    return [line for line in ps.stdout.splitlines()[1:]
            if line.split()[1] == str(pgid) and not line.split()[2].startswith("Z")]


@pytest.fixture
def ray_cluster():
    """A one-node Ray cluster (2 CPUs); yields its Ray temp dir's parent. ``ray start --block``
    runs in its own session, and Ray's GCS, raylet, agents and workers join its process group,
    so stopping that group by its PID stops this cluster and nothing else (``ray stop`` would
    stop every Ray on the machine)."""
    base = Path(tempfile.mkdtemp(prefix="fcr-", dir="/tmp"))   # Ray's socket paths stay short
    log = open(base / "head.log", "w")  # noqa: SIM115 (closed below)
    # Fixed default ports (client server 10001, agent 52365, dashboard 8265) would clash with
    # any other Ray on this machine. Ray 2.55 turns --node-ip-address=127.0.0.1 into this
    # machine's address and binds its GCS and raylet on all interfaces whatever the flags.
    head = subprocess.Popen(
        [RAY, "start", "--head", "--block", "--node-ip-address=127.0.0.1",
         f"--port={free_port()}", "--num-cpus=2", "--disable-usage-stats",
         "--include-dashboard=false", f"--dashboard-port={free_port()}",
         f"--ray-client-server-port={free_port()}",
         f"--dashboard-agent-listen-port={free_port()}", f"--temp-dir={base / 'ray'}"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        # `ray start` records the address once the node is up
        while not (base / "ray" / "ray_current_cluster").exists():
            assert head.poll() is None, (base / "head.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (base / "head.log").read_text()[-3000:]
            time.sleep(0.5)
        yield base
    finally:
        stop_process_group(head.pid, timeout=30)
        deadline = time.monotonic() + 30   # the head is gone; let its group finish exiting
        while _group(head.pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = _group(head.pid)
        if left:   # still there: SIGKILL the group (its PGID is the head's PID), then fail
            os.killpg(head.pid, signal.SIGKILL)
        log.close()
        shutil.rmtree(base, ignore_errors=True)
        assert not left, f"Ray processes left running: {left}"


@pytest.mark.slow
def test_a_run_attaches_to_an_existing_ray_cluster(ray_cluster, tmp_path):
    base = ray_cluster
    out = tmp_path / "ray"
    sets = [a for k, v in SMALL.items() if k != "strategy" for a in ("--set", f"{k}={v}")]
    # profile `cluster`: ray-address = "auto", i.e. the cluster `ray start` recorded in the
    # Ray temp dir (base/ray) of RAY_TMPDIR
    proc = subprocess.run(
        [sys.executable, "-m", "fedcluster_app.cli", "run", "--engine", "ray",
         "--federation", "cluster", "--strategy", SMALL["strategy"], "--run-config", str(QUICK),
         "--out", str(out), *sets],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "RAY_TMPDIR": str(base)},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[round   4/4 | step  2]" in proc.stdout
    summary, rounds = load_run(out)
    assert summary["status"] == "completed" and summary["failures"] == 0 and len(rounds) == 4
    # the same numbers as without Ray
    reference = run_inprocess({**SMALL, **_toml(QUICK), "out-dir": str(tmp_path / "inproc"),
                               "progress": False})
    _, ref_rounds = load_run(Path(reference["out_dir"]))
    assert [r["accuracy"] for r in rounds] == [r["accuracy"] for r in ref_rounds]

    # The actors ran on this cluster: its workers' logs name them. A Ray that Flower started
    # itself would have its own session (in the run's private temp dir), not this one.
    logs = base / "ray" / "session_latest" / "logs"
    actors = [p for p in logs.glob("worker-*.out") if ":actor_name:ClientAppActor" in p.read_text()]
    # client-resources-num-cpus = 1 on a 2-CPU cluster: a pool of two actors
    assert len(actors) == 2, sorted(p.name for p in logs.iterdir())
    assert list(logs.glob("python-core-driver-*.log"))       # Flower's simulation was the driver


@pytest.mark.slow
def test_the_bench_runs_its_matrix_on_an_existing_ray_cluster(ray_cluster, tmp_path):
    """`fedcluster bench --ray-address`: every run a Ray task on the cluster, the same rows as
    the local process pool makes."""
    base = ray_cluster
    matrix = ["--datasets", "mixture", "--shifts", "concept", "--patterns", "sudden",
              "--priors", "uniform", "--skip-static", "--strategies", "fedavg", "oracle",
              "--seeds", "0", "1", "--set", "num-steps=3", "--set", "rounds-per-step=1",
              "--set", "local-steps=3", "--set", "lr=0.03"]    # one fixed rate: no tuning runs
    proc = subprocess.run(
        [sys.executable, "-m", "fedcluster_app.cli", "bench", *matrix, "--ray-address", "auto",
         "--runs-dir", str(tmp_path / "ray-runs"), "--report", str(tmp_path / "ray.md")],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "RAY_TMPDIR": str(base)},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "4 to run on the Ray cluster at auto" in proc.stdout
    assert main(["bench", *matrix, "--runs-dir", str(tmp_path / "local-runs"),
                 "--report", str(tmp_path / "local.md")]) == 0

    def scores(name: str) -> list[tuple]:
        rows = [json.loads(line) for line in (tmp_path / name / "runs.jsonl").read_text()
                .splitlines()]
        return [(r["strategy"], r["seed"], r["status"], r["acc_current"], r["acc_next"])
                for r in rows]

    assert scores("ray") == scores("local")
    assert all(s[2] == "completed" for s in scores("ray"))
    # the bench attached to this cluster as a driver (a Ray it started itself would have a
    # session of its own elsewhere), so its tasks ran on the cluster's one node
    logs = base / "ray" / "session_latest" / "logs"
    assert list(logs.glob("python-core-driver-*.log")), sorted(p.name for p in logs.iterdir())


def _toml(path: Path) -> dict:
    import tomllib

    return tomllib.loads(path.read_text())
