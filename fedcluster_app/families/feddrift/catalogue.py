"""The FedDrift family's catalogue, declared without importing its code
(``fedcluster_app/families/__init__.py``): its strategies, and the paper's data, SINE-2,
CIRCLE-2, SEA-2 and SEA-4 (docs/feddrift/README.md, "Data and drift schedules").

Ten clients, ten training steps plus the test-only step 11, on the standard synthetic streams
of the core's catalogue (``core/data/generators.py``: SINE, CIRCLE, SEA) with the authors'
concept matrices: Y (2 concepts, staggered) and F (4 concepts, with recurrence), bundled with
the app (``core/data/feddrift_changepoints.json``).
"""

from __future__ import annotations

from fedcluster_app.core.data.catalogue import ScenarioDef
from fedcluster_app.core.strategy_info import StrategyInfo
from fedcluster_app.families.feddrift.params import BaselineParams, FedDriftParams
from fedcluster_app.families.foundation.params import OracleParams

_PKG = "fedcluster_app.families.feddrift"

FEDDRIFT_EAGER = StrategyInfo(
    "feddrift-eager",
    "FedDrift-Eager: local drift detection, one new cluster per step, no merging",
    f"{_PKG}.feddrift:FedDriftEager", FedDriftParams)
FEDDRIFT = StrategyInfo(
    "feddrift", "FedDrift: local drift detection, one new model per drifted client, merging",
    f"{_PKG}.feddrift:FedDrift", FedDriftParams)
FEDDRIFT_C = StrategyInfo(
    "feddrift-c", "FedDrift-C: FedDrift with at most one new global model per step",
    f"{_PKG}.feddrift:FedDriftC", FedDriftParams)
FEDDRIFT_EAGER_W = StrategyInfo(
    "feddrift-eager-w", "FedDrift-Eager-W: FedDrift-Eager training on the newest batch only",
    f"{_PKG}.feddrift:FedDriftEagerW", FedDriftParams)
FEDDRIFT_W = StrategyInfo(
    "feddrift-w", "FedDrift-W: FedDrift training on the newest batch only",
    f"{_PKG}.feddrift:FedDriftW", FedDriftParams)
OBLIVIOUS = StrategyInfo(
    "oblivious", "FedDrift baseline: one model, FedAvg on all of each client's history",
    f"{_PKG}.baselines:Oblivious")
WINDOW = StrategyInfo(
    "window", "FedDrift baseline: one model, FedAvg on the newest batch only",
    f"{_PKG}.baselines:Window")
WINDOW_2 = StrategyInfo(
    "window-2", "FedDrift baseline: one model, FedAvg on the last two batches",
    f"{_PKG}.baselines:Window2")
ORACLE_T = StrategyInfo(
    "oracle-t", "FedDrift protocol Oracle: one model per true concept, all history",
    f"{_PKG}.baselines:OracleT", OracleParams)
ORACLE_W = StrategyInfo(
    "oracle-w", "FedDrift protocol Oracle-W: one model per true concept, newest batch only",
    f"{_PKG}.baselines:OracleW", OracleParams)
KUE = StrategyInfo(
    "kue", "KUE: 10 models on random feature subspaces, kappa weights, replace the worst",
    f"{_PKG}.baselines:KUE")
IFCA_T = StrategyInfo(
    "ifca-t", "IFCA(T): k models, cluster once per step to the lowest error, all history",
    f"{_PKG}.baselines:IFCAT")
IFCA_W = StrategyInfo(
    "ifca-w", "IFCA-W: k models, every round each client trains its lowest-error one, newest batch",
    f"{_PKG}.baselines:IFCAW", BaselineParams)
WEIGHTED_LINEAR = StrategyInfo(
    "weighted-linear",
    "FedDrift baseline: FedAvg on all history, steps sampled with probability ~ t",
    f"{_PKG}.baselines:WeightedLinear")
WEIGHTED_EXP = StrategyInfo(
    "weighted-exp",
    "FedDrift baseline: FedAvg on all history, steps sampled with probability ~ 2^t",
    f"{_PKG}.baselines:WeightedExp")
