"""What successive halving costs in k-means quality (``families/fielding/kmeans.kmeans``, ``keep``).

On the drift-step benchmark's Open-Images-like bucket trace (5,078 clients x 100 labels), for
every K in 2..10 and a few traces and seeds: the cost (sum of l1 distances to the centers) of the
best restart when all ``--n-init`` restarts run to convergence (the k-means of docs/fielding/README.md, D4, lock-step
engine) against successive halving (only the ``--n-keep`` restarts of lowest cost after
``--prune-at`` Lloyd iterations run on), both from the same k-means++ seeds, and the time of each.
Also the spread of the costs of the individual restarts (the per-restart engine), for scale.

    python benchmarks/fielding_kmeans_halving.py [--traces 0 1 2] [--seeds 0 1] [--n-keep 2]
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import time  # noqa: E402

import numpy as np  # noqa: E402
from fielding_drift_step import bucket_trace, load  # noqa: E402
from harness import parser  # noqa: E402

from fedcluster_app.families.fielding.distances import Points  # noqa: E402
from fedcluster_app.families.fielding.kmeans import kmeans  # noqa: E402


def main() -> None:
    ap = parser(__doc__, seeds=[0, 1])
    ap.add_argument("--clients", type=int, default=5078)
    ap.add_argument("--labels", type=int, default=100)
    ap.add_argument("--traces", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--n-init", type=int, default=10)
    ap.add_argument("--n-keep", type=int, default=2)
    ap.add_argument("--prune-at", type=int, default=3)
    args = ap.parse_args()
    print(f"{args.clients} clients x {args.labels} labels, K = 2..10, n-init {args.n_init}, "
          f"n-keep {args.n_keep} after {args.prune_at} iterations; {load()}")
    diffs, spreads, t_all, t_keep = [], [], [], []
    for trace in args.traces:
        _, x = bucket_trace(args.clients, args.labels, trace)
        pts = Points(x, "l1")
        for seed in args.seeds:
            row = []
            for keep, times in ((None, t_all), (args.n_keep, t_keep)):
                rng = np.random.default_rng([trace, seed])
                t0 = time.perf_counter()
                row.append(np.array([kmeans(pts, k, args.n_init, rng, batched=True,
                                                 keep=keep, prune_at=args.prune_at).cost
                                     for k in range(2, 11)]))
                times.append(time.perf_counter() - t0)
            rel = (row[1] - row[0]) / row[0] * 100
            diffs.append(rel)
            rng = np.random.default_rng([trace, seed])
            single = np.array([[kmeans(pts, k, 1, rng, batched=False).cost
                                for k in range(2, 11)] for _ in range(3)])
            spreads.append((single.max(0) - single.min(0)) / single.min(0) * 100)
            print(f"trace {trace} seed {seed}: halving vs all restarts, best cost "
                  f"{rel.mean():+.3f}% on average over K (max {rel.max():+.3f}%); time "
                  f"{t_all[-1]:.2f} s -> {t_keep[-1]:.2f} s", flush=True)
    d = np.concatenate(diffs)
    print(f"overall: best cost with halving {d.mean():+.3f}% (max {d.max():+.3f}%, min "
          f"{d.min():+.3f}%) vs all {args.n_init} restarts; spread of 3 single restarts "
          f"{np.mean(np.concatenate(spreads)):.2f}% on average; median time "
          f"{np.median(t_all):.2f} s -> {np.median(t_keep):.2f} s "
          f"({np.median(t_all) / np.median(t_keep):.1f}x); {load()}")


if __name__ == "__main__":
    main()
