"""FedAvg (and FedProx through ``prox-mu``): one global model, no clustering."""

from __future__ import annotations

from fedcluster_app.core.strategy import ClusteredStrategy


class FedAvg(ClusteredStrategy):
    name = "fedavg"
    description = "one global model, FedAvg; FedProx with prox-mu > 0"
    # The base's defaults are exactly FedAvg: one model, every client on it, sample-weighted mean.


class FedProx(FedAvg):
    name = "fedprox"
    description = "FedAvg with the FedProx proximal term (prox-mu, 0.01 when unset)"
    DEFAULT_MU = 0.01

    def plan_train(self, step: int):
        mu = self.cfg.train.prox_mu or self.DEFAULT_MU
        plan = super().plan_train(step)
        for task in plan.values():
            task.config["prox-mu"] = mu
        return plan
