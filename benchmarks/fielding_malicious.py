"""Fielding with malicious clients that permute their label vector at registration
(the paper's threat model; docs/fielding/README.md, D15) on ``labels-small-large`` (settings of fielding_small_large.py), against the
global model: mean accuracy before the drifts (rounds 1-20, where the lies matter: the initial
clustering uses them), after them (21-60) and overall.

    python benchmarks/fielding_malicious.py [--fractions 0 0.1 0.2 0.3] [--seeds 0 1 2] [--jsonl FILE]

``--jsonl`` writes one JSON line per run (the raw results of the table).
"""

from __future__ import annotations


import numpy as np
from fielding_common import record, run, window
from fielding_small_large import BASE
from harness import load_average, parser, write_rows


def main() -> None:
    ap = parser(__doc__, jsonl="one per run", seeds=[0, 1, 2])
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.0, 0.1, 0.2, 0.3])
    args = ap.parse_args()
    load_start = load_average()
    rows = {}
    lines = []

    def windows(seed, name, strategy, config, summary, rounds, secs):
        vals = (window(rounds, 1, 20), window(rounds, 21, 60), window(rounds, 1, 60))
        rows.setdefault(name, []).append(vals)
        lines.append(record(seed, name, config, summary, secs, strategy=strategy,
                            scenario="labels-small-large", rounds_1_20=vals[0],
                            rounds_21_60=vals[1], all_rounds=vals[2]))

    for seed in args.seeds:
        summary, g, secs = run("fedavg", "labels-small-large", seed, **BASE)
        windows(seed, "fedavg (global)", "fedavg", BASE, summary, g, secs)
        for f in args.fractions:
            config = {**BASE, "fielding.malicious-fraction": f}
            summary, r, secs = run("fielding", "labels-small-large", seed, **config)
            windows(seed, f"fielding, {f:.0%} malicious", "fielding", config, summary, r, secs)
            print(f"seed {seed} malicious {f:.0%}: 1-20 {window(r, 1, 20):.3f} 21-60 "
                  f"{window(r, 21, 60):.3f} all {window(r, 1, 60):.3f}; global all "
                  f"{window(g, 1, 60):.3f}", flush=True)
    print(f"\nmean over seeds {args.seeds}:")
    print("| method | rounds 1-20 | rounds 21-60 | all rounds |")
    print("|---|---|---|---|")
    for name, vals in rows.items():
        m = np.mean(vals, axis=0)
        print(f"| {name} | {m[0]:.3f} | {m[1]:.3f} | {m[2]:.3f} |")
    write_rows(args.jsonl, lines, load_start=load_start)


if __name__ == "__main__":
    main()
