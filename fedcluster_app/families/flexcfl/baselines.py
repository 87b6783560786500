"""The FlexCFL paper's IFCA, IFCA-MIG and FedAvg: the foundation's strategies under its protocol.

"Flexible Clustered Federated Learning for Client-Level Data Distribution Shift", Duan et al.,
IEEE TPDS 2022, https://arxiv.org/abs/2108.09749, sections 4.3 and 6 (FeSEM and FeSEM-MIG are
in ``fesem.py``). The paper runs IFCA with all m models down, the client's min-loss choice and
the *unweighted* mean per model; IFCA-MIG adds the label-shift test, and a shifted warm client
(selected or not) receives all m models and takes the one of lowest training loss at once, as
the authors' code re-runs IFCA's assignment: m models down per shifted client.
"""

from __future__ import annotations

from flwr.serverapp import Grid

from fedcluster_app.core import wire as P
from fedcluster_app.core.limits import ModelCount
from fedcluster_app.core.server.strategy import Reply
from fedcluster_app.families.flexcfl import catalogue
from fedcluster_app.families.flexcfl.migration import MigrationMixin
from fedcluster_app.families.flexcfl.protocol import (
    PaperProtocol,
    num_groups,
    num_groups_key,
)
from fedcluster_app.families.foundation.fedavg import FedAvg
from fedcluster_app.families.foundation.ifca import IFCA


class FlexIFCA(IFCA):
    name, description, Params = catalogue.FLEXCFL_IFCA.class_attributes()
    protocol_factory = PaperProtocol

    def num_models(self) -> int:
        return num_groups(self)

    def model_count(self) -> ModelCount:
        return ModelCount(self.num_models(), self.num_models(), num_groups_key(self))


class FlexIFCAMig(MigrationMixin, FlexIFCA):
    name, description, Params = catalogue.FLEXCFL_IFCA_MIG.class_attributes()

    def before_round(self, grid: Grid, step: int, new_step: bool) -> None:
        self.migrate(grid)

    def reassign(self, grid: Grid, cids: list[int]) -> list[int]:
        replies = self.query(grid, P.QUERY_LOSSES, cids, models=list(self.center_ids))
        done = []
        for cid, r in sorted(replies.items()):
            losses = dict(zip((int(m) for m in r.metrics[P.MODEL_IDS]), r.metrics[P.LOSSES]))
            self.assign(cid, min(sorted(losses), key=lambda m: (losses[m], m)))
            done.append(cid)
        return done

    def on_train_replies(self, step: int, replies: list[Reply]) -> None:
        super().on_train_replies(step, replies)
        self.set_reference([r.cid for r in replies])     # assigned by its min-loss choice


class FlexFedAvg(FedAvg):
    name, description, Params = catalogue.FLEXCFL_FEDAVG.class_attributes()
    protocol_factory = PaperProtocol
