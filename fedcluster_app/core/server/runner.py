"""The run of a clustered strategy, apart from the strategy base that it drives.

A run owns its directory (one writer, held by a lock; refusals before any file is touched; a
resumed run's files reconciled with its checkpoint), goes round by round through the strategy's
hooks and its protocol (the loop in ``strategy.py``'s docstring), checkpoints by rounds, by
seconds and when a signal asks it to stop, and ends with summary.json (status ``completed``,
``degraded``, ``failed`` or ``interrupted``) and Flower's ``Result``.
"""

from __future__ import annotations

import contextlib
import math
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from flwr.app import ArrayRecord, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result

from fedcluster_app.core import codec
from fedcluster_app.core import wire as P
from fedcluster_app.core.experiment import data_fingerprint, resolved_config
from fedcluster_app.core.results import RunRecorder, check_out_dir, finished_run, format_round_line
from fedcluster_app.core.results.files import CHECKPOINT_FILE, METRICS_FILE, reconcile_metrics
from fedcluster_app.core.run_lock import run_lock
from fedcluster_app.core.server.checkpoint import read_checkpoint, resume_command
from fedcluster_app.core.server.messages import Reply
from fedcluster_app.core.stopping import Interrupted, round_loop, stop_requested

if TYPE_CHECKING:   # the strategy module composes this one: its type only
    from fedcluster_app.core.server.strategy import ClusteredStrategy

Weights = list[np.ndarray]


@dataclass
class ClusteredResult(Result):
    """Flower's ``Result`` for a clustered run: ``arrays`` is the model of the largest
    cluster; ``models`` every model by id, ``assignments`` every client's cluster and
    ``summary`` what summary.json holds."""

    models: dict[int, ArrayRecord] | None = None
    assignments: dict[int, int | None] | None = None
    summary: dict[str, Any] | None = None


@dataclass
class RoundStats:
    """What one round's exchanges cost and who failed in them (metrics.jsonl's keys)."""

    bytes_up: int = 0
    bytes_down: int = 0
    failures: int = 0
    #: who missed or failed a message this round (a query phase goes on with the others)
    failed_clients: list[int] = field(default_factory=list)
    #: returned models scaled down by update-norm-bound
    bounded_updates: int = 0
    #: failures by kind: "no-reply", "error" (the client's), or a ``RejectedReply.kind``
    rejected: dict[str, int] = field(default_factory=dict)
    #: the optimizer steps the accepted replies' training took (every exchange, every phase)
    gradient_steps: int = 0

    def as_record(self) -> dict[str, Any]:
        record = asdict(self)
        if not self.rejected:   # written only for a round with failures
            del record["rejected"]
        return record


def train_loss(replies: list[Reply]) -> float | None:
    """The round's training loss: the losses the training replies report (one per model
    trained, or one per reply), averaged with their num-examples as weights, as Flower's
    strategies average ``train_loss``; None when no reply reports one. A diagnostic only: no
    decision reads it, and a total that overflows is recorded as None."""
    total = weight = 0.0
    for r in replies:
        reports = [m for m in r.model_metrics.values() if P.TRAIN_LOSS in m]
        if not reports and P.TRAIN_LOSS in r.metrics:
            reports = [r.metrics]
        for m in reports:
            n = float(m.get(P.NUM_EXAMPLES, r.num_examples))
            total += n * float(m[P.TRAIN_LOSS])
            weight += n
    mean = total / weight if weight > 0 else None
    return mean if mean is not None and math.isfinite(mean) else None


