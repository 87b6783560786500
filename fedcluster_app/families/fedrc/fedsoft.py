"""FedSoft: soft clustered federated learning with proximal local updating.

"FedSoft: Soft Clustered Federated Learning with Proximal Local Updating", Ruan, Joe-Wong,
AAAI 2022, https://arxiv.org/abs/2112.06053. A soft-clustering baseline of the FedRC paper.

K centres; every client keeps a personal model trained towards the centres it resembles
(client side: ``client.py``) and reports its importance weights u_c; each centre becomes

    c_k = sum_c u_ck N_c w_c / sum_c u_ck N_c

over the clients of the round. Local accuracy uses the personal model; a held-out client picks
the centre with the lowest loss on its adaptation split.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from fedcluster_app.core import wire as P
from fedcluster_app.core.config import ConfigError
from fedcluster_app.core.limits import ModelCount
from fedcluster_app.core.server.strategy import ClusteredStrategy, RejectedReply, Reply, Task
from fedcluster_app.core.server.updates import weighted_average
from fedcluster_app.families.fedrc import catalogue
from fedcluster_app.families.fedrc import wire as C


class FedSoft(ClusteredStrategy):
    name, description, Params = catalogue.FEDSOFT.class_attributes()
    message_kinds: ClassVar[dict[str, str]] = {P.TRAIN: C.FEDSOFT_TRAIN_KIND}

    def __init__(self, experiment) -> None:
        super().__init__(experiment)
        if self.cfg.train.prox_mu > 0:     # the paper's proximal term is its own, towards the mix
            raise ConfigError(f"fedsoft's proximal term is fedsoft.lam (towards its clients' "
                              f"importance-weighted centres): prox-mu must be 0, got "
                              f"{self.cfg.train.prox_mu}")
        self.trained: set[int] = set()     # clients that hold a personal model

    def model_count(self) -> ModelCount:
        return ModelCount(self.cfg.num_clusters, self.cfg.num_clusters, "num-clusters")

    def on_start(self) -> None:
        for j in range(self.cfg.num_clusters):
            self.new_model(self.initial_weights(salt=j))
        for cid in self.clients:
            self.on_new_client(cid)

    def on_new_client(self, cid: int) -> None:
        self.clients[cid].soft = {m: 1.0 / len(self.models) for m in self.models}

    def plan_train(self, step: int) -> dict[int, Task]:
        ids = sorted(self.models)
        config = self.params.to_message(C.FEDSOFT_PARAMS)
        return {cid: Task(models=ids, config=config, personal=True)
                for cid in self.sample(self.training_clients(), self.cfg.fraction_train)}

    def check_reply(self, kind: str, reply: Reply) -> None:
        if kind != C.FEDSOFT_TRAIN_KIND:
            return
        u = np.asarray(reply.metrics.get(C.IMPORTANCE, []), dtype=np.float64)
        if u.shape != (len(self.models),) or (u < 0).any() or abs(u.sum() - 1.0) > 1e-4:
            raise RejectedReply(f"importance weights {u.tolist()} are not {len(self.models)} "
                                "non-negative numbers summing to 1")
        if P.PERSONAL_MODEL_ID not in reply.models:
            raise RejectedReply("no personal model in the reply")

    def on_train_replies(self, step: int, replies: list[Reply]) -> None:
        ids = sorted(self.models)
        for r in replies:
            u = r.metrics[C.IMPORTANCE]
            self.clients[r.cid].soft = {m: float(w) for m, w in zip(ids, u)}
            self.trained.add(r.cid)
        for j, mid in enumerate(ids):
            items = [(r.models[P.PERSONAL_MODEL_ID], float(r.metrics[C.IMPORTANCE][j]) * r.num_examples)
                     for r in replies]
            if items and sum(w for _, w in items) > 0:
                self.models[mid] = weighted_average(items)

    def eval_task(self, cid: int) -> Task | None:
        if cid not in self.trained:         # no personal model yet: the best-fitting centre
            return self.global_eval_task(cid)
        return Task(personal=True)          # local accuracy: the personal model

    def summary_extra(self) -> dict[str, Any]:
        return {"hparams": self.params.to_table()}

    def strategy_state(self) -> dict[str, Any]:
        return {"trained": sorted(self.trained)}

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        self.trained = {int(c) for c in state["trained"]}
