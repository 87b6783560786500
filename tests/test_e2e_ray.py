"""End to end through `flwr run` on Ray (slow: Ray starts in 15-20 s)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fedcluster_app.engine import run_inprocess
from fedcluster_app.results import load_run

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent
QUICK = ROOT / "presets" / "quick.toml"


def fedcluster(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedcluster_app.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, check=False)


def superlinks() -> set[str]:
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=True)
    return {line.split()[0] for line in ps.stdout.splitlines() if "flower-superlink" in line}


def test_flwr_run_on_ray_gives_the_inprocess_metrics(tmp_path):
    before = superlinks()
    out = tmp_path / "ray"
    proc = fedcluster("run", "--engine", "ray", "--strategy", "ifca", "--run-config", str(QUICK),
                      "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[round  12/12 | step  6]" in proc.stdout      # the per-round lines reach the user
    summary, rounds = load_run(out)
    assert summary["status"] == "completed" and len(rounds) == 12

    reference = run_inprocess({"strategy": "ifca", "out-dir": str(tmp_path / "inproc"),
                               "progress": False, **_toml(QUICK)})
    _, ref_rounds = load_run(Path(reference["out_dir"]))
    assert [r["accuracy"] for r in rounds] == [r["accuracy"] for r in ref_rounds]
    assert [r["ari"] for r in rounds] == [r["ari"] for r in ref_rounds]
    assert superlinks() <= before                          # the SuperLink it started is gone


def test_a_failed_run_exits_non_zero(tmp_path):
    proc = fedcluster("run", "--engine", "ray", "--run-config", str(QUICK), "--out",
                      str(tmp_path / "x"), "--set", f'resume-from="{tmp_path / "missing"}"')
    assert proc.returncode == 1
    assert "run failed" in proc.stderr and "finished:failed" in proc.stderr
    assert json.loads((tmp_path / "x" / "summary.json").read_text())["status"] == "failed"


def _toml(path: Path) -> dict:
    import tomllib

    return tomllib.loads(path.read_text())
