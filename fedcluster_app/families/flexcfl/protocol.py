"""The FlexCFL paper's protocol: its client selection, its accounting and its scoring rule.

From "Flexible Clustered Federated Learning for Client-Level Data Distribution Shift", Duan,
Liu, Ji, Wu, Liang, Chen, Tan, Ren; IEEE TPDS 2022, https://arxiv.org/abs/2108.09749. Every
strategy of its comparison runs under it (FlexCFL, FedGroup, FeSEM, and the foundation's IFCA
and FedAvg), so they see the same clients in the same rounds:

* selection (``selection = "paper"``): round-robin over the clients sorted by id for the first
  N/K rounds, then ``random.Random(t + seed).sample(clients, K)``: stateless, identical for
  every method; ``selection = "fraction"``: the base's ``fraction-train`` sampling instead;
* accounting: ``models_down`` / ``models_up`` count the models moved by training and query
  messages, evaluation excluded (the communication the paper reports);
* scoring (``eval-model``): ``current_group`` tests every client with its group's current model,
  ``last_received`` with the model it last trained from (w0 if none), as the authors' code does
  (docs/flexcfl/README.md, D13); ``score-both`` tests the same clients under both rules every evaluated
  round (``accuracy_<rule>``, ``weighted_accuracy_<rule>``), the run itself unchanged. Held-out
  clients never see those snapshots.

The common scoring rule (``score-next-step = true``, core/server/protocol.py) is the base's, under the
``eval-model`` rule: ``accuracy_current`` is ``accuracy`` (the same clients, the model that rule
gives them), and at the last round of step t ``accuracy_next`` scores those clients and models
on step t+1's held-out test split.
"""

from __future__ import annotations

import random
from typing import Any

from flwr.serverapp import Grid

from fedcluster_app.core import wire as P
from fedcluster_app.core.config import ConfigError
from fedcluster_app.core.server.messages import Reply, Task
from fedcluster_app.core.server.protocol import Protocol, mean_accuracy, weighted_accuracy


def num_groups(strategy) -> int:
    """m: the table's ``num-groups``, 0 = the run's ``num-clusters``; at most the clients."""
    m = strategy.params.num_groups or strategy.cfg.num_clusters
    n = strategy.exp.scenario.num_clients
    if m > n:
        raise ConfigError(f"{strategy.params.table}.num-groups (m) = {m} is larger than the "
                          f"number of clients ({n})")
    return m


def num_groups_key(strategy) -> str:
    """The key that sets m: the table's ``num-groups``, or ``num-clusters`` where it is 0."""
    return f"{strategy.params.table}.num-groups" if strategy.params.num_groups else "num-clusters"


