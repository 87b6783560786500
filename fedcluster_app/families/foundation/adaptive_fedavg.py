"""Adaptive-FedAvg's learning-rate schedule (Canonaco et al., IJCNN 2021), written once.

After every aggregation t = 1, 2, ... of the global weights w_t (flattened):

    m_t = b1 m_{t-1} + (1 - b1) w_t                          m^_t = m_t / (1 - b1^t)
    v_t = b2 v_{t-1} + (1 - b2) mean((w_t - m^_{t-1})^2)     v^_t = v_t / (1 - b2^t)
    r_t = b3 r_{t-1} + (1 - b3) v^_t / v^_{t-1}              r^_t = r_t / (1 - b3^t)
    next lr = min(eta0, eta0 r^_t / t)

with m_0 = v_0 = r_0 = 0, the ratio v^_t / v^_{t-1} taken as 1 at t = 1 and wherever
v^_{t-1} = 0. The one open choice is m^_0, the "previous mean" at t = 1:

* ``zero_start=True``: m^_0 = 0, so v_1 measures the weights themselves (the FedCCFA authors'
  code, spec fedccfa.md section 6: beta1 0.7, beta2 0.3, beta3 0.7, eta0 0.01);
* ``zero_start=False``: m^_0 = w_1, so v_1 = 0 and the first ratio that counts is at t = 3
  (the FedDrift issue's implementation, one beta 0.5 for all three).

Users: ``adaptive-fedavg`` (``feddrift_baselines.AdaptiveFedAvg``, t = the time step: lr adapted
once per step) and ``adaptive-fedavg-rounds`` (below, t = the round: lr adapted after every
round's aggregation, on the standard round loop).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fedcluster_app.core.config import ConfigError
from fedcluster_app.core.strategy import Reply, Task
from fedcluster_app.families.foundation.cfl import flatten
from fedcluster_app.families.foundation.fedavg import FedAvg


class AdaptiveLR:
    """The schedule's state and its update; ``lr`` is the rate for the next local training.

    The state names (``mu``, ``s``, ``gamma``, ``s_hat_prev``, ``lr``) are the checkpoint keys
    the FedDrift strategy has always written, so its old checkpoints still resume.
    """

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


class AdaptiveFedAvgRounds(FedAvg):
    """Adaptive-FedAvg as the FedCCFA paper runs it (spec fedccfa.md 6): FedAvg whose client SGD
    lr is set by the server after every round's aggregation (``AdaptiveLR``, m^_0 = 0)."""

    name = "adaptive-fedavg-rounds"
    description = ("Adaptive-FedAvg (FedCCFA's baseline): FedAvg, client SGD lr adapted after "
                   "every round from the stability of the global weights")
    DEFAULTS: dict[str, Any] = {"beta1": 0.7, "beta2": 0.3, "beta3": 0.7, "eta0": 0.01,
                                "momentum": 0.9, "weight-decay": 1e-5}

    def __init__(self, experiment) -> None:
        super().__init__(experiment)
        h = self.checked_hparams(self.DEFAULTS)
        for key, value in h.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(float(value)):
                raise ConfigError(f"{self.name}.{key} must be a finite number, got {value!r}")
            h[key] = float(value)
        for key in ("beta1", "beta2", "beta3"):
            if not 0 < h[key] < 1:
                raise ConfigError(f"{self.name}.{key} must be in (0, 1), got {h[key]}")
        if h["eta0"] <= 0:
            raise ConfigError(f"{self.name}.eta0 must be > 0, got {h['eta0']}")
        if not 0 <= h["momentum"] < 1:
            raise ConfigError(f"{self.name}.momentum must be in [0, 1), got {h['momentum']}")
        if h["weight-decay"] < 0:
            raise ConfigError(f"{self.name}.weight-decay must be >= 0, got {h['weight-decay']}")
        self.h = h
        self.schedule = AdaptiveLR(h["eta0"], h["beta1"], h["beta2"], h["beta3"], zero_start=True)
        self._round_lr = self.schedule.lr

    def plan_train(self, step: int) -> dict[int, Task]:
        plan = super().plan_train(step)
        self._round_lr = self.schedule.lr
        for task in plan.values():
            task.config.update({"optimizer": "sgd", "lr": float(self.schedule.lr),
                                "momentum": self.h["momentum"],
                                "weight-decay": self.h["weight-decay"]})
        return plan

    def on_train_replies(self, step: int, replies: list[Reply]) -> None:
        super().on_train_replies(step, replies)
        self.schedule.update(flatten(self.models[min(self.models)]), self.round)

    def round_metrics(self) -> dict[str, Any]:
        return {"lr": self._round_lr, "next_lr": self.schedule.lr}

    def strategy_state(self) -> dict[str, Any]:
        return {"adaptive_lr": self.schedule.state()}

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        self.schedule.load_state(state["adaptive_lr"])
