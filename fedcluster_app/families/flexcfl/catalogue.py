"""The FlexCFL family's catalogue, declared without importing its code
(``fedcluster_app/families/__init__.py``): its strategies, and the paper's data (built by
``scenarios.py``: Synthetic(a, b), digits pairs and the client-level shifts)."""

from __future__ import annotations

from fedcluster_app.core.data.catalogue import lazy_builder
from fedcluster_app.core.strategy_info import StrategyInfo
from fedcluster_app.families.flexcfl.params import (
    FedGroupParams,
    FeSEMMigParams,
    FeSEMParams,
    FlexCFLParams,
    FlexFedAvgParams,
    FlexIFCAMigParams,
    FlexIFCAParams,
)

_PKG = "fedcluster_app.families.flexcfl"

FLEXCFL = StrategyInfo(
    "flexcfl",
    "FlexCFL: EDC group cold start, newcomer cold start, migration on label "
    "shift, inter-group aggregation (eta-g)",
    f"{_PKG}.flexcfl:FlexCFL", FlexCFLParams)
FEDGROUP = StrategyInfo(
    "fedgroup", "FedGroup: FlexCFL's EDC grouping and newcomer cold start, no migration",
    f"{_PKG}.flexcfl:FedGroup", FedGroupParams)
FESEM = StrategyInfo(
    "fesem", "FeSEM: each selected client joins the centre nearest (L2) to its last local model",
    f"{_PKG}.fesem:FeSEM", FeSEMParams)
FLEXCFL_IFCA = StrategyInfo(
    "flexcfl-ifca",
    "IFCA as in the FlexCFL paper: all m models down, min-loss choice, unweighted "
    "mean, paper selection",
    f"{_PKG}.baselines:FlexIFCA", FlexIFCAParams)
FLEXCFL_FEDAVG = StrategyInfo(
    "flexcfl-fedavg", "FedAvg on the FlexCFL paper's client selection (its reference baseline)",
    f"{_PKG}.baselines:FlexFedAvg", FlexFedAvgParams)
FLEXCFL_IFCA_MIG = StrategyInfo(
    "flexcfl-ifca-mig",
    "IFCA-MIG: flexcfl-ifca plus the label-shift check; a shifted client takes "
    "the lowest-loss model at once (m models down)",
    f"{_PKG}.baselines:FlexIFCAMig", FlexIFCAMigParams)
FESEM_MIG = StrategyInfo(
    "fesem-mig",
    "FeSEM-MIG: fesem plus the label-shift check; a shifted client joins the "
    "centre nearest to its cached local model at once",
    f"{_PKG}.fesem:FeSEMMig", FeSEMMigParams)

#: the strategies the family registers, in this order
STRATEGIES = [FLEXCFL, FEDGROUP, FESEM, FLEXCFL_IFCA, FLEXCFL_FEDAVG, FLEXCFL_IFCA_MIG, FESEM_MIG]

SYNTHETIC_STEPS = 100           # the small experiment: T = 100 rounds
DIGITS_STEPS = 60               # digits pairs: T = 60
# (name, description, users, own shift as a drift-pattern, clients, steps)
_SCENARIOS = [
    ("synthetic-1-1", "FlexCFL Synthetic(1,1): 100 users, power-law sizes, MCLR 60->10; no shift",
     "synthetic", "none", 100, SYNTHETIC_STEPS),
    ("synthetic-1-1-swap", "Synthetic(1,1); swap-all shift: client pairs exchange their data "
     "with p = 0.05 per step", "synthetic", "swap-all", 100, SYNTHETIC_STEPS),
    ("synthetic-1-1-swap-part", "Synthetic(1,1); swap-part shift: client pairs exchange one "
     "label each with p = 0.05 per step", "synthetic", "swap-part", 100, SYNTHETIC_STEPS),
    ("synthetic-1-1-incremental", "Synthetic(1,1); incremental shift: 25/50/75/100% of each "
     "training set released every 50 steps", "synthetic", "incremental", 100, SYNTHETIC_STEPS),
    ("digits-pairs", "8x8 digits, 50 clients owning classes (u, u+1) mod 10, MCLR 64->10; no "
     "shift", "digits", "none", 50, DIGITS_STEPS),
    ("digits-pairs-swap", "8x8 digits pairs; swap-all shift with p = 0.1 per step", "digits",
     "swap-all@0.1", 50, DIGITS_STEPS),
]

#: (name, one-line description, builder) of every scenario of this family
SCENARIOS = [(row[0], row[1], lazy_builder(f"{_PKG}.scenarios:holdings_scenario", *row))
             for row in _SCENARIOS]


# The FlexCFL paper's setup on Synthetic(1,1) (docs/flexcfl/README.md; presets/flexcfl-synthetic.toml):
# a round per time step, 10 local SGD epochs (lr 0.01, batches of 10, L2 0.002), m = 5 groups.
_PAPER = {"rounds-per-step": 1, "num-clusters": 5, "optimizer": "sgd", "lr": 0.01,
          "weight-decay": 0.002, "local-steps": 0, "local-epochs": 10, "batch-size": 10}
PROTOCOLS = {name: dict(_PAPER) for name, *_ in _SCENARIOS if name.startswith("synthetic-")}
