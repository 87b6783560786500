"""Oracle: one model per ground-truth concept (the upper reference; no other strategy may do this).

At the start of every time step it asks all clients for the concept of their current training
data and assigns each client to that concept's model, created lazily with the common seeded
initialisation.
"""

from __future__ import annotations

from flwr.serverapp import Grid

from fedcluster_app.core import wire as P
from fedcluster_app.core.strategy import ClusteredStrategy


class Oracle(ClusteredStrategy):
    name = "oracle"
    description = "clusters = ground-truth concepts (upper reference)"
    uses_ground_truth = True

    def __init__(self, experiment) -> None:
        super().__init__(experiment)
        self.concept_model: dict[int, int] = {}

    def on_start(self) -> None:
        pass  # models are created per concept in before_round

    def before_round(self, grid: Grid, step: int, new_step: bool) -> None:
        if not new_step:
            return
        self.query(grid, P.QUERY_INFO)
        for cid in sorted(self.clients):
            concept = self.true_concept(cid, step)
            if concept is None:
                continue
            if concept not in self.concept_model:
                self.concept_model[concept] = self.new_model()
            self.assign(cid, self.concept_model[concept])

    def strategy_state(self) -> dict:
        return {"concept_model": {str(k): v for k, v in self.concept_model.items()}}

    def load_strategy_state(self, state: dict) -> None:
        self.concept_model = {int(k): int(v) for k, v in state["concept_model"].items()}
