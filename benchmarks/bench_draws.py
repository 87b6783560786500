"""What one model's minibatches of one round cost: NumPy's ``choice`` call per step against the
bulk draw (``core/sampling.choice_batches``); a KUE member's whole draw (a fresh generator, a
bootstrap sample, the minibatches) through NumPy's calls against one compiled call
(``core/training.round_draws``); and the compiled MLP trainer per step.

FedDrift's protocol: 50 local steps, minibatches of 50 out of a client's 500 samples, a 2-4-2
MLP trained with Adam. Both draws give the same indices (checked here too); the ratio, measured
in one run, is what the bulk draw saves. The trainer is timed for 10 models in one call (a
round's clients, batched) and for one model (one by one), each with the CPU time spent inside
the compiled trainer (its loop and its loss, ``feddrift_grid.TrainerClock``, as the grid counts
it; the rest stacks the jobs).

    python benchmarks/bench_draws.py [--repeats 2000] [--jsonl docs/operations/performance_draws.jsonl]
"""

from __future__ import annotations

import timeit

import numpy as np
from feddrift_grid import TrainerClock
from harness import load_average, machine, parser, write_rows

from fedcluster_app.core.config import TrainConfig
from fedcluster_app.core.client.kernels import numpy_train_many
from fedcluster_app.core.sampling import bootstrap_rows, choice_batches, seeded
from fedcluster_app.core.training import batch_indices, round_draws

N, SIZE, STEPS = 500, 50, 50


def per_call(fn, repeats: int) -> float:
    fn()                                            # compile / warm caches, not timed
    return min(timeit.repeat(fn, number=repeats, repeat=3)) / repeats


def timed_trainer(fn, repeats: int, clock: TrainerClock) -> tuple[float, float]:
    """``per_call(fn)`` and, in the same calls, the CPU time per call inside the compiled
    trainer (``clock``: its loop and its loss, as the grid counts it); the best of three
    rounds of ``repeats`` calls each."""
    fn()                                            # compile / warm caches, not timed
    best = (float("inf"), 0.0)
    for _ in range(3):
        clock.seconds = 0.0
        total = timeit.timeit(fn, number=repeats)
        best = min(best, (total / repeats, clock.seconds / repeats))
    return best


def main() -> None:
    ap = parser(__doc__, jsonl="one per measurement", repeats=2000)
    args = ap.parse_args()
    load = load_average()
    a, b = np.random.default_rng(0), np.random.default_rng(0)
    same = all(np.array_equal(x, y) for x, y in zip(
        [a.choice(N, size=SIZE, replace=False) for _ in range(STEPS)], choice_batches(b, N, SIZE, STEPS)))
    rng = np.random.default_rng(1)
    loop = per_call(lambda: [rng.choice(N, size=SIZE, replace=False) for _ in range(STEPS)],
                    max(1, args.repeats // 10))
    bulk = per_call(lambda: choice_batches(rng, N, SIZE, STEPS), args.repeats)
    print(f"{STEPS} minibatches of {SIZE} out of {N}: choice per step {loop * 1e6:.0f} us, "
          f"bulk {bulk * 1e6:.0f} us, {loop / bulk:.1f}x; same indices: {same}")
    cfg = TrainConfig(optimizer="adam", lr=0.01, weight_decay=1e-3, local_steps=STEPS, batch_size=SIZE)
    words = (0, 3, 517, 5 + 2**16)      # seed, client, round, model: a client's stream

    def member_numpy():
        rng = seeded(*words)
        rows = bootstrap_rows(rng, N)
        return rows, choice_batches(rng, len(rows), min(SIZE, len(rows)), STEPS)

    (rows_a, batches_a), (rows_b, batches_b) = member_numpy(), round_draws(words, N, cfg, True)
    member_same = np.array_equal(rows_a, rows_b) and all(
        np.array_equal(x, y) for x, y in zip(batches_a, batches_b))
    member_loop = per_call(member_numpy, args.repeats)
    member_one = per_call(lambda: round_draws(words, N, cfg, True), args.repeats)
    print(f"a KUE member's draw (generator, bootstrap of {N}, {STEPS} minibatches): NumPy's "
          f"calls {member_loop * 1e6:.0f} us, one compiled call {member_one * 1e6:.0f} us, "
          f"{member_loop / member_one:.1f}x; same rows and minibatches: {member_same}")
    data = np.random.default_rng(2)
    jobs = []
    for _ in range(10):
        w = [data.normal(size=(4, 2)), data.normal(size=4), data.normal(size=(2, 4)), data.normal(size=2)]
        x = data.random((N, 2))
        jobs.append((w, x, (x[:, 0] > x[:, 1]).astype(np.int64), batch_indices(N, cfg, data)))
    clock = TrainerClock()
    ten, ten_inside = timed_trainer(lambda: numpy_train_many(jobs, cfg),
                                    max(1, args.repeats // 20), clock)
    one, one_inside = timed_trainer(lambda: numpy_train_many(jobs[:1], cfg),
                                    max(1, args.repeats // 10), clock)
    print(f"MLP trainer, {STEPS} Adam steps: 10 models in one call {ten * 1e3:.2f} ms "
          f"({ten / STEPS * 1e6:.0f} us per step; inside the compiled trainer "
          f"{ten_inside * 1e3:.2f} ms), one model {one * 1e3:.2f} ms (inside "
          f"{one_inside * 1e3:.2f} ms); load average {load[0]:.2f} at the start")
    write_rows(args.jsonl, [{"what": "draws", "choice_loop_us": round(loop * 1e6, 1),
                             "bulk_us": round(bulk * 1e6, 1), "ratio": round(loop / bulk, 2),
                             "same_indices": same, **machine(load)},
                            {"what": "member_draw", "numpy_calls_us": round(member_loop * 1e6, 1),
                             "compiled_us": round(member_one * 1e6, 1),
                             "ratio": round(member_loop / member_one, 2),
                             "same_rows_and_minibatches": member_same, **machine(load)},
                            {"what": "mlp_trainer", "ten_models_ms": round(ten * 1e3, 3),
                             "ten_models_compiled_ms": round(ten_inside * 1e3, 3),
                             "one_model_ms": round(one * 1e3, 3),
                             "one_model_compiled_ms": round(one_inside * 1e3, 3), **machine(load)}])


if __name__ == "__main__":
    main()
