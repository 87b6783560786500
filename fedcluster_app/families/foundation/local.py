"""Local: no federation. Each client trains and evaluates its own model, which never leaves it.

No paper: the lower reference of personalised FL (no collaboration at all).

The model lives in the client's ``context.state`` (the base's "personal model" path, the same
mechanism FedCCFA's personal classifiers use), so nothing but metrics travels. In
metrics.jsonl every client is a cluster of its own: ``assignments`` maps a client to its own
id, and ``num_clusters`` and ``models_allocated`` count the personal models.
"""

from __future__ import annotations

from fedcluster_app.core.limits import ModelCount
from fedcluster_app.core.server.strategy import ClusteredStrategy, Task
from fedcluster_app.families.foundation import catalogue


class Local(ClusteredStrategy):
    name, description, Params = catalogue.LOCAL.class_attributes()

    def model_count(self) -> ModelCount:
        return ModelCount(self.exp.scenario.num_clients, 1, "num-clients")   # one personal each

    def on_start(self) -> None:
        pass

    def plan_train(self, step: int) -> dict[int, Task]:
        return {cid: Task(personal=True) for cid in self.protocol.select(sorted(self.clients))}

    def eval_task(self, cid: int) -> Task | None:
        return Task(personal=True)

    def assigned_model(self, cid: int) -> int | None:
        return cid      # its personal model, named by its client id (module docstring)

    def cluster_models(self) -> list[int]:
        return self.training_clients()
