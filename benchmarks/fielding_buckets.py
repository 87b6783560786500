"""Fielding vs the global model and the Auxo-style baseline on the label-bucket streams
(``digits-buckets``, ``mixture-buckets``: the paper's Open Images bucket trace at a small scale; docs/fielding/README.md).

9 time steps x 10 rounds; every step a new label bucket streams into every client's window (all
clients drift). MLP, SGD lr 0.1, 10 local steps, batch 20, 30% of the clients trained per round
(M = 9 of 30 digits clients, 15 of 50 mixture clients). Prints final accuracy (mean of the last
5 rounds), mean accuracy, global re-clusterings, final K, and time to the target (the global
model's final accuracy) in rounds and simulated seconds, with Fielding's speed-up over each
baseline (TTA(baseline) / TTA(fielding)).

    python benchmarks/fielding_buckets.py [--scenarios digits-buckets mixture-buckets] [--seeds 0]
                                            [--rounds-per-step 10] [--local-steps 10]
                                            [--clients 302 --prox-mu 0.01] [--jsonl FILE]

``--clients`` changes the population (M stays 30% of it unless ``--participants`` says), and
``--prox-mu`` trains every method with FedProx, as the paper runs them; ``--jsonl`` writes one
JSON line per run (the raw results of the table; ``final_last_5`` is the table's final accuracy,
``final_accuracy`` the summary's, of the last round).
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

M = {"digits-buckets": 9, "mixture-buckets": 15}


def main() -> None:
    ap = parser(__doc__, jsonl="one per run", seeds=[0],
                strategies=["fedavg", "auxo", "fielding"])
    ap.add_argument("--scenarios", nargs="+", default=list(M))
    ap.add_argument("--rounds-per-step", type=int, default=10)
    ap.add_argument("--local-steps", type=int, default=10)
    ap.add_argument("--clients", type=int, default=0, help="clients (0: the scenario's)")
    ap.add_argument("--participants", type=int, default=0,
                    help="M, clients trained per round (0: 30%% of the clients)")
    ap.add_argument("--prox-mu", type=float, default=0.0, help="FedProx mu for every method")
    args = ap.parse_args()
    load_start = load_average()
    rows = []
    for scenario in args.scenarios:
        m = args.participants or (round(0.3 * args.clients) if args.clients else M[scenario])
        base = {"rounds-per-step": args.rounds_per_step, "optimizer": "sgd", "lr": 0.1,
                "local-steps": args.local_steps,
                "batch-size": 20, "fraction-train": 0.3, "fielding.participants": m,
                "auxo.participants": m, "prox-mu": args.prox_mu,
                **({"num-clients": args.clients} if args.clients else {})}
        table: dict[str, list] = {}
        for seed in args.seeds:
            runs = {s: run(s, scenario, seed, **base) for s in args.strategies}
            last = runs["fedavg"][1][-1]["round"]  # final accuracy = mean of the last 5 rounds
            target = runs["fedavg"][0]["final_accuracy"]
            f_tta = (time_to_target(runs["fielding"][1], target, base["local-steps"])
                     if "fielding" in runs else None)
            for s, (summary, rounds, secs) in runs.items():
                tta_r = rounds_to_target(rounds, target)
                tta_s = time_to_target(rounds, target, base["local-steps"])
                vals = [window(rounds, last - 4, last), summary["mean_accuracy"],
                        rounds[-1].get("fielding_reclusters", rounds[-1].get("auxo_splits")),
                        rounds[-1]["num_clusters"], tta_r, tta_s]
                table.setdefault(s, []).append(vals)
                rows.append(record(
                    seed, s, base, summary, secs, strategy=s, scenario=scenario,
                    clients=summary.get("num_clients"), participants=m, prox_mu=args.prox_mu,
                    final_last_5=vals[0], mean_accuracy=vals[1], reclusters_or_splits=vals[2],
                    k_end=vals[3], tta_rounds=tta_r, tta_sim_s=tta_s, target=target,
                    fielding_speedup_sim=(tta_s / f_tta if tta_s and f_tta else None)
                    if s != "fielding" else None))
                print(f"{scenario} seed {seed} {s:10s} final={fmt(vals[0])} mean={fmt(vals[1])} "
                      f"reclusters/splits={vals[2]} K={vals[3]} TTA rounds={fmt(tta_r)} "
                      f"TTA sim s={fmt(tta_s, 1)} target={target:.3f} ({secs:.0f} s)", flush=True)
        print(f"\n{scenario}, seeds {args.seeds}:")
        print("| method | final acc | mean acc | re-clusterings / splits | K end | TTA rounds | "
              "TTA sim s | fielding speed-up (sim time) |")
        print("|---|---|---|---|---|---|---|---|")
        f_tta = [v[5] for v in table.get("fielding", [])]
        for s, vals in table.items():
            tta = [v[5] for v in vals]
            speed = [f"{b / a:.2f}x" if a and b else ("never reached" if not b else "-")
                     for a, b in zip(f_tta, tta)] if s != "fielding" else ["-"]
            print(f"| {s} | {np.mean([v[0] for v in vals]):.3f} | {np.mean([v[1] for v in vals]):.3f} "
                  f"| {'/'.join(fmt(v[2]) for v in vals)} | {'/'.join(str(v[3]) for v in vals)} "
                  f"| {'/'.join(fmt(v[4]) for v in vals)} | {'/'.join(fmt(v[5], 1) for v in vals)} "
                  f"| {'/'.join(speed)} |", flush=True)
    write_rows(args.jsonl, rows, load_start=load_start)


if __name__ == "__main__":
    main()
