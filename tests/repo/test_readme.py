"""The README's commands, as written there, from a fresh clone: a README command that breaks
fails here. The commands are read from the README's fenced bash blocks (never copied here);
each test runs one block (or line) in the module's clone and checks the exit codes, what each
command says it writes, and that the clone's files are unchanged (results go to ignored
places: runs/)."""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path

import pytest

from tests.support import ROOT

RUN_FILES = ("metrics.jsonl", "summary.json", "plot.png", "checkpoint.npz")


def readme_blocks(text: str) -> dict[str, list[list[str]]]:
    """``{heading: [block, ...]}``: each fenced bash block's command lines (comment-only and
    blank lines dropped; a command's trailing comment is left to the shell), under the
    heading it follows."""
    sections: dict[str, list[list[str]]] = {}
    heading, block = "", None
    for line in text.splitlines():
        if block is not None:
            if line.startswith("```"):
                sections.setdefault(heading, []).append(block)
                block = None
            elif line.strip() and not line.lstrip().startswith("#"):
                block.append(line.strip())
        elif line.startswith("```bash"):
            block = []
        elif line.startswith("#"):
            heading = line.lstrip("#").strip()
    return sections


BLOCKS = readme_blocks((ROOT / "README.md").read_text())


def block(heading: str) -> list[str]:
    """The first bash block under the README heading that starts with ``heading``."""
    found = [b for h, bs in BLOCKS.items() if h.startswith(heading) for b in bs]
    assert found, f"no bash block under a README heading {heading!r}"
    return found[0]


RUN = block("Run")
BRING_YOUR_OWN = block("Bring your own model, data, strategy and GPU")
BENCH_QUICK = [c for c in block("Benchmark") if c.startswith("fedcluster bench --quick")]
EXPORT = block("Export and serve")
TRACKING = block("Follow a run in MLflow / TensorBoard")


def test_the_readme_blocks_hold_the_commands_these_tests_run():
    assert [c.split()[:2] for c in RUN] == [["flwr", "run"], ["fedcluster", "run"]]
    assert len(BRING_YOUR_OWN) >= 5 and all(c.startswith("fedcluster run ") for c in BRING_YOUR_OWN)
    assert any("--engine ray" in c for c in BRING_YOUR_OWN)
    assert len(BENCH_QUICK) == 1
    assert TRACKING[0].startswith("fedcluster run ") and "tracking=" in TRACKING[0]


def run_name(command: str, clone: Path) -> str:
    """``<strategy>-<scenario>-s<seed>``, the run directory the README says a run without
    --out writes (a user's strategy class by its class name), from the command's flags or the
    defaults of the clone's pyproject.toml."""
    with (clone / "pyproject.toml").open("rb") as fh:
        config = tomllib.load(fh)["tool"]["flwr"]["app"]["config"]
    args = shlex.split(command, comments=True)
    flag = lambda name, default: args[args.index(name) + 1] if name in args else default
    strategy = flag("--strategy", config["strategy"]).rsplit(":", 1)[-1]
    return f"{strategy}-{flag('--scenario', config['scenario'])}-s{config['seed']}"


def run_block(clone, commands: list[str]) -> list[tuple[str, Path, str]]:
    """Run ``commands`` one after the other; for each, ``(command, the run directory it made,
    its output)``. Each must exit 0 and make exactly one new directory under runs/."""
    made = []
    for command in commands:
        before = set((clone.path / "runs").glob("*"))
        proc = clone.sh(command)
        log = proc.stdout + proc.stderr
        assert proc.returncode == 0, f"{command}\n{log[-3000:]}"
        new = set((clone.path / "runs").glob("*")) - before
        assert len(new) == 1, f"{command}: new run directories {sorted(new)}\n{log[-3000:]}"
        made.append((command, new.pop(), log))
    return made


def check_run(out: Path, log: str) -> dict:
    """The run directory holds what the README says a run writes, of a completed run."""
    for name in RUN_FILES:
        assert (out / name).stat().st_size > 0, f"{out / name}\n{log[-3000:]}"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed", log[-3000:]
    assert len((out / "metrics.jsonl").read_text().splitlines()) == summary["rounds"] > 0
    return summary


@pytest.mark.slow
def test_the_run_block_flwr_run_and_fedcluster_run(fresh_clone):
    """`flwr run .` (Ray, via the bundle) and `fedcluster run` (in process): the default
    experiment, a line per round, its files in runs/<strategy>-<scenario>-s<seed>/, the second
    run in the next free `-2` directory; Flower's local SuperLink stopped by PID afterwards."""
    try:
        made = run_block(fresh_clone, RUN)
    finally:
        fresh_clone.stop_superlinks()
    assert not fresh_clone.superlink_pids()
    name = run_name(RUN[1], fresh_clone.path)
    assert [out.name for _, out, _ in made] == [name, f"{name}-2"]
    flwr_run, fedcluster_run = (check_run(out, log) for _, out, log in made)
    for (_, _, log), summary in zip(made, (flwr_run, fedcluster_run)):
        rounds = summary["rounds"]
        assert re.search(rf"\[round +{rounds}/{rounds} ", log), log[-3000:]
    # both engines run the same seeded experiment
    assert flwr_run["mean_accuracy"] == pytest.approx(fedcluster_run["mean_accuracy"], abs=1e-6)
    assert fresh_clone.changed_files() == ""


