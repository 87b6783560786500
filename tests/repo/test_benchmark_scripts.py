"""The benchmark scripts: every one builds its command line with the harness
(``benchmarks/harness.py``) and keeps its rules, and the ones docs/ names run end to end on a
tiny setting (the FedDrift ones share ``run_config`` of ``benchmarks/feddrift_reproduce.py``, and
a change to it has broken the grid script twice without a test noticing)."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT

BENCH = ROOT / "benchmarks"
#: the fields every timing row carries (harness.machine)
MACHINE = {"load_start", "load_end", "cores", "cpu"}


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
               "--report", str(tmp_path / "t.md"))
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
         "--jsonl", str(rows), env={"NUMBA_CACHE_DIR": str(tmp_path / "numba")})
    got = [json.loads(line) for line in rows.read_text().splitlines()]
    assert sorted(r["batched"] for r in got) == [False, True]
    assert got[0]["acc_omit"] == got[1]["acc_omit"] and got[0]["status"] == "completed"
    # the compiled arithmetic is clocked: the trainer's and the draws' share of each run
    assert all(r["trainer_cpu_s"] > 0 and r["draws_cpu_s"] > 0 for r in got)
    assert all(r["trainer_cpu_s"] + r["draws_cpu_s"] <= r["cpu_s"] for r in got)
    assert all(MACHINE <= set(r) for r in got)


def test_model_exchange_script_times_the_three_cases(tmp_path):
    rows = tmp_path / "exchange.jsonl"
    out = _run("bench_model_exchange.py", "--repeats", "1", "--jsonl", str(rows))
    got = [json.loads(line) for line in rows.read_text().splitlines()]
    assert [r["case"] for r in got] == ["layer arrays", "one flat array", "no model"]
    assert all(r["us_per_reply_min"] > 0 and r["clients"] == 10 for r in got)
    assert all(MACHINE <= set(r) for r in got)
    assert "layer arrays vs one flat array" in out


def test_conv_stacking_script_trains_each_way_to_the_per_client_weights(tmp_path):
    """The hand-written stacked ways (the script asserts its grouped convolutions' weights
    within 1e-5 of one client after the other, and fails otherwise); the compiled ways, a
    cold compile each, run only in the committed measurement."""
    rows = tmp_path / "conv.jsonl"
    ways = ["batched", "stacked vmap", "stacked vmap, channels-last", "grouped conv",
            "grouped conv, channels-last"]
    out = _run("bench_conv_stacking.py", "--clients", "3", "--repeats", "1", "--ways", *ways,
               "--program-clients", "2", "--jsonl", str(rows))
    got = [json.loads(line) for line in rows.read_text().splitlines()]
    assert [r["way"] for r in got] == ["per-client", *ways,
                                       "grouped conv, channels-last, programs of 2"]
    assert got[0]["ratio"] == 1.0 and got[0]["max_abs_diff"] == 0.0
    assert all(r["clients"] == 3 and r["round_s"] > 0 and r["max_abs_diff"] <= 1e-5
               and MACHINE <= set(r) for r in got)
    assert "grouped conv, channels-last" in out


def test_round_profile_script_splits_a_run_into_parts(tmp_path):
    rows = tmp_path / "profile.jsonl"
    out = _run("feddrift_round_profile.py", "--method", "KUE", "--rounds", "2",
               "--local-steps", "2", "--jsonl", str(rows))
    (row,) = [json.loads(line) for line in rows.read_text().splitlines()]
    assert row["method"] == "KUE" and row["batched"] is True and row["looks"] > 0
    assert abs(sum(row["shares"].values()) - 1.0) < 1e-3 and MACHINE <= set(row)
    labels = {label for *_, label in _parts()} | {"strategy and protocol (the rest)"}
    assert set(row["shares"]) <= labels
    assert "ms/round" in out


def _parts():
    return _bench_module("feddrift_round_profile").PARTS


def _bench_module(name: str):
    """A benchmark script imported as ``python benchmarks/NAME.py`` sees its siblings."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    import importlib

    return importlib.import_module(name)


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
    assert all(MACHINE <= set(r) for r in got)     # every row: the families' runs are timed too
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


