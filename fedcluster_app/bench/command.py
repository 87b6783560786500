"""``fedcluster bench``: build the matrix, run what is missing, write the leaderboard."""

from __future__ import annotations

import argparse
import os
import shlex
import time
from pathlib import Path

from fedcluster_app.bench import matrix as M
from fedcluster_app.core.atomic import atomic_write_bytes

RUNS_DIR = Path("runs/bench")
QUICK_RUNS_DIR = Path("runs/bench-quick")
REPORT_NAME = "benchmark.md"

EPILOG = """\
examples:
  fedcluster bench --quick                      # a smoke matrix (8 short runs, seconds)
  fedcluster bench --workers 2                  # the full matrix (resumable: run it again to go on)
  fedcluster bench --datasets digits --strategies fedavg ifca fielding --seeds 0 1 2
  # regenerate the committed page: it runs only what the committed rows lack
  fedcluster bench --workers 2 --reuse-rows docs/benchmark/runs.jsonl --report docs/benchmark/README.md

The leaderboard, its rows and plots go under the runs directory (RUNS_DIR/benchmark.md and
RUNS_DIR/benchmark/) unless --report names another page (a page named README.md keeps them
beside it, in its own folder): nothing is written into the repository unless you name it.
"""


def add_parser(sub) -> None:
    b = sub.add_parser("bench", help="run the benchmark matrix and write its leaderboard",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    b.add_argument("--quick", action="store_true",
                   help=f"the smoke matrix: {', '.join(M.QUICK['datasets'])}, shifts "
                        f"{', '.join(M.QUICK['shifts'])}, strategies "
                        f"{', '.join(M.QUICK['strategies'])}, one seed, shorter runs")
    b.add_argument("--datasets", nargs="+", help=f"default: {' '.join(M.DATASETS)}")
    b.add_argument("--shifts", nargs="+", help=f"default: {' '.join(M.SHIFTS)}")
    b.add_argument("--patterns", nargs="+", help=f"default: {' '.join(M.PATTERNS)}")
    b.add_argument("--skip-static", action="store_true",
                   help="leave out the no-drift scenario of each data set")
    b.add_argument("--strategies", nargs="+", help=f"default: {' '.join(M.STRATEGIES)}")
    b.add_argument("--seeds", nargs="+", type=int, help="default: 0 1 2")
    b.add_argument("--workers", type=int, default=1,
                   help="runs at a time, each in its own process (default 1)")
    b.add_argument("--ray-address", metavar="ADDRESS",
                   help="run on this Ray cluster instead (e.g. auto, or head-host:6379): one "
                        "one-CPU task per run; --runs-dir must be on a file system every node "
                        "sees")
    b.add_argument("--runs-dir", type=Path,
                   help=f"one directory per run; finished runs there are reused (default "
                        f"{RUNS_DIR}, with --quick {QUICK_RUNS_DIR}: the smoke matrix's shorter "
                        f"runs never stand for the full matrix's)")
    b.add_argument("--report", type=Path,
                   help="the leaderboard (markdown); its rows and plots go in a folder of the "
                        "same name beside it (default RUNS_DIR/benchmark.md)")
    b.add_argument("--reuse-rows", type=Path, metavar="RUNS_JSONL",
                   help="rows of an earlier bench (its runs.jsonl) stand for runs --runs-dir "
                        "does not hold: a finished row counts when its scenario, strategy, seed "
                        "and protocol match, so only the missing cells run")
    b.add_argument("--retry-failed", action="store_true", help="run failed runs again")
    b.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="change the common protocol (every run), e.g. --set rounds-per-step=6")
    b.add_argument("--dry-run", action="store_true",
                   help="list the runs and which cannot run, run nothing")


def cells_of(args: argparse.Namespace) -> tuple[list[M.Cell], list[str], dict]:
    from fedcluster_app.core.config import (
        default_run_config,
        merge_overrides,
        parse_assignment,
        parse_run_config,
    )

    quick = M.QUICK if args.quick else {}
    datasets = M.check_names("data set", args.datasets or quick.get("datasets", M.DATASETS),
                             M.DATASETS)
    shifts = M.check_names("shift", args.shifts or quick.get("shifts", M.SHIFTS), M.SHIFTS)
    patterns = M.check_names("drift pattern", args.patterns
                             or quick.get("patterns", M.PATTERNS), M.PATTERNS)
    strategies = list(args.strategies or quick.get("strategies", M.STRATEGIES))
    seeds = args.seeds if args.seeds is not None else list(quick.get("seeds", (0, 1, 2)))
    protocol = {**M.PROTOCOL, **quick.get("protocol", {}),
                **dict(parse_assignment(s) for s in args.set)}
    # a mistake in the common protocol or a method's settings is the command's error, before
    # any run starts, not every cell's "cannot run"
    parse_run_config(merge_overrides(default_run_config(), protocol))
    M.check_methods(strategies, protocol)
    scenarios = M.scenarios(datasets, shifts, patterns, no_drift=not (args.skip_static or args.quick))
    frozen = tuple(sorted(protocol.items()))
    cells = [M.Cell(sc, s, seed, frozen) for sc in scenarios for s in strategies for seed in seeds]
    return cells, strategies, protocol