@pytest.mark.slow
def test_the_bring_your_own_block(fresh_clone):
    """The user's model, data and strategy modules of tests/plugins and a user's `my.npz`, in
    process and on Ray. The README's `npz:my.npz` names the user's file: here a 10-class table
    (scikit-learn's digits) in the shape the README documents (`x`, `y` with labels 0..C-1)."""
    import numpy as np
    from sklearn.datasets import load_digits

    digits = load_digits()
    np.savez(fresh_clone.path / "my.npz", x=digits.data.astype(np.float32), y=digits.target)
    for command, out, log in run_block(fresh_clone, BRING_YOUR_OWN):
        assert out.name == run_name(command, fresh_clone.path), command
        summary = check_run(out, log)
        assert summary["failures"] == 0, command
    assert fresh_clone.changed_files() == ""                 # my.npz is ignored (*.npz)


def test_the_benchmark_quick_line(fresh_clone):
    """`fedcluster bench --quick`: the smoke matrix's runs, page, rows and plots all under its
    runs directory, none in the repository."""
    (command,) = BENCH_QUICK
    proc = fresh_clone.sh(command)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    runs = fresh_clone.path / "runs" / "bench-quick"
    rows = [json.loads(line) for line in (runs / "benchmark" / "runs.jsonl").open()]
    promised = int(re.search(r"(\d+) short runs", command).group(1))   # the README's comment
    assert len(rows) == promised and {r["status"] for r in rows} == {"completed"}, log[-3000:]
    page = (runs / "benchmark.md").read_text()
    assert "fedcluster bench --quick" in page and "## Leaderboard" in page
    plots = sorted((runs / "benchmark").glob("*.png"))
    assert plots and all(f"benchmark/{p.name}" in page for p in plots)
    assert fresh_clone.changed_files() == ""


def test_the_export_and_serve_block(fresh_clone):
    """A run exported at its end, served by `load_run` (examples/serve.py), predictions for a
    routed new client and for a client of the run, an export from the checkpoint: every file
    the block names, all under runs/."""
    assert [c.split()[:2] for c in EXPORT] == [
        ["fedcluster", "run"], ["python", "examples/serve.py"], ["fedcluster", "predict"],
        ["fedcluster", "predict"], ["fedcluster", "export"]]
    logs = []
    for command in EXPORT:
        proc = fresh_clone.sh(command)
        logs.append(proc.stdout + proc.stderr)
        assert proc.returncode == 0, f"{command}\n{logs[-1][-3000:]}"
    runs = fresh_clone.path / "runs"
    manifest = json.loads((runs / "serve" / "export" / "manifest.json").read_text())
    assert manifest["strategy"] == "ifca" and len(manifest["models"]) == 2
    assert "a new client with client 3's concept -> cluster" in logs[1]
    assert re.search(r"routed to cluster \d \(lowest loss\)", logs[2])
    assert len((runs / "serve" / "predictions.csv").read_text().splitlines()) > 1
    assert (runs / "serve" / "client3.jsonl").stat().st_size > 0
    assert (runs / "serve-export" / "manifest.json").is_file()
    assert fresh_clone.changed_files() == ""


def test_the_strategy_table_lists_every_registered_strategy():
    """README "Strategies": every registered name in a row (by the paper whose baseline it is),
    and no name there that is not registered (a run-config key such as `prox-mu` may be
    mentioned), so that adding or renaming a strategy cannot leave the table behind."""
    from fedcluster_app.api import STRATEGIES, run_config_defaults

    text = (ROOT / "README.md").read_text()
    table = text[text.index("### Strategies (`strategy`)"):text.index("### Scenarios")]
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("|") and len(cells) == 3 and not cells[0].startswith(("family", "-")):
            rows[cells[0].split()[0].lower()] = set(re.findall(r"`([^`]+)`", cells[1]))
    listed = set().union(*rows.values())
    assert sorted(set(STRATEGIES) - listed) == [], "README's strategy table misses these"
    keys = set(run_config_defaults())
    named = {t for names in rows.values() for t in names if re.fullmatch(r"[a-z0-9-]+", t)}
    assert named - set(STRATEGIES) - keys == set(), "README names strategies that do not exist"
def test_the_tracking_block(fresh_clone):
    """A run logged to MLflow's local store, TensorBoard's event files and metrics.csv, read
    back as the README shows: MLflow's run with the resolved config and the last accuracy,
    TensorBoard's accuracy curve equal to metrics.jsonl's; nothing written into the clone."""
    import ast

    outputs = []
    for command in TRACKING:
        proc = fresh_clone.sh(command)
        assert proc.returncode == 0, f"{command}\n{(proc.stdout + proc.stderr)[-3000:]}"
        outputs.append(proc.stdout)
    out = fresh_clone.path / "runs" / "tracked"
    check_run(out, outputs[0])
    assert (out / "metrics.csv").stat().st_size > 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evaluated = [(r["round"], r["accuracy"]) for r in records if r["accuracy"] is not None]
    mlflow_row = outputs[1].splitlines()[1].split()
    # run name, the scenario's samples-per-step (the config says 0), the last accuracy
    assert mlflow_row[1:3] == ["tracked", "200"]
    assert float(mlflow_row[3]) == pytest.approx(evaluated[-1][1], abs=1e-6)
    curve = ast.literal_eval(outputs[2].strip())
    assert [s for s, _ in curve] == [s for s, _ in evaluated]
    assert [v for _, v in curve] == pytest.approx([a for _, a in evaluated], abs=1e-3)
    assert fresh_clone.changed_files() == ""
