"""The clustered strategy base: many models, clients moving between them, one round loop.

``flwr.serverapp.strategy.Strategy.start`` carries one global model, so this base overrides the
round loop. It keeps

* a registry of cluster models (ids increase and are never reused; models can be created,
  merged and deleted while the run goes on),
* one ``ClientRecord`` per *logical* client id (hard cluster or soft weights, data size, last
  round seen, failures), never keyed on Flower node ids, which change between runs,
* per-node messages: a message may carry several models (clients training several models in one
  round, soft clustering) or none (a personal model that stays in the client's context.state),
* query phases that reach every client, sampled or not (``self.query``),

validates every reply (wrong shapes or non-finite values are rejected and counted, the round
goes on), writes the results contract and checkpoints its whole state atomically.

The loop (:meth:`ClusteredStrategy.run`), once per round r of step t::

    discover new nodes -> on_new_client            (clients that joined)
    if r starts step t: begin_step(grid, t)        (between rounds: probes, drift handling)
    before_round(grid, t, new_step)                (query phases, re-clustering, selection)
    plan_train(t) -> one train message per client  (default: the protocol's plan)
    on_train_replies(t, replies)                   (aggregation)
    if the protocol evaluates r: evaluate          (the protocol's rule)
    if r ends step t: end_step(t)
    a line in metrics.jsonl; a checkpoint every checkpoint-every rounds

When and on what data is the protocol's (``self.protocol``, core/server/protocol.py): the plain round
protocol by default, FedDrift's time-step protocol or FlexCFL's paper protocol for strategies
that say so with ``protocol_factory``. What is the strategy's: these hooks, and its typed
hyper-parameters (``Params``, read from the run-config table ``[tool.flwr.app.config.<table>]``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import shutil
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.server.strategy.aggregate import aggregate_median, aggregate_trimmed_avg
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from fedcluster_app.core import codec
from fedcluster_app.core import wire as P
from fedcluster_app.core.server.updates import weighted_average
from fedcluster_app.core.server.checkpoint import (
    CHECKPOINT_FILE,
    check_same_run,
    checkpoint_file,
    read_checkpoint,
    read_client_states,
    resume_command,
    write_checkpoint,
)
from fedcluster_app.core.data.schedules import schedule_digest
from fedcluster_app.core.config import ConfigError
from fedcluster_app.core.experiment import Experiment, data_fingerprint, resolved_config
from fedcluster_app.core.hparams import HParams, NoParams
from fedcluster_app.core.server.messages import (
    RejectedReply,
    Reply,
    Task,
    validate_reply,
)
from fedcluster_app.core.models import (
    SPLIT_CONTRACT,
    build_model,
    initial_weights,
    split_model,
    weight_dtypes,
    weight_shapes,
)
from fedcluster_app.core.server.courier import Courier
from fedcluster_app.core.server.nodes import ClientRecord, NodeDirectory
from fedcluster_app.core.server.protocol import Protocol
from fedcluster_app.core.results import (
    RunRecorder,
    check_out_dir,
    finished_run,
    format_round_line,
)
from fedcluster_app.core.results.files import METRICS_FILE, reconcile_metrics
from fedcluster_app.core.run_lock import run_lock
from fedcluster_app.core.stopping import Interrupted, round_loop, stop_requested

Weights = list[np.ndarray]

__all__ = ["CHECKPOINT_FILE", "ClientRecord", "ClusteredResult", "ClusteredStrategy",
           "RejectedReply", "Reply", "Task", "Weights", "read_checkpoint", "weighted_average",
           "write_checkpoint"]


@dataclass
class ClusteredResult(Result):
    """Flower's ``Result`` for a clustered run: ``arrays`` is the model of the largest
    cluster; ``models`` every model by id, ``assignments`` every client's cluster and
    ``summary`` what summary.json holds."""

    models: dict[int, ArrayRecord] | None = None
    assignments: dict[int, int | None] | None = None
    summary: dict[str, Any] | None = None


class ClusteredStrategy(Strategy):
    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    uses_ground_truth: ClassVar[bool] = False   # only the Oracle may read clients' true concepts
    # message kinds a family's ClientApp handlers answer instead of the built-in ones, e.g.
    # {P.TRAIN: "train.fedrc"}; every exchange of that kind is sent under the mapped name
    message_kinds: ClassVar[dict[str, str]] = {}
    #: the strategy's hyper-parameters, read from the run-config table ``Params.table``
    Params: ClassVar[type[HParams]] = NoParams
    #: the protocol it runs under
    protocol_factory: ClassVar[Callable[[], Protocol]] = Protocol
    #: its clients split the model into the feature extractor and the classifier
    #: (``models.split_model``): a model without the two parts is refused before round 1
    needs_split_model: ClassVar[bool] = False
    #: under a time-step protocol, a client's past batches move with it to a new cluster
    #: (CFL-W); by default they stay with the cluster they were trained into
    history_follows_client: ClassVar[bool] = False

    def __init__(self, experiment: Experiment) -> None:
        self.exp = experiment
        self.cfg = experiment.cfg
        self.params = self.Params.from_run_config(self.cfg.raw)
        if self.needs_split_model:
            self._check_split_model()
        self.rng = np.random.default_rng([self.cfg.seed, 0xC1])
        self.models: dict[int, Weights] = {}
        self.model_birth: dict[int, int] = {}        # model id -> round it was created
        self.next_model_id = 0
        self.clients: dict[int, ClientRecord] = {}
        self.round = 0
        self.step: int | None = None                 # the step of the round under way
        self.nodes = NodeDirectory(self)             # which node holds which client id
        self.courier = Courier(self)                 # messages out, replies checked and bounded
        self._untrained_rounds: list[int] = []      # rounds whose training got no usable reply
        self._unevaluated_rounds: list[int] = []    # evaluated rounds without a usable score
        self._pending_states: dict[int, bytes] = {}  # resumed: clients' checkpointed state
        self._truth: dict[int, dict[int, int]] = {}  # cid -> step -> concept (metrics, Oracle)
        self._round_stats = self._fresh_stats()
        self._shapes = weight_shapes(experiment.spec)
        self._dtypes = weight_dtypes(experiment.spec)
        # the most training data one client of the scenario holds (caps a reply's num-examples)
        self.max_examples = experiment.scenario.max_client_examples()
        self.holdouts = frozenset(experiment.scenario.holdout_clients)  # never trained
        self.round_timeout = self.cfg.round_timeout
        self._initial: Weights | None = None        # start(initial_arrays=...) replaces w0
        self._extra_config = {P.TRAIN: {}, P.EVALUATE: {}}   # start(train_config=, ...)
        self._evaluate_fn = None
        self._last_round = 0                         # 0 = the protocol's number of rounds
        self._records: list[dict[str, Any]] = []     # the rounds of the last run()
        self.protocol = self.protocol_factory()
        self.protocol.bind(self)

    @property
    def num_rounds(self) -> int:
        return self._last_round or self.protocol.num_rounds()

    # ------------------------------------------------------------------ model registry
    def new_model(self, weights: Weights | None = None, *, created: bool = True) -> int:
        """Register a model; without weights it gets the run's common seeded initialisation.
        ``created=False``: the model replaces others (a merge), it is not a new cluster."""
        mid = self.next_model_id
        self.next_model_id += 1
        self.models[mid] = weights if weights is not None else self.initial_weights()
        self.model_birth[mid] = self.round
        self.protocol.on_new_model(mid, created)
        return mid

    def _check_split_model(self) -> None:
        """A strategy with ``needs_split_model``: refuse a model without the two parts."""
        spec = self.exp.spec
        try:
            split_model(build_model(spec, 0))
        except ValueError:
            got = spec.kind + (f" with hidden={spec.hidden}" if spec.kind == "mlp" else "")
            raise ConfigError(f"model: {self.name} needs {SPLIT_CONTRACT}; got {got} (built in: "
                              "model = \"cnn\", or \"mlp\" with hidden > 0)") from None

    def initial_weights(self, salt: int = 0) -> Weights:
        """The run's common initialisation (salt 0, or the arrays given to ``start``), or
        another seeded one (salt > 0: strategies that need distinct random models)."""
        if salt == 0 and self._initial is not None:
            return [a.copy() for a in self._initial]
        return initial_weights(self.exp.spec, seed=self.cfg.seed * 1000 + salt)

    def delete_model(self, mid: int) -> None:
        del self.models[mid]
        self.model_birth.pop(mid, None)
        for rec in self.clients.values():
            if rec.cluster == mid:
                rec.cluster = None
            if rec.soft and mid in rec.soft:
                rec.soft.pop(mid)

    def merge_models(self, ids: list[int], weights: list[float]) -> int:
        """Replace models ``ids`` by their weighted average; their clients move to the new one."""
        merged = self.new_model(weighted_average([(self.models[i], w) for i, w in zip(ids, weights)]),
                                created=False)
        for i in ids:
            self.relabel(i, merged)
            self.delete_model(i)
        return merged

    def relabel(self, old: int, new: int | None) -> None:
        """Every client of model ``old`` now belongs to ``new`` (None: to no model), and so
        does the history the protocol keeps (FedDrift's identities of past steps)."""
        for rec in self.clients.values():
            if rec.cluster == old:
                rec.cluster = new
        self.protocol.on_relabel(old, new)

    def assign(self, cid: int, mid: int | None) -> None:
        self.clients[cid].cluster = mid
        self.protocol.on_assign(cid, mid)

    def training_clients(self) -> list[int]:
        """The known clients that take part in training (all but the held-out ones), sorted."""
        return [c for c in sorted(self.clients) if c not in self.holdouts]

    def members(self, mid: int) -> list[int]:
        return sorted(c for c, rec in self.clients.items() if rec.cluster == mid)

    def clusters_in_use(self) -> list[int]:
        """The models that are some client's hard cluster (what plain rounds train)."""
        return sorted({rec.cluster for rec in self.clients.values() if rec.cluster is not None})

    def cluster_models(self) -> list[int]:
        """The models that are clusters, which ``models_allocated`` counts: the registry, less
        entries a strategy keeps for another purpose (a probe, the initial model)."""
        return sorted(self.models)

    # ------------------------------------------------------------------ ground truth
    def true_concept(self, cid: int, step: int) -> int | None:
        """A client's true concept at ``step``: only a strategy with ``uses_ground_truth``
        (the Oracle) may ask."""
        if not self.uses_ground_truth:
            raise PermissionError(f"{self.name} may not read ground-truth concepts")
        return self._truth.get(cid, {}).get(step)

    def concept_for_metrics(self, cid: int, step: int) -> int | None:
        """The true concept, for metrics (ARI, drift counts) only: never for decisions."""
        return self._truth.get(cid, {}).get(step)

    # ------------------------------------------------------------------ hooks
    def on_start(self) -> None:
        """After the clients are known (not called on resume). Default: one model for all."""
        mid = self.new_model()
        for cid in self.clients:
            self.assign(cid, mid)

    def on_new_client(self, cid: int) -> None:
        """A client seen for the first time after the start. Default: the largest cluster."""
        sizes = {mid: len(self.members(mid)) for mid in self.clusters_in_use()}
        if sizes:
            self.assign(cid, max(sizes, key=lambda m: (sizes[m], -m)))

    def begin_step(self, grid: Grid, step: int) -> None:
        """At the start of every time step, between rounds (``self.round`` is the last round
        done): probes, drift detection, assignments that hold for the step."""

    def before_round(self, grid: Grid, step: int, new_step: bool) -> None:
        """Runs before training, every round; query phases and re-clustering go here."""

    def plan_train(self, step: int) -> dict[int, Task]:
        """Who trains what this round; default: the protocol's plan (plain rounds:
        ``fraction-train`` of every cluster's members, each on its cluster's model)."""
        return self.protocol.default_plan(step)

    def on_train_replies(self, step: int, replies: list[Reply]) -> None:
        """Default: every returned model is FedAvg-ed into its registry entry (by num-examples)."""
        for mid, items in self.collect_updates(replies).items():
            if mid in self.models:
                self.models[mid] = self.aggregate(items)

    def end_step(self, step: int) -> None:
        """After the last round of a time step (and its evaluation)."""

    def active_models(self, step: int) -> list[int] | None:
        """The models trained during ``step``, if the strategy knows better than its protocol."""
        return None

    def eval_task(self, cid: int) -> Task | None:
        rec = self.clients[cid]
        if rec.soft:
            ids = sorted(m for m, w in rec.soft.items() if w > 0 and m in self.models)
            return Task(models=ids, config={P.MIXTURE: [float(rec.soft[m]) for m in ids]})
        if rec.cluster is None or rec.cluster not in self.models:
            return None
        return Task(models=[rec.cluster])

    def assigned_model(self, cid: int) -> int | None:
        """The cluster (model id) a client is in: its hard cluster, or under soft clustering
        the model of its largest weight (ties: the lowest id). metrics.jsonl's ``assignments``
        and ``num_clusters`` come from it (through the protocol)."""
        rec = self.clients[cid]
        if rec.soft:
            return max(rec.soft, key=lambda m: (rec.soft[m], -m))
        return rec.cluster

    def cluster_label(self, cid: int) -> int | None:
        """The cluster a client counts in for the adjusted Rand index: its assigned model,
        unless the strategy clusters something else than models (FedCCFA: classifier rows)."""
        return self.assigned_model(cid)

    def global_eval_task(self, cid: int) -> Task | None:
        """How a held-out client is scored: every model goes down and the client predicts with
        the one of lowest loss on its adaptation split; None = not scored."""
        return Task.min_loss(sorted(self.models))

    def step_eval_tasks(self, tau: int) -> tuple[str, dict[int, Task]] | None:
        """Under a time-step protocol: how clients are scored at step ``tau`` when the strategy
        has its own rule (the message kind and every client's task: AUE's and KUE's weighted
        votes); None = each client's model of step ``tau``, the protocol's default."""
        return None

    def evaluate_step(self, grid: Grid, tau: int) -> dict[int, float] | None:
        """Under a time-step protocol: the strategy's own score of every client at step ``tau``
        (client -> accuracy); None = the protocol's (``step_eval_tasks`` on step tau + 1)."""
        return None

    def common_init_model(self) -> int | None:
        """The registry id of the run's common initial model w0 where the strategy keeps it
        (FlexCFL); None = the protocol adds it when it needs it (a never-trained client)."""
        return None

    def check_reply(self, kind: str, reply: Reply) -> None:
        """Strategy-specific checks of a reply that passed the generic ones; raise
        RejectedReply to drop that client's contribution this round (logged and counted)."""

    def round_metrics(self) -> dict[str, Any]:
        """Strategy-specific keys added to metrics.jsonl (the protocol decides when: every
        round, or once per time step with its evaluation)."""
        return {}

    def summary_extra(self) -> dict[str, Any]:
        """Strategy-specific run-level keys added to summary.json (default: none)."""
        return {}

    def strategy_state(self) -> dict[str, Any]:
        """Extra JSON-able state a subclass must checkpoint."""
        return {}

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        pass

    # ------------------------------------------------------------------ helpers for hooks
    def sample(self, cids: list[int], fraction: float,
               rng: np.random.Generator | None = None) -> list[int]:
        """``fraction`` of ``cids`` (at least one), drawn with the run's generator (or ``rng``)."""
        if fraction >= 1.0 or not cids:
            return list(cids)
        k = max(1, math.ceil(fraction * len(cids)))
        rng = self.rng if rng is None else rng
        return sorted(int(c) for c in rng.choice(cids, size=k, replace=False))

    def aggregate(self, items: list[tuple[Weights, float]]) -> Weights:
        """Average client updates ``(weights, num-examples)`` into one model: the weighted mean,
        or with ``robust-aggregation`` Flower's coordinate-wise median or trimmed mean (which
        ignore the counts: a robust rule cannot trust what a client says it holds)."""
        rule = self.cfg.robust_aggregation
        if rule == "none":
            return weighted_average(items)
        results = [(w, 1) for w, _ in items]
        out = (aggregate_median(results) if rule == "median"
               else aggregate_trimmed_avg(results, self.cfg.trim_fraction))
        return [np.asarray(a).astype(w.dtype) for a, w in zip(out, items[0][0])]

    def collect_updates(self, replies: list[Reply]) -> dict[int, list[tuple[Weights, float]]]:
        updates: dict[int, list[tuple[Weights, float]]] = {}
        for r in replies:
            for mid, weights in r.models.items():
                n = r.model_metrics.get(mid, {}).get(P.NUM_EXAMPLES, r.num_examples)
                updates.setdefault(mid, []).append((weights, float(n)))
        return updates

    @staticmethod
    def train_loss(replies: list[Reply]) -> float | None:
        """The round's training loss: the losses the training replies report (one per model
        trained, or one per reply), averaged with their num-examples as weights, as Flower's
        strategies average ``train_loss``; None when no reply reports one. A diagnostic only:
        no decision reads it, and a total that overflows is recorded as None."""
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

    def query(
        self,
        grid: Grid,
        kind: str,
        cids: Iterable[int] | None = None,
        models: list[int] | None = None,
        config: dict[str, Any] | None = None,
    ) -> dict[int, Reply]:
        """Send a query.* message to clients (default: every known client), sampled or not."""
        targets = sorted(self.clients) if cids is None else sorted(cids)
        tasks = {cid: Task(models=list(models or []), config=dict(config or {})) for cid in targets}
        return {r.cid: r for r in self.exchange(grid, kind, tasks)}

    # ------------------------------------------------------------------ messaging
    def exchange(self, grid: Grid, kind: str, tasks: dict[int, Task]) -> list[Reply]:
        """Send one message per task, wait, validate (``courier.Courier``); failures are logged
        and counted."""
        return self.courier.exchange(grid, kind, tasks)

    # ------------------------------------------------------------------ clients
    def discover(self, grid: Grid) -> list[int]:
        """Ask nodes not seen yet for their logical id (``nodes.NodeDirectory``); returns the
        newly known client ids."""
        return self.nodes.discover(grid)

    def wait_for_nodes(self, grid: Grid) -> None:
        self.nodes.wait_for(grid)

    # ------------------------------------------------------------------ Flower Strategy API
    def configure_train(self, server_round, arrays, config, grid) -> Iterable[Message]:
        raise NotImplementedError("clustered strategies run their own loop: call start()")

    def aggregate_train(self, server_round, replies):
        raise NotImplementedError("clustered strategies run their own loop: call start()")

    def configure_evaluate(self, server_round, arrays, config, grid) -> Iterable[Message]:
        raise NotImplementedError("clustered strategies run their own loop: call start()")

    def aggregate_evaluate(self, server_round, replies) -> MetricRecord | None:
        raise NotImplementedError("clustered strategies run their own loop: call start()")

    def summary(self) -> None:
        log(INFO, "%s (%s) on %s: %d clients, %d rounds (%s protocol)", self.name,
            self.description, self.exp.scenario.name, self.exp.scenario.num_clients,
            self.num_rounds, self.protocol.name)
        if self.exp.protocol:
            log(INFO, "%s's paper protocol sets %s (keys left at their defaults; --set one to "
                "change it, protocol = \"none\" for the plain defaults)", self.exp.scenario.name,
                ", ".join(f"{k}={v}" for k, v in self.exp.protocol))
        for line in self.exp.scenario.data_report():
            log(INFO, "%s", line)

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord | None = None,
        num_rounds: int | None = None,
        timeout: float | None = None,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
        *,
        out_dir: str | Path | None = None,
    ) -> ClusteredResult:
        """Run every remaining round on ``grid`` (Flower's ``Strategy.start``, for many models).

        ``initial_arrays`` replace the run's common initial model (arrays of the run's model);
        ``num_rounds`` stops after that many rounds of the protocol (at most its own number);
        ``timeout`` bounds every exchange (the run config's ``round-timeout`` otherwise);
        ``train_config`` / ``evaluate_config`` are added to every train / evaluate message;
        ``evaluate_fn(round, arrays)`` is called on every cluster model after each round, its
        metrics logged under ``server_evaluation`` (model id -> metrics). Results go to
        ``out_dir`` (default: the run config's ``out-dir``) as with ``fedcluster run``.
        """
        if initial_arrays is not None:
            arrays = [np.asarray(a) for a in codec.unpack_arrays(initial_arrays)]
            shapes = tuple(tuple(a.shape) for a in arrays)
            if shapes != self._shapes:
                raise ConfigError(f"initial_arrays have shapes {shapes}; the run's model "
                                  f"{self.exp.spec.kind} has {self._shapes}")
            self._initial = [a.astype(np.float32) for a in arrays]
        if num_rounds is not None:
            full = self.protocol.num_rounds()
            if not 1 <= int(num_rounds) <= full:
                raise ConfigError(f"num_rounds must be in 1..{full} (the scenario's time steps "
                                  f"x rounds-per-step under the {self.protocol.name} protocol), "
                                  f"got {num_rounds}")
            self._last_round = int(num_rounds)
        if timeout is not None:
            self.round_timeout = float(timeout)
        self._extra_config = {P.TRAIN: dict(train_config or {}),
                              P.EVALUATE: dict(evaluate_config or {})}
        self._evaluate_fn = evaluate_fn
        summary = self.run(grid, out_dir)
        return self.result(summary)

    def result(self, summary: dict[str, Any]) -> ClusteredResult:
        """Flower's ``Result`` of the run: per round, the clients' training counts and test
        metrics and the server-side evaluation (as metrics.jsonl has them)."""
        models = {mid: codec.pack_arrays(w) for mid, w in sorted(self.models.items())}
        sizes = {mid: len(self.members(mid)) for mid in models}
        largest = max(sizes, key=lambda m: (sizes[m], -m)) if sizes else None
        out = ClusteredResult(
            arrays=models[largest] if largest is not None else ArrayRecord(),
            models=models,
            assignments={cid: rec.cluster for cid, rec in sorted(self.clients.items())},
            summary=summary,
        )

        def numbers(record: dict[str, Any], keys: Iterable[str]) -> MetricRecord:
            return MetricRecord({k: record[k] for k in keys if isinstance(record.get(k), (int, float))
                                 and not isinstance(record.get(k), bool)})

        for r in self._records:
            rnd = r["round"]
            out.train_metrics_clientapp[rnd] = numbers(
                r, ("trained_clients", "train_loss", "bytes_up", "bytes_down", "failures"))
            if r.get("accuracy") is not None or r.get("accuracy_current") is not None:
                out.evaluate_metrics_clientapp[rnd] = numbers(
                    r, ("accuracy", "weighted_accuracy", "global_accuracy", "ari", "acc_omit",
                        "accuracy_current", "accuracy_next", "next_step"))
            if r.get("server_evaluation"):
                out.evaluate_metrics_serverapp[rnd] = MetricRecord(
                    {f"model{mid}.{k}": v for mid, m in r["server_evaluation"].items()
                     for k, v in m.items()})
        return out

    # ------------------------------------------------------------------ the round loop
    def run(self, grid: Grid, out_dir: str | Path | None = None) -> dict[str, Any]:
        """Run every remaining round, writing metrics.jsonl round by round, summary.json and
        the plot at the end and checkpoints as configured; returns the summary. A failure
        during the run still writes summary.json with status "failed", then propagates."""
        t0 = time.monotonic()
        out = resolve_out_dir(self.cfg.raw, out_dir)
        self.check_writable(out)   # refusals first: they touch nothing
        with run_lock(out):        # one writer per directory, for the whole run
            return self._run_locked(grid, out, t0)

    def _run_locked(self, grid: Grid, out: Path, t0: float) -> dict[str, Any]:
        resumed_after = self.round
        if self._continuing(out):   # the files must agree with the checkpoint
            note = reconcile_metrics(out, self.round, repair=True)
            if note:
                log(WARNING, "%s", note)
        recorder = self.open_recorder(out)   # refuses a finished run's directory, touching nothing
        log(INFO, "fedcluster: %s on %s, %d rounds; results in %s", self.name,
            self.exp.scenario.name, self.num_rounds, out)
        try:
            with round_loop():
                self._rounds(grid, recorder, out)
        except (Interrupted, KeyboardInterrupt) as ex:
            self._finish_interrupted(recorder, out, ex, time.monotonic() - t0)
            raise
        except Exception as ex:
            log(ERROR, "run failed: %s", traceback.format_exc())
            recorder.finish(status="failed", error=f"{type(ex).__name__}: {ex}", plot=False,
                            extra={"wall_time_s": time.monotonic() - t0})
            raise
        extra = {"wall_time_s": time.monotonic() - t0, "out_dir": str(out),
                 "num_clients": self.exp.scenario.num_clients,
                 "num_steps": self.exp.scenario.num_steps,
                 "round_protocol": self.protocol.name,
                 "accuracy_rule": self.protocol.accuracy_rule,
                 **({"resumed_after_round": resumed_after} if resumed_after else {}),
                 **self.protocol.summary_extra(), **self.summary_extra()}
        status, reason = self.health()
        summary = recorder.finish(status=status, reason=reason, plot=self.cfg.plot, extra=extra)
        self._records = recorder.rounds
        if status != "completed":
            log(ERROR, "fedcluster: the run is %s: %s", status, reason)
        log(INFO, "fedcluster: done: mean accuracy %.4f, final %.4f; summary in %s",
            summary["mean_accuracy"] or 0.0, summary["final_accuracy"] or 0.0,
            out / "summary.json")
        return summary

    def _finish_interrupted(self, recorder: RunRecorder, out: Path,
                            ex: BaseException, wall_time_s: float) -> None:
        signame = ex.signame if isinstance(ex, Interrupted) else "SIGINT"
        finish_interrupted(recorder, out, signame, self.num_rounds, wall_time_s)

    def health(self) -> tuple[str, str | None]:
        """The status of a run that got to its end: "failed" when no client was ever admitted,
        "degraded" when a round planned training and no reply to it was usable."""
        if not self.clients:
            errors = "; ".join(f"node {n}: {e}" for n, e in sorted(self.nodes.errors.items())[:3])
            return "failed", ("no client was ever admitted" + (f" ({errors})" if errors else
                                                               " (no node answered discovery)"))
        reasons = []
        for rounds, what in ((self._untrained_rounds, "training"),
                             (self._unevaluated_rounds, "evaluation")):
            if rounds:
                shown = ", ".join(map(str, rounds[:10])) + (", ..." if len(rounds) > 10 else "")
                reasons.append(f"{len(rounds)} of {self.round} rounds had no usable {what} reply "
                               f"(rounds {shown})")
        if reasons:
            return "degraded", ("; ".join(reasons) + ": every reply rejected or missing, see "
                                "failures and failed_clients in metrics.jsonl")
        return "completed", None

    def _rounds(self, grid: Grid, recorder: RunRecorder, out_dir: Path) -> None:
        self.summary()
        total = self.num_rounds
        resumed = self.round > 0
        self.wait_for_nodes(grid)
        self.discover(grid)
        if not resumed:
            self.on_start()
        last_checkpoint = time.monotonic()
        for rnd in range(self.round + 1, total + 1):
            step = self.protocol.time_step(rnd)
            new_step = self.protocol.starts_step(rnd)
            last_of_step = rnd == total or self.protocol.starts_step(rnd + 1)
            self._round_stats = self._fresh_stats()
            self.protocol.start_round(rnd)
            t_round = time.monotonic()
            self.step = step
            if new_step:   # a step begins between rounds: its decisions hold from round rnd on
                for cid in self.discover(grid):
                    self.on_new_client(cid)
                self.protocol.begin_step(grid, step)
                self.begin_step(grid, step)
            self.round = rnd
            for cid in self.discover(grid):   # newcomers, and returning clients' new node ids
                self.on_new_client(cid)
            self.protocol.before_round(grid, step)
            self.before_round(grid, step, new_step)
            plan = {cid: t for cid, t in self.plan_train(step).items()
                    if cid in self.clients and cid not in self.holdouts}
            replies = self.exchange(grid, P.TRAIN, plan)
            if plan and not replies:
                self._untrained_rounds.append(rnd)
            before = {mid: [a.copy() for a in w] for mid, w in self.models.items()}
            self.on_train_replies(step, replies)
            self._keep_finite(before)
            record: dict[str, Any] = {"round": rnd, "time_step": step}
            evaluated = self.protocol.evaluates(rnd)
            if evaluated:
                # a round evaluated only for score-next-step: its exchanges are not accounted
                with (contextlib.nullcontext() if self.protocol.scheduled(rnd)
                      else self.protocol.scoring_only()):
                    record.update(self.protocol.evaluate(grid, step))
                if record.get("accuracy") is None and record.get("accuracy_current") is None:
                    self._unevaluated_rounds.append(rnd)
            else:
                record.update(accuracy=None)
            if self._evaluate_fn is not None:
                record["server_evaluation"] = self._server_evaluation(rnd)
            metrics = self.protocol.round_metrics(evaluated)   # what this round did
            clustering = self.protocol.clustering()             # who is in which cluster
            if last_of_step:
                self.end_step(step)
            record.update(
                **clustering,
                trained_clients=len(replies),
                train_loss=self.train_loss(replies),
                round_time_s=round(time.monotonic() - t_round, 4),
                **self._round_stats,
                **metrics,
            )
            recorder.log_round(record)
            if self.cfg.progress and (evaluated or new_step):
                log(INFO, "%s", format_round_line(record, total))
            # periodic checkpoints (by rounds, by time), and one when a signal asked the run to
            # stop: at a round's end, so a checkpoint always holds whole rounds
            stop = stop_requested() if rnd < total else None
            every, every_s = self.cfg.checkpoint_every, self.cfg.checkpoint_every_s
            if (stop is not None or (every and rnd % every == 0)
                    or (every_s and time.monotonic() - last_checkpoint >= every_s)):
                self.save_checkpoint(out_dir / CHECKPOINT_FILE, grid)
                last_checkpoint = time.monotonic()
            if stop is not None:
                raise Interrupted(stop, checkpointed_round=rnd)
        self.step = None
        self.save_checkpoint(out_dir / CHECKPOINT_FILE, grid)

    def _keep_finite(self, before: dict[int, Weights]) -> None:
        """A model is never replaced by a non-finite one (an aggregate of updates that are
        each finite can still overflow): it keeps its weights from before the round."""
        for mid, weights in self.models.items():
            if not all(np.isfinite(a).all() for a in weights if a.dtype.kind == "f"):
                log(ERROR, "round %d: model %d became non-finite after aggregation; it keeps its "
                    "weights from before the round", self.round, mid)
                if mid in before:
                    self.models[mid] = before[mid]
                else:   # created this round from non-finite weights: start it afresh
                    self.models[mid] = self.initial_weights()

    def _server_evaluation(self, rnd: int) -> dict[str, Any]:
        out = {}
        for mid in self.clusters_in_use() or sorted(self.models):
            metrics = self._evaluate_fn(rnd, codec.pack_arrays(self.models[mid]))
            if metrics is not None:
                out[str(mid)] = dict(metrics)
        return out

    @staticmethod
    def _fresh_stats() -> dict[str, Any]:
        # failed_clients: who missed or failed a message this round (a query phase goes on
        # with the others; this records who did not answer); bounded_updates: returned models
        # scaled down by update-norm-bound
        return {"bytes_up": 0, "bytes_down": 0, "failures": 0, "failed_clients": [],
                "bounded_updates": 0}

    # ------------------------------------------------------------------ checkpoints
    #: the checkpoint file load_checkpoint read (None: not resumed from a file)
    resumed_from: Path | None = None

    def _continuing(self, out: Path) -> bool:
        """Whether this run continues the checkpoint of ``out`` itself (its files with it)."""
        return (self.round > 0 and self.resumed_from is not None
                and self.resumed_from.parent == Path(out).resolve())

    def check_writable(self, out: Path) -> None:
        """Refuse, before any file is touched: writing into another finished run's directory
        (unless ``overwrite``; continuing the checkpoint of ``out`` itself is fine), or into one
        that holds files that are not a run's; a checkpoint past this run's last round; a
        directory whose metrics.jsonl lacks rounds the checkpoint has (``reconcile_metrics``)."""
        continuing = self._continuing(out)
        check_out_dir(out, overwrite=self.cfg.overwrite, continuing=continuing)
        if self.round > self.num_rounds:
            raise ValueError(f"the checkpoint is after round {self.round}, but this run has only "
                             f"{self.num_rounds} rounds")
        if continuing:
            reconcile_metrics(out, self.round)

    def open_recorder(self, out: Path) -> RunRecorder:
        self.check_writable(out)
        return RunRecorder(out, strategy=self.name, scenario=self.exp.scenario.name,
                           seed=self.cfg.seed, config=dict(self.cfg.raw), resume=self.round > 0,
                           resolved_config={**resolved_config(self.exp), "out-dir": str(out)},
                           data_fingerprint=data_fingerprint(self.exp.scenario),
                           tracking=self.cfg.tracking_backends,
                           tracking_uri=self.cfg.tracking_uri)

    def state_dict(self) -> tuple[dict[str, Any], dict[int, Weights]]:
        scenario = self.exp.scenario
        meta = {
            "strategy": self.name,
            "scenario": scenario.name,
            "num_clients": scenario.num_clients,
            # what check_same_run compares when the run is resumed; `fedcluster run --resume
            # DIR` reads the config from here (a killed run has no summary.json)
            "config": dict(self.cfg.raw),
            "num_steps": scenario.num_steps,
            "schedule": schedule_digest(scenario.concept_matrix(), scenario.concept_labels),
            "round": self.round,
            "next_model_id": self.next_model_id,
            "model_birth": {str(k): v for k, v in self.model_birth.items()},
            "model_ids": sorted(self.models),
            "clients": [asdict(r) | {"soft": _keys_to_str(r.soft)} for r in self.clients.values()],
            "truth": {str(c): {str(s): k for s, k in d.items()} for c, d in self._truth.items()},
            "rng": self.rng.bit_generator.state,
            "protocol_state": self.protocol.state(),
            "strategy_state": self.strategy_state(),
            "untrained_rounds": self._untrained_rounds,
            "unevaluated_rounds": self._unevaluated_rounds,
        }
        return meta, dict(self.models)

    def load_state_dict(self, meta: dict[str, Any], models: dict[int, Weights]) -> None:
        for key, mine in (("strategy", self.name), ("scenario", self.exp.scenario.name),
                          ("num_clients", self.exp.scenario.num_clients)):
            if meta.get(key) != mine:
                raise ValueError(f"the checkpoint is from a run with {key} = {meta.get(key)!r}; "
                                 f"this run has {key} = {mine!r}")
        check_same_run(meta, self.cfg.raw, self.exp.scenario)
        self.round = int(meta["round"])
        self.next_model_id = int(meta["next_model_id"])
        self.model_birth = {int(k): int(v) for k, v in meta["model_birth"].items()}
        for mid, weights in models.items():
            shapes = tuple(tuple(a.shape) for a in weights)
            if shapes != self._shapes:
                raise ValueError(f"model {mid} of the checkpoint has shapes {shapes}, this run's "
                                 f"model {self._shapes}")
            if not all(np.isfinite(a).all() for a in weights if a.dtype.kind == "f"):
                raise ValueError(f"model {mid} of the checkpoint has non-finite weights")
        self.models = {int(mid): models[int(mid)] for mid in meta["model_ids"]}
        self.clients = {}
        for r in meta["clients"]:
            soft = {int(k): float(v) for k, v in r["soft"].items()} if r["soft"] else None
            self.clients[int(r["cid"])] = ClientRecord(**{**r, "soft": soft, "node_id": None})
        self._truth = {int(c): {int(s): int(k) for s, k in d.items()} for c, d in meta["truth"].items()}
        self.rng.bit_generator.state = meta["rng"]
        self.protocol.load_state(meta["protocol_state"])
        self.load_strategy_state(meta["strategy_state"])
        self._untrained_rounds = [int(r) for r in meta.get("untrained_rounds", [])]
        self._unevaluated_rounds = [int(r) for r in meta.get("unevaluated_rounds", [])]

    def save_checkpoint(self, path: Path, grid: Grid | None = None) -> None:
        """The strategy's state, and with ``grid`` (and checkpoint-client-state) every
        client's context.state, so that a resumed run continues the clients exactly too."""
        states = (self.pull_client_states(grid)
                  if grid is not None and self.cfg.checkpoint_client_state else {})
        meta, models = self.state_dict()
        try:
            write_checkpoint(path, meta, models, states)
        except OSError as ex:
            if ex.errno != errno.ENOSPC:
                raise
            # the write is atomic: the checkpoint before this one is still whole
            need = (sum(a.nbytes for ws in models.values() for a in ws)
                    + sum(map(len, states.values())) + len(json.dumps(meta)))
            free = shutil.disk_usage(Path(path).parent).free
            raise OSError(errno.ENOSPC, (
                f"no space left for the checkpoint of round {self.round} in {Path(path).parent}: "
                f"it needs about {need / 1e6:.1f} MB, {free / 1e6:.1f} MB are free; the last "
                f"checkpoint written ({path}) is intact: free space, then resume it")) from None

    def pull_client_states(self, grid: Grid) -> dict[int, bytes]:
        """Every reachable client's context.state, serialised; a client that does not answer
        is logged and resumes without its state."""
        sent = {rec.node_id: cid for cid, rec in sorted(self.clients.items())
                if rec.node_id is not None}
        messages = [Message(content=codec.build_content(config={P.ROUND: self.round}), dst_node_id=n,
                            message_type=P.QUERY_STATE, group_id=f"state-{self.round}")
                    for n in sent]
        states = {}
        for msg in grid.send_and_receive(messages, timeout=self.round_timeout) if messages else []:
            cid = sent.get(msg.metadata.src_node_id)
            if cid is None:
                continue
            try:   # the generic check (error reply, metrics, client id); it carries no model
                validate_reply(msg, cid, Task(), self._shapes)
                states[cid] = codec.encode_state(msg.content)
            except Exception as ex:   # a hostile or failed reply: that client only
                log(WARNING, "round %d: client %s: its state is not in the checkpoint (%s)",
                    self.round, cid, ex)
        return states

    def _restore_states(self, grid: Grid, cids: list[int]) -> None:
        """Give resumed clients back their checkpointed context.state (once each)."""
        todo = {self.clients[c].node_id: c for c in cids if c in self._pending_states}
        messages = []
        for node, cid in todo.items():
            content = codec.decode_state(self._pending_states[cid])
            content[P.CONFIG] = ConfigRecord({P.ROUND: self.round})
            messages.append(Message(content=content, dst_node_id=node,
                                    message_type=P.QUERY_RESTORE, group_id="restore"))
        restored = set()
        for msg in grid.send_and_receive(messages, timeout=self.round_timeout) if messages else []:
            cid = todo.get(msg.metadata.src_node_id)
            if cid is not None and not msg.has_error():
                restored.add(cid)
                self._pending_states.pop(cid)
        for cid in sorted(set(todo.values()) - restored):
            log(WARNING, "client %d: its checkpointed state could not be restored; it continues "
                "from the state it has", cid)

    def load_checkpoint(self, path: Path) -> None:
        meta, models = read_checkpoint(path)
        try:
            self.load_state_dict(meta, models)
        except KeyError as ex:
            raise ValueError(f"checkpoint {path} is incomplete: missing {ex}") from None
        self.resumed_from = checkpoint_file(path)
        self._pending_states = read_client_states(path)
        for cid, blob in self._pending_states.items():   # refused now, not when it rejoins
            try:
                codec.decode_state(blob)
            except Exception as ex:
                raise ValueError(f"checkpoint {path}: the saved state of client {cid} is corrupt "
                                 f"({type(ex).__name__}: {ex})") from None


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


def _keys_to_str(d: dict[int, float] | None) -> dict[str, float] | None:
    return None if d is None else {str(k): v for k, v in d.items()}
