"""The cost of FedRC against FedAvg on the same population: seconds per round, as a ratio.

FedRC sends K models to every client, runs K inference passes over its training data (the
E-step) and K weighted local trainings, and returns K models; FedAvg trains one. Both run here
in-process on ``shifts-3`` with the preset ``presets/fedrc-shifts3.toml`` (K = 3), alternating
FedAvg / FedRC / FedEM ``--repeats`` times in this one process so machine load hits all alike;
the ratio uses the median seconds per round of each.

    python benchmarks/fedrc_cost.py            # 3 x 20 rounds each
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
import tomllib
from pathlib import Path

from harness import load_average, machine, parser, write_rows

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = parser(__doc__, jsonl="one per strategy (every run's seconds per round, the median)",
                repeats=3, strategies=["fedavg", "fedrc", "fedem"])
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    load_start = load_average()
    from fedcluster_app.engine import run_inprocess

    preset = tomllib.loads((ROOT / "presets" / "fedrc-shifts3.toml").read_text())
    times: dict[str, list[float]] = {s: [] for s in args.strategies}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for strategy in args.strategies:
                out = Path(tmp) / f"{strategy}-{i}"
                t0 = time.perf_counter()
                run_inprocess({**preset, "strategy": strategy, "rounds-per-step": args.rounds,
                               "overwrite": True, "out-dir": str(out), "plot": False, "progress": False,
                               "protocol": "none"})
                times[strategy].append((time.perf_counter() - t0) / args.rounds)
    med = {s: statistics.median(v) for s, v in times.items()}
    base = med.get("fedavg")
    rows = [{"strategy": s, "s_per_round_median": round(med[s], 4),
             "runs": [round(t, 4) for t in times[s]], "rounds": args.rounds,
             "ratio_to_fedavg": round(med[s] / base, 3) if base else None,
             "num_clusters": preset["num-clusters"], **machine(load_start)}
            for s in args.strategies]
    for row in rows:
        print(json.dumps(row))
    write_rows(args.jsonl, rows)
    if base:
        for s in args.strategies:
            if s != "fedavg":
                print(f"{s} / fedavg seconds per round: {med[s] / base:.2f}x "
                      f"(K = {preset['num-clusters']}, {args.rounds} rounds x {args.repeats})")


if __name__ == "__main__":
    main()
