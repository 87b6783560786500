"""The FlexCFL family's typed hyper-parameters: the paper protocol's own keys, the label-shift
test's, and one table per strategy of the comparison, apart from the strategies so that the
catalogue reads them without importing torch or Flower."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedcluster_app.core.config import ConfigError
from fedcluster_app.core.hparams import HParams, param
from fedcluster_app.core.limits import MAX_CLIENTS, MAX_CLUSTERS, MAX_ITERATIONS

SELECTIONS = ("paper", "fraction")
EVAL_MODELS = ("current_group", "last_received")
SHIFT_METRICS = ("scipy_counts", "tv")


@dataclass(frozen=True)
class SelectionParams(HParams):
    """The protocol's own keys, in every FlexCFL-comparison table."""

    clients_per_round: int = param(20, "K, clients selected per round", ge=1,
                                   le=MAX_CLIENTS)
    selection: str = param("paper", "paper: round-robin for N/K rounds, then "
                           "random.sample seeded t + seed | fraction: fraction-train",
                           choices=SELECTIONS)


def eval_model_param() -> Any:
    return param("current_group", "current_group | last_received: each client tested with the "
                 "model it last trained from (w0 if none)", choices=EVAL_MODELS)


def score_both_param() -> Any:
    return param(False, "also test every evaluated client under the other eval-model: "
                 "accuracy_<rule> and weighted_accuracy_<rule> for both rules in metrics.jsonl")


@dataclass(frozen=True)
class ShiftParams(HParams):
    shift_metric: str = param("scipy_counts", "scipy_counts (the paper's code: Wasserstein of "
                              "the count vectors) | tv (label-aware)", choices=SHIFT_METRICS)
    shift_threshold: float = param(0.2, "tau = this x n_orig / C for scipy_counts; the total "
                                   "variation threshold for tv", ge=0)


@dataclass(frozen=True)
class FedGroupParams(SelectionParams):
    table = "fedgroup"
    num_groups: int = param(0, "m, the number of groups; 0 = the run's num-clusters", ge=0,
                           le=MAX_CLUSTERS)
    pretrain_scale: int = param(0, "alpha: alpha x m clients pre-train for the group cold start "
                                "(error if > N); 0 = the paper's 20, capped at N", ge=0,
                                le=MAX_CLIENTS)
    pretrain_iters: int = param(50, "SGD minibatch steps of a pre-training from w0 (the run's "
                                "batch-size and lr)", ge=1, le=MAX_ITERATIONS)
    eta_g: float = param(0.0, "inter-group aggregation rate (0 = none; paper: 0.1 no shift, "
                         "5.0 shift)", ge=0)
    group_init: str = param("pretrained", "group models start at w0 + mean member update "
                            "(pretrained) | at w0", choices=("pretrained", "w0"))
    cold_start: str = param("lazy", "lazy: a newcomer is cold-started when first selected | "
                            "eager: all at once", choices=("lazy", "eager"))
    measure: str = param("edc", "group cold start: edc (SVD + k-means++) | madc (full cosine "
                         "matrix, MADC, complete-linkage agglomerative)",
                         choices=("edc", "madc"), lower=True)
    rcc: bool = param(False, "RCC ablation: no SVD / clustering; m random pre-trained clients "
                      "are the group centres")
    rac: bool = param(False, "RAC ablation: newcomers and migrants join a uniformly random "
                      "group (seeded)")
    eval_model: str = eval_model_param()
    score_both: bool = score_both_param()

    def check(self) -> None:
        if self.rcc and self.measure != "edc":
            raise ConfigError(f"{self.table}.measure = {self.measure!r} has no use with "
                              f"{self.table}.rcc = true (RCC forms no clusters); set one of them")


@dataclass(frozen=True)
class FlexCFLParams(ShiftParams, FedGroupParams):
    table = "flexcfl"
    migration: bool = param(True, "re-cold-start warm clients whose label counts shifted past "
                            "the threshold")


@dataclass(frozen=True)
class FeSEMParams(SelectionParams):
    table = "fesem"
    num_groups: int = param(0, "m, the number of centres; 0 = the run's num-clusters", ge=0,
                           le=MAX_CLUSTERS)
    weighted: bool = param(False, "false: unweighted mean per centre (the paper); true: by "
                           "num-examples")
    init: str = param("w0", "a client without a local model: nearest to w0 | min-loss: the "
                      "centre of lowest loss (FedRC's FeSEM)", choices=("w0", "min-loss"))
    eval_model: str = eval_model_param()
    score_both: bool = score_both_param()


@dataclass(frozen=True)
class FeSEMMigParams(ShiftParams, FeSEMParams):
    table = "fesem-mig"


@dataclass(frozen=True)
class FlexIFCAParams(SelectionParams):
    table = "flexcfl-ifca"
    num_groups: int = param(0, "m, the number of models; 0 = the run's num-clusters", ge=0,
                           le=MAX_CLUSTERS)
    weighted: bool = param(False, "false: unweighted mean per model (the paper); true: by "
                           "num-examples")
    eval_model: str = eval_model_param()
    score_both: bool = score_both_param()


@dataclass(frozen=True)
class FlexIFCAMigParams(ShiftParams, FlexIFCAParams):
    table = "flexcfl-ifca-mig"


@dataclass(frozen=True)
class FlexFedAvgParams(SelectionParams):
    table = "flexcfl-fedavg"
