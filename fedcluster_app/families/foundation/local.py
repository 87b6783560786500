"""Local: no federation. Each client trains and evaluates its own model, which never leaves it.

No paper: the lower reference of personalised FL (no collaboration at all).

The model lives in the client's ``context.state`` (the base's "personal model" path, the same
mechanism FedCCFA's personal classifiers use), so nothing but metrics travels.
"""

from __future__ import annotations

from fedcluster_app.core.strategy import ClusteredStrategy, Task
from fedcluster_app.families.foundation import catalogue


class Local(ClusteredStrategy):
    name, description, Params = catalogue.LOCAL.class_attributes()

    def on_start(self) -> None:
        pass

    def plan_train(self, step: int) -> dict[int, Task]:
        return {cid: Task(personal=True) for cid in self.protocol.select(sorted(self.clients))}

    def eval_task(self, cid: int) -> Task | None:
        return Task(personal=True)

    def cluster_label(self, cid: int) -> int | None:
        return cid

    def num_clusters(self) -> int:
        return len(self.clients)
