"""Cost of the Ray path (`flwr run` simulation) against the in-process engine, same experiment.

Runs one experiment both ways and prints the wall time of each, the CPU time of this process
(the in-process engine does all its work here; for the Ray path it is the launcher, and the
CPU of the SuperLink and Ray processes it started and waited for is counted apart), the fixed
start-up cost of the Ray path, the per-round overhead (median round time, Ray minus in-process),
and whether the two produced the same metrics (they must: same seed, same results).

    python benchmarks/bench_ray_overhead.py [--rounds-per-step 5] [--scenario mixture-swap]
    python benchmarks/bench_ray_overhead.py --strategy feddrift --scenario circle2 \\
        --set rounds-per-step=100 --set local-steps=50 ... --jsonl FILE   # docs/feddrift/README.md
"""

from __future__ import annotations

import resource
import statistics
import tempfile
import time
from pathlib import Path

from harness import assignments, load_average, machine, parser, write_rows

from fedcluster_app.core.config import default_run_config, merge_overrides
from fedcluster_app.core.experiment import load_experiment
from fedcluster_app.core.results import load_run
from fedcluster_app.engine import run_inprocess
from fedcluster_app.launcher import run_with_flwr


def children_cpu_s() -> float:
    """User + system CPU seconds of the child processes that ended and were waited for."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def timed(run) -> dict:
    load_start = load_average()
    t0, c0, k0 = time.perf_counter(), time.process_time(), children_cpu_s()
    run()
    return {"wall_s": round(time.perf_counter() - t0, 2),
            "cpu_s": round(time.process_time() - c0, 2),
            "children_cpu_s": round(children_cpu_s() - k0, 2), **machine(load_start)}


def main() -> None:
    ap = parser(__doc__, jsonl="one per engine (times, load, metric)", overrides=True)
    ap.add_argument("--scenario", default="mixture-swap")
    ap.add_argument("--strategy", default="ifca")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds-per-step", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = {"strategy": args.strategy, "scenario": args.scenario, "seed": args.seed,
                "progress": False, "rounds-per-step": args.rounds_per_step, "plot": False,
                **assignments(args.set)}
        rc_in = merge_overrides(default_run_config(), {**base, "out-dir": f"{tmp}/inprocess"})
        rc_ray = merge_overrides(default_run_config(), {**base, "out-dir": f"{tmp}/ray"})
        n = load_experiment(rc_in).scenario.num_clients
        t_in = timed(lambda: run_inprocess(rc_in))
        t_ray = timed(lambda: run_with_flwr(rc_ray, n))
        s_in, r_in = load_run(Path(tmp) / "inprocess")
        s_ray, r_ray = load_run(Path(tmp) / "ray")
    med_in = statistics.median(r["round_time_s"] for r in r_in[1:])
    med_ray = statistics.median(r["round_time_s"] for r in r_ray[1:])
    in_rounds = sum(r["round_time_s"] for r in r_ray)
    same = [r["accuracy"] for r in r_in] == [r["accuracy"] for r in r_ray]
    print(f"{args.strategy} on {args.scenario}: {n} clients, {len(r_in)} rounds, "
          f"{2 * n} messages per round")
    for name, t, med in (("in-process engine", t_in, med_in), ("flwr run on Ray", t_ray, med_ray)):
        print(f"{name:18s}: {t['wall_s']:7.1f} s wall, CPU {t['cpu_s']:6.1f} s here + "
              f"{t['children_cpu_s']:6.1f} s in waited-for children, median round "
              f"{med * 1e3:6.1f} ms (load {t['load_start'][0]:.2f} at the start)")
    print(f"Ray start-up + teardown (wall - rounds): {t_ray['wall_s'] - in_rounds:6.1f} s")
    print(f"Ray per-round overhead: {(med_ray - med_in) * 1e3:6.1f} ms "
          f"({(med_ray - med_in) * 1e3 / (2 * n):.1f} ms per client message); "
          f"round-time ratio {med_ray / med_in:.2f}x")
    print(f"same metrics on both engines: {same}")
    rows = []
    for engine, t, med, summary in (("in-process", t_in, med_in, s_in),
                                    ("ray", t_ray, med_ray, s_ray)):
        rows.append({"engine": engine, "strategy": args.strategy, "scenario": args.scenario,
                     "seed": args.seed, "config": base, "rounds": len(r_in),
                     "median_round_s": round(med, 4), **t,
                     "mean_accuracy": summary.get("mean_accuracy"),
                     "acc_omit": summary.get("acc_omit"),
                     "same_metrics_on_both": same})
    write_rows(args.jsonl, rows)


if __name__ == "__main__":
    main()
