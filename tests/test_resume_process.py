"""Kill the server process (SIGKILL) mid-run and resume it from its checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from fedcluster_app.core.results import load_run
from fedcluster_app.core.server.strategy import read_checkpoint
from tests.support import ROOT

pytestmark = pytest.mark.slow
ARGS = ["--scenario", "mixture-swap", "--set", "rounds-per-step=3",
        "--set", "local-steps=5", "--set", "samples-per-step=100", "--set", "test-samples=50",
        "--set", "checkpoint-every=2", "--set", "plot=false"]


def fedcluster(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "fedcluster_app.cli", "run", *args], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw)


def assignments(out: Path) -> dict[int, int]:
    meta, _ = read_checkpoint(out)
    return {c["cid"]: c["cluster"] for c in meta["clients"]}


# ifca: server state only; fedccfa: personal classifiers and anchors live on the clients, which
# die with the process (the checkpoint's copy of their context.state brings them back)
@pytest.mark.parametrize("strategy", ["ifca", "fedccfa"])
def test_killed_server_resumes_to_the_uninterrupted_result(tmp_path, strategy):
    full, crashed = tmp_path / "full", tmp_path / "crashed"
    args = ["--strategy", strategy, *ARGS]
    assert fedcluster(*args, "--out", str(full)).wait(timeout=600) == 0

    proc = fedcluster(*args, "--out", str(crashed))
    metrics = crashed / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:   # kill it after round 7 (checkpoint of round 6 on disk)
        if metrics.is_file() and len(metrics.read_text().splitlines()) >= 7:
            break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    _, partial = load_run_lenient(crashed)
    assert 7 <= len(partial) < 18
    checkpointed = read_checkpoint(crashed)[0]["round"]

    assert fedcluster("--resume", str(crashed)).wait(timeout=600) == 0   # all from the checkpoint
    summary, rounds = load_run(crashed)
    _, reference = load_run(full)
    assert summary["status"] == "completed"
    assert summary["resumed_after_round"] == checkpointed        # continued, not started again
    assert [r["round"] for r in rounds] == list(range(1, 19))
    assert assignments(crashed) == assignments(full)
    np.testing.assert_allclose([r["accuracy"] for r in rounds], [r["accuracy"] for r in reference],
                               atol=1e-9)


def load_run_lenient(out: Path) -> tuple[None, list[dict]]:
    """The killed run has no summary; read what metrics.jsonl holds."""
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return None, [json.loads(line) for line in lines if line.strip()]
