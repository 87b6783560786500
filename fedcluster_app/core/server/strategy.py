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

The loop (:meth:`ClusteredStrategy.run`, carried out by ``runner.RoundRunner``), once per round r
of step t::

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

import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.server.strategy.aggregate import aggregate_median, aggregate_trimmed_avg
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fedcluster_app.core import codec
from fedcluster_app.core import wire as P
from fedcluster_app.core.config import ConfigError
from fedcluster_app.core.experiment import Experiment
from fedcluster_app.core.hparams import HParams, NoParams
from fedcluster_app.core.limits import ModelCount
from fedcluster_app.core.models import (
    SPLIT_CONTRACT,
    build_model,
    initial_weights,
    split_model,
    weight_dtypes,
    weight_shapes,
)
from fedcluster_app.core.server.checkpoint import (
    CHECKPOINT_FILE,
    Checkpoints,
    read_checkpoint,
    write_checkpoint,
)
from fedcluster_app.core.server.courier import Courier
from fedcluster_app.core.server.messages import RejectedReply, Reply, Task
from fedcluster_app.core.server.nodes import ClientRecord, NodeDirectory
from fedcluster_app.core.server.protocol import Protocol
from fedcluster_app.core.server.runner import ClusteredResult, RoundRunner, RoundStats
from fedcluster_app.core.server.updates import weighted_average

Weights = list[np.ndarray]

__all__ = ["CHECKPOINT_FILE", "ClientRecord", "ClusteredResult", "ClusteredStrategy",
           "RejectedReply", "Reply", "Task", "Weights", "read_checkpoint", "weighted_average",
           "write_checkpoint"]


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
        self.runner = RoundRunner(self)              # the round loop, its directory and end
        self.checkpoints = Checkpoints(self)         # state out to a checkpoint and back
        self.truth: dict[int, dict[int, int]] = {}   # cid -> step -> concept (metrics, Oracle)
        self.round_stats = RoundStats()              # what this round's exchanges cost
        self.shapes = weight_shapes(experiment.spec)
        self.dtypes = weight_dtypes(experiment.spec)
        # the most training data one client of the scenario holds (caps a reply's num-examples)
        self.max_examples = experiment.scenario.max_client_examples()
        self.holdouts = frozenset(experiment.scenario.holdout_clients)  # never trained
        self.round_timeout = self.cfg.round_timeout
        self._initial: Weights | None = None        # start(initial_arrays=...) replaces w0
        self.extra_config = {P.TRAIN: {}, P.EVALUATE: {}}   # start(train_config=, ...)
        self._last_round = 0                         # 0 = the protocol's number of rounds
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
        return self.truth.get(cid, {}).get(step)

    def concept_for_metrics(self, cid: int, step: int) -> int | None:
        """The true concept, for metrics (ARI, drift counts) only: never for decisions."""
        return self.truth.get(cid, {}).get(step)

    # ------------------------------------------------------------------ hooks
    def model_count(self) -> ModelCount:
        """The models the strategy keeps from its start, how many a client it trains is sent
        per round, and the key that sets them (IFCA: ``ModelCount(K, K, "num-clusters")``):
        their memory is capped before round 1 (``limits.check_models``). Default: one model,
        or models it grows as it runs, within its own caps (``max-clusters``, ``k-max``)."""
        return ModelCount()

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
        """Flower's: log what the run is (``runner.RoundRunner.log_start``)."""
        self.runner.log_start()

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
            if shapes != self.shapes:
                raise ConfigError(f"initial_arrays have shapes {shapes}; the run's model "
                                  f"{self.exp.spec.kind} has {self.shapes}")
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
        self.extra_config = {P.TRAIN: dict(train_config or {}),
                             P.EVALUATE: dict(evaluate_config or {})}
        self.runner.evaluate_fn = evaluate_fn
        return self.runner.result(self.run(grid, out_dir))

    # ------------------------------------------------------------------ the run, checkpoints
    def run(self, grid: Grid, out_dir: str | Path | None = None) -> dict[str, Any]:
        """Run every remaining round (``runner.RoundRunner``); returns the summary."""
        return self.runner.run(grid, out_dir)

    def check_writable(self, out: Path) -> None:
        """Refuse a directory this run may not write, before any file is touched."""
        self.runner.check_writable(out)

    @property
    def resumed_from(self) -> Path | None:
        """The checkpoint file this strategy was resumed from (None: a fresh run)."""
        return self.checkpoints.resumed_from

    def state_dict(self) -> tuple[dict[str, Any], dict[int, Weights]]:
        """(metadata, models by id): what a checkpoint holds (``checkpoint.Checkpoints``)."""
        return self.checkpoints.state_dict()

    def load_state_dict(self, meta: dict[str, Any], models: dict[int, Weights]) -> None:
        self.checkpoints.load_state_dict(meta, models)

    def save_checkpoint(self, path: Path, grid: Grid | None = None) -> None:
        self.checkpoints.save(path, grid)

    def load_checkpoint(self, path: Path) -> None:
        self.checkpoints.load(path)

