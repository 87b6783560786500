"""Seconds per round: in-process vs Ray simulation vs a real SuperLink + SuperNodes on 127.0.0.1.

Runs the same small experiment (3 clients, IFCA) on the engines and prints each one's median
round time: in-process, Ray, and two local deployments, one of plain `flower-supernode`s
(`fedcluster deploy up --stock-supernodes`: a fresh ClientApp process per message, Flower's 3 s
polls) and one as `fedcluster deploy up` starts them (one long-lived ClientApp process per
SuperNode, short polls). Also the parts that explain the stock deployment's time: the import
time of the ClientApp in a fresh process and the number of message waves per round.

    python benchmarks/bench_deployment.py [--rounds 4] [--jsonl docs/operations/deployment.jsonl]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import load_average, machine, parser, write_rows

from fedcluster_app.core.config import default_run_config, merge_overrides
from fedcluster_app.core.results import load_run
from fedcluster_app.deploy import LocalDeployment
from fedcluster_app.engine import run_inprocess
from fedcluster_app.launcher import run_on_deployment, run_with_flwr


def clientapp_import_seconds() -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import fedcluster_app.client_app"], check=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = parser(__doc__, jsonl="one per engine (and one for the ClientApp import)")
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    load_start = load_average()
    with tempfile.TemporaryDirectory() as tmp:
        def cfg(name):
            return merge_overrides(default_run_config(), {
                "strategy": "ifca", "scenario": "mixture-swap", "num-clients": 3,
                "num-steps": args.rounds, "rounds-per-step": 1, "local-steps": 5,
                "samples-per-step": 100, "test-samples": 50, "plot": False,
                "round-timeout": 300.0, "out-dir": f"{tmp}/{name}"})

        walls = {}
        t0 = time.perf_counter()
        run_inprocess(cfg("inprocess"))
        walls["in-process"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        run_with_flwr(cfg("ray"), 3)
        walls["Ray simulation"] = time.perf_counter() - t0
        deployments = {"deployment, stock SuperNodes": ("stock", True),
                       "deployment": ("deployment", False)}
        for name, (key, stock) in deployments.items():
            with LocalDeployment(Path(tmp) / f"dep-{key}", num_nodes=3,
                                 stock_supernodes=stock) as dep:
                t0 = time.perf_counter()
                run_on_deployment(cfg(key), dep.connection())
                walls[name] = time.perf_counter() - t0
        medians = {}
        for name, key in (("in-process", "inprocess"), ("Ray simulation", "ray"),
                          *((name, key) for name, (key, _) in deployments.items())):
            _, rounds = load_run(Path(tmp) / key)
            medians[name] = statistics.median(r["round_time_s"] for r in rounds)
    imp = clientapp_import_seconds()
    print(f"IFCA, 3 clients, {args.rounds} rounds, 2 message waves per round (train, evaluate)")
    for name in medians:
        print(f"{name:29s}: median round {medians[name]:7.2f} s, whole run "
              f"{walls[name]:7.1f} s")
    print(f"deployment / Ray round time: {medians['deployment'] / medians['Ray simulation']:.1f}x;"
          f" stock SuperNodes / deployment: "
          f"{medians['deployment, stock SuperNodes'] / medians['deployment']:.1f}x")
    print(f"ClientApp import in a fresh process (torch, flwr, numpy): {imp:.2f} s; a stock "
          f"SuperNode pays it once per message, i.e. about {2 * imp:.1f} s per round per client "
          f"(clients run in parallel, on this machine they share {os.cpu_count()} "
          f"cores), and polls the SuperLink every 3 s (Flower's built-in interval).")
    load = machine(load_start)
    rows = [{"engine": name, "rounds": args.rounds, "median_round_s": round(medians[name], 4),
             "whole_run_s": round(walls[name], 2), **load} for name in medians]
    rows.append({"clientapp_import_s": round(imp, 3), **load})
    write_rows(args.jsonl, rows)


if __name__ == "__main__":
    main()
