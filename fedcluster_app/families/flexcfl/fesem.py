"""FeSEM, and FeSEM-MIG: each selected client joins the centre nearest to its last local model.

"Multi-Center Federated Learning: Clients Clustering for Better Personalization", Long, Xie,
Shen, Zhou, Wang, Jiang (FeSEM), World Wide Web 2023; first version
https://arxiv.org/abs/2005.01026. A baseline of the FlexCFL paper (FeSEM-MIG: its Fig. 6) and,
with ``init = "min-loss"``, of the FedRC paper (docs/fedrc/README.md, "The algorithm as built").

With m centres c_1..c_m, every round each selected client i joins
k = argmin_k ||w_i - c_k||_2 (w_i its last local solution, w0 if it never trained), trains
c_k, and c_k <- the (unweighted, or n-weighted) mean of its trained copies.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.serverapp import Grid

from fedcluster_app.core import wire as P
from fedcluster_app.core.limits import ModelCount
from fedcluster_app.core.server.strategy import (
    ClusteredStrategy,
    Reply,
    Task,
)
from fedcluster_app.families.flexcfl import catalogue
from fedcluster_app.families.flexcfl.grouping import (
    decode,
    encode,
    flatten,
    nearest_model,
)
from fedcluster_app.families.flexcfl.migration import MigrationMixin
from fedcluster_app.families.flexcfl.protocol import (
    PaperProtocol,
    num_groups,
    num_groups_key,
)


class FeSEM(ClusteredStrategy):
    """FeSEM (Xie et al.): m randomly initialised centres; a selected client joins the centre
    nearest to :meth:`assignment_vector` (its last local solution; w0 if never trained), trains
    it, and each centre becomes the (unweighted, or n-weighted) mean of its trained copies.
    ``init = "min-loss"``: a client without a local solution joins the centre of lowest loss on
    its training data instead (FeSEM as the FedRC paper runs it)."""

    name, description, Params = catalogue.FESEM.class_attributes()
    protocol_factory = PaperProtocol

    def __init__(self, experiment) -> None:
        super().__init__(experiment)
        self.m = num_groups(self)
        self.weighted = self.params.weighted
        self.local: dict[int, np.ndarray] = {}     # server cache of local solutions (flattened)
        self.center_ids: list[int] = []

    def model_count(self) -> ModelCount:
        return ModelCount(self.m, self.m, num_groups_key(self))   # min-loss: all, to newcomers

    def on_start(self) -> None:
        self.center_ids = [self.new_model(self.initial_weights(salt=j)) for j in range(self.m)]
        self._w0 = flatten(self.initial_weights())

    def assignment_vector(self, cid: int) -> np.ndarray:
        if not hasattr(self, "_w0"):
            self._w0 = flatten(self.initial_weights())
        return self.local.get(cid, self._w0)

    def assign_selected(self, cids: list[int]) -> None:
        centers = {g: flatten(self.models[g]) for g in self.center_ids}
        for cid in cids:
            self.assign(cid, nearest_model(self.assignment_vector(cid), centers))

    def assign_clients(self, grid: Grid, cids: list[int]) -> None:
        """FeSEM's rule for ``cids``: the nearest centre to the local solution; with ``init =
        "min-loss"`` a client without one takes the centre of lowest training loss."""
        fresh = set()
        if self.params.init == "min-loss":
            fresh = {c for c in cids if c not in self.local}
            replies = self.query(grid, P.QUERY_LOSSES, fresh, models=self.center_ids) if fresh else {}
            for cid, r in replies.items():
                losses = dict(zip(r.metrics[P.MODEL_IDS], r.metrics[P.LOSSES]))
                self.assign(cid, min(sorted(losses), key=lambda m: losses[m]))
        self.assign_selected([c for c in cids if c not in fresh])

    def before_round(self, grid: Grid, step: int, new_step: bool) -> None:
        self.assign_clients(grid, self.protocol.selected)

    def plan_train(self, step: int) -> dict[int, Task]:
        return {c: Task(models=[self.clients[c].cluster]) for c in self.protocol.selected
                if self.clients[c].cluster is not None}

    def on_train_replies(self, step: int, replies: list[Reply]) -> None:
        for r in replies:
            for mid, w in r.models.items():
                self.local[r.cid] = flatten(w)
        for mid, items in self.collect_updates(replies).items():
            self.models[mid] = self.aggregate(
                items if self.weighted else [(w, 1.0) for w, _ in items])

    def strategy_state(self) -> dict[str, Any]:
        return {"center_ids": self.center_ids,
                "local": {str(c): encode(v) for c, v in self.local.items()}}

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        self.center_ids = [int(g) for g in state["center_ids"]]
        self.local = {int(c): decode(v) for c, v in state["local"].items()}


class FeSEMMig(MigrationMixin, FeSEM):
    """FeSEM-MIG: a shifted warm client is re-assigned by FeSEM's rule, the centre nearest (L2)
    to its cached last local solution: no message with a model (2K per round)."""

    name, description, Params = catalogue.FESEM_MIG.class_attributes()

    def before_round(self, grid: Grid, step: int, new_step: bool) -> None:
        selected = self.protocol.selected
        self.migrate(grid)
        self.assign_clients(grid, selected)
        self.set_reference([c for c in selected if self.clients[c].cluster is not None])

    def reassign(self, grid: Grid, cids: list[int]) -> list[int]:
        self.assign_clients(grid, cids)
        return [c for c in cids if self.clients[c].cluster is not None]
