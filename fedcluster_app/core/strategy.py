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

and it validates every reply (wrong shapes or non-finite values are rejected and counted, the
round goes on), evaluates every client on its own cluster's model, writes the results contract
and checkpoints its whole state atomically.

A scenario may hold *held-out* clients (``scenario.holdout_clients``, e.g. FedRC's test
clients): they never train, and after each evaluation they pick a model the way a newcomer
would (``global_eval_task``: by default the lowest loss on their labelled adaptation split) and
report ``global_accuracy``.

Subclasses override a few hooks: ``on_start``, ``before_round``, ``plan_train``,
``on_train_replies``, ``eval_task`` and ``strategy_state``/``load_strategy_state``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from flwr.app import Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fedcluster_app.core import wire as P
from fedcluster_app.core.atomic import atomic_open
from fedcluster_app.core.config import ConfigError, section
from fedcluster_app.core.experiment import Experiment
from fedcluster_app.core.models import initial_weights, weight_shapes
from fedcluster_app.core.results import RunRecorder, format_round_line

Weights = list[np.ndarray]
CHECKPOINT_FILE = "checkpoint.npz"


@dataclass
class ClientRecord:
    cid: int
    node_id: int | None = None
    cluster: int | None = None               # hard assignment: a model id
    soft: dict[int, float] | None = None     # soft assignment: model id -> weight
    num_examples: int = 0
    last_round: int = 0                      # last round this client answered
    failures: int = 0


@dataclass
class Task:
    """What one client is asked to do in one message."""

    models: list[int] = field(default_factory=list)   # ids of the models sent
    train_ids: list[int] | None = None                 # which of them to train (None: all)
    config: dict[str, Any] = field(default_factory=dict)
    personal: bool = False                             # use the model kept on the client


@dataclass
class Reply:
    """A validated client reply."""

    cid: int
    metrics: dict[str, Any]
    models: dict[int, Weights] = field(default_factory=dict)
    model_metrics: dict[int, dict[str, Any]] = field(default_factory=dict)
    extras: dict[str, Weights] = field(default_factory=dict)   # unchecked: see check_reply

    @property
    def num_examples(self) -> int:
        return int(self.metrics.get(P.NUM_EXAMPLES, 0))


class RejectedReply(ValueError):
    """A client reply that cannot be used; the message says why."""


def weighted_average(items: list[tuple[Weights, float]]) -> Weights:
    total = float(sum(w for _, w in items))
    if total <= 0:
        raise ValueError("weighted average needs a positive total weight")
    out = [np.zeros(a.shape, dtype=np.float64) for a in items[0][0]]
    for arrays, w in items:
        for acc, a in zip(out, arrays):
            acc += a * (w / total)
    return [a.astype(np.float32) for a in out]


