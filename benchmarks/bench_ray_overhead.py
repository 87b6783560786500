"""Cost of the Ray path (`flwr run` simulation) against the in-process engine, same experiment.

Runs one experiment both ways and prints the wall time of each, the fixed start-up cost of the
Ray path, the per-round overhead (median round time, Ray minus in-process), and whether the two
produced the same metrics (they must: same seed, same results).

    python benchmarks/bench_ray_overhead.py [--rounds-per-step 5] [--scenario mixture-swap]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from fedcluster_app.core.config import default_run_config, merge_overrides
from fedcluster_app.core.experiment import load_experiment
from fedcluster_app.core.results import load_run
from fedcluster_app.engine import run_inprocess
from fedcluster_app.launcher import run_with_flwr


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", default="mixture-swap")
    ap.add_argument("--strategy", default="ifca")
    ap.add_argument("--rounds-per-step", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = {"strategy": args.strategy, "scenario": args.scenario, "progress": False,
                "rounds-per-step": args.rounds_per_step, "plot": False}
        rc_in = merge_overrides(default_run_config(), {**base, "out-dir": f"{tmp}/inprocess"})
        rc_ray = merge_overrides(default_run_config(), {**base, "out-dir": f"{tmp}/ray"})
        n = load_experiment(rc_in).scenario.num_clients
        t0 = time.perf_counter()
        run_inprocess(rc_in)
        t_in = time.perf_counter() - t0
        t0 = time.perf_counter()
        run_with_flwr(rc_ray, n)
        t_ray = time.perf_counter() - t0
        _, r_in = load_run(Path(tmp) / "inprocess")
        _, r_ray = load_run(Path(tmp) / "ray")
    med_in = statistics.median(r["round_time_s"] for r in r_in[1:])
    med_ray = statistics.median(r["round_time_s"] for r in r_ray[1:])
    in_rounds = sum(r["round_time_s"] for r in r_ray)
    same = [r["accuracy"] for r in r_in] == [r["accuracy"] for r in r_ray]
    print(f"{args.strategy} on {args.scenario}: {n} clients, {len(r_in)} rounds, "
          f"{2 * n} messages per round")
    print(f"in-process engine : {t_in:6.1f} s wall, median round {med_in * 1e3:6.1f} ms")
    print(f"flwr run on Ray   : {t_ray:6.1f} s wall, median round {med_ray * 1e3:6.1f} ms")
    print(f"Ray start-up + teardown (wall - rounds): {t_ray - in_rounds:6.1f} s")
    print(f"Ray per-round overhead: {(med_ray - med_in) * 1e3:6.1f} ms "
          f"({(med_ray - med_in) * 1e3 / (2 * n):.1f} ms per client message); "
          f"round-time ratio {med_ray / med_in:.2f}x")
    print(f"same metrics on both engines: {same}")


if __name__ == "__main__":
    main()
