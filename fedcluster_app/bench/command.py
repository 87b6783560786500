"""``fedcluster bench``: build the matrix, run what is missing, write the leaderboard."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from fedcluster_app.bench import matrix as M
from fedcluster_app.core.atomic import atomic_write_bytes

RUNS_DIR = Path("runs/bench")
TIER_PAPERS = "papers"   # each paper's own protocol: fedcluster_app/bench/papers.py
QUICK_RUNS_DIR = Path("runs/bench-quick")
REPORT_NAME = "benchmark.md"

EPILOG = """\
examples:
  fedcluster bench --quick                      # a smoke matrix (8 short runs, seconds)
  fedcluster bench --workers 2                  # the full matrix (resumable: run it again to go on)
  fedcluster bench --tier scale --workers 2     # the papers' regime: 100 clients, 20% a round
  fedcluster bench --tier papers --workers 2    # each paper's own protocol, every method on it
  fedcluster bench --datasets digits --strategies fedavg ifca fielding --seeds 0 1 2
  # regenerate the committed page: it runs only what the committed rows lack
  fedcluster bench --workers 2 --reuse-rows docs/benchmark/runs.jsonl --report docs/benchmark/README.md

Each method's learning rate is chosen per data set from --lr-grid on a validation seed that is
never scored (those runs come first; their rows go beside the page's, in tuning.jsonl);
--set lr=RATE gives every method that rate instead.

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
    b.add_argument("--tier", default="headline",
                   help="which matrix: " + "; ".join(f"{k}: {t.description}"
                                                     for k, t in M.TIERS.items())
                        + f"; {TIER_PAPERS}: each paper's own protocol (its preset) with every "
                          "method on it, scored by the paper's metric (default headline)")
    b.add_argument("--papers", nargs="+", metavar="PAPER",
                   help=f"with --tier {TIER_PAPERS}: which papers (default all: "
                        "fielding feddrift flexcfl fedrc fedccfa)")
    b.add_argument("--datasets", nargs="+", help="default: the tier's")
    b.add_argument("--shifts", nargs="+", help="default: the tier's")
    b.add_argument("--patterns", nargs="+", help="default: the tier's")
    b.add_argument("--priors", nargs="+",
                   help=f"the clients' class priors, of {' '.join(M.PRIORS)} (default: the "
                        "tier's; dirichlet runs on the patterns it is an axis of)")
    b.add_argument("--lr-grid", nargs="+", type=float, metavar="LR",
                   help=f"the learning rates each method is tuned over per data set on seed "
                        f"{M.VALIDATION_SEED} (default {' '.join(map(str, M.LR_GRID))})")
    b.add_argument("--skip-static", action="store_true",
                   help="leave out the no-drift scenario of each data set")
    b.add_argument("--strategies", nargs="+", help=f"default: {' '.join(M.STRATEGIES)}")
    b.add_argument("--seeds", nargs="+", type=int, help=f"default: {' '.join(map(str, M.SEEDS))}")
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
                        "does not hold: a finished (or, without --retry-failed, failed) row counts "
                        "when its scenario, strategy, seed and protocol match (with --tier "
                        "papers: its paper, method, seed and run config), so only the missing "
                        "cells run")
    b.add_argument("--retry-failed", action="store_true",
                   help="run failed runs (and --reuse-rows' failed rows) again")
    b.add_argument("--render-only", action="store_true",
                   help=f"with --tier {TIER_PAPERS}: run nothing; write the page from the runs "
                        "finished so far (and --reuse-rows' rows), the others listed as not run "
                        "yet: a long bench's page while it goes on, or its rows kept to go on "
                        "from later")
    b.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="change the common protocol (every run), e.g. --set rounds-per-step=6")
    b.add_argument("--tune-only", action="store_true",
                   help="run the learning-rate tuning, write its rows (tuning.jsonl beside the "
                        "page's) and print the rates chosen, then stop")
    b.add_argument("--dry-run", action="store_true",
                   help="list the runs and which cannot run, run nothing")


@dataclass
class Plan:
    """What one ``fedcluster bench`` runs: the learning-rate tuning runs (none with a fixed
    rate), the matrix's cells (their rates set once the tuning has run), its methods and its
    common protocol."""

    tuning: list[M.Cell]
    cells: list[M.Cell]
    strategies: list[str]
    protocol: dict


