"""Run several strategies x seeds on one scenario in-process and print the comparison table.

    python benchmarks/compare_strategies.py --scenario circle2 --strategies fedavg ifca oracle \
        --seeds 0 1 2 --runs-dir runs/compare-circle2 [--set key=value ...] [--jsonl FILE]

Each run leaves its own results directory under --runs-dir; the table is `fedcluster report` over
them (the per-(strategy, scenario) block gives mean +- std over seeds). ``--jsonl`` also writes
one JSON line per run: its summary (scalars only) with the settings it ran with.
"""

from __future__ import annotations

from pathlib import Path

from harness import assignments, load_average, parser, write_rows

from fedcluster_app.core.results import compare_runs
from fedcluster_app.engine import run_inprocess


def main() -> None:
    ap = parser(__doc__, jsonl="one per run", seeds=[0, 1, 2],
                strategies=["fedavg", "ifca", "oracle"], overrides=True)
    ap.add_argument("--scenario", default="circle2")
    ap.add_argument("--runs-dir", type=Path, default=Path("runs/compare"))
    args = ap.parse_args()
    extra = assignments(args.set)
    load_start = load_average()
    dirs, rows = [], []
    for strategy in args.strategies:
        for seed in args.seeds:
            out = (args.runs_dir / f"{strategy}-s{seed}").resolve()
            summary = run_inprocess({**extra, "strategy": strategy, "scenario": args.scenario,
                                     "seed": seed, "overwrite": True, "out-dir": str(out),
                                     "progress": False, "protocol": "none"})
            dirs.append(out)
            rows.append({"strategy": strategy, "scenario": args.scenario, "seed": seed,
                         "set": extra, **{k: v for k, v in summary.items()
                                          if isinstance(v, (int, float, str, type(None)))
                                          and k != "out_dir"}})
    print(compare_runs(dirs, out_path=args.runs_dir / "comparison.png"))
    write_rows(args.jsonl, rows, load_start=load_start)     # the runs' wall times


if __name__ == "__main__":
    main()
