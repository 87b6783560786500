"""Fielding on ``labels-small-large`` (the small experiment of docs/fielding/README.md): small drift at round 21, large at round 41.

Settings: 30 clients, 60 rounds (12 steps x 5 rounds), multinomial logistic
regression, SGD lr 0.3, 5 local steps, batch 20, M = 9 clients per round (fraction-train 0.3 for
the global model; floor(M/K) per cluster for the clustered ones). Prints per method the mean
accuracy over the windows (pre-drift 16-20, after drift 1 21-25, after drift 2 41-45,
final 56-60, mean 21-60), global re-clusterings, final K and the time to the target accuracy
(the global model's final accuracy, round 60) in rounds and simulated seconds.

    python benchmarks/fielding_small_large.py [--seeds 0 1 2] [--strategies fedavg static-cfl fielding]
                                                [--scenario labels-small-large] [--jsonl FILE]

``--jsonl`` writes one JSON line per run (the raw results of the table).
"""

from __future__ import annotations


import numpy as np
from fielding_common import (
    fmt,
    record,
    rounds_to_target,
    run,
    time_to_target,
    window,
)
from harness import load_average, parser, write_rows

BASE = {"rounds-per-step": 5, "optimizer": "sgd", "lr": 0.3, "local-steps": 5, "batch-size": 20,
        "fraction-train": 0.3, "fielding.participants": 9}


def main() -> None:
    ap = parser(__doc__, jsonl="one per run", seeds=[0, 1, 2], strategies=[
        "fedavg", "static-cfl", "fielding", "fielding-tau0", "fielding-tauinf"])
    ap.add_argument("--scenario", default="labels-small-large")
    args = ap.parse_args()
    load_start = load_average()
    cols = ["pre 16-20", "d1 21-25", "d2 41-45", "final 56-60", "mean 21-60", "re-clust", "K end",
            "TTA rounds", "TTA sim s"]
    keys = ["pre_16_20", "drift1_21_25", "drift2_41_45", "final_56_60", "mean_21_60",
            "reclusters", "k_end", "tta_rounds", "tta_sim_s"]
    rows: dict[str, list[list]] = {}
    lines = []
    for seed in args.seeds:
        runs = {s: run(s, args.scenario, seed, **BASE) for s in args.strategies}
        target = runs["fedavg"][0]["final_accuracy"] if "fedavg" in runs else None
        for s, (summary, rounds, secs) in runs.items():
            recl = rounds[-1].get("fielding_reclusters")
            vals = [window(rounds, 16, 20), window(rounds, 21, 25), window(rounds, 41, 45),
                    window(rounds, 56, 60), window(rounds, 21, 60), recl,
                    rounds[-1]["num_clusters"],
                    rounds_to_target(rounds, target) if target else None,
                    time_to_target(rounds, target, BASE["local-steps"]) if target else None]
            rows.setdefault(s, []).append(vals)
            lines.append(record(seed, s, BASE, summary, secs, strategy=s, scenario=args.scenario,
                                **dict(zip(keys, vals)), target=target))
            print(f"seed {seed} {s:16s} " + " ".join(f"{c}={fmt(v)}" for c, v in zip(cols, vals))
                  + f"  ({secs:.0f} s)", flush=True)
    print(f"\nmean over seeds {args.seeds} (target = fedavg's final-round accuracy of the same seed; TTA per seed):")
    print("| method | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for s, vals in rows.items():
        cells = []
        for j in range(len(cols)):
            xs = [v[j] for v in vals]
            if j >= 7:
                cells.append("/".join(fmt(x, 0 if j == 7 else 1) for x in xs))
            elif any(x is None for x in xs):
                cells.append("-")
            elif j in (5, 6):
                cells.append("/".join(str(int(x)) for x in xs))
            else:
                cells.append(f"{np.mean(xs):.3f}")
        print(f"| {s} | " + " | ".join(cells) + " |")
    write_rows(args.jsonl, lines, load_start=load_start)


if __name__ == "__main__":
    main()