def plan_of(args: argparse.Namespace) -> Plan:
    from fedcluster_app.core.config import (
        default_run_config,
        merge_overrides,
        parse_assignment,
        parse_run_config,
    )

    tier = M.TIERS[M.check_names("tier", [args.tier], [*M.TIERS, TIER_PAPERS])[0]]
    if getattr(args, "papers", None):
        raise ValueError(f"--papers chooses the papers of --tier {TIER_PAPERS}")
    if getattr(args, "render_only", False):
        # the matrix's rates come from its tuning runs: a page of part of them would score
        # rates chosen on part of the grid; its page re-renders from rows with --reuse-rows
        raise ValueError(f"--render-only writes the page of --tier {TIER_PAPERS} from what "
                         f"has finished; the matrix re-renders from its rows with --reuse-rows")
    quick = M.QUICK if args.quick else {}
    pick = lambda kind, given, key, valid: M.check_names(
        kind, given or quick.get(key, getattr(tier, key)), valid)
    datasets = pick("data set", args.datasets, "datasets", M.DATASETS)
    shifts = pick("shift", args.shifts, "shifts", M.SHIFTS)
    patterns = pick("drift pattern", args.patterns, "patterns", M.PATTERNS)
    priors = pick("prior", args.priors, "priors", M.PRIORS)
    strategies = list(args.strategies or quick.get("strategies", M.STRATEGIES))
    seeds = args.seeds if args.seeds is not None else list(quick.get("seeds", M.SEEDS))
    if M.VALIDATION_SEED in seeds:
        raise ValueError(f"seed {M.VALIDATION_SEED} is the validation seed the learning rates "
                         f"are chosen on: it is never scored (choose other seeds)")
    given = dict(parse_assignment(s) for s in args.set)
    protocol = {**M.PROTOCOL, **dict(tier.protocol), **quick.get("protocol", {}), **given}
    tune = not args.quick and "lr" not in given
    if not tune and args.tune_only:
        raise ValueError("--tune-only runs the learning-rate tuning, which "
                         + ("--set lr fixes" if "lr" in given else "--quick does not run"))
    if not tune and args.lr_grid:
        raise ValueError("--lr-grid tunes the learning rate, which "
                         + ("--set lr fixes" if "lr" in given else "--quick does not tune")
                         + ": give one or the other")
    # a mistake in the common protocol or a method's settings is the command's error, before
    # any run starts, not every cell's "cannot run"
    parse_run_config(merge_overrides(default_run_config(), protocol))
    M.check_methods(strategies, protocol)
    scenarios = M.scenarios(datasets, shifts, patterns, priors,
                            no_drift=not (args.skip_static or args.quick))
    frozen = tuple(sorted(protocol.items()))
    cells = [M.Cell(sc, s, seed, frozen) for sc in scenarios for s in strategies for seed in seeds]
    tuning = (M.tuning_cells(sorted({c.scenario.data for c in cells}, key=datasets.index),
                             strategies, frozen, tuple(args.lr_grid or M.LR_GRID), priors)
              if tune else [])
    return Plan(tuning, cells, strategies, protocol)


def heatmap_scenarios(scenarios: list[str]) -> list[str]:
    """Per data set, the scenario whose assignments the heat maps show: its mixed shift under
    sudden drift, else its first scenario with drift."""
    by_data: dict[str, list[str]] = {}
    for sc in dict.fromkeys(scenarios):
        by_data.setdefault(sc.split("/")[0], []).append(sc)
    out = []
    for scs in by_data.values():
        drifting = [sc for sc in scs if "/none" not in sc]
        preferred = [sc for sc in drifting if "/mix/sudden" in sc]
        if preferred or drifting:
            out.append((preferred or drifting)[0])
    return out


def output_paths(args: argparse.Namespace) -> tuple[Path, Path]:
    """The runs directory and the leaderboard page. The page goes into the runs directory
    unless ``--report`` names another (the smoke matrix and each tier but the headline have a
    runs directory of their own), so a bench writes into the repository only where it is
    told to."""
    default = (QUICK_RUNS_DIR if args.quick else RUNS_DIR if args.tier == "headline"
               else RUNS_DIR.with_name(f"{RUNS_DIR.name}-{args.tier}"))
    runs_dir = args.runs_dir or default
    return runs_dir, args.report or runs_dir / REPORT_NAME


def report_folder(report: Path) -> Path:
    """Where a leaderboard page's rows and plots go: the folder of the page's name beside it
    (``benchmark.md`` -> ``benchmark/``), or the page's own folder when the page is a folder's
    ``README.md`` (docs/benchmark/README.md keeps page, rows and plots together)."""
    return report.parent if report.name == "README.md" else report.with_suffix("")


