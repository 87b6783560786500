"""Auxo-style baseline: continuous re-clustering of the clients sampled for training.

"Auxo: Efficient Federated Learning via Scalable Client Clustering", Liu, Lai, Dai, Akella,
Madhyastha, Chowdhury, ACM SoCC 2023, https://arxiv.org/abs/2210.16656. The Fielding paper
compares against it; this is the simplified form of docs/fielding/README.md, D20.

Re-clustering uses only the sampled clients' training outputs (no extra communication). It
starts with one cohort. After each round, with S_k the participants of cohort k (model w_k) and
w_i participant i's trained copy:

    dw_i = w_i - w_k                               participant i's update
    w_k <- (1/|S_k|) sum_{i in S_k} w_i            uniform averaging
    u_k  = (1/|S_k|) sum_{i in S_k} dw_i           the cohort's mean update

then, every ``split-every`` rounds, a cohort of at least ``min-split`` participants whose
updates are spread out, mean_{i in S_k} (1 - cos(dw_i, v_k)) > ``split-threshold`` with v_k the
mean of the unit updates, is split in two by 2-means on the update directions (up to
``max-cohorts``; the new cohort starts from a copy of the cohort's model, each half gets its own
u_k); finally every participant re-joins the cohort of most similar mean update,

    k(i) <- argmax_k cos(dw_i, u_k)

and a cohort left without members is deleted. Drifted clients that were not sampled keep stale
assignments; every sampled client may be reassigned every round (the churn the Fielding paper
describes). Training uses the same per-cohort budget as Fielding (floor(M/K) sampled members per
cohort). Hyper-parameters: ``[tool.flwr.app.config.auxo]``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fedcluster_app.core.server.strategy import (
    ClusteredStrategy,
    Reply,
    Task,
)
from fedcluster_app.families.fielding import catalogue
from fedcluster_app.families.fielding.distances import Points
from fedcluster_app.families.fielding.fielding import sample_clusters, split_budget
from fedcluster_app.families.fielding.kmeans import kmeans


def _flat(weights: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in weights])


def _unit(v: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(v)
    return v / n if n > 0 else v


class Auxo(ClusteredStrategy):
    name, description, Params = catalogue.AUXO.class_attributes()


    def __init__(self, experiment) -> None:
        super().__init__(experiment)
        self.mean_update: dict[int, np.ndarray] = {}
        self.splits = 0
        self.events: dict[str, Any] = {}

    def plan_train(self, step: int) -> dict[int, Task]:
        self.events = {}
        sizes = {m: len(self.members(m)) for m in self.clusters_in_use()}
        n = sum(sizes.values())
        total = self.params.participants or max(1, math.ceil(self.cfg.fraction_train * n))
        return sample_clusters(self, split_budget(sizes, total, "floor"))

    def on_train_replies(self, step: int, replies: list[Reply]) -> None:
        updates: dict[int, np.ndarray] = {}
        by_cohort: dict[int, list[int]] = {}
        for r in replies:
            for mid, w in r.models.items():
                updates[r.cid] = _flat(w) - _flat(self.models[mid])
                by_cohort.setdefault(mid, []).append(r.cid)
        for mid, items in self.collect_updates(replies).items():
            self.models[mid] = self.aggregate([(w, 1.0) for w, _ in items])
            self.mean_update[mid] = np.mean([updates[c] for c in by_cohort[mid]], axis=0)
        if self.round % self.params.split_every == 0:
            for mid in sorted(by_cohort):
                if len(self.models) >= self.params.max_cohorts:
                    break
                self.maybe_split(mid, by_cohort[mid], updates)
        # every participant joins the cohort whose mean update is most similar to its own
        ids = sorted(m for m in self.mean_update if m in self.models)
        moves = 0
        if len(ids) > 1:
            means = np.stack([_unit(self.mean_update[m]) for m in ids])
            for cid in sorted(updates):
                best = ids[int(np.argmax(means @ _unit(updates[cid])))]
                if self.clients[cid].cluster != best:
                    self.assign(cid, best)
                    moves += 1
        for mid in list(self.models):
            if len(self.models) > 1 and not self.members(mid):
                self.delete_model(mid)
                self.mean_update.pop(mid, None)
        self.events.update(auxo_moves=moves, auxo_splits=self.splits)

    def maybe_split(self, mid: int, cids: list[int], updates: dict[int, np.ndarray]) -> None:
        if len(cids) < self.params.min_split:
            return
        vecs = np.stack([_unit(updates[c]) for c in cids])
        center = _unit(vecs.mean(0))
        spread = float(np.mean(1.0 - vecs @ center))
        if spread <= self.params.split_threshold:
            return
        pts = Points(vecs, "cosine")
        res = kmeans(pts, 2, 3, np.random.default_rng([self.cfg.seed, self.round, mid]))
        if len(res.centers) < 2:
            return
        new = self.new_model([a.copy() for a in self.models[mid]])
        half = [c for c, lab in zip(cids, res.labels) if lab == 1]
        for c in half:
            self.assign(c, new)
        self.mean_update[new] = np.mean([updates[c] for c in half], axis=0)
        self.mean_update[mid] = np.mean([updates[c] for c, lab in zip(cids, res.labels) if lab == 0],
                                        axis=0)
        self.splits += 1

    def round_metrics(self) -> dict[str, Any]:
        return dict(self.events)

    def strategy_state(self) -> dict[str, Any]:
        return {"mean_update": {str(k): v.tolist() for k, v in self.mean_update.items()},
                "splits": self.splits}

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        self.mean_update = {int(k): np.asarray(v) for k, v in state["mean_update"].items()}
        self.splits = int(state["splits"])