def heatmap_scenarios(scenarios: list[str]) -> list[str]:
    """Per data set, the scenario whose assignments the heat maps show: its mixed shift under
    sudden drift, else its first scenario with drift."""
    by_data: dict[str, list[str]] = {}
    for sc in dict.fromkeys(scenarios):
        by_data.setdefault(sc.split("/")[0], []).append(sc)
    out = []
    for scs in by_data.values():
        drifting = [sc for sc in scs if not sc.endswith("/none")]
        preferred = [sc for sc in drifting if sc.endswith("/mix/sudden")]
        if preferred or drifting:
            out.append((preferred or drifting)[0])
    return out


def output_paths(args: argparse.Namespace) -> tuple[Path, Path]:
    """The runs directory and the leaderboard page. The page goes into the runs directory
    unless ``--report`` names another (the smoke matrix has a runs directory of its own), so a
    bench writes into the repository only where it is told to."""
    runs_dir = args.runs_dir or (QUICK_RUNS_DIR if args.quick else RUNS_DIR)
    return runs_dir, args.report or runs_dir / REPORT_NAME


def report_folder(report: Path) -> Path:
    """Where a leaderboard page's rows and plots go: the folder of the page's name beside it
    (``benchmark.md`` -> ``benchmark/``), or the page's own folder when the page is a folder's
    ``README.md`` (docs/benchmark/README.md keeps page, rows and plots together)."""
    return report.parent if report.name == "README.md" else report.with_suffix("")


def run(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    from fedcluster_app.bench import report as R
    from fedcluster_app.bench.runner import run_dir, run_matrix

    args.runs_dir, args.report = output_paths(args)
    cells, strategies, protocol = cells_of(args)
    if args.dry_run:
        for cell in cells:
            why = M.cannot_run(cell, cell.run_config(M.num_concepts(cell)))
            done = (run_dir(args.runs_dir, cell) / "summary.json").is_file()
            print(f"{cell.name}: " + (f"cannot run: {why}" if why else
                                      "finished" if done else "to run"))
        return 0
    reuse = R.read_rows(args.reuse_rows) if args.reuse_rows else None
    t0, load0 = time.time(), os.getloadavg()[0]
    rows, ran = run_matrix(cells, args.runs_dir.resolve(), workers=args.workers,
                           retry_failed=args.retry_failed,
                           log=lambda line: print(line, flush=True),
                           ray_address=args.ray_address, reuse=reuse)
    load1 = os.getloadavg()[0]
    folder = report_folder(args.report)
    data_file = folder / "runs.jsonl"
    R.write_rows(rows, data_file)
    heat = heatmap_scenarios([r["scenario"] for r in rows])
    plots = R.plot_all(rows, strategies, folder, heat)
    reading_file = folder / "reading.md"
    reading = reading_file.read_text() if reading_file.is_file() else None
    command = "fedcluster " + " ".join(shlex.quote(a) for a in (argv or ["bench"]))
    info = {"compute_min": sum(r.get("wall_time_s") or 0 for r in rows) / 60.0,
            "where": (f"on the Ray cluster at {args.ray_address}" if args.ray_address
                      else f"on {args.workers} worker process(es)"),
            "cores": os.cpu_count(), "ran": ran,
            "elapsed_min": (time.time() - t0) / 60.0,
            "load": f"{load0:.1f} at its start, {load1:.1f} at its end"}
    text = R.render(rows, strategies, protocol, command, plots, args.report, data_file,
                    info, reading)
    args.report.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(args.report, text.encode())
    ok = sum(1 for r in rows if r["status"] in R.OK)
    print(f"bench: {ok} of {len(rows)} runs finished; {time.time() - t0:.0f} s; leaderboard "
          f"{args.report}, data {data_file}")
    print("\n".join(R.leaderboard(rows)))
    return 0
