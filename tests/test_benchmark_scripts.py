"""The FedDrift benchmark scripts that docs/ names run end to end on a tiny setting: they share
``run_config`` (``benchmarks/feddrift_reproduce.py``), and a change to it has broken the grid
script twice without a test noticing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(script: str, *args: str, env: dict | None = None) -> str:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args],
                          capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env=None if env is None else {**os.environ, **env})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_reproduce_script_runs_with_set_and_writes_its_rows(tmp_path):
    rows = tmp_path / "rows.jsonl"
    out = _run("feddrift_reproduce.py", "--rounds", "1", "--local-steps", "2", "--seeds", "0",
               "--datasets", "circle2", "--methods", "IFCA-W", "--runs-dir", str(tmp_path / "r"),
               "--set", "feddrift-baselines.ifca-choice=loss", "--jsonl", str(rows),
               "--out", str(tmp_path / "t.md"))
    (row,) = [json.loads(line) for line in rows.read_text().splitlines()]
    assert row["method"] == "IFCA-W" and row["status"] == "completed"
    assert row["set"] == {"feddrift-baselines.ifca-choice": "loss"}
    assert "feddrift-baselines.ifca-choice = loss" in (tmp_path / "t.md").read_text()
    assert "--runs-dir" not in (tmp_path / "t.md").read_text() and "IFCA-W" in out


def test_grid_script_measures_both_ways(tmp_path):
    """Also with nothing compiled yet (an empty Numba cache, as on a fresh checkout): the clocks
    must not hand Numba, which compiles a function against its module's globals, a timed
    Python stand-in for a compiled function that another one calls (every reply then failed
    and the trainer's clock read 0)."""
    rows = tmp_path / "grid.jsonl"
    _run("feddrift_grid.py", "--rounds", "1", "--local-steps", "2", "--methods", "Oblivious",
         "--out", str(rows), env={"NUMBA_CACHE_DIR": str(tmp_path / "numba")})
    got = [json.loads(line) for line in rows.read_text().splitlines()]
    assert sorted(r["batched"] for r in got) == [False, True]
    assert got[0]["acc_omit"] == got[1]["acc_omit"] and got[0]["status"] == "completed"
    # the compiled arithmetic is clocked: the trainer's and the draws' share of each run
    assert all(r["trainer_cpu_s"] > 0 and r["draws_cpu_s"] > 0 for r in got)
    assert all(r["trainer_cpu_s"] + r["draws_cpu_s"] <= r["cpu_s"] for r in got)


def test_model_exchange_script_times_the_three_cases(tmp_path):
    rows = tmp_path / "exchange.jsonl"
    out = _run("bench_model_exchange.py", "--repeats", "1", "--jsonl", str(rows))
    got = [json.loads(line) for line in rows.read_text().splitlines()]
    assert [r["case"] for r in got] == ["layer arrays", "one flat array", "no model"]
    assert all(r["us_per_reply_min"] > 0 and r["clients"] == 10 for r in got)
    assert "layer arrays vs one flat array" in out


def test_round_profile_script_splits_a_run_into_parts(tmp_path):
    rows = tmp_path / "profile.jsonl"
    out = _run("feddrift_round_profile.py", "--method", "KUE", "--rounds", "2",
               "--local-steps", "2", "--jsonl", str(rows))
    (row,) = [json.loads(line) for line in rows.read_text().splitlines()]
    assert row["method"] == "KUE" and row["batched"] is True and row["looks"] > 0
    assert abs(sum(row["shares"].values()) - 1.0) < 1e-3
    labels = {label for *_, label in _parts()} | {"strategy and protocol (the rest)"}
    assert set(row["shares"]) <= labels
    assert "ms/round" in out


def _parts():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import feddrift_round_profile

    return feddrift_round_profile.PARTS


def test_gpu_check_runs_on_the_cpu(tmp_path):
    """The GPU check with the CPU in the GPU's place: every section but Ray's (the slow test
    below) writes its rows, each family's paper run completes on both sides and equals itself,
    and the clients' module calls are counted on the device they ran on."""
    rows = tmp_path / "gpu.jsonl"
    out = _run("bench_gpu.py", "--device", "cpu", "--quick", "--budget-s", "400",
               "--sections", "env", "families", "scaling", "endtoend", "--jsonl", str(rows))
    got = [json.loads(line) for line in rows.read_text().splitlines()]
    by = {}
    for r in got:
        by.setdefault(r["section"], []).append(r)
    assert by["env"][0]["device"] == "cpu" and by["env"][0]["gpu"] == "none"
    fam = by["families"]
    assert {r["name"].split("/")[0] for r in fam} >= {
        "feddrift", "fielding", "flexcfl", "fedrc", "fedccfa"}
    assert all(r["status"] == "completed" for r in fam), [r for r in fam if r["status"] != "completed"]
    assert all(r["verdict"] in ("equal", "repeat equal") for r in fam)
    assert any(r["name"].endswith("#again") for r in fam)
    # on the CPU every client module call takes CPU inputs, and FedDrift's MLP the NumPy kernel
    assert all(r["forwards_gpu"] == 0 for r in fam)
    assert next(r for r in fam if r["name"] == "fedccfa/fedccfa")["forwards_cpu"] > 0
    assert next(r for r in fam if r["name"] == "feddrift/feddrift")["kernel_jobs"] > 0
    sc = by["scaling"]
    assert {(r["model"], r["mode"]) for r in sc} == {
        (m, mode) for m in ("cnn", "resnet") for mode in ("batched", "one-by-one")}
    assert all(r["status"] == "ok" and r["round_s"] > 0 for r in sc)
    assert {r["measured"] for r in sc if r["mode"] == "one-by-one"} == {4}   # the rest projected
    (e2e,) = by["endtoend"]
    assert e2e["status"] == "completed" and len(e2e["round_s"]) == 3
    assert "families (" in out and "scaling:" in out


@pytest.mark.slow
def test_gpu_check_ray_section_runs_on_the_cpu(tmp_path):
    rows = tmp_path / "ray.jsonl"
    _run("bench_gpu.py", "--device", "cpu", "--quick", "--budget-s", "900", "--sections", "ray",
         "--jsonl", str(rows))
    (row,) = [json.loads(line) for line in rows.read_text().splitlines()]
    assert row["profile"] == "cpu" and row["status"] == "ok", row
    assert len(row["round_s"]) == 4 and row["gpu_pids"] == 0


def test_route_heldout_script_routes_withheld_clients_and_writes_its_rows(tmp_path):
    rows = tmp_path / "rows.jsonl"
    out = _run("route_heldout.py", "--families", "fielding", "flexcfl", "--seeds", "0",
               "--out", str(tmp_path / "r"), "--jsonl", str(rows))
    got = {r["family"]: r for r in map(json.loads, rows.read_text().splitlines())}
    assert sorted(got) == ["fielding", "flexcfl"]
    for row in got.values():
        assert row["routes"] == 4 and len(row["detail"]) == 4 and row["separated"] is True
        assert row["right"] == sum(d["right"] for d in row["detail"])
    assert "fielding: " in out and "routes to the cluster of the client's concept" in out


def test_checkpoint_cost_script_times_the_three_settings(tmp_path):
    rows = tmp_path / "checkpoint.jsonl"
    out = _run("bench_checkpoint.py", "--rounds-per-step", "1", "--strategies", "ifca",
               "--jsonl", str(rows))
    got = [json.loads(line) for line in rows.read_text().splitlines()]
    assert [r["setting"] for r in got] == ["off", "default (every 30 s)", "every round"]
    assert all(r["rounds"] == 6 and r["s_per_round"] > 0 for r in got)
    assert "same accuracy: True" in out
