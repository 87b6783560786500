"""Where a FedDrift-family run's time goes, by part of the round: a sampling profile.

Runs one Table 2 method once at the paper's protocol (in process, batched unless
``--one-by-one``), looking at the running stack every millisecond of CPU time and counting,
for each look, the deepest part of the round it is in (``PARTS``): the compiled trainer, the
minibatch draws, the stacking of training jobs, the family's client handler, the ClientApp's
reading of a message and building of its reply, the server's building of messages (with the
in-process engine's delivery), its checks of replies (``validate_reply``, update norms),
aggregation, the ``metrics.jsonl`` record, and the rest of the strategy and protocol. Each
look is credited with the CPU time used since the previous one (``Sampler``). It prints each
part's share of that CPU time and its milliseconds per round. Linux and macOS (a profiling
timer signal).

    python benchmarks/feddrift_round_profile.py [--method KUE] [--dataset circle2]
        [--rounds 100] [--one-by-one] [--jsonl FILE]
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import tempfile
import time
from collections import Counter

from feddrift_grid import TrainerClock
from feddrift_reproduce import PAPER, run_config
from harness import load_average, machine, parser, write_rows

#: (file ending, function name or "*") -> part; a look counts for the deepest frame that matches
PARTS: list[tuple[str, str, str]] = [
    ("feddrift_grid.py", "timed", "trainer (compiled)"),    # TrainerClock's wrapper
    ("core/sampling.py", "*", "minibatch draws"),
    ("core/training.py", "round_draws", "minibatch draws"),
    ("core/training.py", "batch_indices", "minibatch draws"),
    ("families/feddrift/client.py", "_weighted_batches", "minibatch draws"),
    ("core/client/batched.py", "*", "training jobs: grouping, stacking"),
    ("core/client/kernels.py", "*", "training jobs: grouping, stacking"),
    ("core/client/handlers.py", "*", "client handler (data, masks, bootstrap)"),
    ("families/feddrift/client.py", "*", "client handler (data, masks, bootstrap)"),
    ("core/client/stream_client.py", "*", "client handler (data, masks, bootstrap)"),
    ("client_app.py", "_request", "ClientApp: message in"),
    ("client_app.py", "_reply", "ClientApp: reply out"),
    ("engine.py", "push_messages", "server: messages out, replies in"),
    ("engine.py", "pull_messages", "server: messages out, replies in"),
    ("core/server/strategy.py", "exchange", "server: messages out, replies in"),
    ("core/server/messages.py", "*", "server: reply checks"),
    ("core/server/strategy.py", "_check_scale", "server: reply checks"),
    ("core/server/strategy.py", "_bound_updates", "server: reply checks"),
    ("core/server/strategy.py", "weighted_average", "server: aggregation"),
    ("results/recorder.py", "*", "metrics.jsonl"),
]
REST = "strategy and protocol (the rest)"


def part_of(frame) -> str:
    part = REST
    stack = []
    while frame is not None:
        stack.append(frame)
        frame = frame.f_back
    for f in reversed(stack):                      # outermost first: the deepest match wins
        name, file = f.f_code.co_name, f.f_code.co_filename.replace(os.sep, "/")
        for ending, func, label in PARTS:
            if file.endswith(ending) and func in ("*", name):
                part = label
                break
    return part


class Sampler:
    """Every ``interval`` seconds of CPU time a profiling signal interrupts the run; its
    handler credits the part of the round the interpreter is in with the CPU time used since
    the last look. A signal arriving inside compiled code or a C call is handled when the
    call returns, in the frame that made it, which is then credited with the call's time."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.seconds: Counter[str] = Counter()
        self.looks = 0
        self._last = 0.0

    def _look(self, signum, frame) -> None:
        now = time.process_time()
        self.seconds[part_of(frame)] += now - self._last
        self.looks += 1
        self._last = now

    def start(self) -> None:
        signal.signal(signal.SIGPROF, self._look)
        self._last = time.process_time()
        signal.setitimer(signal.ITIMER_PROF, self.interval, self.interval)

    def stop(self) -> None:
        signal.setitimer(signal.ITIMER_PROF, 0.0, 0.0)
        signal.signal(signal.SIGPROF, signal.SIG_DFL)


def main() -> None:
    ap = parser(__doc__, jsonl="one for the run", append=True)
    ap.add_argument("--method", default="KUE", choices=sorted(PAPER))
    ap.add_argument("--dataset", default="circle2")
    ap.add_argument("--rounds", type=int, default=100, help="rounds per time step")
    ap.add_argument("--local-steps", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--one-by-one", action="store_true", help="batch-clients = false")
    args = ap.parse_args()
    from flwr.common.logger import FLOWER_LOGGER

    from fedcluster_app.engine import run_inprocess

    FLOWER_LOGGER.setLevel(logging.ERROR)
    os.environ.setdefault("FEDCLUSTER_TORCH_THREADS", "1")
    TrainerClock()      # the trainer's calls go through a Python function that looks find
    sampler = Sampler(0.001)
    strategy = PAPER[args.method][0]
    batch = not args.one_by_one

    def config(rounds: int, runs_dir: str) -> dict:
        ns = argparse.Namespace(rounds=rounds, local_steps=args.local_steps, seed=args.seed,
                                data_seed=0, optimizer_state="round", overrides={},
                                runs_dir=runs_dir)
        return {**run_config(strategy, args.dataset, args.seed, ns), "batch-clients": batch}

    with tempfile.TemporaryDirectory() as tmp:
        run_inprocess(config(1, tmp + "/warm"))       # imports, compiled code, data: not counted
        load = load_average()
        wall, cpu = time.perf_counter(), time.process_time()
        sampler.start()
        summary = run_inprocess(config(args.rounds, tmp + "/run"))
        sampler.stop()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    rounds = summary["rounds"]
    total = sum(sampler.seconds.values())
    print(f"{args.method} on {args.dataset}, {rounds} rounds, "
          f"{'batched' if batch else 'one by one'}: {wall:.1f} s wall, {cpu:.1f} s CPU "
          f"({1e3 * cpu / rounds:.2f} ms per round), {total:.1f} s of it seen by "
          f"{sampler.looks} looks; load average {load[0]:.2f} at the start")
    shares = {part: t / total for part, t in sampler.seconds.most_common()}
    for part, share in shares.items():
        print(f"  {100 * share:5.1f} %  {1e3 * share * cpu / rounds:6.2f} ms/round  {part}")
    write_rows(args.jsonl, [{"method": args.method, "dataset": args.dataset,
                             "rounds": rounds, "batched": batch, "wall_s": round(wall, 2),
                             "cpu_s": round(cpu, 2), "looks": sampler.looks,
                             "shares": {p: round(s, 4) for p, s in shares.items()},
                             **machine(load)}], append=args.append)


if __name__ == "__main__":
    main()
