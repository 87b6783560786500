"""FlexCFL and FedGroup: group cold start, newcomer cold start, migration, inter-group
aggregation.

FlexCFL: "Flexible Clustered Federated Learning for Client-Level Data Distribution Shift",
Duan, Liu, Ji, Wu, Liang, Chen, Tan, Ren, IEEE TPDS 2022, https://arxiv.org/abs/2108.09749.
FedGroup: "FedGroup: Efficient Clustered Federated Learning via Decomposed Data-Driven
Measure", Duan et al., ISPA 2021, https://arxiv.org/abs/2010.06870.

* Group cold start (once): alpha x m clients pre-train from w0; the truncated SVD of their
  un-centred update matrix gives the EDC embedding (the cosine of each update to the m leading
  directions), k-means++ makes m groups; group g's direction dw0_g is the mean of its members'
  updates and its model w0 + dw0_g (``group-init = "pretrained"``). Options: MADC + complete
  linkage (``measure = "madc"``), RCC (m random pre-trained clients are the centres), RAC
  (newcomers and migrants join a random group).
* Client cold start: a newcomer (when first selected, ``cold-start = "lazy"``) pre-trains from
  w0 and joins argmin_g (1 - cos(dw0_g, dw)) / 2 over the fixed directions.
* Migration (FlexCFL, not FedGroup): a warm client whose label counts moved past the threshold
  is cold-started again (``migration.py``).
* Aggregation: intra-group FedAvg, then w_j = sum_l a_jl w_l / sum_l a_jl with a_jj = 1,
  a_jl = eta_g / ||w_l|| (``eta-g`` = 0: none).

Both run under the paper's protocol (``protocol.py``: selection, accounting, scoring). Every
round reports ``newcomers``, ``shift_cold_starts``, ``migrations`` and ``group_sizes``; the
choices where the paper is silent: docs/flexcfl/README.md.
"""

from __future__ import annotations

from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.common.logger import log
from flwr.serverapp import Grid

from fedcluster_app.core import wire as P
from fedcluster_app.core.config import ConfigError
from fedcluster_app.core.limits import ModelCount
from fedcluster_app.core.server.strategy import ClusteredStrategy, Reply, Task
from fedcluster_app.families.flexcfl import catalogue
from fedcluster_app.families.flexcfl.grouping import (
    cosine,
    cosine_matrix,
    decode,
    edc_embedding,
    edc_kmeans,
    encode,
    flatten,
    inter_group_aggregate,
    madc_cluster,
    madc_matrix,
    rac_group,
    unflatten,
)
from fedcluster_app.families.flexcfl.migration import ShiftCheck
from fedcluster_app.families.flexcfl.protocol import (
    PaperProtocol,
    num_groups,
    num_groups_key,
)
from fedcluster_app.families.flexcfl.wire import PRETRAIN_ITERS, QUERY_PRETRAIN


