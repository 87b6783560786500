"""How long FedDrift's Table 2 grid takes, projected from measured runs, batched and not.

Runs each of the 11 Table 2 methods once on one dataset at the paper's protocol (R = 100
rounds per step, K = 50 local steps; configs of ``feddrift_reproduce.py``), twice: with
``batch-clients = true`` (a round's clients train as one program) and ``false`` (one client
after the other), alternating which goes first. Prints per method the CPU and wall time of
both, their ratio and whether the accuracies agree, then projects the grid of 220 runs
(4 datasets x 11 methods x 5 seeds) on 2 cores from the summed CPU time: one process per core,
so grid hours = 4 x 5 x sum(CPU per method) / 2. Each row also holds the CPU time spent inside
the compiled trainer (``trainer_cpu_s``) and the compiled draws of generators, bootstrap samples
and minibatches (``draws_cpu_s``): the arithmetic both ways pay, the floor of a run.
The per-run results (JSON lines) go to ``--jsonl`` (``--append``: after the rows there). Targets: the grid in at most 15 minutes;
batched at least 5x unbatched per run.

    python benchmarks/feddrift_grid.py [--dataset circle2] [--rounds 100] [--local-steps 50]
        [--seed 0] [--methods ...] [--jsonl docs/operations/performance_feddrift_grid.jsonl
        [--append]]
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import tempfile
import time

from feddrift_reproduce import PAPER, TABLE2, run_config
from harness import add_row, load_average, machine, parser, start_rows

GRID_RUNS_PER_METHOD = 4 * 5        # datasets x seeds
CORES = 2


class CompiledClock:
    """CPU time spent inside some of the compiled loops (``NAMES`` of the module ``MODULE``),
    counted by timed stand-ins for them where Python calls them (``_install``)."""

    MODULE = ""
    NAMES: tuple[str, ...] = ()

    def __init__(self) -> None:
        compiled = importlib.import_module(self.MODULE)
        self.seconds = 0.0
        self._install(compiled, {name: self._timed(getattr(compiled, name))
                                 for name in self.NAMES})

    def _install(self, compiled, timed: dict) -> None:
        raise NotImplementedError

    def _timed(self, fn):
        def timed(*args):
            start = time.process_time()
            try:
                return fn(*args)
            finally:
                self.seconds += time.process_time() - start
        return timed


class TrainerClock(CompiledClock):
    """Time spent inside the compiled MLP trainer (its training loop and its loss), the
    arithmetic every way of running a round pays: what is left of a run without it is the
    cost of the rounds around the training."""

    MODULE = "fedcluster_app.core.client.compiled_mlp"
    NAMES = ("train_mlp", "mean_losses")

    def _install(self, compiled, timed: dict) -> None:
        # no compiled function calls these two, so the module itself can hold the stand-ins
        for name, fn in timed.items():
            setattr(compiled, name, fn)


class DrawsClock(CompiledClock):
    """Time spent inside the compiled draws: a client's generator per model and round, its
    bootstrap sample and its minibatches (the same numbers NumPy's calls draw), which both ways
    also pay."""

    MODULE = "fedcluster_app.core.compiled_rng"
    NAMES = ("fresh_draws", "replay", "seed_state")

    def _install(self, compiled, timed: dict) -> None:
        # the compiled fresh_draws calls replay and seed_state itself, and Numba compiles a
        # function against its module's globals, so the module keeps its own; core/sampling.py,
        # their only caller from Python, gets a stand-in module holding the timed ones
        from fedcluster_app.core.sampling import use_compiled_draws

        use_compiled_draws(_WithStandIns(compiled, timed))


class _WithStandIns:
    """A module whose named functions are replaced, everything else its own."""

    def __init__(self, module, stand_ins: dict) -> None:
        self._module = module
        self.__dict__.update(stand_ins)

    def __getattr__(self, name: str):
        return getattr(self._module, name)


def measure(strategy: str, dataset: str, batch: bool, args, clock: TrainerClock,
            draws: DrawsClock) -> dict:
    from fedcluster_app.engine import run_inprocess

    with tempfile.TemporaryDirectory() as tmp:
        args.runs_dir = tmp
        cfg = {**run_config(strategy, dataset, args.seed, args), "batch-clients": batch}
        load = load_average()
        clock.seconds = draws.seconds = 0.0
        wall, cpu = time.perf_counter(), time.process_time()
        summary = run_inprocess(cfg)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"strategy": strategy, "dataset": dataset, "seed": args.seed, "rounds": args.rounds,
            "local_steps": args.local_steps, "batched": batch, "status": summary["status"],
            "acc_omit": summary.get("acc_omit"), "acc_include": summary.get("acc_include"),
            "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
            "trainer_cpu_s": round(clock.seconds, 4), "draws_cpu_s": round(draws.seconds, 4),
            **machine(load)}


def grid_minutes(cpu_s: float) -> float:
    """The grid's wall minutes from the summed CPU seconds of one run per method."""
    return GRID_RUNS_PER_METHOD * cpu_s / CORES / 60


def main() -> None:
    ap = parser(__doc__, jsonl="one per run, written as it ends", append=True)
    ap.add_argument("--dataset", default="circle2")
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--local-steps", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-seed", type=int, default=0)
    ap.add_argument("--optimizer-state", default="round", choices=("round", "step"),
                    help="Adam state: fresh every round (default) or kept through a time step")
    ap.add_argument("--methods", nargs="+", default=TABLE2, help="paper row names")
    ap.set_defaults(overrides={})          # run_config's --set of feddrift_reproduce.py: none
    args = ap.parse_args()
    from flwr.common.logger import FLOWER_LOGGER

    FLOWER_LOGGER.setLevel(logging.ERROR)
    os.environ.setdefault("FEDCLUSTER_TORCH_THREADS", "1")
    clock, draws = TrainerClock(), DrawsClock()
    warm = argparse.Namespace(**{**vars(args), "rounds": 1})
    measure("feddrift", args.dataset, True, warm, clock, draws)  # imports, data caches: not timed
    start_rows(args.jsonl, args.append)
    rows = []
    for i, method in enumerate(args.methods):
        strategy = PAPER[method][0]
        pair = {}
        for batch in ((True, False) if i % 2 == 0 else (False, True)):
            pair[batch] = measure(strategy, args.dataset, batch, args, clock, draws)
            rows.append(pair[batch])
            add_row(args.jsonl, pair[batch])
        b, u = pair[True], pair[False]
        same = b["acc_omit"] == u["acc_omit"]
        print(f"{method:16s} batched {b['cpu_s']:7.1f} s CPU ({b['wall_s']:6.1f} wall)  "
              f"one by one {u['cpu_s']:7.1f} s CPU ({u['wall_s']:6.1f} wall)  "
              f"{u['cpu_s'] / b['cpu_s']:5.2f}x  trainer {b['trainer_cpu_s']:5.1f} s  "
              f"draws {b['draws_cpu_s']:4.1f} s  "
              f"acc {b['acc_omit']:.4f} vs {u['acc_omit']:.4f}"
              f"{'' if same else ' (differ)'}  load {b['load_start'][0]:.1f}", flush=True)
    for batch, name in ((True, "batched"), (False, "one by one")):
        cpu = sum(r["cpu_s"] for r in rows if r["batched"] is batch)
        trainer = sum(r["trainer_cpu_s"] for r in rows if r["batched"] is batch)
        drawn = sum(r["draws_cpu_s"] for r in rows if r["batched"] is batch)
        print(f"{name:10s}: {cpu:7.1f} s CPU for the {len(args.methods)} methods; the grid of "
              f"{GRID_RUNS_PER_METHOD * len(args.methods)} runs on {CORES} cores: "
              f"{grid_minutes(cpu):6.1f} min (target <= 15); of it in the compiled trainer "
              f"{trainer:6.1f} s and draws {drawn:5.1f} s: {grid_minutes(trainer + drawn):.1f} "
              f"min of the grid, the rest {cpu - trainer - drawn:.1f} s")
    ratio = (sum(r["cpu_s"] for r in rows if not r["batched"])
             / sum(r["cpu_s"] for r in rows if r["batched"]))
    print(f"batched vs one by one over the methods: {ratio:.2f}x (target >= 5x); load average "
          f"now {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
