"""The FedCCFA family's catalogue, declared without importing its code
(``fedcluster_app/families/__init__.py``): its strategies (and the foundation's Adaptive-FedAvg,
the paper's baseline), and its named drift patterns on the digits (built by ``scenarios.py``)."""

from __future__ import annotations

from fedcluster_app.core.data.catalogue import lazy_builder
from fedcluster_app.core.strategy_info import StrategyInfo
from fedcluster_app.families.fedccfa.params import (
    FedBABUParams,
    FedCCFAParams,
    FedRepParams,
    FlashParams,
)
from fedcluster_app.families.foundation.catalogue import ADAPTIVE_FEDAVG_ROUNDS

_PKG = "fedcluster_app.families.fedccfa"

FEDCCFA = StrategyInfo(
    "fedccfa",
    "FedCCFA: shared extractor, personal classifiers clustered per class "
    "(MADD + DBSCAN), entropy-weighted anchor alignment",
    f"{_PKG}.fedccfa:FedCCFA", FedCCFAParams)
FEDREP = StrategyInfo(
    "fedrep", "FedRep: shared extractor, private classifier (1 epoch @0.1, then extractor)",
    f"{_PKG}.fedccfa:FedRep", FedRepParams)
FEDBABU = StrategyInfo(
    "fedbabu", "FedBABU: classifier frozen at its init, extractor averaged; fine-tune to evaluate",
    f"{_PKG}.fedccfa:FedBABU", FedBABUParams)
FLASH = StrategyInfo(
    "flash",
    "Flash: client early stopping on validation loss, drift-aware adaptive server optimiser",
    f"{_PKG}.fedccfa:Flash", FlashParams)

#: the strategies the family registers, in this order
STRATEGIES = [FEDCCFA, FEDREP, FEDBABU, FLASH, ADAPTIVE_FEDAVG_ROUNDS]

#: (name, one-line description, builder) of every scenario of this family
SCENARIOS = [
    ("digits-swap-incremental", "scikit-learn 8x8 digits; FedCCFA's incremental label swaps: G1 "
     "at the drift step, G2 one step later, G3 two steps later",
     lazy_builder(f"{_PKG}.scenarios:build_digits_swap", "incremental")),
    ("digits-swap-recurring", "scikit-learn 8x8 digits; FedCCFA's reoccurring label swaps: all "
     "groups swap at the drift step and swap back later",
     lazy_builder(f"{_PKG}.scenarios:build_digits_swap", "recurring")),
    ("digits-ccfa", "scikit-learn 8x8 digits with FedCCFA's partition (>= 5 training / 2 test "
     "samples of every class per client and step, the rest by Dirichlet skew) and label swaps "
     "by group; drift-pattern none | sudden (default) | incremental | recurring",
     lazy_builder(f"{_PKG}.scenarios:build_digits_ccfa")),
]


# The FedCCFA paper's local training (docs/fedccfa/README.md; benchmarks/fedccfa_small.py): an MLP with
# 64 hidden units, 5 SGD epochs per round (lr 0.01, momentum 0.9, weight decay 1e-5, batches of
# 64), 5 rounds per time step.
_PAPER = {"model": "mlp", "hidden": 64, "rounds-per-step": 5, "optimizer": "sgd", "lr": 0.01,
          "momentum": 0.9, "weight-decay": 1e-5, "local-steps": 0, "local-epochs": 5,
          "batch-size": 64}
PROTOCOLS = {name: dict(_PAPER) for name in ("digits-ccfa", "digits-swap-incremental",
                                             "digits-swap-recurring")}