@pytest.mark.slow
def test_ray_against_stock_flower_runs_both_apps_on_the_same_data(tmp_path):
    rows = tmp_path / "rows.jsonl"
    out = _run("bench_ray_vs_stock.py", "--clients", "2", "--rounds", "5", "--jsonl", str(rows))
    got = [json.loads(line) for line in rows.read_text().splitlines()]
    assert [(r["way"], r["clients"], r["rounds"]) for r in got] == [
        ("fedcluster", 2, 5), ("stock-flower", 2, 5)]
    assert all(r["s_per_round"] > 0 and r["simulation_cpu_s"] > 0 and MACHINE <= set(r)
               for r in got)
    # the same model, data and recipe: the same accuracy up to the minibatch draws
    assert abs(got[0]["final_accuracy"] - got[1]["final_accuracy"]) < 0.1, got
    assert got[0]["ratio_fedcluster_to_stock"] == got[1]["ratio_fedcluster_to_stock"]
    assert "fedcluster / stock Flower" in out


def test_route_heldout_script_routes_withheld_clients_and_writes_its_rows(tmp_path):
    rows = tmp_path / "rows.jsonl"
    out = _run("route_heldout.py", "--families", "fielding", "flexcfl", "--seeds", "0",
               "--runs-dir", str(tmp_path / "r"), "--jsonl", str(rows))
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


# ------------------------------------------------------------------------------ the harness
SCRIPTS = sorted(p for p in BENCH.glob("*.py") if p.name != "harness.py")


def _calls(tree: ast.AST, name: str) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)
            and (getattr(n.func, "id", None) == name or getattr(n.func, "attr", None) == name)]


def _root(node: ast.AST) -> str | None:
    """``a`` of ``a.b.c``."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return getattr(node, "id", None)


def _private_assignments(tree: ast.AST) -> list[str]:
    """Assignments (and deletions) of a private attribute of something the script imported
    from the package: ``module._name = ...``, ``module.sub._name = ...``, ``setattr(module,
    "_name", ...)``. A private name is no switch: the package declares a public one."""
    package = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
               and (n.module or "").split(".")[0] == "fedcluster_app" for a in n.names}
    package |= {a.asname or a.name.split(".")[0] for n in ast.walk(tree)
                if isinstance(n, ast.Import) for a in n.names
                if a.name.split(".")[0] == "fedcluster_app"}
    hits = [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Attribute)
            and isinstance(n.ctx, (ast.Store, ast.Del)) and n.attr.startswith("_")
            and _root(n) in package]
    return hits + [ast.unparse(c) for c in _calls(tree, "setattr") if len(c.args) > 1
                   and _root(c.args[0]) in package and isinstance(c.args[1], ast.Constant)
                   and str(c.args[1].value).startswith("_")]


def test_private_assignments_are_found():
    tree = ast.parse("from fedcluster_app.core import sampling\n"
                     "import fedcluster_app.core.client.batched as batched\n"
                     "sampling._compiled = 1\nbatched.kernels._x, y = 2, 3\n"
                     "setattr(sampling, '_CALLS', 0)\nself._own = sampling\n"
                     "sampling.LOOP_FIRST_CALLS = 0\n")
    assert _private_assignments(tree) == ["sampling._compiled", "batched.kernels._x",
                                          "setattr(sampling, '_CALLS', 0)"]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_script_keeps_the_harness_rules(script):
    """One harness: a script's command line comes from ``harness.parser`` (the shared flags
    declared once), its runs from ``harness.run_many`` (the package's process pool); it never
    edits ``sys.path``, imports no private name and assigns none of the package's."""
    tree = ast.parse(script.read_text())
    assert not _calls(tree, "ArgumentParser"), "build the parser with harness.parser"
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "path"
                and getattr(n.value, "id", None) == "sys"], "no sys.path edits"
    assert not [n for n in ast.walk(tree) if getattr(n, "id", getattr(n, "attr", None))
                in ("ProcessPoolExecutor", "Pool")], "use harness.run_many"
    private = [f"{n.module}.{a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
               for a in n.names if a.name.startswith("_") and n.module != "__future__"]
    private += [a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                for a in n.names if any(part.startswith("_") for part in a.name.split(".")[1:])]
    assert not private, f"private names imported: {private}"
    patched = _private_assignments(tree)
    assert not patched, f"private attributes of the package assigned: {patched}"
    is_script = any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)
                    for n in tree.body)
    if is_script:
        from_harness = {a.asname or a.name for n in ast.walk(tree)
                        if isinstance(n, ast.ImportFrom) and n.module == "harness"
                        for a in n.names}
        assert "parser" in from_harness and _calls(tree, "parser"), \
            "a script builds its command line with harness.parser"


