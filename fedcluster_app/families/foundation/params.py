"""The foundation family's typed hyper-parameters (the run-config tables of CFL on plain rounds
and of Adaptive-FedAvg), apart from the strategies so that the catalogue reads them without
importing torch or Flower."""

from __future__ import annotations

from dataclasses import dataclass

from fedcluster_app.core.hparams import HParams, param
from fedcluster_app.core.limits import MAX_CLUSTERS


@dataclass(frozen=True)
class CFLParams(HParams):
    """CFL's thresholds, as the FedRC paper's comparison runs it (docs/fedrc/README.md, D17)."""

    table = "cfl-rounds"
    eps1: float = param(0.0, "split when the mean update norm < eps1 ...; 0 = the heuristic "
                        "(largest mean norm seen / 10)", ge=0)
    eps2: float = param(0.0, "... and the largest update norm > eps2; 0 = 6 x eps1", ge=0)
    gamma: float = param(0.0, "and sqrt((1 - max cross cosine) / 2) > gamma", ge=0)
    max_clusters: int = param(0, "never more clusters than this; 0 = no cap", ge=0,
                              le=MAX_CLUSTERS)


@dataclass(frozen=True)
class CFL3Params(CFLParams):
    """CFL(3): at most three clusters."""

    table = "cfl3-rounds"
    max_clusters: int = param(3, "never more clusters than this; 0 = no cap", ge=0,
                              le=MAX_CLUSTERS)


@dataclass(frozen=True)
class AdaptiveFedAvgParams(HParams):
    """Adaptive-FedAvg with the FedCCFA paper's constants, adapted every round."""

    table = "adaptive-fedavg-rounds"
    #: the schedule starts from the run's shared lr and adapts it for the shared optimizer
    moved = {"eta0": "lr", "momentum": "momentum", "weight-decay": "weight-decay"}
    beta1: float = param(0.7, "EMA rate of the global weights", gt=0, lt=1)
    beta2: float = param(0.3, "EMA rate of their squared deviation from the previous mean",
                         gt=0, lt=1)
    beta3: float = param(0.7, "EMA rate of the variance ratio", gt=0, lt=1)


@dataclass(frozen=True)
class OracleParams(HParams):
    """The Oracle's one choice: where a concept's model starts when the concept first appears."""

    table = "oracle"
    warm_start: bool = param(False, "true = from the mean of the models its clients were on "
                             "(a reference that keeps what they learnt, as the other methods "
                             "can); false = from the run's common initialisation (D4)")
