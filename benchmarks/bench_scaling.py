"""Seconds per round and peak memory of the in-process engine at 100 to 100,000 clients.

FedAvg on CIRCLE-2, every client (or ``--fraction`` of them) training 1 local step per round and
evaluated;
each size runs in its own process (its peak resident memory is its own), batched (the default)
and, with ``--unbatched``, one client after the other too. The time per round is the median of
the rounds' ``round_time_s`` (training and evaluation of every client, server work included);
start-up (imports, data) is left out. The last column is the time per client-round relative to
the smallest size: 1.0 means linear scaling.

    python benchmarks/bench_scaling.py [--clients 100 1000 10000] [--rounds 3] [--unbatched]
        [--fraction 0.01] [--jsonl docs/operations/performance_scaling.jsonl [--append]]

With ``--fraction f`` a round samples f of the clients for training and f for evaluation
(``fraction-train``, ``fraction-evaluate``); the first round (discovery of every node, which
asks each client its data size) is also reported apart (``first_round_s``; ``later_round_s``:
the median of the others).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import load_average, parser, write_rows

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, logging, resource, statistics, sys, tempfile, time
from pathlib import Path
from flwr.common.logger import FLOWER_LOGGER
FLOWER_LOGGER.setLevel(logging.ERROR)
from fedcluster_app.engine import run_inprocess
n, rounds, batch, fraction = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1", float(sys.argv[4])
out = Path(tempfile.mkdtemp()) / "run"
t0 = time.perf_counter()
summary = run_inprocess({"strategy": "fedavg", "scenario": "circle2", "num-clients": n,
    "local-steps": 1, "num-steps": 1, "rounds-per-step": rounds, "protocol": "none",
    "batch-clients": batch, "checkpoint-client-state": False, "plot": False, "progress": False,
    "fraction-train": fraction, "fraction-evaluate": fraction, "node-wait-s": 0,
    "out-dir": str(out)})
wall = time.perf_counter() - t0
times = [json.loads(l)["round_time_s"] for l in (out / "metrics.jsonl").read_text().splitlines()]
print(json.dumps({"clients": n, "batched": batch, "rounds": rounds, "fraction": fraction,
    "status": summary["status"], "first_round_s": times[0],
    "round_s": statistics.median(times), "later_round_s": statistics.median(times[1:] or times),
    "run_s": round(wall, 2),
    "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    "accuracy": summary.get("final_accuracy")}))
"""


def main() -> None:
    ap = parser(__doc__, jsonl="one per size and mode", append=True)
    ap.add_argument("--clients", type=int, nargs="+", default=[100, 1000, 10000])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--unbatched", action="store_true", help="also one client after the other")
    ap.add_argument("--fraction", type=float, default=1.0,
                    help="share of the clients trained and evaluated each round")
    args = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FEDCLUSTER_TORCH_THREADS": "1"}
    rows = []
    load_start = load_average()
    for batch in ([True, False] if args.unbatched else [True]):
        for n in args.clients:
            with tempfile.TemporaryDirectory() as tmp:
                res = subprocess.run([sys.executable, "-c", CHILD, str(n), str(args.rounds),
                                      "1" if batch else "0", str(args.fraction)], env=env, cwd=tmp,
                                     capture_output=True, text=True, check=False)
            if res.returncode != 0:
                raise SystemExit(f"{n} clients failed:\n{res.stderr[-2000:]}")
            rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
    load_end = load_average()
    print(f"FedAvg on circle2, 1 local step, {args.rounds} rounds per size; load average "
          f"{load_start[0]:.2f} at the start, {load_end[0]:.2f} at the end, {os.cpu_count()} cores")
    print(f"{'clients':>8} {'mode':>10} {'s/round':>9} {'ms/client':>10} {'peak MiB':>9} "
          f"{'vs linear':>9}")
    for batch in sorted({r["batched"] for r in rows}, reverse=True):
        mine = [r for r in rows if r["batched"] == batch]
        base = mine[0]["round_s"] / mine[0]["clients"]
        for r in mine:
            per = r["round_s"] / r["clients"]
            r["vs_linear"] = round(per / base, 2)
            print(f"{r['clients']:>8} {'batched' if batch else 'one by one':>10} "
                  f"{r['round_s']:>9.3f} {1000 * per:>10.3f} {r['peak_rss_mib']:>9.0f} "
                  f"{r['vs_linear']:>9.2f}")
    write_rows(args.jsonl, rows, append=args.append, load_start=load_start)


if __name__ == "__main__":
    main()