class PaperProtocol(Protocol):
    """FlexCFL's selection, accounting and scoring (module docstring)."""

    name = "flexcfl-selection"

    def __init__(self) -> None:
        super().__init__()
        self.selected: list[int] = []
        self.comm = {"models_down": 0, "models_up": 0}
        # last_received: client -> snapshot (a registry entry) of the model it last trained from
        self.received: dict[int, int] = {}
        self.snapshots: set[int] = set()
        self.eval_w0_id: int | None = None

    @property
    def eval_model(self) -> str:
        return getattr(self.s.params, "eval_model", "current_group")

    @property
    def accuracy_rule(self) -> str:
        """``last_received`` scores another model than the plain rule: its own column."""
        return ("current step" if self.eval_model == "current_group" else
                "current step, model last received")

    @property
    def score_both(self) -> bool:
        return bool(getattr(self.s.params, "score_both", False))

    def keeps_received(self) -> bool:
        return self.eval_model == "last_received" or self.score_both

    # -- selection
    def before_round(self, grid: Grid, step: int) -> None:
        self.selected = self.select_round()

    def select_round(self) -> list[int]:
        s = self.s
        cids = s.training_clients()
        if not cids:
            return []
        if s.params.selection == "fraction":
            return s.sample(cids, s.cfg.fraction_train)
        n, k = len(cids), min(s.params.clients_per_round, len(cids))
        t = s.round - 1
        if t * k < n:
            start = (t * k) % n
            return sorted(cids[(start + i) % n] for i in range(k))
        return sorted(random.Random(t + s.cfg.seed).sample(cids, k))

    def select(self, cids: list[int]) -> list[int]:
        wanted = set(cids)
        return [c for c in self.selected if c in wanted]

    def default_plan(self, step: int) -> dict[int, Task]:
        """Every selected client whose group has a model trains it."""
        mids = self.s.clusters_in_use()
        return {c: Task(models=[self.s.clients[c].cluster]) for c in self.selected
                if self.s.clients[c].cluster in mids}

    # -- accounting, and what each client received
    def on_exchange(self, kind: str, tasks: dict[int, Task], replies: list[Reply]) -> None:
        s = self.s
        if kind != P.EVALUATE:
            self.comm["models_down"] += sum(
                len(t.models) for c, t in tasks.items() if s.clients[c].node_id is not None)
            self.comm["models_up"] += sum(len(r.models) for r in replies)
        if kind == P.TRAIN and self.keeps_received():
            self._record_received(replies)

    def _record_received(self, replies: list[Reply]) -> None:
        """``last_received``: the model a client trained from, as it was sent (this runs before
        the round's aggregation), kept as a registry entry until no client refers to it. A
        client whose training failed keeps its previous one."""
        s = self.s
        snap: dict[int, int] = {}
        for r in replies:
            if len(r.models) != 1:
                continue
            (mid,) = r.models
            if mid not in s.models:
                continue
            if mid not in snap:
                snap[mid] = s.new_model([a.copy() for a in s.models[mid]])
                self.snapshots.add(snap[mid])
            self.received[r.cid] = snap[mid]
        used = set(self.received.values())
        for sid in sorted(self.snapshots - used):
            s.delete_model(sid)
        self.snapshots &= used

    def w0_model_id(self) -> int:
        """w0 (the run's common initial model), what a never-trained client holds."""
        own = self.s.common_init_model()           # FlexCFL keeps w0 in its registry anyway
        if own is not None:
            return own
        if self.eval_w0_id is None or self.eval_w0_id not in self.s.models:
            self.eval_w0_id = self.s.new_model(self.s.initial_weights())
        return self.eval_w0_id

    def eval_task(self, cid: int, rule: str = "") -> Task | None:
        if (rule or self.eval_model) != "last_received":
            return self.s.eval_task(cid)
        rec = self.s.clients[cid]
        if rec.cluster is None or rec.cluster not in self.s.models:
            return None      # not in a group (yet): not evaluated, as with current_group
        sid = self.received.get(cid)
        return Task(models=[sid if sid in self.s.models else self.w0_model_id()])

    def global_eval_task(self, cid: int) -> Task | None:
        hidden = self.snapshots | ({self.eval_w0_id} if self.eval_w0_id is not None else set())
        return Task.min_loss(sorted(m for m in self.s.models if m not in hidden))

    def evaluate(self, grid: Grid, step: int) -> dict[str, Any]:
        out = super().evaluate(grid, step)
        if not self.score_both:
            return out
        rule = self.eval_model
        other = "last_received" if rule == "current_group" else "current_group"
        out[f"accuracy_{rule}"] = out["accuracy"]
        out[f"weighted_accuracy_{rule}"] = out["weighted_accuracy"]
        tasks = {c: t for c in self.eval_clients if (t := self.eval_task(c, other)) is not None}
        replies = self.s.exchange(grid, P.EVALUATE, tasks)
        out[f"accuracy_{other}"] = mean_accuracy(replies)
        out[f"weighted_accuracy_{other}"] = weighted_accuracy(replies)
        return out

    # -- reporting and state
    def models_allocated(self) -> int:
        # the snapshots and w0 kept for scoring are no clusters
        return len(set(self.s.cluster_models()) - self.snapshots - {self.eval_w0_id})

    def round_metrics(self, evaluated: bool) -> dict[str, Any]:
        out = {**self.comm, **self.s.round_metrics()}
        self.comm = {"models_down": 0, "models_up": 0}
        return out

    def state(self) -> dict[str, Any]:
        return {"received": {str(c): s for c, s in self.received.items()},
                "snapshots": sorted(self.snapshots), "eval_w0_id": self.eval_w0_id}

    def load_state(self, state: dict[str, Any]) -> None:
        self.received = {int(c): int(s) for c, s in state["received"].items()}
        self.snapshots = {int(s) for s in state["snapshots"]}
        self.eval_w0_id = state["eval_w0_id"]
