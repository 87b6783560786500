"""Fielding with malicious clients that permute their label vector at registration
(the paper's threat model; docs/fielding.md, D15) on ``labels-small-large`` (settings of fielding_small_large.py), against the
global model: mean accuracy before the drifts (rounds 1-20, where the lies matter: the initial
clustering uses them), after them (21-60) and overall.

    python benchmarks/fielding_malicious.py [--fractions 0 0.1 0.2 0.3] [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse

import numpy as np
from fielding_common import run, window
from fielding_small_large import BASE


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.0, 0.1, 0.2, 0.3])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = ap.parse_args()
    rows = {}
    for seed in args.seeds:
        g = run("fedavg", "labels-small-large", seed, **BASE)[1]
        rows.setdefault("fedavg (global)", []).append(
            (window(g, 1, 20), window(g, 21, 60), window(g, 1, 60)))
        for f in args.fractions:
            r = run("fielding", "labels-small-large", seed,
                    **{**BASE, "fielding.malicious-fraction": f})[1]
            rows.setdefault(f"fielding, {f:.0%} malicious", []).append(
                (window(r, 1, 20), window(r, 21, 60), window(r, 1, 60)))
            print(f"seed {seed} malicious {f:.0%}: 1-20 {window(r, 1, 20):.3f} 21-60 "
                  f"{window(r, 21, 60):.3f} all {window(r, 1, 60):.3f}; global all "
                  f"{window(g, 1, 60):.3f}", flush=True)
    print(f"\nmean over seeds {args.seeds}:")
    print("| method | rounds 1-20 | rounds 21-60 | all rounds |")
    print("|---|---|---|---|")
    for name, vals in rows.items():
        m = np.mean(vals, axis=0)
        print(f"| {name} | {m[0]:.3f} | {m[1]:.3f} | {m[2]:.3f} |")


if __name__ == "__main__":
    main()
