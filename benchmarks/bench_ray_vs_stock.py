"""fedcluster's FedAvg on Ray against stock Flower's, the same experiment, in one run.

The reference is benchmarks/stock_flower/, a minimal Flower 1.41 Message-API app: Flower's own
``flwr.serverapp.strategy.FedAvg`` and a ClientApp with fedcluster's MLP, the same data (the
mixture-swap scenario), local steps (20), batch size (50) and optimizer (Adam, 0.01), every
client training and evaluating in every round. Both run as Ray simulations through ``flwr run``
on a private SuperLink, one SuperNode per client and ``client-resources-num-cpus=1``, one after
the other for each client count. Printed per count: the median seconds per round (round 1, in
which the Ray workers import torch, left out), the ratio fedcluster / stock, and the CPU
seconds of the simulation process (``flwr-simulation``, which runs the ServerApp and Ray's
driver), read from /proc while it runs.

    python benchmarks/bench_ray_vs_stock.py [--clients 10 100] [--rounds 20] [--jsonl FILE]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from harness import ROOT, load_average, machine, parser, write_rows

from fedcluster_app.core.config import default_run_config, merge_overrides
from fedcluster_app.core.results import load_run
from fedcluster_app.launcher import (
    LocalSimulationSuperLink,
    process_tree,
    run_with_flwr,
    write_run_config,
)

STOCK_APP = ROOT / "benchmarks" / "stock_flower"
SIMULATION_PROCESS = "flwr-simulation"
TICKS = os.sysconf("SC_CLK_TCK")


class SimulationCPU:
    """Polls the CPU seconds (user + system) of this process's descendants whose command line
    names ``flwr-simulation``; ``cpu_s`` is the last reading (the process is gone once the run
    ends, so the reading is at most ``every`` seconds short)."""

    def __init__(self, every: float = 0.2) -> None:
        self.every, self.cpu_s, self._stop = every, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> SimulationCPU:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _poll(self) -> None:
        seen: dict[int, float] = {}
        while not self._stop.wait(self.every):
            for pid in process_tree(os.getpid()):
                try:
                    if SIMULATION_PROCESS not in Path(f"/proc/{pid}/cmdline").read_text():
                        continue
                    stat = Path(f"/proc/{pid}/stat").read_text()
                except OSError:
                    continue
                fields = stat[stat.rindex(")") + 2:].split()
                seen[pid] = (int(fields[11]) + int(fields[12])) / TICKS   # utime + stime
            self.cpu_s = sum(seen.values())


def run_fedcluster(n: int, rounds: int, tmp: Path) -> tuple[list[float], list[float]]:
    """(round times, accuracies) of ``fedcluster run --engine ray --strategy fedavg``."""
    rc = merge_overrides(default_run_config(), {
        "strategy": "fedavg", "scenario": "mixture-swap", "num-clients": n,
        "num-steps": rounds // 5, "rounds-per-step": 5, "progress": False, "plot": False,
        "out-dir": str(tmp / f"fedcluster-{n}")})
    run_with_flwr(rc, n, workdir=tmp)
    _, rows = load_run(tmp / f"fedcluster-{n}")
    return [r["round_time_s"] for r in rows], [r["accuracy"] for r in rows]


def run_stock(n: int, rounds: int, tmp: Path) -> tuple[list[float], list[float]]:
    """(round times, accuracies) of the stock Flower app, through ``flwr run``."""
    times = tmp / f"stock-{n}.json"
    home = Path(tempfile.mkdtemp(prefix="stock-", dir=tmp))
    config = write_run_config({"num-server-rounds": rounds, "num-clients": n,
                               "num-steps": rounds // 5, "times-file": str(times)},
                              home / "run-config.toml")
    with LocalSimulationSuperLink(home) as link:   # its env's PATH finds this env's flwr
        done = subprocess.run(
            ["flwr", "run", str(STOCK_APP), "fedcluster", "--stream",
             "--run-config", str(config), "--federation-config",
             f"num-supernodes={n} client-resources-num-cpus=1"],
            env=link.env, capture_output=True, text=True, check=False)
    if not times.is_file():   # `flwr run` exits 0 even when the run failed
        raise RuntimeError(f"the stock Flower run wrote no times: {done.stdout[-3000:]}")
    out = json.loads(times.read_text())
    return out["round_time_s"], [out["accuracy"][str(r)] for r in range(1, rounds + 1)]


def measure(way: str, run, n: int, rounds: int, tmp: Path) -> dict:
    load_start = load_average()
    t0 = time.perf_counter()
    with SimulationCPU() as cpu:
        round_times, accuracy = run(n, rounds, tmp)
    wall = time.perf_counter() - t0
    return {"way": way, "clients": n, "rounds": len(round_times),
            "s_per_round": round(statistics.median(round_times[1:]), 4),
            "round_time_s": [round(t, 4) for t in round_times],
            "simulation_cpu_s": round(cpu.cpu_s, 1), "wall_s": round(wall, 1),
            "final_accuracy": round(float(accuracy[-1]), 4), **machine(load_start)}


def main() -> None:
    ap = parser(__doc__, jsonl="one per way and client count (round times, CPU, load)",
                append=True)
    ap.add_argument("--clients", type=int, nargs="+", default=[10, 100], metavar="N")
    ap.add_argument("--rounds", type=int, default=20,
                    help="rounds of each run (a multiple of 5, fedcluster's rounds per step)")
    args = ap.parse_args()
    if args.rounds < 5 or args.rounds % 5:
        ap.error(f"--rounds must be a multiple of 5 (at least 5), got {args.rounds}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="rvs-") as tmp:
        for n in args.clients:
            pair = [measure("fedcluster", run_fedcluster, n, args.rounds, Path(tmp)),
                    measure("stock-flower", run_stock, n, args.rounds, Path(tmp))]
            ratio = pair[0]["s_per_round"] / pair[1]["s_per_round"]
            for row in pair:
                row["ratio_fedcluster_to_stock"] = round(ratio, 3)
                print(f"{n:4d} clients  {row['way']:12s}: {row['s_per_round']:7.3f} s/round "
                      f"(median of rounds 2-{row['rounds']}), simulation process CPU "
                      f"{row['simulation_cpu_s']:6.1f} s, wall {row['wall_s']:6.1f} s, "
                      f"accuracy {row['final_accuracy']:.3f} (load {row['load_start'][0]:.2f})")
            print(f"{n:4d} clients  fedcluster / stock Flower: {ratio:.2f}x per round, "
                  f"{pair[0]['simulation_cpu_s'] / max(pair[1]['simulation_cpu_s'], 1e-9):.2f}x "
                  f"simulation-process CPU")
            rows += pair
    command = " ".join(["python benchmarks/bench_ray_vs_stock.py", *ap.argv])
    write_rows(args.jsonl, [{**r, "command": command} for r in rows], append=args.append)


if __name__ == "__main__":
    main()