class ClusteredStrategy(Strategy):
    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    uses_ground_truth: ClassVar[bool] = False   # only the Oracle may read clients' true concepts
    # message kinds a family's ClientApp handlers answer instead of the built-in ones, e.g.
    # {P.TRAIN: "train.fedrc"}; every exchange of that kind is sent under the mapped name
    message_kinds: ClassVar[dict[str, str]] = {}

    def __init__(self, experiment: Experiment) -> None:
        self.exp = experiment
        self.cfg = experiment.cfg
        self.rng = np.random.default_rng([self.cfg.seed, 0xC1])
        self.models: dict[int, Weights] = {}
        self.model_birth: dict[int, int] = {}        # model id -> round it was created
        self.next_model_id = 0
        self.clients: dict[int, ClientRecord] = {}
        self.round = 0
        self._node_to_cid: dict[int, int] = {}
        self._unidentifiable: set[int] = set()      # nodes without a usable client-id
        self._refused_duplicates: set[int] = set()  # nodes claiming a client id held by a live node
        self._truth: dict[int, dict[int, int]] = {}  # cid -> step -> concept (metrics, Oracle)
        self._round_stats = self._fresh_stats()
        self._shapes = weight_shapes(experiment.spec)
        self.holdouts = frozenset(experiment.scenario.holdout_clients)  # never trained

    # ------------------------------------------------------------------ model registry
    def new_model(self, weights: Weights | None = None) -> int:
        """Register a model; without weights it gets the run's common seeded initialisation."""
        mid = self.next_model_id
        self.next_model_id += 1
        self.models[mid] = weights if weights is not None else self.initial_weights()
        self.model_birth[mid] = self.round
        return mid

    def initial_weights(self, salt: int = 0) -> Weights:
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
        merged = self.new_model(weighted_average([(self.models[i], w) for i, w in zip(ids, weights)]))
        for rec in self.clients.values():
            if rec.cluster in ids:
                rec.cluster = merged
        for i in ids:
            self.delete_model(i)
        return merged

    def assign(self, cid: int, mid: int | None) -> None:
        self.clients[cid].cluster = mid

    def training_clients(self) -> list[int]:
        """The known clients that take part in training (all but the held-out ones), sorted."""
        return [c for c in sorted(self.clients) if c not in self.holdouts]

    def members(self, mid: int) -> list[int]:
        return sorted(c for c, rec in self.clients.items() if rec.cluster == mid)

    def clusters_in_use(self) -> list[int]:
        return sorted({rec.cluster for rec in self.clients.values() if rec.cluster is not None})

    def num_clusters(self) -> int:
        return len(self.clusters_in_use())

    def hparams(self) -> dict[str, Any]:
        """This strategy's own run-config table, ``[tool.flwr.app.config.<name>]``."""
        return section(self.cfg.raw, self.name)

    def checked_hparams(self, defaults: dict[str, Any], table: str = "") -> dict[str, Any]:
        """``defaults`` overridden by the run-config table ``table`` (default: this strategy's
        name); a key the strategy does not know is a ConfigError listing the valid ones."""
        table = table or self.name
        given = section(self.cfg.raw, table)
        unknown = sorted(set(given) - set(defaults))
        if unknown:
            raise ConfigError(f"unknown {table} hyper-parameter(s) {', '.join(unknown)}; valid: "
                              f"{', '.join(sorted(defaults))}")
        return {k: given.get(k, v) for k, v in defaults.items()}

    def true_concept(self, cid: int, step: int) -> int | None:
        if not self.uses_ground_truth:
            raise PermissionError(f"{self.name} may not read ground-truth concepts")
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

    def before_round(self, grid: Grid, step: int, new_step: bool) -> None:
        """Runs before training; query phases and re-clustering go here."""

    def plan_train(self, step: int) -> dict[int, Task]:
        """Default: sample ``fraction-train`` of every cluster's members; each trains its model."""
        plan = {}
        for mid in self.clusters_in_use():
            for cid in self.sample(self.members(mid), self.cfg.fraction_train):
                plan[cid] = Task(models=[mid])
        return plan

    def on_train_replies(self, step: int, replies: list[Reply]) -> None:
        """Default: every returned model is FedAvg-ed into its registry entry (by num-examples)."""
        for mid, items in self.collect_updates(replies).items():
            self.models[mid] = weighted_average(items)

    def eval_task(self, cid: int) -> Task | None:
        rec = self.clients[cid]
        if rec.soft:
            ids = sorted(m for m, w in rec.soft.items() if w > 0 and m in self.models)
            return Task(models=ids, config={P.MIXTURE: [float(rec.soft[m]) for m in ids]})
        if rec.cluster is None or rec.cluster not in self.models:
            return None
        return Task(models=[rec.cluster])

    def cluster_label(self, cid: int) -> int | None:
        """The cluster a client counts in for the adjusted Rand index."""
        rec = self.clients[cid]
        if rec.soft:
            return max(rec.soft, key=lambda m: (rec.soft[m], -m))
        return rec.cluster

    def global_eval_task(self, cid: int) -> Task | None:
        """How a held-out client is scored: every model goes down and the client predicts with
        the one of lowest loss on its adaptation split (spec fedrc.md 4.4); None = not scored."""
        ids = sorted(self.models)
        if not ids:
            return None
        return Task(models=ids, config={P.SELECT: "min-loss"} if len(ids) > 1 else {})

    def check_reply(self, kind: str, reply: Reply) -> None:
        """Strategy-specific checks of a reply that passed the generic ones; raise
        RejectedReply to drop that client's contribution this round (logged and counted)."""

    def round_metrics(self) -> dict[str, Any]:
        """Strategy-specific keys added to this round's metrics.jsonl line."""
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
    def sample(self, cids: list[int], fraction: float) -> list[int]:
        if fraction >= 1.0 or not cids:
            return list(cids)
        k = max(1, math.ceil(fraction * len(cids)))
        return sorted(int(c) for c in self.rng.choice(cids, size=k, replace=False))

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
        """Send one message per task, wait, validate; failures are logged and counted."""
        kind = self.message_kinds.get(kind, kind)
        messages, sent, packed = [], {}, {}
        for cid, task in sorted(tasks.items()):
            node = self.clients[cid].node_id
            if node is None:
                continue
            config = {P.ROUND: self.round, P.STEP: self.exp.time_step(max(self.round, 1)), **task.config}
            if task.train_ids is not None:
                config[P.TRAIN_IDS] = list(task.train_ids)
            if task.personal:
                config[P.PERSONAL] = True
            for m in task.models:
                if m not in packed:
                    packed[m] = P.pack_arrays(self.models[m])
            content = P.build_content({m: packed[m] for m in task.models}, config)
            self._round_stats["bytes_down"] += P.nbytes(content)
            messages.append(
                Message(content=content, dst_node_id=node, message_type=kind, group_id=str(self.round))
            )
            sent[node] = (cid, task)
        replies = list(grid.send_and_receive(messages, timeout=self.cfg.round_timeout)) if messages else []
        out, answered = [], set()
        for msg in replies:
            node = msg.metadata.src_node_id
            cid, task = sent.get(node, (None, None))
            if cid is None:
                continue
            answered.add(node)
            try:
                reply = self._validate(msg, cid, task)
                self.check_reply(kind, reply)
            except RejectedReply as ex:
                self._fail(cid, f"{kind} reply rejected: {ex}")
                continue
            self._round_stats["bytes_up"] += P.nbytes(msg.content)
            self.clients[cid].last_round = self.round
            out.append(reply)
        for node, (cid, _) in sent.items():
            if node not in answered:
                self._fail(cid, f"no {kind} reply within {self.cfg.round_timeout:.0f} s")
        return sorted(out, key=lambda r: r.cid)  # order fixed: aggregation sums are reproducible

    def _fail(self, cid: int, reason: str) -> None:
        self.clients[cid].failures += 1
        self._round_stats["failures"] += 1
        self._round_stats["failed_clients"].append(cid)
        log(WARNING, "round %d: client %d: %s", self.round, cid, reason)

    def _validate(self, msg: Message, cid: int, task: Task) -> Reply:
        if msg.has_error():
            raise RejectedReply(f"client error: {msg.error.reason}")
        content = msg.content
        records = content.metric_records   # a property that copies: read it once
        if P.METRICS not in records:
            raise RejectedReply("no metrics record")
        metrics = dict(records[P.METRICS])
        if int(metrics.get(P.CLIENT_ID, -1)) != cid:
            raise RejectedReply(f"reply claims client id {metrics.get(P.CLIENT_ID)!r}")
        for key, value in metrics.items():
            values = value if isinstance(value, list) else [value]
            if not all(math.isfinite(v) for v in values):
                raise RejectedReply(f"metric {key!r} is not finite: {value!r}")
        if metrics.get(P.NUM_EXAMPLES, 0) < 0:
            raise RejectedReply(f"negative num-examples {metrics[P.NUM_EXAMPLES]}")
        models = P.unpack_models(content)
        allowed = set(task.models if task.train_ids is None else task.train_ids)
        if task.personal:   # a client's own model may come back under the personal id
            allowed.add(P.PERSONAL_MODEL_ID)
        for mid, arrays in models.items():
            if mid not in allowed:
                raise RejectedReply(f"returned model {mid}, which it was not asked to train")
            shapes = tuple(tuple(a.shape) for a in arrays)
            if shapes != self._shapes:
                raise RejectedReply(f"model {mid} has shapes {shapes}, expected {self._shapes}")
            if not all(np.isfinite(a).all() for a in arrays):
                raise RejectedReply(f"model {mid} contains non-finite values")
        model_metrics = {
            mid: dict(records[P.model_metrics_key(mid)])
            for mid in models
            if P.model_metrics_key(mid) in records
        }
        if P.CONCEPT in metrics and P.STEP in metrics:
            self._truth.setdefault(cid, {})[int(metrics[P.STEP])] = int(metrics[P.CONCEPT])
        if not self.uses_ground_truth:
            metrics.pop(P.CONCEPT, None)
        return Reply(cid, metrics, models, model_metrics, P.unpack_extras(content))

    # ------------------------------------------------------------------ clients
    def discover(self, grid: Grid) -> list[int]:
        """Ask nodes we have not seen for their logical id; returns newly known client ids."""
        unknown = [n for n in grid.get_node_ids()
                   if n not in self._node_to_cid and n not in self._unidentifiable]
        if not unknown:
            return []
        step = self.exp.time_step(max(self.round, 1))
        messages = [
            Message(content=P.build_content(config={P.ROUND: self.round, P.STEP: step}),
                    dst_node_id=n, message_type=P.QUERY_INFO, group_id="discover")
            for n in unknown
        ]
        new = []
        for msg in grid.send_and_receive(messages, timeout=self.cfg.round_timeout):
            node = msg.metadata.src_node_id
            if msg.has_error() or P.METRICS not in msg.content.metric_records:
                reason = msg.error.reason if msg.has_error() else "no metrics"
                log(ERROR, "node %d refused: it could not identify itself (%s); set the node-config "
                    "key client-id", node, reason)
                self._unidentifiable.add(node)
                continue
            cid = int(msg.content.metric_records[P.METRICS][P.CLIENT_ID])
            rec = self.clients.get(cid)
            if rec is not None and rec.node_id not in (None, node) and self._holder_alive(rec):
                if node not in self._refused_duplicates:
                    log(ERROR, "node %d refused: client id %d is already held by node %d, which is "
                        "still answering", node, cid, rec.node_id)
                    self._refused_duplicates.add(node)
                continue
            if rec is not None and rec.node_id not in (None, node):
                log(INFO, "client %d is back on node %d (was node %d); it keeps cluster %s",
                    cid, node, rec.node_id, rec.cluster)
                self._node_to_cid.pop(rec.node_id, None)
            self._node_to_cid[node] = cid
            if rec is None:
                rec = self.clients[cid] = ClientRecord(cid)
                new.append(cid)
            rec.node_id = node
            rec.num_examples = int(msg.content.metric_records[P.METRICS].get(P.NUM_EXAMPLES, 0))
        return sorted(new)

    def _holder_alive(self, rec: ClientRecord) -> bool:
        """A node holding a client id counts as alive while it has not missed a round."""
        return rec.last_round >= self.round - 1 and rec.cid not in self._round_stats["failed_clients"]

    def wait_for_nodes(self, grid: Grid) -> None:
        wanted = self.cfg.min_nodes or self.exp.scenario.num_clients
        deadline = time.monotonic() + self.cfg.node_wait_s
        while len(list(grid.get_node_ids())) < wanted and time.monotonic() < deadline:
            time.sleep(0.2)
        found = len(list(grid.get_node_ids()))
        if found < wanted:
            log(WARNING, "only %d of %d nodes connected after %.0f s; starting with them "
                "(in simulation set num-supernodes=%d; `fedcluster run` does this for you)",
                found, wanted, self.cfg.node_wait_s, wanted)

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
        log(INFO, "%s (%s) on %s: %d clients, %d steps x %d rounds", self.name, self.description,
            self.exp.scenario.name, self.exp.scenario.num_clients, self.exp.scenario.num_steps,
            self.cfg.rounds_per_step)

    # ------------------------------------------------------------------ the round loop
    def start(self, grid: Grid, recorder: RunRecorder, checkpoint_dir: Path | None = None) -> dict:
        """Run every remaining round; returns the summary written to summary.json."""
        self.summary()
        t0 = time.monotonic()
        total = self.exp.num_rounds
        resumed = self.round > 0
        self.wait_for_nodes(grid)
        self.discover(grid)
        if not resumed:
            self.on_start()
        for rnd in range(self.round + 1, total + 1):
            self.round = rnd
            self._round_stats = self._fresh_stats()
            t_round = time.monotonic()
            step = self.exp.time_step(rnd)
            new_step = rnd == 1 or self.exp.time_step(rnd - 1) != step
            for cid in self.discover(grid):   # newcomers, and returning clients' new node ids
                self.on_new_client(cid)
            self.before_round(grid, step, new_step)
            plan = {cid: t for cid, t in self.plan_train(step).items()
                    if cid in self.clients and cid not in self.holdouts}
            replies = self.exchange(grid, P.TRAIN, plan)
            self.on_train_replies(step, replies)
            record: dict[str, Any] = {"round": rnd, "time_step": step}
            if rnd % self.cfg.eval_every == 0 or rnd == total:
                record.update(self.evaluate_clients(grid, step))
            else:
                record.update(accuracy=None)
            record.update(
                num_clusters=self.num_clusters(),
                trained_clients=len(replies),
                round_time_s=round(time.monotonic() - t_round, 4),
                **self._round_stats,
                **self.round_metrics(),
            )
            recorder.log_round(record)
            if self.cfg.progress:
                log(INFO, "%s", format_round_line(record, total))
            if checkpoint_dir and self.cfg.checkpoint_every and rnd % self.cfg.checkpoint_every == 0:
                self.save_checkpoint(checkpoint_dir / CHECKPOINT_FILE)
        if checkpoint_dir:
            self.save_checkpoint(checkpoint_dir / CHECKPOINT_FILE)
        return {"wall_time_s": time.monotonic() - t0}

    def evaluate_clients(self, grid: Grid, step: int) -> dict[str, Any]:
        """Local accuracy of the participating clients (each on its own cluster's model or
        mixture), then global accuracy of the held-out clients (``global_eval_task``)."""
        tasks = {}
        for cid in self.sample(self.training_clients(), self.cfg.fraction_evaluate):
            task = self.eval_task(cid)
            if task is not None:
                tasks[cid] = task
        replies = self.exchange(grid, P.EVALUATE, tasks)
        accs = {r.cid: float(r.metrics[P.ACCURACY]) for r in replies}
        out: dict[str, Any] = {
            "accuracy": float(np.mean(list(accs.values()))) if accs else None,
            "weighted_accuracy": _weighted_accuracy(replies),
            "evaluated_clients": len(accs),
        }
        if len(accs) <= 200:
            out["client_accuracy"] = {str(c): round(a, 5) for c, a in accs.items()}
        if self.holdouts:
            out.update(self.evaluate_holdouts(grid))
        truth = {c: self._truth.get(c, {}).get(step) for c in accs}
        truth = {c: k for c, k in truth.items() if k is not None}
        if truth:
            from sklearn.metrics import adjusted_rand_score

            labels = {c: self.cluster_label(c) for c in truth}
            pairs = [(truth[c], -1 if labels[c] is None else labels[c]) for c in truth]
            out["ari"] = float(adjusted_rand_score([p[0] for p in pairs], [p[1] for p in pairs]))
            out["concept_cluster_mass"] = self.concept_cluster_mass(truth)
            if self.round == 1 or self.exp.time_step(self.round - 1) != step:
                # a drift happens when a step brings data of another concept: count it once
                before = {c: self._truth.get(c, {}).get(step - 1) for c in truth}
                out["drifted_clients"] = sum(
                    1 for c in truth if before[c] is not None and before[c] != truth[c]
                )
        return out

    def evaluate_holdouts(self, grid: Grid) -> dict[str, Any]:
        tasks = {c: t for c in sorted(self.holdouts & set(self.clients))
                 if (t := self.global_eval_task(c)) is not None}
        replies = self.exchange(grid, P.EVALUATE, tasks)
        accs = {r.cid: float(r.metrics[P.ACCURACY]) for r in replies}
        return {
            "global_accuracy": float(np.mean(list(accs.values()))) if accs else None,
            "global_client_accuracy": {str(c): round(a, 5) for c, a in accs.items()},
        }

    def concept_cluster_mass(self, truth: dict[int, int]) -> dict[str, dict[str, float]]:
        """Concept -> cluster -> summed assignment weight of that concept's clients (soft
        weights, or 1 on the hard cluster): the paper's concept-by-cluster mass matrix."""
        mass: dict[str, dict[str, float]] = {}
        for cid, concept in sorted(truth.items()):
            rec = self.clients[cid]
            weights = rec.soft or ({rec.cluster: 1.0} if rec.cluster is not None else {})
            row = mass.setdefault(str(concept), {})
            for mid, w in sorted(weights.items()):
                row[str(mid)] = round(row.get(str(mid), 0.0) + float(w), 6)
        return mass

    @staticmethod
    def _fresh_stats() -> dict[str, Any]:
        # failed_clients: who missed or failed a message this round (a query phase goes on
        # with the others; this records who did not answer)
        return {"bytes_up": 0, "bytes_down": 0, "failures": 0, "failed_clients": []}

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> tuple[dict[str, Any], dict[int, Weights]]:
        meta = {
            "strategy": self.name,
            "scenario": self.exp.scenario.name,
            "num_clients": self.exp.scenario.num_clients,
            "round": self.round,
            "next_model_id": self.next_model_id,
            "model_birth": {str(k): v for k, v in self.model_birth.items()},
            "model_ids": sorted(self.models),
            "clients": [asdict(r) | {"soft": _keys_to_str(r.soft)} for r in self.clients.values()],
            "truth": {str(c): {str(s): k for s, k in d.items()} for c, d in self._truth.items()},
            "rng": self.rng.bit_generator.state,
            "strategy_state": self.strategy_state(),
        }
        return meta, dict(self.models)

    def load_state_dict(self, meta: dict[str, Any], models: dict[int, Weights]) -> None:
        for key, mine in (("strategy", self.name), ("scenario", self.exp.scenario.name),
                          ("num_clients", self.exp.scenario.num_clients)):
            if meta.get(key) != mine:
                raise ValueError(f"the checkpoint is from a run with {key} = {meta.get(key)!r}; "
                                 f"this run has {key} = {mine!r}")
        self.round = int(meta["round"])
        self.next_model_id = int(meta["next_model_id"])
        self.model_birth = {int(k): int(v) for k, v in meta["model_birth"].items()}
        for mid, weights in models.items():
            if len(weights) != len(self._shapes):
                raise ValueError(f"model {mid} has {len(weights)} arrays, this run's model "
                                 f"{len(self._shapes)}")
        self.models = {int(mid): models[int(mid)] for mid in meta["model_ids"]}
        self.clients = {}
        for r in meta["clients"]:
            soft = {int(k): float(v) for k, v in r["soft"].items()} if r["soft"] else None
            self.clients[int(r["cid"])] = ClientRecord(**{**r, "soft": soft, "node_id": None})
        self._truth = {int(c): {int(s): int(k) for s, k in d.items()} for c, d in meta["truth"].items()}
        self.rng.bit_generator.state = meta["rng"]
        self.load_strategy_state(meta["strategy_state"])

    def save_checkpoint(self, path: Path) -> None:
        write_checkpoint(path, *self.state_dict())

    def load_checkpoint(self, path: Path) -> None:
        meta, models = read_checkpoint(path)
        try:
            self.load_state_dict(meta, models)
        except KeyError as ex:
            raise ValueError(f"checkpoint {path} is incomplete: missing {ex}") from None


