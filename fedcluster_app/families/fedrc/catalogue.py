"""The FedRC family's catalogue, declared without importing its code
(``fedcluster_app/families/__init__.py``): its strategies, and its client populations (built by
``scenarios.py``, whose docstring describes them)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from fedcluster_app.core.data.catalogue import lazy_builder
from fedcluster_app.core.strategy_info import StrategyInfo
from fedcluster_app.families.fedrc.params import FedRCParams, FedSoftParams

_PKG = "fedcluster_app.families.fedrc"

FEDRC = StrategyInfo(
    "fedrc",
    "FedRC: soft clustering, every client trains all K models with robust "
    "per-sample weights (label-frequency correction)",
    f"{_PKG}.fedrc:FedRC", FedRCParams)
FEDEM = StrategyInfo(
    "fedem", "FedEM: soft clustering, every client trains all K models (FedRC without P~)",
    f"{_PKG}.fedrc:FedEM", FedRCParams)
FEDSOFT = StrategyInfo(
    "fedsoft",
    "FedSoft: K centres, personal models pulled towards the centres by "
    "importance weights (share of samples each centre fits best)",
    f"{_PKG}.fedsoft:FedSoft", FedSoftParams)

#: the strategies the family registers, in this order
STRATEGIES = [FEDRC, FEDEM, FEDSOFT]


@dataclass(frozen=True)
class Variant:
    """One population of ``scenarios.py``: which shifts it has, on which data."""

    name: str
    description: str
    data: str          # "gauss" | "digits"
    alpha: float       # default per-class Dirichlet concentration (inf = uniform)
    feature: bool      # corrupted blocks present
    concept: bool      # three concepts (else everyone on concept 0)


VARIANTS = {v.name: v for v in (
    Variant("shifts-3", "FedRC small experiment: 10-class Gaussians in 20-d, 30 clients + 3 "
            "held-out test clients; feature shift (40% corrupted), Dirichlet(0.1) label skew, "
            "3 concepts (y, 9-y, y+1)", "gauss", 0.1, True, True),
    Variant("shifts-3-mild", "FedRC small experiment's control: shifts-3 with mild label skew "
            "(Dirichlet 0.5 per class)", "gauss", 0.5, True, True),
    Variant("digits-shifts-3", "FedRC small experiment on digits: scikit-learn 8x8 digits, "
            "30 clients + 3 held-out; 5 corruption styles (40% corrupted), Dirichlet(0.1), "
            "3 concepts", "digits", 0.1, True, True),
    Variant("shifts-feature-only", "FedRC single-shift ablation: shifts-3's Gaussians with "
            "feature shift only (one concept, uniform labels)", "gauss", math.inf, True, False),
    Variant("shifts-label-only", "FedRC single-shift ablation: shifts-3's Gaussians with "
            "Dirichlet(0.1) label skew only (one concept, no corruption)", "gauss", 0.1, False,
            False),
    Variant("shifts-concept-only", "FedRC single-shift ablation: shifts-3's Gaussians with "
            "concept shift only (3 concepts 40/30/30%, uniform labels, no corruption)", "gauss",
            math.inf, False, True),
)}

#: (name, one-line description, builder) of every scenario of this family
SCENARIOS = [(name, v.description, lazy_builder(f"{_PKG}.scenarios:build_fedrc", name))
             for name, v in VARIANTS.items()]


# The FedRC paper's setup (docs/fedrc/README.md; presets/fedrc-shifts3.toml): one static time step of
# T = 150 rounds, one SGD epoch (lr 0.2, batches of 32, last partial batch dropped) per round,
# K = 3 clusters, weights N(0, 1/fan_in).
_PAPER = {"rounds-per-step": 150, "num-clusters": 3, "init": "normal", "optimizer": "sgd",
          "lr": 0.2, "local-steps": 0, "local-epochs": 1, "batch-size": 32, "drop-last": True}
PROTOCOLS = {name: dict(_PAPER) for name in ("shifts-3", "shifts-3-mild", "shifts-feature-only",
                                             "shifts-label-only", "shifts-concept-only")}
