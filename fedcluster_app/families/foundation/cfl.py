"""CFL: clusters split recursively where the clients' updates disagree.

"Clustered Federated Learning: Model-Agnostic Distributed Multitask Optimization Under Privacy
Constraints", Sattler, Müller, Samek, IEEE TNNLS 2020, https://arxiv.org/abs/1910.01991.

One cluster at first; every round each client trains its cluster's model. With Delta_c the
updates of one cluster's clients, the cluster splits when

    ||mean_c Delta_c|| < eps1   and   max_c ||Delta_c|| > eps2

(it has converged on average but not individually): its clients are bipartitioned by
complete-linkage clustering of the pairwise cosine similarities of their updates, and the split
is made if sqrt((1 - alpha_cross) / 2) > gamma, alpha_cross being the largest similarity across
the two groups. The new cluster starts as a copy of its parent's model. With eps1 = 0 the
thresholds follow the FedDrift authors' heuristic (docs/foundation/README.md D3): eps1 = (largest
mean-update norm seen so far) / 10, eps2 = 6 eps1, tested only in rounds where the mean norm is
not a new maximum.

One implementation, two protocols: ``cfl-rounds`` / ``cfl3-rounds`` on plain rounds (the FedRC
paper's baselines: the cluster is averaged, then split if it has more than two members, up to
``max-clusters``) and ``cfl`` / ``cfl-w`` under FedDrift's time-step protocol (a splitting
cluster skips that round's aggregation, as in the FedDrift authors' code; a client's past
batches move with it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import squareform

from fedcluster_app.core.server.strategy import ClusteredStrategy, Reply
from fedcluster_app.families.foundation import catalogue


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


class CFL(ClusteredStrategy):
    """CFL (module docstring)."""

    name, description, Params = catalogue.CFL_ROUNDS.class_attributes()
    #: average a cluster before testing it for a split (False: a split skips the round's average)
    aggregate_before_split: ClassVar[bool] = True
    #: fewest clients that trained a cluster in a round for it to be tested for a split
    min_split_members: ClassVar[int] = 3
    #: under the time-step protocol a client's past batches move with it to a new cluster
    history_follows_client: ClassVar[bool] = True

    def __init__(self, experiment) -> None:
        super().__init__(experiment)
        gamma, eps1, eps2, self.max_clusters = self.split_settings()
        self.splitter = CFLSplitter(gamma=gamma, eps1=eps1, eps2=eps2)
        self.splits: list[list[int]] = []          # [round, parent, child, *moved clients]
        self._reported = 0                         # splits already in metrics.jsonl

    def split_settings(self) -> tuple[float, float | None, float | None, int]:
        """(gamma, eps1, eps2, max clusters); None thresholds: the heuristic."""
        p = self.params
        return p.gamma, p.eps1 or None, p.eps2 or None, p.max_clusters

    def on_train_replies(self, step: int, replies: list[Reply]) -> None:
        for mid in sorted({m for r in replies for m in r.models}):
            rs = [r for r in replies if mid in r.models]
            base = flatten(self.models[mid])
            updates = np.stack([flatten(r.models[mid]) - base for r in rs])
            average = self.aggregate(
                [(r.models[mid], float(r.model_metrics.get(mid, {}).get("num-examples",
                                                                        r.num_examples)))
                 for r in rs])
            if self.aggregate_before_split:
                self.models[mid] = average
            capped = self.max_clusters and len(self.models) >= self.max_clusters
            split = (None if len(rs) < self.min_split_members or capped
                     else self.splitter.propose(updates))
            if split is not None:
                child = self.new_model([a.copy() for a in self.models[mid]])
                moved = [rs[i].cid for i in split[1]]
                for cid in moved:
                    self.assign(cid, child)
                self.splits.append([self.round, mid, child, *moved])
            elif not self.aggregate_before_split:
                self.models[mid] = average

    def round_metrics(self) -> dict[str, Any]:
        """Splits since the last report (every round, or every time step)."""
        out = {"splits": len(self.splits) - self._reported}
        self._reported = len(self.splits)
        return out

    def summary_extra(self) -> dict[str, Any]:
        return {"splits": self.splits}

    def strategy_state(self) -> dict[str, Any]:
        return {"splits": self.splits, "max_mean_norm": self.splitter.max_mean_norm,
                "reported": self._reported}

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        self.splits = [list(s) for s in state["splits"]]
        self.splitter.max_mean_norm = float(state["max_mean_norm"])
        self._reported = int(state["reported"])


class CFL3(CFL):
    name, description, Params = catalogue.CFL3_ROUNDS.class_attributes()