ADAPTIVE_FEDAVG = StrategyInfo(
    "adaptive-fedavg", "Adaptive-FedAvg: SGD on the newest batch, lr adapted to the model's drift",
    f"{_PKG}.baselines:AdaptiveFedAvgT", BaselineParams)
CFL = StrategyInfo(
    "cfl", "CFL (Sattler et al.): split clusters by update cosine similarity, all history",
    f"{_PKG}.baselines:CFLT", BaselineParams)
CFL_W = StrategyInfo(
    "cfl-w", "CFL-W: CFL where each client trains on its newest batch only",
    f"{_PKG}.baselines:CFLW", BaselineParams)
DRIFTSURF = StrategyInfo(
    "driftsurf", "DriftSurf: centralised drift detector with stable and reactive models",
    f"{_PKG}.baselines:DriftSurf", BaselineParams)
AUE = StrategyInfo(
    "aue", "AUE: ensemble of up to 5 models on sliding windows, MSE-based weights",
    f"{_PKG}.baselines:AUE")

#: the strategies the family registers, in this order
STRATEGIES = [FEDDRIFT_EAGER, FEDDRIFT, FEDDRIFT_C, FEDDRIFT_EAGER_W, FEDDRIFT_W, OBLIVIOUS, WINDOW,
              WINDOW_2, ORACLE_T, ORACLE_W, KUE, IFCA_T, IFCA_W, WEIGHTED_LINEAR, WEIGHTED_EXP,
              ADAPTIVE_FEDAVG, CFL, CFL_W, DRIFTSURF, AUE]

#: the family's scenarios (entries of the core's standard catalogue)
SCENARIOS = [
    ScenarioDef("sine2", "SINE-2 (FedDrift): y = [x2 <= sin(x1)], concept B flips the labels; "
                "staggered 2-concept schedule Y", "sine", "", "Y", num_steps=11, drift_step=4),
    ScenarioDef("circle2", "CIRCLE-2 (FedDrift): inside/outside a circle that moves and grows; "
                "staggered 2-concept schedule Y", "circle", "", "Y", num_steps=11, drift_step=4),
    ScenarioDef("sea2", "SEA-2 (FedDrift): y = [x1 + x2 <= 9 (A) / 8 (B)], 10% label noise; "
                "schedule Y", "sea", "2", "Y", num_steps=11, drift_step=4),
    ScenarioDef("sea4", "SEA-4 (FedDrift): thresholds 9, 8, 7, 9.5, 10% label noise; 4-concept "
                "schedule F with recurrence", "sea", "4", "F", num_steps=11, drift_step=4),
    # SEA as the FedDrift authors' data files are (docs/feddrift/README.md, "SEA as the authors' files")
    ScenarioDef("sea2-authors", "SEA-2 as the FedDrift authors' data files: thresholds 8 (A) / 9 "
                "(B), 10% label noise; schedule Y", "sea", "2-authors", "Y", num_steps=11,
                drift_step=4),
    ScenarioDef("sea4-authors", "SEA-4 as the FedDrift authors' data files: thresholds 8, 9, 7, 9 "
                "(B = D: three distinct concepts), 10% label noise; schedule F", "sea",
                "4-authors", "F", num_steps=11, drift_step=4),
]


# The FedDrift paper's setup on its synthetic streams (docs/feddrift/README.md; benchmarks/
# feddrift_reproduce.py): R = 100 rounds per time step of K = 50 local Adam steps on batches of
# 50, lr 0.01 with L2 0.001, and as many clusters as the stream has concepts.
_PAPER = {"rounds-per-step": 100, "local-steps": 50, "batch-size": 50, "optimizer": "adam",
          "lr": 0.01, "weight-decay": 0.001}
PROTOCOLS = {name: {**_PAPER, "num-clusters": k}
             for name, k in (("sine2", 2), ("circle2", 2), ("sea2", 2), ("sea4", 4),
                             ("sea2-authors", 2), ("sea4-authors", 4))}
