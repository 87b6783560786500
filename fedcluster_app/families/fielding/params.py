"""The Fielding family's typed hyper-parameters (the server reads them from the run config;
clients read ``malicious-fraction`` through the same class), apart from the strategies so that
the catalogue reads them without importing torch or Flower."""

from __future__ import annotations

from dataclasses import dataclass

from fedcluster_app.core.config import ConfigError
from fedcluster_app.core.hparams import HParams, param
from fedcluster_app.core.limits import (MAX_CLIENTS, MAX_CLUSTERS, MAX_ITERATIONS, MAX_RESTARTS,
                                        MAX_SAMPLES)

METRICS = ("l1", "js", "sqeuclidean", "cosine")
TRIGGERS = ("center_shift", "pairwise", "either")
SHIFT_REFERENCES = ("step", "last_global")
REPRESENTATIONS = ("label", "embedding", "gradient")
DEFAULT_METRIC = {"label": "l1", "embedding": "sqeuclidean", "gradient": "cosine"}


@dataclass(frozen=True)
class FieldingParams(HParams):
    """Fielding's hyper-parameters (one table for fielding, its ablations and static CFL)."""

    table = "fielding"
    rep: str = param("label", "client representation", choices=REPRESENTATIONS)
    distance: str = param("", "\"\" = the representation's default: l1 (label), sqeuclidean "
                          "(embedding), cosine (gradient); js for label",
                          choices=("",) + METRICS)
    eps_drift: float = param(0.0, "client drift test: rho(r_now, r_last) > eps-drift "
                             "(0 = any change)", ge=0)
    tau: float = param(1 / 3, "re-cluster when a center moves >= tau x mean center distance "
                       "(inf = never)", ge=0, allow_inf=True)
    trigger: str = param("center_shift", "center_shift | pairwise (diameter > adaptive Delta) "
                         "| either", choices=TRIGGERS)
    delta_start: float = param(0.1, "pairwise trigger: Delta starts (and floors) at this value "
                               "(0 = 0.1)", ge=0)
    shift_reference: str = param("step", "centers the shift is measured against",
                                 choices=SHIFT_REFERENCES)
    k_min: int = param(2, "smallest K of the silhouette search (the silhouette needs two "
                       "clusters: use min-silhouette for K = 1; at most N - 1)", ge=2,
                       le=MAX_CLUSTERS)
    k_max: int = param(10, "largest K of the silhouette search (capped at N - 1)", ge=1,
                       le=MAX_CLUSTERS)
    n_init: int = param(10, "k-means++ restarts per K", ge=1, le=MAX_RESTARTS)
    n_keep: int = param(2, "l1 from 1,000 clients: only the n-keep restarts of lowest cost "
                        "after 3 Lloyd iterations run on (0 = all)", ge=0, le=MAX_RESTARTS)
    adjust: str = param("drifted", "drifted clients acted on: drifted (all, sampled or not) | "
                        "sampled (ablation: only once sampled)", choices=("drifted", "sampled"))
    min_silhouette: float = param(-1.0, "best silhouette below this -> K = 1 (-1 = off)",
                                  ge=-1, le=1)
    participants: int = param(0, "M clients trained per round over all clusters; 0 = "
                              "fraction-train x N", ge=0, le=MAX_CLIENTS)
    budget: str = param("floor", "per-cluster share of M: floor (M/K each, rest to the largest) "
                        "| proportional", choices=("floor", "proportional"))
    aggregation: str = param("uniform", "cluster model = uniform mean of its trained clients | "
                             "samples (FedAvg weights)", choices=("uniform", "samples"))
    grad_layers: str = param("last", "gradient representation: last (classifier) | all layers "
                             "of the probe", choices=("last", "all"))
    probe_steps: int = param(300, "Adam steps that train the shared probe model centrally", ge=0,
                             le=MAX_ITERATIONS)
    probe_per_class: int = param(50, "central probe set: samples per class from the clients' "
                                 "first step", ge=1, le=MAX_SAMPLES)
    label_tol: float = param(0.001, "a reported label vector must sum to 1 within this", ge=0)
    log_moves: int = param(100, "moves listed per round in metrics.jsonl (all are counted)",
                           ge=0, le=MAX_CLIENTS)
    malicious_fraction: float = param(0.0, "test hook: this fraction of clients permute their "
                                      "registration vector", ge=0, le=1)

    def check(self) -> None:
        if self.k_max < self.k_min:
            raise ConfigError(f"the K range fielding.k-min..k-max = {self.k_min}..{self.k_max} "
                              "is empty")
        if self.distance == "js" and self.rep != "label":
            raise ConfigError("fielding.distance = 'js' needs probability vectors: use it with "
                              "fielding.rep = 'label'")

    @property
    def metric(self) -> str:
        return self.distance or DEFAULT_METRIC[self.rep]

    @property
    def delta_floor(self) -> float:
        return self.delta_start if self.delta_start > 0 else 0.1


@dataclass(frozen=True)
class AuxoParams(HParams):
    table = "auxo"
    participants: int = param(0, "M clients trained per round over all cohorts; 0 = "
                              "fraction-train x N", ge=0, le=MAX_CLIENTS)
    split_threshold: float = param(0.5, "split a cohort when its participants' mean cosine "
                                   "distance to their mean update exceeds this", ge=0, le=2)
    min_split: int = param(4, "participants a cohort needs in a round to be split", ge=2,
                           le=MAX_CLIENTS)
    max_cohorts: int = param(10, "never more cohorts than this", ge=1, le=MAX_CLUSTERS)
    split_every: int = param(1, "try splitting every N rounds", ge=1)
