"""The foundation family's catalogue: its strategies as the registry lists them, declared
without importing them (``fedcluster_app/families/__init__.py``)."""

from __future__ import annotations

from fedcluster_app.core.strategy_info import StrategyInfo
from fedcluster_app.families.foundation.params import (
    AdaptiveFedAvgParams,
    CFL3Params,
    CFLParams,
    OracleParams,
)

_PKG = "fedcluster_app.families.foundation"

FEDAVG = StrategyInfo(
    "fedavg", "one global model, FedAvg; FedProx with prox-mu > 0",
    f"{_PKG}.fedavg:FedAvg")
FEDPROX = StrategyInfo(
    "fedprox", "FedAvg with the FedProx proximal term (prox-mu, 0.01 when unset)",
    f"{_PKG}.fedavg:FedProx")
IFCA = StrategyInfo(
    "ifca", "K models (num-clusters); each client trains the one with the lowest loss",
    f"{_PKG}.ifca:IFCA")
ORACLE = StrategyInfo(
    "oracle", "clusters = ground-truth concepts (upper reference)",
    f"{_PKG}.oracle:Oracle", OracleParams)
LOCAL = StrategyInfo(
    "local", "no federation: every client trains its own model, kept on the client",
    f"{_PKG}.local:Local")
CFL_ROUNDS = StrategyInfo(
    "cfl-rounds", "CFL (Sattler et al.) on plain rounds: recursive bi-partitioning, no cap",
    f"{_PKG}.cfl:CFL", CFLParams)
CFL3_ROUNDS = StrategyInfo(
    "cfl3-rounds", "CFL(3) on plain rounds: recursive bi-partitioning, at most 3 clusters",
    f"{_PKG}.cfl:CFL3", CFL3Params)
# the FedCCFA paper's baseline: the FedCCFA family lists it
ADAPTIVE_FEDAVG_ROUNDS = StrategyInfo(
    "adaptive-fedavg-rounds",
    "Adaptive-FedAvg (FedCCFA's baseline): FedAvg, client SGD lr adapted after "
    "every round from the stability of the global weights",
    f"{_PKG}.adaptive_fedavg:AdaptiveFedAvg", AdaptiveFedAvgParams)

#: the strategies the family registers, in this order
STRATEGIES = [FEDAVG, FEDPROX, IFCA, ORACLE, LOCAL, CFL_ROUNDS, CFL3_ROUNDS]
