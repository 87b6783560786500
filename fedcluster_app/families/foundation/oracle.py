"""Oracle: one model per ground-truth concept, the upper reference.

No paper: the reference every clustered-FL paper compares with. At the start of every time
step the server asks all clients for the concept of their current training data and puts each
client on that concept's model, created when the concept first appears from the run's common
initialisation (docs/foundation/README.md D4) or, with ``oracle.warm-start``, from the mean of
the models its clients were on (weighted by how many came from each), so that what they learnt
of the shared parts of the task is kept. A client whose concept is unknown keeps its model.
The only strategy allowed to read the ground truth. One implementation serves every protocol:
``oracle`` on plain rounds, ``oracle-t`` / ``oracle-w`` under FedDrift's time-step protocol.
"""

from __future__ import annotations

from typing import Any

from flwr.serverapp import Grid

from fedcluster_app.core import wire as P
from fedcluster_app.core.server.strategy import ClusteredStrategy, Weights, weighted_average
from fedcluster_app.families.foundation import catalogue


class Oracle(ClusteredStrategy):
    name, description, Params = catalogue.ORACLE.class_attributes()
    uses_ground_truth = True

    def __init__(self, experiment) -> None:
        super().__init__(experiment)
        self.concept_model: dict[int, int] = {}

    def on_start(self) -> None:
        pass  # models are created per concept in begin_step

    def begin_step(self, grid: Grid, step: int) -> None:
        self.query(grid, P.QUERY_INFO)
        before = {cid: rec.cluster for cid, rec in self.clients.items()}   # last step's models
        concepts = {cid: self.true_concept(cid, step) for cid in sorted(self.clients)}
        for cid, concept in concepts.items():
            if concept is None:
                continue
            if concept not in self.concept_model:
                came_from = [before[c] for c, k in concepts.items()
                             if k == concept and before[c] in self.models]
                self.concept_model[concept] = self.new_model(self.warm_start(came_from))
            self.assign(cid, self.concept_model[concept])

    def warm_start(self, came_from: list[int]) -> Weights | None:
        """A new concept's first weights: with ``warm-start``, the mean of the models its
        clients were on (each counted once per client); else None (the common initialisation)."""
        if not (self.params.warm_start and came_from):
            return None
        return weighted_average([(self.models[mid], 1.0) for mid in came_from])

    def strategy_state(self) -> dict[str, Any]:
        return {"concept_model": {str(k): v for k, v in self.concept_model.items()}}

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        self.concept_model = {int(k): int(v) for k, v in state["concept_model"].items()}
