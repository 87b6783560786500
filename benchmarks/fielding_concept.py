"""Concept drift (the paper's appendix experiment; docs/fielding.md, D16): ``digits-concept-swap``, half of the 20 clients swap
two random labels at step 2 (round 6). Fielding with the label representation cannot see it (the
label vectors do not change); with the gradient representation of the shared probe model it can.
Squared Euclidean distance and eps-drift 0.3 for the gradients (with a well-trained probe the
cosine distance is dominated by noise: see docs/fielding.md).

    python benchmarks/fielding_concept.py [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse

import numpy as np
from fielding_common import run, window

BASE = {"rounds-per-step": 5, "optimizer": "sgd", "lr": 0.1, "local-steps": 5, "batch-size": 20,
        "fraction-train": 0.5, "fielding.participants": 10}
VARIANTS = {
    "fedavg (global)": ("fedavg", {}),
    "fielding, label vectors": ("fielding", {}),
    "fielding, probe gradients": ("fielding", {"fielding.rep": "gradient",
                                               "fielding.distance": "sqeuclidean",
                                               "fielding.eps-drift": 0.3}),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = ap.parse_args()
    rows = {}
    for seed in args.seeds:
        for name, (strategy, extra) in VARIANTS.items():
            summary, rounds, _ = run(strategy, "digits-concept-swap", seed, **BASE, **extra)
            drift_round = 6
            reports = rounds[drift_round - 1].get("fielding_drifted")
            vals = (window(rounds, 1, 5), window(rounds, 6, 30), window(rounds, 26, 30),
                    reports if reports is not None else float("nan"),
                    rounds[-1].get("fielding_reclusters", 0), rounds[-1]["num_clusters"])
            rows.setdefault(name, []).append(vals)
            print(f"seed {seed} {name}: before {vals[0]:.3f} after {vals[1]:.3f} final "
                  f"{vals[2]:.3f} drift reports at round 6: {vals[3]} re-clusterings {vals[4]} "
                  f"K {vals[5]}", flush=True)
    print(f"\nmean over seeds {args.seeds}:")
    print("| representation | rounds 1-5 | rounds 6-30 | final 26-30 | drift reports at round 6 "
          "(10 swapped) | re-clusterings | K end |")
    print("|---|---|---|---|---|---|---|")
    for name, vals in rows.items():
        v = np.array(vals, dtype=float)
        print(f"| {name} | {v[:, 0].mean():.3f} | {v[:, 1].mean():.3f} | {v[:, 2].mean():.3f} | "
              f"{'/'.join('-' if np.isnan(x) else str(int(x)) for x in v[:, 3])} | "
              f"{'/'.join(str(int(x)) for x in v[:, 4])} | {'/'.join(str(int(x)) for x in v[:, 5])} |")


if __name__ == "__main__":
    main()
