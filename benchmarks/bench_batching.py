"""Batched against one by one: one round's training of J clients, per model, in one process.

For each model (the built-in MLP, the built-in CNN on 8x8, 16x16 and 28x28 images, and a
user's CNN: the small ResNet of ``gpu_models.py`` on 32x32 colour images) and each client
count, the same jobs (100 samples a client, ``local-steps`` minibatches of ``batch-size``)
train once through the per-client path (``batched.run_jobs``, what ``batch-clients = false``
runs) and once through the batched program the engine would choose (``run_jobs_batched``);
each is timed as the median of ``--repeats`` runs after one warm-up. ``ratio`` is batched /
one by one (below 1: batching wins); ``stacked`` says whether the batched path stacked the
jobs with ``vmap`` (its rule, ``batched.stacking_pays``), ``grouped`` whether it stacked them
as grouped convolutions instead (``batched.grouped_pays``: the built-in CNN where ``vmap``
loses), else it ran them one by one itself; ``forced_ratio`` is what ``vmap`` stacking would
have cost had it been forced, the measurement the rule is drawn from.

    python benchmarks/bench_batching.py [--clients 10 50] [--repeats 3] [--jsonl FILE]
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from harness import load_average, machine, parser, write_rows

MODELS = {
    "mlp 8": dict(kind="mlp", input_shape=(8,), num_classes=4, hidden=32),
    "mlp 256": dict(kind="mlp", input_shape=(256,), num_classes=10, hidden=128),
    "mlp 784 h64": dict(kind="mlp", input_shape=(784,), num_classes=10, hidden=64),
    "mlp 784 h128": dict(kind="mlp", input_shape=(784,), num_classes=10, hidden=128),
    "mlp 784": dict(kind="mlp", input_shape=(784,), num_classes=10, hidden=200),
    "cnn 1x8x8": dict(kind="cnn", input_shape=(1, 8, 8), num_classes=10),
    "cnn 1x16x16": dict(kind="cnn", input_shape=(1, 16, 16), num_classes=10),
    "cnn 1x28x28": dict(kind="cnn", input_shape=(1, 28, 28), num_classes=10),
    "user resnet 3x32x32": dict(kind="gpu_models:resnet_gn", input_shape=(3, 32, 32),
                                num_classes=10),
}


def jobs_for(spec, cfg, clients: int):
    from fedcluster_app.core.client.batched import FitJob
    from fedcluster_app.core.models import initial_weights
    from fedcluster_app.core.training import batch_indices

    out = []
    for k in range(clients):
        rng = np.random.default_rng([3, k])
        x = rng.normal(size=(100, *spec.input_shape)).astype(np.float32)
        y = rng.integers(0, spec.num_classes, 100)
        out.append(FitJob(spec, initial_weights(spec, k), x, y, batch_indices(100, cfg, rng), cfg))
    return out


def timed(fn, repeats: int) -> float:
    fn()   # warm-up: the model's first build, the allocator
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = parser(__doc__, jsonl="one per model and client count")
    ap.add_argument("--clients", type=int, nargs="+", default=[10, 50])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    args = ap.parse_args()
    # gpu_models (the user model) sits beside this script, which Python puts on the path
    from fedcluster_app.core.client import batched
    from fedcluster_app.core.config import TrainConfig
    from fedcluster_app.core.models import ModelSpec
    from fedcluster_app.core.training import limit_threads

    limit_threads()
    load_start = load_average()
    cfg = TrainConfig(optimizer="sgd", lr=0.05, local_steps=5, batch_size=32)
    rows = []
    for name in args.models:
        spec = ModelSpec(**MODELS[name])
        for clients in args.clients:
            jobs = jobs_for(spec, cfg, clients)
            alone = timed(lambda: batched.run_jobs(jobs), args.repeats)
            chosen = timed(lambda: batched.run_jobs_batched(jobs), args.repeats)
            with batched.stacking_forced():
                forced = timed(lambda: batched.run_jobs_batched(jobs), args.repeats)
            row = {"model": name, "clients": clients, "one_by_one_s": round(alone, 4),
                   "batched_s": round(chosen, 4), "ratio": round(chosen / alone, 3),
                   "stacked": batched.stacking_pays(spec, "cpu", [5] * clients),
                   "grouped": batched.grouped_pays(spec, "cpu", cfg, [5] * clients),
                   "forced_ratio": round(forced / alone, 3),
                   "activation_per_sample": batched.activation_bytes(spec, 1) // 4,
                   "macs_per_sample": batched.macs_per_sample(spec),
                   **machine(load_start)}
            print(f"{name:20s} {clients:3d} clients: one by one {alone:7.3f} s, batched "
                  f"{chosen:7.3f} s (x{chosen / alone:.2f}; stacked {row['stacked']}, grouped "
                  f"{row['grouped']}), forced "
                  f"x{forced / alone:.2f}", flush=True)
            rows.append(row)
    write_rows(args.jsonl, rows)


if __name__ == "__main__":
    main()
