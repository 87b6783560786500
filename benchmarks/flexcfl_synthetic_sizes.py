"""How the user sizes of Synthetic(1,1) fall for a data seed, and for the paper's data.

The sizes are FedProx's lognormal(4, 2) + 50 per user, the first draws of the data seed's
generator (``synthetic_users`` in fedcluster_app/families/flexcfl/scenarios.py). Prints, per data
seed, the total number of samples and the share of the largest user; then, over ``--scan``
seeds, the share of the largest user among the draws whose total is within 5% of the paper's
75,349 samples for 100 clients (its dataset table): what the paper's unknown seed probably
looked like.

    python benchmarks/flexcfl_synthetic_sizes.py [--seeds 1 2 3 4] [--scan 100000]
"""

from __future__ import annotations

import numpy as np
from harness import parser

PAPER_TOTAL, USERS = 75_349, 100


def sizes(seed: int, users: int = USERS) -> np.ndarray:
    # the same first draws as synthetic_users (one RandomState, sizes first)
    return np.random.RandomState(seed).lognormal(4, 2, users).astype(int) + 50


def main() -> None:
    ap = parser(__doc__, seeds=[1, 2, 3, 4])
    ap.add_argument("--scan", type=int, default=100_000, help="seeds 0..N-1 to scan")
    args = ap.parse_args()
    print("| data seed | samples | largest user's share |")
    print("|---|---|---|")
    for seed in args.seeds:
        s = sizes(seed)
        print(f"| {seed} | {s.sum():,} | {s.max() / s.sum():.3f} |")
    near = [s.max() / s.sum() for s in map(sizes, range(args.scan))
            if abs(s.sum() - PAPER_TOTAL) < 0.05 * PAPER_TOTAL]
    lo, mid, hi = np.percentile(near, [10, 50, 90])
    print(f"\n{len(near)} of {args.scan} seeds give a total within 5% of {PAPER_TOTAL:,}: their "
          f"largest user holds {mid:.3f} of the samples (median; 10-90%: {lo:.3f}-{hi:.3f})")


if __name__ == "__main__":
    main()