class FlexCFL(ClusteredStrategy):
    name, description, Params = catalogue.FLEXCFL.class_attributes()
    MIGRATION = True
    protocol_factory = PaperProtocol

    def __init__(self, experiment) -> None:
        super().__init__(experiment)
        p = self.params
        n = self.exp.scenario.num_clients
        self.m = num_groups(self)
        self.rcc, self.rac, self.measure = p.rcc, p.rac, p.measure
        alpha = p.pretrain_scale
        if self.rcc:
            self.n_pre = self.m                # RCC: m random pre-trained clients
        elif alpha:
            self.n_pre = alpha * self.m
            if self.n_pre > n:
                raise ConfigError(
                    f"{p.table}.pretrain-scale x num-groups (alpha x m = {alpha} x {self.m} = "
                    f"{self.n_pre}) is larger than the number of clients ({n})")
        else:
            self.n_pre = min(20 * self.m, n)   # the paper's alpha = 20, capped at N
        if self.rac and self.n_pre >= n:
            log(WARNING, "%s.rac: alpha x m = %d >= N = %d, so there is no newcomer to assign at "
                "random (docs/flexcfl/README.md, D20); only migrants are", p.table, self.n_pre, n)
        self.pretrain_iters, self.eta_g = p.pretrain_iters, p.eta_g
        self.migration = getattr(p, "migration", False) and self.MIGRATION
        self.group_init, self.cold_mode = p.group_init, p.cold_start
        self.shifts = ShiftCheck(self)
        self.group_ids: list[int] = []
        self.w0_id: int | None = None
        self.directions: dict[int, np.ndarray] = {}     # fixed after the group cold start
        self.grouped = False
        self.pre_clients: list[int] = []
        self.pre_labels: list[int] = []
        self.embedding: np.ndarray | None = None        # M_d (edc) or the MADC matrix (madc)
        self.totals = {"newcomers": 0, "shift_cold_starts": 0, "migrations": 0,
                       "pretrain_left_out": 0}
        self._round = dict.fromkeys(self.totals, 0)
        self._shifted: list[int] = []

    # -- set-up
    def common_init_model(self) -> int | None:
        return self.w0_id

    def model_count(self) -> ModelCount:
        return ModelCount(self.m, self.m, num_groups_key(self))   # migration: all, to a shifted

    def on_start(self) -> None:
        # group models first (ids 0..m-1, so m = 1 trains model 0 as fedavg does), then w0
        w0 = self.initial_weights()
        self.group_ids = [self.new_model([a.copy() for a in w0]) for _ in range(self.m)]
        self.w0_id = self.new_model(w0)
        self.shifts.note_sizes()

    def on_new_client(self, cid: int) -> None:
        self.shifts.note_sizes([cid])   # cold until selected

    def before_round(self, grid: Grid, step: int, new_step: bool) -> None:
        if not self.grouped:
            self.group_cold_start(grid)
        if self.migration:
            self.check_shifts(grid)
        selected = self.protocol.selected
        if self.cold_mode == "eager":
            cold = [c for c in sorted(self.clients) if self.clients[c].cluster is None]
        else:
            cold = [c for c in selected if self.clients[c].cluster is None]
        if cold:
            self.cold_start(grid, cold, "newcomers")

    # -- pre-training
    def _pretrain(self, grid: Grid, cids: list[int]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """cid -> (flattened update from w0, label counts); bad updates are left out, logged."""
        replies = self.query(grid, QUERY_PRETRAIN, cids, models=[self.w0_id],
                             config={PRETRAIN_ITERS: self.pretrain_iters})
        w0 = flatten(self.models[self.w0_id])
        out = {}
        for cid in cids:
            r = replies.get(cid)
            if r is None or self.w0_id not in r.models:
                why = ("missing or rejected (e.g. non-finite values)" if r is None
                       else "empty: no training data")
                log(WARNING, "round %d: %s: pre-training update of client %d %s; left out of "
                    "the SVD / cold start", self.round, self.name, cid, why)
                self._count("pretrain_left_out")
                continue
            delta = flatten(r.models[self.w0_id]) - w0
            if not np.all(np.isfinite(delta)):
                log(WARNING, "round %d: %s: pre-training update of client %d is not finite; "
                    "left out of the SVD / cold start", self.round, self.name, cid)
                self._count("pretrain_left_out")
                continue
            counts = np.asarray(r.metrics.get(P.HISTOGRAM, []), dtype=np.int64)
            self.shifts.last_counts[cid] = int(counts.sum())
            out[cid] = (delta, counts)
        return out

    def group_cold_start(self, grid: Grid) -> None:
        """The paper's Algorithm 3, once, as a pre-round exchange (docs/flexcfl/README.md, D23): EDC +
        k-means++, or MADC + complete-linkage agglomerative clustering (``measure``), or RCC
        (``rcc``)."""
        self.grouped = True
        cids = sorted(self.clients)
        rng = np.random.default_rng([self.cfg.seed, 0xF1E7])  # not self.rng: selection uses it
        n_pre = min(self.n_pre, len(cids))
        self.pre_clients = sorted(int(c) for c in rng.choice(cids, size=n_pre, replace=False))
        updates = self._pretrain(grid, self.pre_clients)
        if len(updates) < len(self.pre_clients):
            log(WARNING, "%s: %d of %d pre-training updates left out of the %s", self.name,
                len(self.pre_clients) - len(updates), len(self.pre_clients),
                "random centres" if self.rcc else "SVD")
        if self.rcc:
            # RCC: the j-th drawn client (by id) is group j's centre; no SVD, no clustering
            members_of = {gid: [c] for gid, c in zip(self.group_ids, self.pre_clients)
                          if c in updates}
            self.pre_clients = [c for c in self.pre_clients if c in updates]
            self.pre_labels = [self.group_ids.index(g) for g, ms in members_of.items()
                               for _ in ms]
            self._form_groups(members_of, updates)
            return
        rows = sorted(updates)
        if not rows:
            log(WARNING, "%s: no usable pre-training update; every group starts at w0", self.name)
            return
        mat = np.stack([updates[c][0] for c in rows])
        k = min(self.m, len(rows))
        if self.measure == "madc":
            self.embedding = madc_matrix(cosine_matrix(mat))
            labels = madc_cluster(self.embedding, k)
        else:
            self.embedding = edc_embedding(mat, self.m)
            labels = edc_kmeans(self.embedding, k, self.cfg.seed)
        self.pre_clients, self.pre_labels = rows, [int(x) for x in labels]
        self._form_groups({gid: [c for c, lab in zip(rows, labels) if lab == j]
                           for j, gid in enumerate(self.group_ids)}, updates)

    def _form_groups(self, members_of: dict[int, list[int]],
                     updates: dict[int, tuple[np.ndarray, np.ndarray]]) -> None:
        """Group g: direction = the unweighted mean of its members' updates, model = w0 + it
        (``group-init = "pretrained"``), members warm with their reference counts."""
        w0 = flatten(self.models[self.w0_id])
        for gid in self.group_ids:
            members = members_of.get(gid, [])
            if not members:
                log(WARNING, "%s: group %d got no pre-training client; it stays at w0 and takes "
                    "no newcomers", self.name, gid)
                continue
            direction = np.mean([updates[c][0] for c in members], axis=0)   # unweighted
            self.directions[gid] = direction
            if self.group_init == "pretrained":
                self.models[gid] = unflatten(w0 + direction, self.models[gid])
            for c in members:
                self.assign(c, gid)
                self.shifts.ref_counts[c] = updates[c][1]
        log(INFO, "%s: group cold start on %d clients: sizes %s", self.name,
            sum(map(len, members_of.values())), [len(self.members(g)) for g in self.group_ids])

    def nearest_group(self, delta: np.ndarray) -> int | None:
        """argmin_j (1 - cos(dw0_j, delta)) / 2 over the fixed directions; ties: lowest id."""
        if not self.directions:
            return self.group_ids[0] if self.group_ids else None
        dis = {g: (1.0 - cosine(self.directions[g], delta)) / 2.0 for g in sorted(self.directions)}
        return min(dis, key=lambda g: (dis[g], g))

    def choose_group(self, cid: int, delta: np.ndarray) -> int | None:
        """The cold start's choice: the nearest direction, or (RAC) a uniformly random group
        among those with a direction."""
        if self.rac and self.directions:
            return rac_group(self.cfg.seed, self.round, cid, sorted(self.directions))
        return self.nearest_group(delta)

    def cold_start(self, grid: Grid, cids: list[int], why: str, old: dict | None = None) -> None:
        """Client cold start (docs/flexcfl/README.md, The algorithm; the paper's Eq. 8): pre-train from w0
        on the current data, join the closest initial direction (RAC: a random group; the
        pre-training still runs, as in the authors' code, and gives the reference counts)."""
        for cid, (delta, counts) in self._pretrain(grid, cids).items():
            g = self.choose_group(cid, delta)
            self.assign(cid, g)
            self.shifts.ref_counts[cid] = counts
            self._count(why)
            if old is not None and old.get(cid) != g:
                self._count("migrations")

    def _count(self, what: str) -> None:
        self._round[what] += 1
        self.totals[what] += 1

    # -- migration (migration.py)
    def check_shifts(self, grid: Grid) -> None:
        warm = [c for c in sorted(self.clients) if self.clients[c].cluster in self.group_ids]
        if not warm:
            return
        shifted = self.shifts.detect(self.shifts.label_counts(grid, warm), warm)
        self._shifted = shifted
        if not shifted:
            return
        old = {c: self.clients[c].cluster for c in shifted}
        for c in shifted:
            self.assign(c, None)
        self.cold_start(grid, shifted, "shift_cold_starts", old)
        for c in shifted:   # a failed re-cold-start keeps the client where it was
            if self.clients[c].cluster is None:
                self.assign(c, old[c])

    # -- training
    def plan_train(self, step: int) -> dict[int, Task]:
        plan = {}
        for cid in self.protocol.selected:
            rec = self.clients.get(cid)
            if rec is None or rec.cluster not in self.group_ids:
                continue
            if self.shifts.last_counts.get(cid, 1) == 0:
                continue     # no training data: skipped in training, still evaluated (D22)
            plan[cid] = Task(models=[rec.cluster])
        return plan

    def on_train_replies(self, step: int, replies: list[Reply]) -> None:
        super().on_train_replies(step, replies)       # intra-group FedAvg (n-weighted)
        if self.eta_g > 0:
            active = [g for g in self.group_ids if self.members(g)]
            flat = {g: flatten(self.models[g]) for g in active}
            for g, vec in inter_group_aggregate(flat, self.eta_g).items():
                self.models[g] = unflatten(vec, self.models[g])

    # -- reporting and state
    def cluster_models(self) -> list[int]:
        return sorted(self.group_ids)     # not w0, kept for the cold starts

    def round_metrics(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out.update(self._round)
        out["group_sizes"] = [len(self.members(g)) for g in self.group_ids]
        out["shifted_clients"] = self._shifted
        self._round = dict.fromkeys(self.totals, 0)
        self._shifted = []
        return out

    def summary_extra(self) -> dict[str, Any]:
        return {f"{k}_total": v for k, v in self.totals.items()} | {
            "pretrain_clients": len(self.pre_clients),
            "group_sizes_final": [len(self.members(g)) for g in self.group_ids]}

    def strategy_state(self) -> dict[str, Any]:
        return self.shifts.state() | {
            "group_ids": self.group_ids, "w0_id": self.w0_id, "grouped": self.grouped,
            "directions": {str(g): encode(v) for g, v in self.directions.items()},
            "pre_clients": self.pre_clients, "pre_labels": self.pre_labels,
            "totals": self.totals,
        }

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        self.shifts.load_state(state)
        self.group_ids = [int(g) for g in state["group_ids"]]
        self.w0_id = state["w0_id"]
        self.grouped = bool(state["grouped"])
        self.directions = {int(g): decode(v) for g, v in state["directions"].items()}
        self.pre_clients = [int(c) for c in state["pre_clients"]]
        self.pre_labels = [int(c) for c in state["pre_labels"]]
        self.totals = {k: int(v) for k, v in state["totals"].items()}


class FedGroup(FlexCFL):
    name, description, Params = catalogue.FEDGROUP.class_attributes()
    MIGRATION = False
