"""Clustered Federated Learning (Sattler et al.): the splitting rule, written once for reuse.

After a round, a cluster whose clients have (almost) converged on average but not individually
(mean update norm < eps1 and largest update norm > eps2) is bipartitioned by complete-linkage
clustering of the pairwise cosine similarities of the clients' updates; the split is made if
sqrt((1 - alpha_cross) / 2) > gamma, alpha_cross being the largest similarity across the two
groups. ``CFLSplitter`` holds the thresholds: fixed eps1/eps2, or the FedDrift reference-code
heuristic eps1 = (largest mean-update norm seen so far) / 10, eps2 = 6 eps1, tested only in
rounds where the mean norm is not a new maximum (feddrift.md section 4.4).

Used by the FedDrift baselines ``cfl`` / ``cfl-w`` (``feddrift_baselines``); usable by any
strategy that has the clients' updates of one cluster as flat vectors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import squareform


def flatten(weights: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in weights])


def pairwise_cosine(updates: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(updates, axis=1, keepdims=True)
    unit = updates / np.maximum(norms, 1e-12)
    return np.clip(unit @ unit.T, -1.0, 1.0)


def bipartition(similarity: np.ndarray) -> tuple[list[int], list[int]]:
    """Two groups by complete-linkage agglomerative clustering on the distance 1 - similarity."""
    n = len(similarity)
    if n < 2:
        raise ValueError("bipartition needs at least 2 clients")
    dist = 1.0 - similarity
    np.fill_diagonal(dist, 0.0)
    labels = fcluster(linkage(squareform(np.maximum(dist, 0.0), checks=False), "complete"),
                      2, criterion="maxclust")
    a = [i for i in range(n) if labels[i] == labels[0]]
    b = [i for i in range(n) if labels[i] != labels[0]]
    return a, b


@dataclass
class CFLSplitter:
    gamma: float = 0.1
    eps1: float | None = None          # None: the reference-code heuristic
    eps2: float | None = None
    max_mean_norm: float = 0.0

    def propose(self, updates: np.ndarray) -> tuple[list[int], list[int]] | None:
        """Rows of ``updates`` are the clients' flat updates of one cluster in one round; returns
        the two groups (row indices) if the cluster should split, else None."""
        if len(updates) < 2:
            return None
        mean_norm = float(np.linalg.norm(updates.mean(axis=0)))
        max_norm = float(np.linalg.norm(updates, axis=1).max())
        if self.eps1 is None:
            if mean_norm > self.max_mean_norm:
                self.max_mean_norm = mean_norm
                return None
            eps1 = self.max_mean_norm / 10.0
            eps2 = 6.0 * eps1
        else:
            eps1, eps2 = self.eps1, self.eps2 if self.eps2 is not None else 6.0 * self.eps1
        if not (mean_norm < eps1 and max_norm > eps2):
            return None
        sim = pairwise_cosine(updates)
        a, b = bipartition(sim)
        if not b:
            return None
        alpha_cross = float(sim[np.ix_(a, b)].max())
        if np.sqrt((1.0 - alpha_cross) / 2.0) > self.gamma:
            return a, b
        return None


# ------------------------------------------------------------------ CFL on the round loop
# (the FedDrift family's ``cfl`` runs the time-step protocol: train on step t, test on t + 1;
# the FedRC comparisons need plain rounds over a static population with held-out clients.)
from typing import Any, ClassVar  # noqa: E402

from fedcluster_app.core.config import ConfigError  # noqa: E402
from fedcluster_app.core.strategy import ClusteredStrategy, Reply, weighted_average  # noqa: E402


class RoundCFL(ClusteredStrategy):
    """CFL (Sattler et al.) as the FedRC paper runs it (spec ``fedrc.md`` 6): one cluster at
    first; every round each client trains its cluster's model, the cluster model becomes the
    N_c-weighted average, and a cluster with more than 2 members whose mean update is small
    (< eps1) while some update is large (> eps2) splits in two by complete linkage on the
    cosine similarities of the updates, up to ``max-clusters`` (0 = no cap)."""

    name = "cfl-rounds"
    description = "CFL (Sattler et al.) on plain rounds: recursive bi-partitioning, no cap"
    HPARAMS: ClassVar[dict[str, Any]] = {"eps1": 0.0, "eps2": 0.0, "gamma": 0.0,
                                         "max-clusters": 0}

    def __init__(self, experiment) -> None:
        super().__init__(experiment)
        self.hp = self.checked_hparams(self.HPARAMS)
        for key in ("eps1", "eps2", "gamma"):
            v = self.hp[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
                raise ConfigError(f"{self.name}.{key} must be a number >= 0, got {v!r}")
        cap = self.hp["max-clusters"]
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
            raise ConfigError(f"{self.name}.max-clusters must be an integer >= 0 (0 = no cap), "
                              f"got {cap!r}")
        eps1 = float(self.hp["eps1"]) or None      # 0: the reference-code heuristic
        self.splitter = CFLSplitter(gamma=float(self.hp["gamma"]), eps1=eps1,
                                    eps2=float(self.hp["eps2"]) or None)
        self.splits: list[list[int]] = []          # [round, parent, child, *moved clients]

    def on_train_replies(self, step: int, replies: list[Reply]) -> None:
        for mid in sorted({m for r in replies for m in r.models}):
            rs = [r for r in replies if mid in r.models]
            base = flatten(self.models[mid])
            updates = np.stack([flatten(r.models[mid]) - base for r in rs])
            self.models[mid] = weighted_average(
                [(r.models[mid], float(r.model_metrics.get(mid, {}).get("num-examples", r.num_examples)))
                 for r in rs])
            cap = int(self.hp["max-clusters"])
            if len(rs) <= 2 or (cap and len(self.models) >= cap):
                continue
            split = self.splitter.propose(updates)
            if split is not None:
                child = self.new_model([a.copy() for a in self.models[mid]])
                moved = [rs[i].cid for i in split[1]]
                for cid in moved:
                    self.assign(cid, child)
                self.splits.append([self.round, mid, child, *moved])

    def round_metrics(self) -> dict[str, Any]:
        return {"splits": sum(1 for s in self.splits if s[0] == self.round)}

    def summary_extra(self) -> dict[str, Any]:
        return {"splits": self.splits}

    def strategy_state(self) -> dict[str, Any]:
        return {"splits": self.splits, "max_mean_norm": self.splitter.max_mean_norm}

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        self.splits = [list(s) for s in state["splits"]]
        self.splitter.max_mean_norm = float(state["max_mean_norm"])


class RoundCFL3(RoundCFL):
    name = "cfl3-rounds"
    description = "CFL(3) on plain rounds: recursive bi-partitioning, at most 3 clusters"
    HPARAMS: ClassVar[dict[str, Any]] = {**RoundCFL.HPARAMS, "max-clusters": 3}
