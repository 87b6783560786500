"""The Fielding family's catalogue, declared without importing its code
(``fedcluster_app/families/__init__.py``): its strategies, and its drift scenarios (built by
``scenarios.py``, docs/fielding/README.md, "Scenarios")."""

from __future__ import annotations

from fedcluster_app.core.data.catalogue import lazy_builder
from fedcluster_app.core.strategy_info import StrategyInfo
from fedcluster_app.families.fielding.params import AuxoParams, FieldingParams

_PKG = "fedcluster_app.families.fielding"

FIELDING = StrategyInfo(
    "fielding",
    "Fielding: drifted clients move to the nearest center; global re-clustering "
    "(silhouette K) when a center moves >= tau x mean center distance",
    f"{_PKG}.fielding:Fielding", FieldingParams)
FIELDING_TAU0 = StrategyInfo(
    "fielding-tau0", "Fielding ablation tau = 0: global re-clustering after every drift",
    f"{_PKG}.fielding:FieldingTau0", FieldingParams)
FIELDING_TAUINF = StrategyInfo(
    "fielding-tauinf", "Fielding ablation tau = infinity: per-client moves only, K fixed",
    f"{_PKG}.fielding:FieldingTauInf", FieldingParams)
STATIC_CFL = StrategyInfo(
    "static-cfl", "static CFL: Fielding's clustering once at the start, never updated",
    f"{_PKG}.fielding:StaticCFL", FieldingParams)
AUXO = StrategyInfo(
    "auxo",
    "Auxo-style: sampled clients re-join the cohort with the most similar mean "
    "update every round; cohorts split by 2-means on spread-out updates",
    f"{_PKG}.auxo:Auxo", AuxoParams)

#: the strategies the family registers, in this order
STRATEGIES = [FIELDING, FIELDING_TAU0, FIELDING_TAUINF, STATIC_CFL, AUXO]


def _scenario(name: str, description: str, builder: str, *args: object) -> tuple:
    """``(name, description, builder)``; ``builder`` is a function of scenarios.py that takes
    the name, the description and ``args`` before the build arguments."""
    build = lazy_builder(f"{_PKG}.scenarios:{builder}", name, description, *args)
    return name, description, build


#: (name, one-line description, builder) of every scenario of this family
SCENARIOS = [
    _scenario("labels-small-large", "Fielding small experiment: 10-class mixture, 3 label "
              "groups; 30% of clients move group at 1/3 (small drift), all re-form into 2 groups "
              "at 2/3 (large drift)", "group_scenario", False),
    _scenario("labels-frequent-small", "Fielding: 3 label groups; 2 random clients move to the "
              "next group every step (many small drifts)", "group_scenario", True),
    _scenario("digits-buckets", "Fielding's label-bucket stream on noisy 8x8 digits: 5 buckets "
              "of 2 labels per client, window = 2 buckets, one new bucket per step",
              "bucket_scenario", "digits"),
    _scenario("mixture-buckets", "Fielding's label-bucket stream on a 30-class Gaussian "
              "mixture: each client holds 10 classes in 5 buckets, window = 2 buckets",
              "bucket_scenario", "mixture"),
    _scenario("digits-concept-swap", "Fielding appendix: static 8x8 digits, uniform labels; "
              "half the clients swap two random labels at 1/3 of the steps (concept drift)",
              "swap_scenario"),
]


# Fielding's setup as the benchmarks run it (docs/fielding/README.md; benchmarks/fielding_*.py): local
# SGD on batches of 20, 30% of the clients per round.
PROTOCOLS = {
    name: {"rounds-per-step": 5, "optimizer": "sgd", "lr": 0.3, "local-steps": 5,
           "batch-size": 20, "fraction-train": 0.3}
    for name in ("labels-small-large", "labels-frequent-small")
} | {
    name: {"rounds-per-step": 10, "optimizer": "sgd", "lr": 0.1, "local-steps": 10,
           "batch-size": 20, "fraction-train": 0.3}
    for name in ("digits-buckets", "mixture-buckets")
} | {"digits-concept-swap": {"rounds-per-step": 5, "optimizer": "sgd", "lr": 0.1,
                            "local-steps": 5, "batch-size": 20, "fraction-train": 0.5}}
