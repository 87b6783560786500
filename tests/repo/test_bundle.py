"""The app bundle (FAB) plain `flwr run .` uploads, built by Flower's own builder from a fresh
clone: the package and the directory's Python modules, far under Flower's 10 MB limit, no docs
or benchmark data; and the app runs from it, a user's module under the app directory included."""

from __future__ import annotations

import io
import json
import subprocess
import zipfile
from pathlib import Path

import pytest
from flwr.cli.build import build_fab_from_disk
from flwr.cli.utils import build_pathspec
from flwr.common.constant import FAB_INCLUDE_PATTERNS, FAB_MAX_SIZE

from fedcluster_app import launcher

#: the bundle may use at most a quarter of Flower's limit (2.6 MB of 10 MB): room to grow, and
#: a bundle that doubles (a data file slipping in) fails here long before Flower refuses it
BUNDLE_BUDGET = FAB_MAX_SIZE // 4


def bundle(app: Path) -> tuple[int, set[str]]:
    """(size in bytes, the files) of the bundle Flower builds from ``app``, without Flower's
    manifest and the pyproject.toml it always adds."""
    fab = build_fab_from_disk(app)
    names = set(zipfile.ZipFile(io.BytesIO(fab)).namelist())
    return len(fab), names - {".info/CONTENT", "pyproject.toml"}


def package_files(clone: Path) -> set[str]:
    """The package's tracked files of the types Flower bundles (its code and data files)."""
    tracked = subprocess.run(["git", "ls-files", "fedcluster_app"], cwd=clone, text=True,
                             capture_output=True, check=True).stdout.split()
    return set(build_pathspec(FAB_INCLUDE_PATTERNS).match_files(tracked))


def test_the_bundle_is_the_package_and_the_python_modules_far_under_the_limit(fresh_clone):
    size, names = bundle(fresh_clone.path)
    assert size <= BUNDLE_BUDGET, f"{size:,} bytes, more than {BUNDLE_BUDGET:,}"
    package = package_files(fresh_clone.path)
    assert "fedcluster_app/core/data/feddrift_changepoints.json" in package
    assert package <= names, sorted(package - names)
    # everything else is a Python module of the directory: a user's module under it travels
    assert all(n.endswith(".py") for n in names - package), sorted(names - package)
    assert "tests/plugins/my_model.py" in names              # the README's example module
    assert not [n for n in names if n.startswith("docs/") or n.endswith((".jsonl", ".md"))]
    # the stock Flower app the Ray benchmark compares with is an app of its own (fab-exclude)
    assert (fresh_clone.path / "benchmarks/stock_flower/stock_fedavg/server_app.py").is_file()
    assert not [n for n in names if n.startswith("benchmarks/stock_flower/")]


def test_the_stock_flower_reference_is_a_small_app_of_its_own(fresh_clone):
    size, names = bundle(fresh_clone.path / "benchmarks" / "stock_flower")
    assert size < 20_000
    assert names == {f"stock_fedavg/{m}.py" for m in ("__init__", "client_app", "server_app",
                                                       "task")}


def test_the_app_fedcluster_run_stages_builds_with_the_same_rules(fresh_clone, tmp_path):
    """`fedcluster run --engine ray|deployment` stages the package and the user's modules with
    the same pyproject.toml: its include patterns must match there too, or Flower refuses it."""
    app = launcher.stage_app(tmp_path / "app", {"model": "tests.plugins.my_model:build"})
    size, names = bundle(app)
    assert size <= BUNDLE_BUDGET
    assert package_files(fresh_clone.path) <= names
    assert "tests/plugins/my_model.py" in names                 # the module's folder travels
    assert "tests/__init__.py" in names                         # ... with its packages' __init__
    assert all(n.startswith(("fedcluster_app/", "tests/plugins/")) or n == "tests/__init__.py"
               for n in names), names


USERS_MODEL = '''\
"""A user's model, in a module under the app's directory that exists nowhere else."""
import math

from torch import nn


def build(input_shape, num_classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), 16), nn.ReLU(),
                         nn.Linear(16, num_classes))
'''


@pytest.mark.slow
def test_flwr_run_from_a_clone_runs_the_app_and_a_users_module_from_the_bundle(fresh_clone,
                                                                              tmp_path):
    """The README's `flwr run .` with a short run config and the user's own model module. The
    clone is not on the run's import path (no PYTHONPATH), so the module can only come from the
    bundle Flower installed in FLWR_HOME/apps."""
    (fresh_clone.path / "my_net").mkdir()
    (fresh_clone.path / "my_net" / "__init__.py").write_text("")
    (fresh_clone.path / "my_net" / "model.py").write_text(USERS_MODEL)
    out = tmp_path / "run"
    settings = f'model="my_net.model:build" num-steps=2 rounds-per-step=1 out-dir="{out}"'
    try:
        proc = fresh_clone.sh('flwr run . --stream --federation-config "num-supernodes=10 '
                              f"client-resources-num-cpus=1\" --run-config '{settings}'",
                              PYTHONPATH=None)
    finally:
        fresh_clone.stop_superlinks()
    assert not fresh_clone.superlink_pids()
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed", log[-3000:]
    assert summary["config"]["model"] == "my_net.model:build" and summary["rounds"] == 2
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2
    installed = list((fresh_clone.flwr_home / "apps").glob("*/my_net/model.py"))
    assert len(installed) == 1, log[-3000:]
    assert not (installed[0].parent.parent / "docs").exists()
