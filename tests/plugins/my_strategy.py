"""A user's own strategy, as `strategy = "tests.plugins.my_strategy:ServerStepFedAvg"` names
it: built on the public base, with typed hyper-parameters set by `--set server-step.lr=...`."""

from __future__ import annotations

from dataclasses import dataclass

from fedcluster_app.api import ClusteredStrategy, HParams, param, weighted_average


@dataclass(frozen=True)
class ServerStepParams(HParams):
    table = "server-step"
    lr: float = param(1.0, "server learning rate: w <- w + lr (mean(w_c) - w)", gt=0, le=2)


class ServerStepFedAvg(ClusteredStrategy):
    """FedAvg with a server learning rate (Reddi et al., "Adaptive Federated Optimization",
    ICLR 2021, https://arxiv.org/abs/2003.00295, with plain SGD on the server)."""

    name = "server-step-fedavg"
    description = "FedAvg whose server moves lr of the way to the clients' mean"
    Params = ServerStepParams

    def on_train_replies(self, step, replies) -> None:
        lr = self.params.lr
        for mid, items in self.collect_updates(replies).items():
            old = self.models[mid]
            mean = weighted_average(items)
            self.models[mid] = [o + lr * (m - o) for o, m in zip(old, mean)]


class NotAStrategy:
    pass
