"""The FedRC family's typed hyper-parameters, of FedRC / FedEM and of FedSoft (the server sends
them with every message, the client reads them through the same classes; it has no defaults of
its own), apart from the strategies so that the catalogue reads them without importing torch or
Flower."""

from __future__ import annotations

from dataclasses import dataclass

from fedcluster_app.core.hparams import HParams, param
from fedcluster_app.core.limits import MAX_ITERATIONS


@dataclass(frozen=True)
class FedRCParams(HParams):
    """FedRC's and FedEM's hyper-parameters (one table for both)."""

    table = "fedrc"
    prune_threshold: float = param(0.0, "adaptive FedRC: remove a model whose share of the "
                                   "sample mass is below this (0 = never; paper: 0.05 from "
                                   "K = 6)", ge=0, lt=1)
    prune_warmup: int = param(20, "no removal before this round", ge=0)
    prune_tol: float = param(0.001, "... and only once max |delta omega| of a round is below "
                             "this", ge=0)
    prune_every_round: bool = param(False, "check every round after the warm-up, converged or "
                                    "not")
    hard_test: bool = param(False, "TeHC: predict with the argmax-omega model instead of the "
                            "mixture")
    hard_train: bool = param(False, "TrHC: omega one-hot after every E-step (each client "
                             "trains one model)")
    test_use_label_prior: bool = param(True, "held-out clients' EM uses P~ (the paper); false = "
                                       "uniform (the authors' code)")
    em_iters: int = param(50, "EM iterations of a held-out client (from uniform omega)", ge=1,
                         le=MAX_ITERATIONS)
    em_tol: float = param(0.0001, "... stopping early once max |delta omega| < em-tol", ge=0)
    omega_floor: float = param(0.0, "lower bound on omega before the E-step, in [0, 1/K); "
                               "0 = off", ge=0)
    mass_noise: float = param(0.0, "std of Gaussian noise on the reported class-by-cluster "
                              "mass (label privacy)", ge=0)


@dataclass(frozen=True)
class FedSoftParams(HParams):
    table = "fedsoft"
    sigma: float = param(0.0001, "smallest importance weight of a centre", gt=0, lt=1)
    lam: float = param(0.1, "proximal coefficient towards the importance-weighted centres",
                       ge=0, key="lambda")
