"""The FedDrift family's typed hyper-parameters (the run-config tables of FedDrift and of the
paper's baselines), apart from the strategies so that the catalogue reads them without
importing torch or Flower."""

from __future__ import annotations

from dataclasses import dataclass

from fedcluster_app.core.hparams import HParams, param
from fedcluster_app.core.limits import MAX_SAMPLES


@dataclass(frozen=True)
class FedDriftParams(HParams):
    """The FedDrift family's hyper-parameters (one table for all its variants)."""

    table = "feddrift"
    delta: float = param(0.1, "drift and merge threshold in 0-1 error units (the authors' "
                         "code: SINE 0.20, CIRCLE 0.10, SEA 0.04; D17)", gt=0, le=1)
    subsample: int = param(1000, "points per cluster for the cluster distances L_ij (D4)", ge=1,
                           le=MAX_SAMPLES)
    init_new: str = param("copy", "new model = a copy of the detecting client's best model "
                          "(D6) | seeded: the run's common initialisation",
                          choices=("copy", "seeded"))
    loss: str = param("error", "loss of detection and distances: 0-1 error (D1) | "
                      "cross-entropy", choices=("error", "cross-entropy"))


@dataclass(frozen=True)
class BaselineParams(HParams):
    """Hyper-parameters of the FedDrift paper's baselines (one table)."""

    table = "feddrift-baselines"
    #: Adaptive-FedAvg's schedule starts from the run's shared lr
    moved = {"afa-lr": "lr"}
    driftsurf_delta: float = param(0.05, "DriftSurf threshold (the authors' code: SINE 0.10, "
                                   "CIRCLE 0.05, SEA 0.02)", gt=0, le=1)
    driftsurf_reactive: int = param(3, "DriftSurf reactive period r (steps, the first "
                                    "included)", ge=2)
    cfl_gamma: float = param(0.1, "CFL split threshold on sqrt((1 - max cross cosine) / 2)",
                             gt=0, lt=1)
    afa_beta: float = param(0.5, "Adaptive-FedAvg beta1 = beta2 = beta3", gt=0, lt=1)
    ifca_choice: str = param("error", "IFCA-W's choice every round: the model of lowest 0-1 "
                             "error on the newest batch (the authors' code: highest accuracy; "
                             "D23) | loss: of lowest cross-entropy (the IFCA paper)",
                             choices=("error", "loss"))
