"""`fedcluster list` reads the families' catalogues, never a strategy's module: none of its
built-in forms imports torch or the other heavy libraries (seconds of start-up; timings are
benchmarks/bench_list.py's business, not the suite's). A user's strategy given as
``package.module:Class`` is imported, torch and all, and lists as a built-in one does."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support import ROOT

FORMS = [["list"], *(["list", what] for what in ("strategies", "scenarios", "federations",
                                                  "config", "params", "presets", "protocols")),
         ["list", "params", "--toml"], ["list", "params", "--strategy", "feddrift"],
         ["list", "params", "--strategy", "fielding", "--toml"],
         ["list", "params", "--strategy", "ifca"], ["list", "params", "--strategy", "nonesuch"]]
HEAVY = ("torch", "torchvision", "flwr", "numpy", "scipy", "sklearn", "matplotlib", "river")

# runs every form in turn in one fresh interpreter; after each, the heavy packages loaded so far
PROBE = """
import contextlib, io, json, sys
from fedcluster_app.cli import main
seen = []
for argv in json.loads(sys.argv[1]):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        rc = main(argv)
    heavy = sorted({m.split(".")[0] for m in sys.modules} & set(json.loads(sys.argv[2])))
    seen.append([argv, rc, heavy])
print(json.dumps(seen))
"""


def test_no_built_in_list_form_imports_torch_or_numpy():
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(FORMS), json.dumps(HEAVY)],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    seen = json.loads(out)
    assert [argv for argv, _, _ in seen] == FORMS
    assert [rc for _, rc, _ in seen] == [0] * (len(FORMS) - 1) + [2]   # nonesuch: unknown
    assert [(argv, heavy) for argv, _, heavy in seen if heavy] == []


def test_the_catalogues_declare_the_classes_that_run():
    from fedcluster_app import api, families

    infos = families.strategy_infos()
    assert list(api.STRATEGIES) == [info.name for info in infos]
    for info in infos:
        cls = api.STRATEGIES[info.name]
        assert (cls.name, cls.description, cls.Params) == info.class_attributes()
        assert info.cls == f"{cls.__module__}:{cls.__qualname__}"


def test_a_strategy_by_import_path_lists_as_by_name(capsys):
    from fedcluster_app.cli import main

    path = "fedcluster_app.families.feddrift.feddrift:FedDrift"
    for extra in ([], ["--toml"]):
        assert main(["list", "params", "--strategy", "feddrift", *extra]) == 0
        by_name = capsys.readouterr().out
        assert main(["list", "params", "--strategy", path, *extra]) == 0
        # the --toml table's comment names the strategy as given
        assert capsys.readouterr().out == by_name.replace("  # feddrift\n", f"  # {path}\n")
