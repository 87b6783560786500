"""In-process engine vs a bare per-client PyTorch loop with the same local updates.

All run FedAvg for 10 clients x 100 rounds on the same scenario: every round each client
trains on its window and every client is evaluated. The bare loop calls the same client code
(`StreamClient.fit/evaluate`) one client after the other, without Flower messages, the strategy
or the results writer. The in-process engine runs twice: one client after the other
(``batch-clients = false``: the ratio is the cost of the framework; its final weights must be
identical to the loop's) and batched (the default: a round's clients train as one program; its
final weights must agree up to rounding). Target: batched at most 1.0x the bare loop.

    python benchmarks/bench_inprocess_vs_torch.py [--rounds 100] [--repeats 2]
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np
from flwr.app import RecordDict
from harness import load_average, machine, parser, write_rows

from fedcluster_app.core import wire as P
from fedcluster_app.core.config import default_run_config, merge_overrides
from fedcluster_app.core.experiment import load_experiment
from fedcluster_app.core.models import initial_weights
from fedcluster_app.core.server.strategy import read_checkpoint
from fedcluster_app.core.server.updates import weighted_average
from fedcluster_app.core.client.stream_client import StreamClient
from fedcluster_app.engine import run_inprocess


def config(rounds: int, out: str) -> dict:
    return merge_overrides(default_run_config(), {
        "strategy": "fedavg", "scenario": "mixture-swap", "num-steps": 10,
        "rounds-per-step": rounds // 10, "local-steps": 20, "samples-per-step": 200,
        "test-samples": 100, "overwrite": True, "out-dir": out, "plot": False, "progress": False,
    })


def bare_loop(run_config: dict) -> tuple[float, list[np.ndarray]]:
    exp = load_experiment(run_config)
    clients = [StreamClient(c, exp, RecordDict()) for c in range(exp.scenario.num_clients)]
    weights = initial_weights(exp.spec, seed=exp.cfg.seed * 1000)   # the strategy's first model
    t0 = time.perf_counter()
    rounds_per_step = exp.cfg.rounds_per_step
    for rnd in range(1, exp.scenario.num_steps * rounds_per_step + 1):
        cfg = {P.ROUND: rnd, P.STEP: (rnd - 1) // rounds_per_step + 1, "model-id": 0}
        updates = []
        for client in clients:
            new, n, _ = client.fit(weights, cfg)
            updates.append((new, float(n)))
        weights = weighted_average(updates)
        accs = [client.evaluate(weights, cfg)[2][P.ACCURACY] for client in clients]
        float(np.mean(accs))
    return time.perf_counter() - t0, weights


def inprocess(run_config: dict, batch: bool) -> tuple[float, list[np.ndarray]]:
    t0 = time.perf_counter()
    summary = run_inprocess({**run_config, "batch-clients": batch})
    elapsed = time.perf_counter() - t0
    return elapsed, read_checkpoint(Path(summary["out_dir"]))[1][0], summary["mean_accuracy"]


def main() -> None:
    ap = parser(__doc__, jsonl="one per way of running (every repeat's seconds, the best)",
                repeats=2)
    ap.add_argument("--rounds", type=int, default=100)
    args = ap.parse_args()
    load_start = load_average()
    with tempfile.TemporaryDirectory() as tmp:
        rc = config(args.rounds, str(Path(tmp) / "run"))
        bare_loop(rc)                                   # warm-up: imports, data caches
        inprocess(rc, True)
        t_bare, t_one, t_batch = [], [], []
        for _ in range(args.repeats):                   # interleaved: all see the same noise
            tb, wb = bare_loop(rc)
            to, wo, acc_one = inprocess(rc, False)
            tt, wt, acc_batch = inprocess(rc, True)
            t_bare.append(tb)
            t_one.append(to)
            t_batch.append(tt)
        same = all(np.array_equal(a, b) for a, b in zip(wb, wo))
        gap = max(float(np.abs(a - b).max()) for a, b in zip(wb, wt))
    load = os.getloadavg()[0]
    ways = {"bare per-client loop": (t_bare, None), "in-process, one by one": (t_one, acc_one),
            "in-process, batched": (t_batch, acc_batch)}
    write_rows(args.jsonl, [
        {"way": way, "rounds": args.rounds, "clients": 10, "seconds": [round(t, 3) for t in ts],
         "best_s": round(min(ts), 3), "ratio_to_loop": round(min(ts) / min(t_bare), 3),
         "mean_accuracy": acc, **machine(load_start)} for way, (ts, acc) in ways.items()])
    print(f"10 clients x {args.rounds} rounds, FedAvg, train + evaluate every round "
          f"(load average {load:.2f} on {os.cpu_count()} cores)")
    print(f"bare per-client PyTorch loop  : {min(t_bare):7.2f} s (best of {args.repeats})")
    print(f"in-process, one by one        : {min(t_one):7.2f} s   "
          f"{min(t_one) / min(t_bare):5.2f}x the loop")
    print(f"in-process, batched (default) : {min(t_batch):7.2f} s   "
          f"{min(t_batch) / min(t_bare):5.2f}x the loop   (target <= 1.0x)")
    print(f"one by one: identical final weights: {same}; batched: mean accuracy {acc_batch:.4f} "
          f"against {acc_one:.4f}, largest final weight difference {gap:.1e} (Adam turns the "
          "rounding of near-zero gradients into small steps, and 2,000 of them add up)")
    if not same or abs(acc_batch - acc_one) > 0.01:
        raise SystemExit("the loops diverged: the updates are not the same")


if __name__ == "__main__":
    main()
