"""FedAvg and FedProx: one global model, no clustering.

FedAvg: "Communication-Efficient Learning of Deep Networks from Decentralized Data", McMahan,
Moore, Ramage, Hampson, Agüera y Arcas, AISTATS 2017, https://arxiv.org/abs/1602.05629.
FedProx: "Federated Optimization in Heterogeneous Networks", Li, Sahu, Zaheer, Sanjabi,
Talwalkar, Smith, MLSys 2020, https://arxiv.org/abs/1812.06127.

Each sampled client c trains the global model w on its data; the server takes

    w <- sum_{c in S} n_c w_c / sum_{c in S} n_c.

FedProx adds mu/2 ||w - w_global||^2 to every client's local loss (``prox-mu``; ``fedprox``
uses mu = 0.01 when it is unset, docs/foundation/README.md D2). Under FedDrift's time-step protocol
the same class is the FedDrift paper's Oblivious, Window and Window-2 baselines, and under
FlexCFL's selection its FedAvg reference.
"""

from __future__ import annotations

from fedcluster_app.core import wire as P
from fedcluster_app.core.server.strategy import ClusteredStrategy, Task
from fedcluster_app.families.foundation import catalogue


class FedAvg(ClusteredStrategy):
    name, description, Params = catalogue.FEDAVG.class_attributes()
    # The base's defaults are exactly FedAvg: one model, every client on it, sample-weighted mean.


class FedProx(FedAvg):
    name, description, Params = catalogue.FEDPROX.class_attributes()
    DEFAULT_MU = 0.01

    def plan_train(self, step: int) -> dict[int, Task]:
        mu = self.cfg.train.prox_mu or self.DEFAULT_MU
        plan = super().plan_train(step)
        for task in plan.values():
            task.config[P.TRAIN_PROX_MU] = mu
        return plan
