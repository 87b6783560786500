"""Adaptive-FedAvg: FedAvg whose client learning rate adapts to how much the model drifts.

"Adaptive Federated Learning in Presence of Concept Drift", Canonaco, Bergamasco, Mongelluzzo,
Roveri, IJCNN 2021, https://doi.org/10.1109/IJCNN52387.2021.9533710.

After every aggregation t = 1, 2, ... of the global weights w_t (flattened):

    m_t = b1 m_{t-1} + (1 - b1) w_t                          m^_t = m_t / (1 - b1^t)
    v_t = b2 v_{t-1} + (1 - b2) mean((w_t - m^_{t-1})^2)     v^_t = v_t / (1 - b2^t)
    r_t = b3 r_{t-1} + (1 - b3) v^_t / v^_{t-1}              r^_t = r_t / (1 - b3^t)
    next lr = min(eta0, eta0 r^_t / t)

with m_0 = v_0 = r_0 = 0, the ratio v^_t / v^_{t-1} taken as 1 at t = 1 and wherever
v^_{t-1} = 0; clients train with SGD at that lr. The one open choice is m^_0, the "previous
mean" at t = 1 (docs/foundation/README.md D6):

* ``zero_start=True``: m^_0 = 0, so v_1 measures the weights themselves (the FedCCFA authors'
  code, with beta1 0.7, beta2 0.3, beta3 0.7, eta0 0.01: docs/fedccfa/README.md, D20);
* ``zero_start=False``: m^_0 = w_1, so v_1 = 0 and the first ratio that counts is at t = 3
  (one beta, 0.5, for all three).

One implementation, two protocols: ``adaptive-fedavg-rounds`` (the FedCCFA paper's baseline:
t = the round, lr adapted after every round's aggregation) and ``adaptive-fedavg`` (the FedDrift
paper's baseline under its time-step protocol: t = the time step, lr adapted once per step).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from fedcluster_app.core import wire as P
from fedcluster_app.core.server.strategy import Reply, Task
from fedcluster_app.families.foundation import catalogue
from fedcluster_app.families.foundation.cfl import flatten
from fedcluster_app.families.foundation.fedavg import FedAvg


class AdaptiveLR:
    """The schedule's state and its update; ``lr`` is the rate for the next local training."""

    def __init__(self, eta0: float, beta1: float, beta2: float, beta3: float,
                 zero_start: bool = True) -> None:
        self.eta0, self.b1, self.b2, self.b3 = float(eta0), float(beta1), float(beta2), float(beta3)
        self.zero_start = bool(zero_start)
        self.lr = self.eta0
        self.mu: np.ndarray | None = None        # m_t (biased first moment of the weights)
        self.s = 0.0                             # v_t
        self.gamma = 0.0                         # rho_t
        self.s_hat_prev: float | None = None     # v^_{t-1}

    def update(self, weights: np.ndarray, t: int) -> float:
        """Fold in the weights after aggregation number ``t`` (1-based); returns the next lr."""
        b1, b2, b3 = self.b1, self.b2, self.b3
        theta = np.asarray(weights)
        if self.mu is None:
            self.mu, self.s, self.gamma = np.zeros_like(theta), 0.0, 0.0
        if t > 1:
            mu_hat_prev = self.mu / (1 - b1 ** (t - 1))
        else:
            mu_hat_prev = np.zeros_like(theta) if self.zero_start else theta
        self.mu = b1 * self.mu + (1 - b1) * theta
        self.s = b2 * self.s + (1 - b2) * float(np.mean((theta - mu_hat_prev) ** 2))
        s_hat = self.s / (1 - b2 ** t)
        rho = s_hat / self.s_hat_prev if self.s_hat_prev else 1.0
        self.s_hat_prev = s_hat
        self.gamma = b3 * self.gamma + (1 - b3) * rho
        g_hat = self.gamma / (1 - b3 ** t)
        self.lr = float(min(self.eta0, self.eta0 * g_hat / t))
        return self.lr

    def state(self) -> dict[str, Any]:
        return {"lr": self.lr, "s": self.s, "gamma": self.gamma, "s_hat_prev": self.s_hat_prev,
                "mu": None if self.mu is None else self.mu.tolist()}

    def load_state(self, state: dict[str, Any]) -> None:
        self.lr, self.s, self.gamma = state["lr"], state["s"], state["gamma"]
        self.s_hat_prev = state["s_hat_prev"]
        self.mu = None if state["mu"] is None else np.asarray(state["mu"])


class AdaptiveFedAvg(FedAvg):
    """FedAvg whose client SGD lr is set by :class:`AdaptiveLR` (module docstring)."""

    name, description, Params = catalogue.ADAPTIVE_FEDAVG_ROUNDS.class_attributes()
    #: when the lr adapts: after every round's aggregation, or once per time step
    per: ClassVar[str] = "round"
    zero_start: ClassVar[bool] = True

    def __init__(self, experiment) -> None:
        super().__init__(experiment)
        eta0, b1, b2, b3 = self.schedule_constants()
        self.schedule = AdaptiveLR(eta0, b1, b2, b3, zero_start=self.zero_start)
        self._round_lr = self.schedule.lr

    def schedule_constants(self) -> tuple[float, float, float, float]:
        """(eta0, beta1, beta2, beta3); eta0 is the run's shared lr."""
        p = self.params
        return self.cfg.train.lr, p.beta1, p.beta2, p.beta3

    def plan_train(self, step: int) -> dict[int, Task]:
        plan = super().plan_train(step)
        self._round_lr = self.schedule.lr
        for task in plan.values():   # the one setting it changes: the rest is the shared recipe
            task.config[P.TRAIN_LR] = float(self.schedule.lr)
        return plan

    def on_train_replies(self, step: int, replies: list[Reply]) -> None:
        super().on_train_replies(step, replies)
        if self.per == "round":
            self.schedule.update(flatten(self.models[min(self.models)]), self.round)

    def end_step(self, step: int) -> None:
        if self.per == "step":
            self.schedule.update(flatten(self.models[min(self.models)]), step)

    def round_metrics(self) -> dict[str, Any]:
        out: dict[str, Any] = {"lr": self._round_lr}
        if self.per == "round":
            out["next_lr"] = self.schedule.lr
        return out

    def strategy_state(self) -> dict[str, Any]:
        return {"adaptive_lr": self.schedule.state()}

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        self.schedule.load_state(state["adaptive_lr"])
