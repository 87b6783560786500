"""IFCA (Ghosh et al.): K models; every round each sampled client takes the lowest-loss one.

The client evaluates all K models on its current training window, trains only the best one and
reports which it chose; each model is then averaged over the clients that chose it. All clients
start on model 0 (FedDrift spec, ambiguity 16); the other models keep distinct random
initialisations until some client finds them better.
"""

from __future__ import annotations

from fedcluster_app.core import wire as P
from fedcluster_app.core.strategy import ClusteredStrategy, Reply, Task


class IFCA(ClusteredStrategy):
    name = "ifca"
    description = "K models (num-clusters); each client trains the one with the lowest loss"

    def on_start(self) -> None:
        for k in range(self.cfg.num_clusters):
            self.new_model(self.initial_weights(salt=k))   # IFCA needs distinct random models
        for cid in self.clients:
            self.assign(cid, 0)

    def plan_train(self, step: int) -> dict[int, Task]:
        ids = sorted(self.models)
        return {
            cid: Task(models=ids, config={P.SELECT: "min-loss"})
            for cid in self.sample(sorted(self.clients), self.cfg.fraction_train)
        }

    def on_train_replies(self, step: int, replies: list[Reply]) -> None:
        for r in replies:
            self.assign(r.cid, int(r.metrics[P.CHOSEN]))
        super().on_train_replies(step, replies)

    def num_clusters(self) -> int:
        return len(self.models)