def run(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    """``fedcluster bench``; SIGINT or SIGTERM stops it with every run it started (exit 130 or
    143), keeping the finished runs for the same command to continue from."""
    from fedcluster_app.core.stopping import Interrupted, stop_signals

    try:
        with stop_signals():
            return _run(args, argv)
    except (Interrupted, KeyboardInterrupt) as ex:
        print(f"bench: stopped by {getattr(ex, 'signame', 'SIGINT')}; the finished runs in "
              f"{args.runs_dir} are kept: the same command goes on from them, and from the "
              f"last checkpoint of each run it stopped", file=sys.stderr)
        return getattr(ex, "exit_code", 130)


def dry_run(plan: Plan, runs_dir: Path, retry_failed: bool, reuse: list[dict] | None) -> int:
    """List every run and whether it is finished, to run or cannot run. The scored runs are
    listed at the rates the tuning chose once every tuning run is finished (their directories
    are those rates'); before, at the protocol's rate, saying the tuning will choose."""
    from fedcluster_app.bench.runner import rows_without_running, run_states

    cells, rates = plan.cells, ""
    if plan.tuning:
        tuned = rows_without_running(plan.tuning, runs_dir, retry_failed, reuse)
        left = len(plan.tuning) - len(tuned)
        if left:
            rates = f" (lr: chosen by the tuning, {left} of its runs still to run)"
        else:
            cells, rates = M.with_tuned_lrs(cells, M.tuned_lrs(list(tuned.values()))), \
                " (lr: tuned)"
    tuning = set(plan.tuning)
    for cell, state in run_states(plan.tuning + cells, runs_dir, retry_failed, reuse).items():
        note = f" (tunes lr {cell.lr})" if cell in tuning else rates
        print(f"{cell.name}{note}: {state}")
    return 0


def _run(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    from fedcluster_app.bench import report as R
    from fedcluster_app.bench.runner import run_matrix

    args.runs_dir, args.report = output_paths(args)
    if args.tier == TIER_PAPERS:
        from fedcluster_app.bench import papers

        return papers.run(args, report_folder(args.report), argv)
    plan = plan_of(args)
    folder = report_folder(args.report)
    reuse = None
    if args.reuse_rows:   # the matrix's rows, and the tuning's that sit beside them
        tuned_beside = args.reuse_rows.parent / R.TUNING_FILE
        reuse = R.read_rows(args.reuse_rows) + (R.read_rows(tuned_beside)
                                                if tuned_beside.is_file() else [])
    if args.dry_run:
        return dry_run(plan, args.runs_dir, args.retry_failed, reuse)
    log = lambda line: print(line, flush=True)
    t0, load0 = time.time(), os.getloadavg()[0]
    tuning_rows, tuned_ran = [], 0
    cells = plan.cells
    if plan.tuning:
        log(f"bench: tuning the learning rate on seed {M.VALIDATION_SEED} over "
            f"{sorted({c.lr for c in plan.tuning})}")
        tuning_rows, tuned_ran = run_matrix(plan.tuning, args.runs_dir.resolve(),
                                            workers=args.workers, retry_failed=args.retry_failed,
                                            log=log, ray_address=args.ray_address, reuse=reuse)
        R.write_rows(tuning_rows, folder / R.TUNING_FILE)
        cells = M.with_tuned_lrs(cells, M.tuned_lrs(tuning_rows))
        if args.tune_only:
            print("\n".join(R.learning_rates_table(tuning_rows)))
            print(f"bench: tuning rows {folder / R.TUNING_FILE}")
            return 0
    rows, ran = run_matrix(cells, args.runs_dir.resolve(), workers=args.workers,
                           retry_failed=args.retry_failed, log=log,
                           ray_address=args.ray_address, reuse=reuse)
    load1 = os.getloadavg()[0]
    data_file = folder / "runs.jsonl"
    R.write_rows(rows, data_file)
    heat = heatmap_scenarios([r["scenario"] for r in rows])
    plots = R.plot_all(rows, plan.strategies, folder, heat)
    reading_file = folder / "reading.md"
    reading = reading_file.read_text() if reading_file.is_file() else None
    command = "fedcluster " + " ".join(shlex.quote(a) for a in (argv or ["bench"]))
    info = {"compute_min": sum(r.get("wall_time_s") or 0 for r in rows + tuning_rows) / 60.0,
            "where": (f"on the Ray cluster at {args.ray_address}" if args.ray_address
                      else f"on {args.workers} worker process(es)"),
            "cores": os.cpu_count(), "ran": ran + tuned_ran,
            "elapsed_min": (time.time() - t0) / 60.0,
            "load": f"{load0:.1f} at its start, {load1:.1f} at its end",
            "tier": M.TIERS[args.tier]}
    text = R.render(rows, plan.strategies, plan.protocol, command, plots, args.report,
                    data_file, info, reading, tuning_rows)
    args.report.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(args.report, text.encode())
    ok = sum(1 for r in rows if r["status"] in M.FINISHED)
    print(f"bench: {ok} of {len(rows)} runs finished; {time.time() - t0:.0f} s; leaderboard "
          f"{args.report}, data {data_file}")
    print("\n".join(R.leaderboard(rows)))
    return 0