class RoundRunner:
    """One strategy's run (module docstring)."""

    def __init__(self, strategy: ClusteredStrategy) -> None:
        self.s = strategy
        self.untrained_rounds: list[int] = []     # rounds whose training got no usable reply
        self.unevaluated_rounds: list[int] = []   # evaluated rounds without a usable score
        #: ``start(evaluate_fn=...)``: called on every cluster model after each round
        self.evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None
        self.records: list[dict[str, Any]] = []   # the rounds of the last run()
        #: when the round under way ends (time.monotonic()): every exchange of the round waits
        #: at most until then, and its instructions expire then; None between rounds
        self.deadline: float | None = None

    def time_left(self) -> float:
        """Seconds an exchange may still wait: to the round's deadline, or ``round-timeout``
        outside a round (discovery before round 1)."""
        if self.deadline is None:
            return self.s.round_timeout
        return self.deadline - time.monotonic()

    # ------------------------------------------------------------------ the directory
    def continuing(self, out: Path) -> bool:
        """Whether this run continues the checkpoint of ``out`` itself (its files with it)."""
        resumed_from = self.s.checkpoints.resumed_from
        return (self.s.round > 0 and resumed_from is not None
                and resumed_from.parent == Path(out).resolve())

    def check_writable(self, out: Path) -> None:
        """Refuse, before any file is touched: writing into another finished run's directory
        (unless ``overwrite``; continuing the checkpoint of ``out`` itself is fine), or into one
        that holds files that are not a run's; a checkpoint past this run's last round; a
        directory whose metrics.jsonl lacks rounds the checkpoint has (``reconcile_metrics``)."""
        s = self.s
        continuing = self.continuing(out)
        check_out_dir(out, overwrite=s.cfg.overwrite, continuing=continuing)
        if s.round > s.num_rounds:
            raise ValueError(f"the checkpoint is after round {s.round}, but this run has only "
                             f"{s.num_rounds} rounds")
        if continuing:
            reconcile_metrics(out, s.round)

    def open_recorder(self, out: Path) -> RunRecorder:
        s = self.s
        self.check_writable(out)
        return RunRecorder(out, strategy=s.name, scenario=s.exp.scenario.name, seed=s.cfg.seed,
                           config=dict(s.cfg.raw), resume=s.round > 0,
                           resolved_config={**resolved_config(s.exp), "out-dir": str(out)},
                           data_fingerprint=data_fingerprint(s.exp.scenario),
                           tracking=s.cfg.tracking_backends, tracking_uri=s.cfg.tracking_uri)

    # ------------------------------------------------------------------ the run
    def run(self, grid: Grid, out_dir: str | Path | None = None) -> dict[str, Any]:
        """Run every remaining round, writing metrics.jsonl round by round, summary.json and
        the plot at the end and checkpoints as configured; returns the summary. A failure
        during the run still writes summary.json with status "failed", then propagates."""
        t0 = time.monotonic()
        out = resolve_out_dir(self.s.cfg.raw, out_dir)
        self.check_writable(out)   # refusals first: they touch nothing
        with run_lock(out):        # one writer per directory, for the whole run
            return self._run_locked(grid, out, t0)

    def _run_locked(self, grid: Grid, out: Path, t0: float) -> dict[str, Any]:
        s = self.s
        resumed_after = s.round
        if self.continuing(out):   # the files must agree with the checkpoint
            note = reconcile_metrics(out, s.round, repair=True)
            if note:
                log(WARNING, "%s", note)
        recorder = self.open_recorder(out)   # refuses a finished run's directory, touching nothing
        log(INFO, "fedcluster: %s on %s, %d rounds; results in %s", s.name,
            s.exp.scenario.name, s.num_rounds, out)
        try:
            with round_loop():
                self.rounds(grid, recorder, out)
        except (Interrupted, KeyboardInterrupt) as ex:
            signame = ex.signame if isinstance(ex, Interrupted) else "SIGINT"
            finish_interrupted(recorder, out, signame, s.num_rounds, time.monotonic() - t0)
            raise
        except Exception as ex:
            log(ERROR, "run failed: %s", traceback.format_exc())
            recorder.finish(status="failed", error=f"{type(ex).__name__}: {ex}", plot=False,
                            extra={"wall_time_s": time.monotonic() - t0})
            raise
        extra = {"wall_time_s": time.monotonic() - t0, "out_dir": str(out),
                 "num_clients": s.exp.scenario.num_clients,
                 "num_steps": s.exp.scenario.num_steps,
                 "round_protocol": s.protocol.name,
                 "accuracy_rule": s.protocol.accuracy_rule,
                 **({"resumed_after_round": resumed_after} if resumed_after else {}),
                 **s.protocol.summary_extra(), **s.summary_extra()}
        status, reason = self.health()
        summary = recorder.finish(status=status, reason=reason, plot=s.cfg.plot, extra=extra)
        self.records = recorder.rounds
        if status != "completed":
            log(ERROR, "fedcluster: the run is %s: %s", status, reason)
        log(INFO, "fedcluster: done: mean accuracy %.4f, final %.4f; summary in %s",
            summary["mean_accuracy"] or 0.0, summary["final_accuracy"] or 0.0,
            out / "summary.json")
        return summary

    def health(self) -> tuple[str, str | None]:
        """The status of a run that got to its end: "failed" when no client was ever admitted,
        "degraded" when a round planned training and no reply to it was usable."""
        s = self.s
        if not s.clients:
            errors = "; ".join(f"node {n}: {e}" for n, e in sorted(s.nodes.errors.items())[:3])
            return "failed", ("no client was ever admitted" + (f" ({errors})" if errors else
                                                               " (no node answered discovery)"))
        reasons = []
        for rounds, what in ((self.untrained_rounds, "training"),
                             (self.unevaluated_rounds, "evaluation")):
            if rounds:
                shown = ", ".join(map(str, rounds[:10])) + (", ..." if len(rounds) > 10 else "")
                reasons.append(f"{len(rounds)} of {s.round} rounds had no usable {what} reply "
                               f"(rounds {shown})")
        if reasons:
            return "degraded", ("; ".join(reasons) + ": every reply rejected or missing, see "
                                "failures and failed_clients in metrics.jsonl")
        return "completed", None

    def log_start(self) -> None:
        """What the run is, in the log: strategy, scenario, rounds, protocol, the data."""
        s = self.s
        log(INFO, "%s (%s) on %s: %d clients, %d rounds (%s protocol)", s.name,
            s.description, s.exp.scenario.name, s.exp.scenario.num_clients,
            s.num_rounds, s.protocol.name)
        if s.exp.protocol:
            log(INFO, "%s's paper protocol sets %s (keys left at their defaults; --set one to "
                "change it, protocol = \"none\" for the plain defaults)", s.exp.scenario.name,
                ", ".join(f"{k}={v}" for k, v in s.exp.protocol))
        for line in s.exp.scenario.data_report():
            log(INFO, "%s", line)

    def rounds(self, grid: Grid, recorder: RunRecorder, out_dir: Path) -> None:
        s, protocol = self.s, self.s.protocol
        s.summary()
        total = s.num_rounds
        resumed = s.round > 0
        s.wait_for_nodes(grid)
        s.discover(grid)
        if not resumed:
            s.on_start()
        before_round_1 = s.round_stats.gradient_steps   # on_start's training: round 1's work
        last_checkpoint = time.monotonic()
        for rnd in range(s.round + 1, total + 1):
            step = protocol.time_step(rnd)
            new_step = protocol.starts_step(rnd)
            last_of_step = rnd == total or protocol.starts_step(rnd + 1)
            s.round_stats = RoundStats(gradient_steps=before_round_1)
            before_round_1 = 0
            protocol.start_round(rnd)
            t_round = time.monotonic()
            self.deadline = t_round + s.round_timeout   # one deadline for the whole round
            s.step = step
            if new_step:   # a step begins between rounds: its decisions hold from round rnd on
                for cid in s.discover(grid):
                    s.on_new_client(cid)
                protocol.begin_step(grid, step)
                s.begin_step(grid, step)
            s.round = rnd
            for cid in s.discover(grid):   # newcomers, and returning clients' new node ids
                s.on_new_client(cid)
            protocol.before_round(grid, step)
            s.before_round(grid, step, new_step)
            plan = {cid: t for cid, t in s.plan_train(step).items()
                    if cid in s.clients and cid not in s.holdouts}
            replies = s.exchange(grid, P.TRAIN, plan)
            if plan and not replies:
                self.untrained_rounds.append(rnd)
            before = {mid: [a.copy() for a in w] for mid, w in s.models.items()}
            s.on_train_replies(step, replies)
            self.keep_finite(before)
            record: dict[str, Any] = {"round": rnd, "time_step": step}
            evaluated = protocol.evaluates(rnd)
            if evaluated:
                # a round evaluated only for score-next-step: its exchanges are not accounted
                with (contextlib.nullcontext() if protocol.scheduled(rnd)
                      else protocol.scoring_only()):
                    record.update(protocol.evaluate(grid, step))
                if record.get("accuracy") is None and record.get("accuracy_current") is None:
                    self.unevaluated_rounds.append(rnd)
            else:
                record.update(accuracy=None)
            if self.evaluate_fn is not None:
                record["server_evaluation"] = self.server_evaluation(rnd)
            metrics = protocol.round_metrics(evaluated)   # what this round did
            clustering = protocol.clustering()             # who is in which cluster
            if last_of_step:
                s.end_step(step)
            record.update(
                **clustering,
                trained_clients=len(replies),
                train_loss=train_loss(replies),
                round_time_s=round(time.monotonic() - t_round, 4),
                **s.round_stats.as_record(),
                **metrics,
            )
            recorder.log_round(record)
            if s.cfg.progress and (evaluated or new_step):
                log(INFO, "%s", format_round_line(record, total))
            self.deadline = None   # the round is over: a checkpoint's pull has its own wait
            # periodic checkpoints (by rounds, by time), and one when a signal asked the run to
            # stop: at a round's end, so a checkpoint always holds whole rounds
            stop = stop_requested() if rnd < total else None
            every, every_s = s.cfg.checkpoint_every, s.cfg.checkpoint_every_s
            if (stop is not None or (every and rnd % every == 0)
                    or (every_s and time.monotonic() - last_checkpoint >= every_s)):
                s.checkpoints.save(out_dir / CHECKPOINT_FILE, grid)
                last_checkpoint = time.monotonic()
            if stop is not None:
                raise Interrupted(stop, checkpointed_round=rnd)
        s.step = None
        s.checkpoints.save(out_dir / CHECKPOINT_FILE, grid)

    def keep_finite(self, before: dict[int, Weights]) -> None:
        """A model is never replaced by a non-finite one (an aggregate of updates that are
        each finite can still overflow): it keeps its weights from before the round."""
        s = self.s
        for mid, weights in s.models.items():
            if not all(np.isfinite(a).all() for a in weights if a.dtype.kind == "f"):
                log(ERROR, "round %d: model %d became non-finite after aggregation; it keeps its "
                    "weights from before the round", s.round, mid)
                if mid in before:
                    s.models[mid] = before[mid]
                else:   # created this round from non-finite weights: start it afresh
                    s.models[mid] = s.initial_weights()

    def server_evaluation(self, rnd: int) -> dict[str, Any]:
        out = {}
        for mid in self.s.clusters_in_use() or sorted(self.s.models):
            metrics = self.evaluate_fn(rnd, codec.pack_arrays(self.s.models[mid]))
            if metrics is not None:
                out[str(mid)] = dict(metrics)
        return out

    # ------------------------------------------------------------------ Flower's Result
    def result(self, summary: dict[str, Any]) -> ClusteredResult:
        """Flower's ``Result`` of the run: per round, the clients' training counts and test
        metrics and the server-side evaluation (as metrics.jsonl has them)."""
        s = self.s
        models = {mid: codec.pack_arrays(w) for mid, w in sorted(s.models.items())}
        sizes = {mid: len(s.members(mid)) for mid in models}
        largest = max(sizes, key=lambda m: (sizes[m], -m)) if sizes else None
        out = ClusteredResult(
            arrays=models[largest] if largest is not None else ArrayRecord(),
            models=models,
            assignments={cid: rec.cluster for cid, rec in sorted(s.clients.items())},
            summary=summary,
        )

        def numbers(record: dict[str, Any], keys: Iterable[str]) -> MetricRecord:
            return MetricRecord({k: record[k] for k in keys if isinstance(record.get(k), (int, float))
                                 and not isinstance(record.get(k), bool)})

        for r in self.records:
            rnd = r["round"]
            out.train_metrics_clientapp[rnd] = numbers(
                r, ("trained_clients", "train_loss", "bytes_up", "bytes_down", "failures"))
            if r.get("accuracy") is not None or r.get("accuracy_current") is not None:
                out.evaluate_metrics_clientapp[rnd] = numbers(
                    r, ("accuracy", "weighted_accuracy", "global_accuracy", "ari", "acc_omit",
                        "accuracy_current", "accuracy_next", "next_step",
                        "balanced_accuracy_current", "balanced_accuracy_next"))
            if r.get("server_evaluation"):
                out.evaluate_metrics_serverapp[rnd] = MetricRecord(
                    {f"model{mid}.{k}": v for mid, m in r["server_evaluation"].items()
                     for k, v in m.items()})
        return out