#: each script's flags, from the usage line of the parser it builds (the script stops there),
#: all in one process (the package imported once)
FLAGS = r"""
import argparse, json, os, re, runpy, sys

class Built(Exception):
    pass

def stop(self, args=None, namespace=None):
    raise Built(self.format_usage())

argparse.ArgumentParser.parse_known_args = stop
out = {}
for path in sys.argv[1:]:
    sys.path.insert(0, os.path.dirname(path))    # as `python benchmarks/NAME.py` has it
    sys.argv = [path]
    try:
        runpy.run_path(path, run_name="__main__")
    except Built as usage:
        out[path] = sorted(set(re.findall(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)", str(usage))))
print(json.dumps(out))
"""


def _documented_commands() -> list[tuple[str, str, str]]:
    """``(file, script, its arguments)`` of every ``python benchmarks/NAME.py ...`` command in
    the README, docs/ and the scripts' own docstrings (continued lines joined)."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *SCRIPTS]:
        text = path.read_text()
        for m in re.finditer(r"python3? benchmarks/(\w+\.py)", text):
            end = m.end()
            while end < len(text) and text[end] not in "`\n|;&>)\"'":
                end += 2 if text[end:end + 2] == "\\\n" else 1
            found.append((path.relative_to(ROOT).as_posix(), m.group(1), text[m.end():end]))
    return found


def test_documented_benchmark_commands_use_the_scripts_own_flags():
    """Every flag of a documented benchmark command is one its script declares, by its one
    name: the harness refuses former names and abbreviations, so a page that still used one
    would hand its reader a command that fails."""
    commands = [c for c in _documented_commands() if (BENCH / c[1]).is_file()]
    scripts = sorted({BENCH / script for _, script, _ in commands})
    done = subprocess.run([sys.executable, "-c", FLAGS, *map(str, scripts)], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    flags = {Path(k).name: set(v) for k, v in json.loads(done.stdout.splitlines()[-1]).items()}
    assert set(flags) == {p.name for p in scripts}, "a script built no parser"
    unknown = [f"{where}: {script} {flag}" for where, script, args in commands
               for flag in re.findall(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)", args)
               if flag not in flags[script]]
    assert len(commands) > 100 and not unknown, "\n".join(unknown)


def test_harness_flags_rows_and_pool(tmp_path, capsys):
    harness = _bench_module("harness")
    ap = harness.parser("doc", jsonl="one per run", append=True, seeds=[0], workers=1,
                        repeats=3, strategies=["fedavg"], overrides=True)
    argv = ["--append", "--jsonl=x.jsonl", "--workers", "2", "--set", "a=1", "b=2", "--set", "c=x"]
    args = ap.parse_args(argv)
    assert (args.jsonl, args.append, args.workers, args.seeds) == ("x.jsonl", True, 2, [0])
    assert harness.assignments(args.set) == {"a": 1, "b": 2, "c": "x"}
    assert ap.argv == argv
    # one name for one thing: the former names and abbreviations are unknown flags
    for former in ("--out", "--jobs", "--json", "--repeat", "--strat", "--runs"):
        with pytest.raises(SystemExit):
            ap.parse_args([former, "2"])
        assert f"unrecognized arguments: {former} 2" in capsys.readouterr().err
    # timing rows get the machine; a row stamped already keeps its own stamp
    rows = tmp_path / "sub" / "rows.jsonl"
    harness.write_rows(rows, [{"s": 1.0}, {"s": 2.0, "load_end": [9.0]}], load_start=[0.5])
    got = [json.loads(x) for x in rows.read_text().splitlines()]
    assert MACHINE <= set(got[0]) and got[0]["load_start"] == [0.5]
    assert got[1] == {"s": 2.0, "load_end": [9.0]}
    harness.write_rows(rows, [{"s": 3.0}], append=True)
    assert len(rows.read_text().splitlines()) == 3
    # the package's pool: results in the order of the tasks
    assert list(harness.run_many(abs, [-3, 2, -1], 2)) == [3, 2, 1]
