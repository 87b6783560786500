"""Wall time of every `fedcluster list` form, each in a fresh process (as a user runs it).

`fedcluster list` reads only the families' catalogues (no torch, no numpy), so every built-in
form should answer well under the limit (1 s). Prints, per form, the median of --repeats runs
and its ratio to the limit, with the machine's load average before and after (a loaded machine
slows every form alike); exits 1 if a form is over the limit.

    python benchmarks/bench_list.py [--repeats 3] [--limit 1.0] [--jsonl FILE]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from harness import load_average, machine, parser, write_rows

ROOT = Path(__file__).resolve().parent.parent

FORMS = [
    ["list"],
    *(["list", what] for what in ("strategies", "scenarios", "federations", "config", "params",
                                  "presets", "protocols")),
    ["list", "--toml"],
    ["list", "params", "--toml"],
    ["list", "params", "--strategy", "feddrift"],
    ["list", "params", "--strategy", "feddrift", "--toml"],
]


def command() -> list[str]:
    """The installed console script next to this interpreter, else ``python -m``."""
    script = Path(sys.executable).with_name("fedcluster")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "fedcluster_app.cli"]


def wall_seconds(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def load() -> str:
    return " ".join(f"{x:.2f}" for x in load_average())


def main() -> int:
    ap = parser(__doc__, jsonl="one per form (every run's seconds)", repeats=3,
                repeats_help="runs per form (the median is shown)")
    ap.add_argument("--limit", type=float, default=1.0, help="slowest allowed, seconds")
    args = ap.parse_args()
    load_start = load_average()

    base = command()
    print(f"load average (1, 5, 15 min) before: {load()} on {os.cpu_count()} CPUs")
    print(f"{'form':<52} {'seconds':>8} {'/ limit':>8}")
    over, rows = [], []
    for form in FORMS:
        runs = [wall_seconds(base + form) for _ in range(args.repeats)]
        seconds = statistics.median(runs)
        rows.append({"form": "fedcluster " + " ".join(form), "seconds": [round(s, 3) for s in runs],
                     "median_s": round(seconds, 3), "limit_s": args.limit})
        ratio = seconds / args.limit
        print(f"{'fedcluster ' + ' '.join(form):<52} {seconds:8.3f} {ratio:8.2f}")
        if ratio > 1:
            over.append(form)
    print(f"load average after: {load()}")
    write_rows(args.jsonl, [{**r, **machine(load_start)} for r in rows])
    if over:
        print(f"over the {args.limit:g} s limit: {', '.join(' '.join(f) for f in over)}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