def finish_interrupted(recorder: RunRecorder, out: Path, signame: str, num_rounds: int,
                       wall_time_s: float) -> dict[str, Any]:
    """summary.json of a run stopped by a signal: status "interrupted", the rounds it logged,
    and the command that continues it from its last checkpoint (``resume_command``)."""
    logged = recorder.rounds[-1]["round"] if recorder.rounds else 0
    try:
        checkpointed = int(read_checkpoint(out)[0]["round"])
    except (FileNotFoundError, ValueError, KeyError):
        checkpointed = None
    command = resume_command(out)
    reason = (f"stopped by {signame} after round {logged} of {num_rounds}; "
              + (f"its checkpoint is after round {checkpointed}; continue it with: {command}"
                 if command else "no checkpoint was written yet"))
    log(WARNING, "fedcluster: %s", reason)
    return recorder.finish(status="interrupted", reason=reason, plot=False,
                           extra={"wall_time_s": wall_time_s, "out_dir": str(out),
                                  "checkpoint_round": checkpointed, "resume_command": command})


def mark_interrupted(strategy: ClusteredStrategy, out: Path, signame: str,
                     wall_time_s: float) -> dict[str, Any] | None:
    """For a run whose ServerApp ran in another process, stopped with it (``fedcluster run
    --engine ray``): its summary.json says "interrupted" (``finish_interrupted``); None when
    the run had written nothing yet."""
    if not (out / METRICS_FILE).is_file():
        return None
    recorder = RunRecorder(out, strategy=strategy.name, scenario=strategy.exp.scenario.name,
                           seed=strategy.cfg.seed, config=dict(strategy.cfg.raw), resume=True)
    return finish_interrupted(recorder, out, signame, strategy.num_rounds, wall_time_s)


def resolve_out_dir(run_config: dict[str, Any], out_dir: str | Path | None = None) -> Path:
    """``out_dir``, else the run config's ``out-dir``, else ``runs/<strategy>-<scenario>-s<seed>``
    or, when that holds a finished run (and ``overwrite`` is off), the first free
    ``...-s<seed>-2``, ``-3``, ...: a run without an out-dir never lands on another's results."""
    out = str(out_dir or run_config.get("out-dir", "") or "")
    if out:
        return Path(out).expanduser().resolve()
    strategy = str(run_config["strategy"]).rsplit(":", 1)[-1]   # a user's: the class name
    base = Path(f"runs/{strategy}-{run_config['scenario']}-s{run_config['seed']}").resolve()
    path, n = base, 2
    while not run_config.get("overwrite") and finished_run(path):
        path, n = base.with_name(f"{base.name}-{n}"), n + 1
    return path
