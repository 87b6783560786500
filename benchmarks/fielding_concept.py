"""Concept drift (the paper's appendix experiment; docs/fielding/README.md, D16): ``digits-concept-swap``, half of the 20 clients swap
two random labels at step 2 (round 6). Fielding with the label representation cannot see it (the
label vectors do not change); with the gradient representation of the shared probe model it can.
Squared Euclidean distance and eps-drift 0.3 for the gradients (with a well-trained probe the
cosine distance is dominated by noise: see docs/fielding/README.md).

    python benchmarks/fielding_concept.py [--seeds 0 1 2] [--jsonl FILE]

``--jsonl`` writes one JSON line per run (the table's numbers, and for the gradient run the
distance ranges below). The gradient run also records every client's representation at every
step (the client's own ``representation``, wrapped for the run) and prints the range of the
distance between consecutive steps, under both the cosine and the squared Euclidean distance,
for the unswapped client-steps and for the swapped clients across the swap: the measurement
behind the choice of the squared Euclidean distance for gradients.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

import numpy as np
from fielding_common import run, window
from harness import load_average, parser, write_rows

from fedcluster_app.core import wire as P
from fedcluster_app.families.fielding import client as fielding_client
from fedcluster_app.families.fielding.distances import distance

BASE = {"rounds-per-step": 5, "optimizer": "sgd", "lr": 0.1, "local-steps": 5, "batch-size": 20,
        "fraction-train": 0.5, "fielding.participants": 10}
VARIANTS = {
    "fedavg (global)": ("fedavg", {}),
    "fielding, label vectors": ("fielding", {}),
    "fielding, probe gradients": ("fielding", {"fielding.rep": "gradient",
                                               "fielding.distance": "sqeuclidean",
                                               "fielding.eps-drift": 0.3}),
}


@contextmanager
def recording_representations(into: dict):
    """Record ``(client, step) -> (concept, vector)`` for every representation a client computes
    (in-process runs only: the clients run in this process)."""
    original = fielding_client.representation

    def recorded(client, config, probe):
        vec = original(client, config, probe)
        step = int(config[P.STEP])
        into[(client.client_id, step)] = (client.exp.scenario.concept(client.client_id, step),
                                          np.array(vec, dtype=np.float64))
        return vec

    fielding_client.representation = recorded
    try:
        yield
    finally:
        fielding_client.representation = original


def distance_ranges(reps: dict) -> dict:
    """[min, max] of the distance between a client's representations at consecutive steps, per
    metric, for client-steps whose concept stayed and for those whose concept changed."""
    out: dict = {}
    for (cid, step), (concept, vec) in sorted(reps.items()):
        if (cid, step - 1) not in reps:
            continue
        before_concept, before = reps[(cid, step - 1)]
        kind = "concept changed" if concept != before_concept else "concept kept"
        for metric in ("cosine", "sqeuclidean"):
            out.setdefault(metric, {}).setdefault(kind, []).append(distance(vec, before, metric))
    return {m: {k: [round(min(v), 3), round(max(v), 3), len(v)] for k, v in kinds.items()}
            for m, kinds in out.items()}


def main() -> None:
    ap = parser(__doc__, jsonl="one per run", seeds=[0, 1, 2])
    args = ap.parse_args()
    load_start = load_average()
    rows = {}
    lines = []
    for seed in args.seeds:
        for name, (strategy, extra) in VARIANTS.items():
            reps: dict = {}
            gradients = extra.get("fielding.rep") == "gradient"
            with recording_representations(reps) if gradients else nullcontext():
                summary, rounds, _ = run(strategy, "digits-concept-swap", seed, **BASE, **extra)
            drift_round = 6
            reports = rounds[drift_round - 1].get("fielding_drifted")
            vals = (window(rounds, 1, 5), window(rounds, 6, 30), window(rounds, 26, 30),
                    reports if reports is not None else float("nan"),
                    rounds[-1].get("fielding_reclusters", 0), rounds[-1]["num_clusters"])
            rows.setdefault(name, []).append(vals)
            line = {"seed": seed, "variant": name, "strategy": strategy,
                    "config": {**BASE, **extra}, "rounds_1_5": vals[0], "rounds_6_30": vals[1],
                    "final_26_30": vals[2], "drift_reports_round_6": reports,
                    "reclusterings": vals[4], "clusters_end": vals[5],
                    "final_accuracy": summary.get("final_accuracy")}
            if gradients:
                line["distance_ranges"] = distance_ranges(reps)
            lines.append(line)
            print(f"seed {seed} {name}: before {vals[0]:.3f} after {vals[1]:.3f} final "
                  f"{vals[2]:.3f} drift reports at round 6: {vals[3]} re-clusterings {vals[4]} "
                  f"K {vals[5]}" + (f" distances {line['distance_ranges']}" if gradients else ""),
                  flush=True)
    print(f"\nmean over seeds {args.seeds}:")
    print("| representation | rounds 1-5 | rounds 6-30 | final 26-30 | drift reports at round 6 "
          "(10 swapped) | re-clusterings | K end |")
    print("|---|---|---|---|---|---|---|")
    for name, vals in rows.items():
        v = np.array(vals, dtype=float)
        print(f"| {name} | {v[:, 0].mean():.3f} | {v[:, 1].mean():.3f} | {v[:, 2].mean():.3f} | "
              f"{'/'.join('-' if np.isnan(x) else str(int(x)) for x in v[:, 3])} | "
              f"{'/'.join(str(int(x)) for x in v[:, 4])} | {'/'.join(str(int(x)) for x in v[:, 5])} |")
    ranges = [ln["distance_ranges"] for ln in lines if "distance_ranges" in ln]
    if ranges:
        print("\ndistance between a client's probe gradients at consecutive steps (all seeds):")
        print("| distance | concept kept: min - max (pairs) | concept changed: min - max (pairs) |")
        print("|---|---|---|")
        for metric in ("cosine", "sqeuclidean"):
            cells = []
            for kind in ("concept kept", "concept changed"):
                got = [r[metric][kind] for r in ranges if kind in r.get(metric, {})]
                cells.append(f"{min(g[0] for g in got):.3f} - {max(g[1] for g in got):.3f} "
                             f"({sum(g[2] for g in got)})" if got else "-")
            print(f"| {metric} | {cells[0]} | {cells[1]} |")
    write_rows(args.jsonl, lines, load_start=load_start)


if __name__ == "__main__":
    main()
