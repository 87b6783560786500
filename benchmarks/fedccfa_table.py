"""Markdown tables from the JSON-lines rows that ``fedccfa_small.py --jsonl`` writes.

    python benchmarks/fedccfa_table.py runs/fedccfa-bench/*.jsonl
    python benchmarks/fedccfa_table.py --clusters runs/fedccfa-bench/sudden-fedccfa-s*   # acceptance check 3 (docs/fedccfa/README.md)
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict

import numpy as np
from harness import parser


def main(paths: list[str]) -> int:
    rows = [json.loads(line) for p in paths for line in open(p) if line.strip()]
    by = defaultdict(list)
    for r in rows:
        by[(r["setting"], r["method"])].append(r)
    print("| setting | method | seeds | generalised acc. % (std) | per seed | own-split acc. % | "
          "drop after drift (pts) | rounds to recover |")
    print("|---|---|---|---|---|---|---|---|")
    for (setting, method), rs in sorted(by.items()):
        rs = sorted(rs, key=lambda r: r["seed"])
        g = np.array([100 * r["gen_final"] for r in rs])
        a = np.array([100 * r["acc_final"] for r in rs])
        drops = [100 * r["drop"] for r in rs if r.get("drop") is not None]
        rec = [r.get("rounds_to_recover") for r in rs]
        print(f"| {setting} | {method} | {','.join(str(r['seed']) for r in rs)} | "
              f"{g.mean():.1f} ({g.std():.1f}) | {' / '.join(f'{v:.1f}' for v in g)} | "
              f"{a.mean():.1f} | {np.mean(drops):.1f} | " if drops else
              f"| {setting} | {method} | {','.join(str(r['seed']) for r in rs)} | "
              f"{g.mean():.1f} ({g.std():.1f}) | {' / '.join(f'{v:.1f}' for v in g)} | "
              f"{a.mean():.1f} | - | ", end="")
        print(f"{' / '.join('never' if v is None else str(v) for v in rec) if drops else '-'} |")
    return 0


def cluster_sanity(run_dirs: list[str], drift_round: int = 31) -> None:
    """Acceptance check 3 of docs/fedccfa/README.md (clustering sanity) on FedCCFA runs: after the drift, mean per-class ARI of classes 1-6, the
    share of rounds in which a drifted and a non-drifted client shared a class-1..6 cluster, and
    the share of rounds in which classes 0, 7, 8, 9 formed one cluster."""
    from pathlib import Path

    for d in run_dirs:
        lines = [json.loads(x) for x in Path(d, "metrics.jsonl").read_text().splitlines()]
        post = [r for r in lines if r["round"] >= drift_round and "class_ari" in r]
        pre = [r for r in lines if r["round"] == drift_round - 1 and "clusters_per_class" in r]
        ari = np.mean([np.mean(r["class_ari"][1:7]) for r in post])
        one = np.mean([all(r["clusters_per_class"][c] == 1 for c in (0, 7, 8, 9)) for r in post])
        mixed = np.mean([any(ari_c < 1.0 and n_lt(r, c) for c, ari_c in enumerate(r["class_ari"])
                             if 1 <= c <= 6) for r in post])
        before = pre[0]["clusters_per_class"] if pre else None
        print(f"{d}: classes 1-6 mean ARI after drift {ari:.3f}; rounds with a drifted and a "
              f"non-drifted client in one class-1..6 cluster {100 * mixed:.0f}%; rounds with "
              f"classes 0,7,8,9 in one cluster {100 * one:.0f}%; clusters per class before the "
              f"drift {before}")


def n_lt(record: dict, c: int) -> bool:
    """A class-c cluster mixes drifted (swapping c) and non-drifted clients."""
    group = {1: (0, 1, 2), 2: (0, 1, 2), 3: (3, 4, 5), 4: (3, 4, 5), 5: (6, 7, 8, 9),
             6: (6, 7, 8, 9)}[c]
    for part in record["class_partitions"][str(c)]:
        kinds = {(k % 10) in group for k in part}
        if len(kinds) == 2:
            return True
    return False


def cli() -> int:
    ap = parser(__doc__)
    ap.add_argument("paths", nargs="+", metavar="PATH",
                    help="rows of fedccfa_small.py --jsonl; with --clusters, FedCCFA run folders")
    ap.add_argument("--clusters", action="store_true",
                    help="the clustering sanity check (acceptance check 3) on run folders")
    args = ap.parse_args()
    if args.clusters:
        cluster_sanity(args.paths)
        return 0
    return main(args.paths)


if __name__ == "__main__":
    sys.exit(cli())
