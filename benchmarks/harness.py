"""The benchmark scripts' harness: their shared flags, their raw rows and their process pool.

Every script builds its command line with :func:`parser`, which declares the flags the scripts
share once, with one name for one thing (a flag is taken by that name only: never abbreviated,
no former names):

* ``--jsonl FILE``: the raw rows, one JSON line per measurement (every table in docs/ has its
  raw rows committed beside it), and ``--append`` to add them after the rows already there;
* ``--seeds N [N ...]``, ``--repeats N``, ``--workers N`` (runs at once, in the package's pool);
* ``--strategies NAME [NAME ...]``: registered strategy names (a script's own variants, which are
  not registry names, are its ``--methods``);
* ``--set KEY=VALUE [KEY=VALUE ...]``: run-config overrides, repeatable.

Timing rows carry :func:`machine`: the load average at the start and the end of the measurement,
the cores and the processor, since the machines are shared and a wall time means little without
them; :func:`write_rows` with ``load_start`` stamps every row that lacks it. (A row read back
from a run finished earlier, whose times were measured then, gets no stamp of today's machine.)

The scripts are run as ``python benchmarks/NAME.py`` from the repository root (so ``benchmarks/``
is on ``sys.path``) with the package installed: none of them edits ``sys.path``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------------------ flags
class Parser(argparse.ArgumentParser):
    """An argument parser that takes each flag by its one name, never abbreviated (a former
    name, such as ``--out`` or ``--methods`` where the harness now says ``--jsonl`` or
    ``--strategies``, is an unrecognised argument); ``argv`` is the command line it parsed
    (what a script records as the command that made its rows)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, allow_abbrev=False, **kwargs)
        self.argv: list[str] = []

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        self.argv = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(self.argv, namespace)


def parser(doc: str | None, *, jsonl: str | None = None, append: bool = False,
           seeds: list[int] | None = None, repeats: int | None = None,
           repeats_help: str = "repetitions of the measurement",
           workers: int | None = None, strategies: list[str] | None = None,
           overrides: bool = False) -> Parser:
    """A script's parser with the shared flags it asks for: ``jsonl`` (the help line: what one
    row is), ``append``, and the defaults of ``seeds``, ``repeats``, ``workers`` and
    ``strategies``; ``overrides`` adds ``--set``."""
    ap = Parser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if jsonl is not None:
        ap.add_argument("--jsonl", default="", metavar="FILE",
                        help=f"write the raw rows here: {jsonl}")
    if append:
        ap.add_argument("--append", action="store_true",
                        help="add the rows after those already in --jsonl (several commands)")
    if seeds is not None:
        ap.add_argument("--seeds", type=int, nargs="+", default=seeds, metavar="N")
    if repeats is not None:
        ap.add_argument("--repeats", type=int, default=repeats, help=repeats_help)
    if workers is not None:
        ap.add_argument("--workers", type=int, default=workers,
                        help="runs at once, each in a process of the package's pool")
    if strategies is not None:
        ap.add_argument("--strategies", nargs="+", default=strategies, metavar="NAME",
                        help="the strategies to run")
    if overrides:
        ap.add_argument("--set", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                        help="override a run-config key (repeatable)")
    return ap


def assignments(pairs: Iterable[str]) -> dict:
    """``--set``'s ``KEY=VALUE`` pairs as a dict (TOML values, as ``flwr run --run-config``)."""
    from fedcluster_app.core.config import parse_assignment

    return dict(parse_assignment(p) for p in pairs)


# ------------------------------------------------------------------------------ raw rows
def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages, rounded to 2 digits."""
    return [round(x, 2) for x in os.getloadavg()]


def machine(load_start: list[float]) -> dict:
    """The fields every timing row carries: the load at its start (taken by the caller before
    measuring) and now, the cores and the processor (the project's machines change between
    sessions, and a timing compares only with timings of the same processor)."""
    return {"load_start": load_start, "load_end": load_average(), "cores": os.cpu_count(),
            **processor()}


def processor() -> dict:
    """The processor's model name and whether it has AVX-512 (NumPy then uses its own
    vectorised exp and log, which can differ from libm's in the last bit), from Linux's
    /proc/cpuinfo; else the architecture Python reports."""
    try:
        with open("/proc/cpuinfo") as fh:
            info = dict(line.split(":", 1) for line in fh.read().split("\n\n")[0].splitlines()
                        if ":" in line)
    except OSError:
        return {"cpu": platform.machine()}
    info = {k.strip(): v.strip() for k, v in info.items()}
    return {"cpu": info.get("model name", platform.machine()),
            "avx512": "avx512f" in info.get("flags", "").split()}


def write_rows(path: str | Path | None, rows: list[dict], sort_keys: bool = False,
               append: bool = False, load_start: list[float] | None = None) -> None:
    """Write ``rows`` to ``path``, one JSON line each, and say so (nothing when ``path`` is
    empty); ``append`` adds them after the rows already there (several commands, one file).
    ``load_start`` (the load before the measurement) marks the rows as timings: each one
    without its own machine stamp gets :func:`machine`."""
    if not path:
        return
    if load_start is not None:
        stamp = machine(load_start)
        rows = [r if "load_end" in r else {**r, **stamp} for r in rows]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a" if append else "w") as fh:
        fh.writelines(json.dumps(r, sort_keys=sort_keys) + "\n" for r in rows)
    print(f"wrote {path} ({len(rows)} rows)")


def start_rows(path: str | Path | None, append: bool) -> None:
    """Empty ``path`` for rows added one at a time with :func:`add_row` (unless ``append``)."""
    if path and not append:
        open(path, "w").close()


def add_row(path: str | Path | None, row: dict) -> None:
    """Append one row at once (a long run cut short keeps the rows it made)."""
    if path:
        with open(path, "a") as fh:
            fh.write(json.dumps(row) + "\n")


# ------------------------------------------------------------------------------ runs
def run_many(fn: Callable[[Any], Any], tasks: Iterable[Any], workers: int) -> Iterator[Any]:
    """``fn(task)`` for every task, ``workers`` at a time in the package's process pool (the one
    ``fedcluster bench`` runs its matrix in); the results in the order of ``tasks``. ``fn`` must
    be a module-level function (the pool's processes are spawned and import it)."""
    from fedcluster_app.bench.runner import process_pool

    with process_pool(max(1, workers)) as pool:
        yield from pool.map(fn, tasks)


def load_module(path: str | Path) -> ModuleType:
    """A Python file of the repository (relative to its root) as a module, without putting its
    folder on ``sys.path``: the golden runs' declarations, for the GPU check."""
    path = ROOT / path
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module
