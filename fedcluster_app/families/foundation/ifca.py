"""IFCA: K models; every round each sampled client trains the one of lowest loss.

"An Efficient Framework for Clustered Federated Learning", Ghosh, Chung, Yin, Ramchandran,
NeurIPS 2020, https://arxiv.org/abs/2006.04088.

With K models w_1..w_K, each selected client c computes the loss of every model on its
training data, trains only k^ = argmin_k L(w_k, D_c) and reports k^; then

    w_k <- sum_{c: k^_c = k} n_c w_c / sum_{c: k^_c = k} n_c      (unchanged if nobody chose k)

(``weighted = False``: the unweighted mean, as the FlexCFL paper runs IFCA). The models start
from distinct random initialisations and every client on model 0 (docs/foundation/README.md D1).
One implementation serves every protocol: ``ifca`` on plain rounds, ``ifca-w`` under
FedDrift's time-step protocol (newest batch; round 1 trains model 0 without a choice) and
``flexcfl-ifca`` under FlexCFL's client selection.
"""

from __future__ import annotations

from typing import Any, ClassVar

from fedcluster_app.core import wire as P
from fedcluster_app.core.limits import ModelCount
from fedcluster_app.core.server.strategy import (
    ClusteredStrategy,
    Reply,
    Task,
)
from fedcluster_app.families.foundation import catalogue


class IFCA(ClusteredStrategy):
    name, description, Params = catalogue.IFCA.class_attributes()
    #: round 1 trains model 0 without a choice (the FedDrift paper's IFCA)
    warm_start: ClassVar[bool] = False

    def __init__(self, experiment) -> None:
        super().__init__(experiment)
        self.center_ids: list[int] = []
        self.weighted = bool(getattr(self.params, "weighted", True))

    def num_models(self) -> int:
        return self.cfg.num_clusters

    def model_count(self) -> ModelCount:
        return ModelCount(self.num_models(), self.num_models(), "num-clusters")

    def on_start(self) -> None:
        # distinct random models, ids 0..K-1
        self.center_ids = [self.new_model(self.initial_weights(salt=k))
                           for k in range(self.num_models())]
        for cid in self.clients:
            self.assign(cid, self.center_ids[0])

    def plan_train(self, step: int) -> dict[int, Task]:
        selected = self.protocol.select(sorted(self.clients))
        if self.warm_start and self.round == 1:
            return {cid: Task(models=[self.center_ids[0]]) for cid in selected}
        return {cid: Task(models=list(self.center_ids), config={P.SELECT: self.select_rule()})
                for cid in selected}

    def select_rule(self) -> str:
        """How a client picks the one model it trains (the ``select`` it is sent)."""
        return "min-loss"

    def on_train_replies(self, step: int, replies: list[Reply]) -> None:
        for r in replies:
            if P.CHOSEN in r.metrics:
                self.assign(r.cid, int(r.metrics[P.CHOSEN]))
        for mid, items in self.collect_updates(replies).items():
            self.models[mid] = self.aggregate(
                items if self.weighted else [(w, 1.0) for w, _ in items])

    def active_models(self, step: int) -> list[int] | None:
        return list(self.center_ids)      # every model is on offer every round

    def strategy_state(self) -> dict[str, Any]:
        return {"center_ids": self.center_ids}

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        self.center_ids = [int(m) for m in state["center_ids"]]
