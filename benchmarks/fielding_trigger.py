"""Why Fielding's global re-clustering fires at 30 clients and not at 302 on ``digits-buckets``.

Fielding re-clusters everybody when the largest center shift of a drift step reaches tau times
the mean distance between the reference centers (docs/fielding/README.md, "The algorithm as
implemented"). This runs Fielding on a label-bucket stream at several population sizes, with the
settings of the 302-client table (``fielding_buckets.py --prox-mu 0.01``: 10 rounds per step,
SGD lr 0.1, 10 local steps, batch 20, M = 30% of the clients), and prints for every drift step the
largest center shift, the threshold tau * theta, whether it fired, and the mean number of members
per cluster (clients / K before the step). A cluster center is the mean of its members' label
vectors, so the part of its shift that comes from which clients happen to be in it falls like
one over the square root of its members: the printed summary sets the shift beside that.

    python benchmarks/fielding_trigger.py [--scenarios digits-buckets mixture-buckets] \\
        [--clients 30 60 120 302] [--seeds 0 1 2] [--jsonl FILE]
"""

from __future__ import annotations

import math
from itertools import pairwise

import numpy as np
from fielding_common import record, run
from harness import load_average, parser, write_rows


def drift_steps(rounds: list[dict], clients: int) -> list[dict]:
    """One entry per drift step of a run: the trigger's quantities from the round that handled
    it, and K from the round before (the clusters the step's shift is measured on)."""
    steps = []
    for prev, r in pairwise(rounds):
        if r.get("fielding_theta") is None or r.get("fielding_max_shift") is None:
            continue
        k = prev["num_clusters"]
        steps.append({"round": r["round"], "k_before": k, "members_per_cluster": clients / k,
                      "theta": r["fielding_theta"], "max_shift": r["fielding_max_shift"],
                      "threshold": r["fielding_threshold"], "moves": r.get("fielding_moves"),
                      "fired": r["fielding_reclusters"] > prev.get("fielding_reclusters", 0)})
    return steps


def main() -> None:
    ap = parser(__doc__, jsonl="one per run, its drift steps included", seeds=[0, 1, 2])
    ap.add_argument("--scenarios", nargs="+", default=["digits-buckets", "mixture-buckets"])
    ap.add_argument("--clients", type=int, nargs="+", default=[30, 60, 120, 302])
    ap.add_argument("--prox-mu", type=float, default=0.01)
    args = ap.parse_args()
    load_start = load_average()
    rows = []
    for scenario in args.scenarios:
        print(f"\n{scenario}: clients | mean members per cluster | largest center shift | "
              "threshold tau*theta | shift / threshold | steps that fired | "
              "shift x sqrt(members) | final accuracy")
        for n in args.clients:
            m = round(0.3 * n)
            cfg = {"rounds-per-step": 10, "optimizer": "sgd", "lr": 0.1, "local-steps": 10,
                   "batch-size": 20, "fraction-train": 0.3, "fielding.participants": m,
                   "prox-mu": args.prox_mu, "num-clients": n}
            per_seed, finals = [], []
            for seed in args.seeds:
                summary, rounds, secs = run("fielding", scenario, seed, **cfg)
                steps = drift_steps(rounds, n)
                per_seed.append(steps)
                finals.append(summary["final_accuracy"])
                rows.append(record(seed, "fielding", cfg, summary, secs, scenario=scenario,
                                   clients=n, participants=m, steps=steps,
                                   fired=sum(s["fired"] for s in steps)))
            steps = [s for seed_steps in per_seed for s in seed_steps]
            members = np.mean([s["members_per_cluster"] for s in steps])
            shift = np.mean([s["max_shift"] for s in steps])
            thr = np.mean([s["threshold"] for s in steps])
            scaled = np.mean([s["max_shift"] * math.sqrt(s["members_per_cluster"]) for s in steps])
            fired = "/".join(str(sum(s["fired"] for s in ss)) + f" of {len(ss)}" for ss in per_seed)
            print(f"| {n} | {members:.1f} | {shift:.3f} | {thr:.3f} | {shift / thr:.2f} | {fired} "
                  f"| {scaled:.2f} | {np.mean(finals):.3f} |", flush=True)
    write_rows(args.jsonl, rows, load_start=load_start)


if __name__ == "__main__":
    main()
