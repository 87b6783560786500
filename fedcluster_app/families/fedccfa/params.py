"""The FedCCFA family's typed hyper-parameters, which every message carries (the server sends
them, the client reads them through the same classes; it has no defaults of its own), apart
from the strategies so that the catalogue reads them without importing torch or Flower.

The local training itself is the run's shared recipe (``optimizer``, ``lr``, ``momentum``,
``weight-decay``, ``local-steps`` / ``local-epochs``, ``batch-size``, ``drop-last``), as for
every strategy: it trains the extractor (FedCCFA, FedRep, FedBABU) or the whole model (Flash).
What the papers define on top of it is declared here: the classifier phases' learning rates and
epochs, FedBABU's fine-tuning, Flash's early stopping and server optimiser. The keys these
classes once had for the shared recipe are refused with the shared key that replaced them."""

from __future__ import annotations

from dataclasses import dataclass

from fedcluster_app.core.hparams import HParams, param
from fedcluster_app.core.limits import MAX_CLIENTS, MAX_EPOCHS, MAX_ITERATIONS, MAX_SAMPLES


#: keys of the shared recipe these tables once redeclared (a fresh optimiser per phase stays)
_SHARED = {"batch-size": "batch-size", "momentum": "momentum", "weight-decay": "weight-decay"}
_EXTRACTOR = {**_SHARED, "ext-lr": "lr", "ext-epochs": "local-epochs (with local-steps = 0)"}


@dataclass(frozen=True)
class FamilyParams(HParams):
    """What every algorithm of the family has: nothing but the shared recipe's replacements."""

    moved = _SHARED


@dataclass(frozen=True)
class ClassifierPhaseParams(FamilyParams):
    """FedCCFA's and FedRep's classifier phase: each round the client trains its classifier
    with the extractor frozen, then the extractor with the shared recipe; a held-out client
    (one that never trains) learns a classifier the same way before it is scored."""

    moved = _EXTRACTOR
    clf_lr: float = param(0.1, "classifier lr, extractor frozen (the extractor trains with "
                          "the shared lr)", gt=0)
    clf_epochs: int = param(1, "classifier epochs (the extractor trains for the shared "
                            "local-steps / local-epochs)", ge=1, le=MAX_EPOCHS)
    newcomer_epochs: int = param(10, "a held-out client (one that never trains) learns its "
                                 "classifier for this many epochs of its adaptation split, the "
                                 "extractor frozen, before it is scored", ge=1, le=MAX_EPOCHS)


@dataclass(frozen=True)
class FedCCFAParams(ClassifierPhaseParams):
    table = "fedccfa"
    eps: float = param(0.1, "DBSCAN eps on the MADD distance of balanced classifier rows "
                       "(0.05 for the digits demo)", gt=0)
    min_samples: int = param(1, "DBSCAN min_samples (1 = connected components)", ge=1,
                             le=MAX_CLIENTS)
    align_start: int = param(20, "T_s: alignment from 0-indexed round t >= align-start", ge=0)
    tau: float = param(0.1, "temperature of the contrastive anchor loss (Eq. 8)", gt=0)
    gamma: float = param(20.0, "entropy scaling: lambda = H(P_k(Y)) / gamma", gt=0)
    weight_mode: str = param("entropy", "entropy (lambda = H/gamma) | fixed (lambda = "
                             "fixed-weight; 0 = no alignment)", choices=("entropy", "fixed"))
    fixed_weight: float = param(0.0, "lambda when weight-mode = fixed", ge=0)
    anchors: str = param("clustered", "clustered (per-class cluster means) | global (one mean "
                         "anchor per class for everybody)", choices=("clustered", "global"))
    bal_lr: float = param(0.1, "balanced classifier: SGD lr", gt=0)
    bal_steps: int = param(5, "balanced classifier: steps on its one balanced batch", ge=1,
                           le=MAX_ITERATIONS)
    bal_per_class: int = param(5, "balanced batch: samples per class (at most the smallest "
                               "present class)", ge=1, le=MAX_SAMPLES)


@dataclass(frozen=True)
class FedRepParams(ClassifierPhaseParams):
    table = "fedrep"


@dataclass(frozen=True)
class FedBABUParams(FamilyParams):
    table = "fedbabu"
    moved = _EXTRACTOR
    ft_lr: float = param(0.01, "fine-tuning lr (whole model) before each evaluation", gt=0)
    ft_epochs: int = param(5, "fine-tuning epochs (0 = evaluate the global model)", ge=0,
                           le=MAX_EPOCHS)


@dataclass(frozen=True)
class FlashParams(FamilyParams):
    table = "flash"
    moved = {**_SHARED, "lr": "lr",
             "epochs": "local-epochs (with local-steps = 0; early stopping may end sooner)"}
    threshold: float = param(0.004, "stop when 0 < prev_loss - loss < threshold / (epoch + 1)",
                             ge=0)
    eta_g: float = param(0.01, "server lr", gt=0)
    beta1: float = param(0.9, "server first moment", ge=0, lt=1)
    beta2: float = param(0.99, "server second moment", ge=0, lt=1)
    tau: float = param(0.001, "server epsilon (v starts at tau^2)", gt=0)