# ---------------------------------------------------------------------- the checkpoint file
# One .npz: the JSON metadata as bytes under "__meta__", model m's arrays as "model<m>_<i>".
def write_checkpoint(path: Path, meta: dict[str, Any], models: dict[int, Weights]) -> None:
    """Atomic: written to a temporary file, then renamed over the old checkpoint."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {f"model{mid}_{i}": a for mid, ws in models.items() for i, a in enumerate(ws)}
    with atomic_open(path) as fh:
        np.savez(fh, __meta__=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **arrays)


def read_checkpoint(path: Path) -> tuple[dict[str, Any], dict[int, Weights]]:
    """(metadata, models by id) of a checkpoint file, or of the one in a run directory."""
    path = Path(path)
    if path.is_dir():
        path = path / CHECKPOINT_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        with np.load(path) as data:
            meta = json.loads(bytes(data["__meta__"]).decode())
            models = {}
            for mid in meta["model_ids"]:
                n = sum(k.startswith(f"model{mid}_") for k in data.files)
                models[int(mid)] = [data[f"model{mid}_{i}"] for i in range(n)]
    except Exception as ex:  # zip, json or key errors: all mean the file is unusable
        raise ValueError(f"checkpoint {path} is corrupt or not a fedcluster checkpoint: "
                         f"{type(ex).__name__}: {ex}") from None
    return meta, models


def _weighted_accuracy(replies: list[Reply]) -> float | None:
    """Test accuracy over all evaluated samples (clients weighted by their test-set size)."""
    pairs = [(float(r.metrics[P.ACCURACY]), r.num_examples) for r in replies
             if r.num_examples > 0 and math.isfinite(float(r.metrics[P.ACCURACY]))]
    total = sum(n for _, n in pairs)
    return sum(a * n for a, n in pairs) / total if total else None


def _keys_to_str(d: dict[int, float] | None) -> dict[str, float] | None:
    return None if d is None else {str(k): v for k, v in d.items()}
