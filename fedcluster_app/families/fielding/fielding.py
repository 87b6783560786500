"""Fielding: drift-aware selective re-clustering, one model per cluster of clients.

"Fielding: Clustered Federated Learning with Data Drift", Li, Avdiukhin, Shahout, Ivkin,
Braverman, Yu, arXiv preprint 2024, https://arxiv.org/abs/2411.01580 (its first version is
titled "Federated Learning Clients Clustering with Adaptation to Data Drifts"). The algorithm as
implemented and the choices where the paper is silent (Dn below): docs/fielding/README.md.

Each client c holds a representation r_c of its current data window (by default its label
distribution, r_c[y] = n_c(y) / n_c) and reports it when rho(r_c, r_c^last) > ``eps-drift``
(D1). With clusters C_k, centers mu_k and models w_k, at the start of a time step
(HANDLE_DRIFT, ``clustering.py``):

    k(c)  <- argmin_k rho(r_c, mu_k)               every drifted client, centers frozen
    mu_k  <- mean_{c in C_k} r_c                    (a cluster left empty is deleted, D6)
    theta  = mean_{i < j} rho(mu_i^ref, mu_j^ref)  (mu^ref: the centers before the moves, D2, D3)
    re-cluster everybody  iff  max_k rho(mu_k, mu_k^ref) >= tau theta          (tau = 1/3)

and then, every round, each cluster trains a uniform sample S_k of floor(M/K) of its members
(capped at its size, the remainder to the largest clusters, D7) with FedAvg, or FedProx through
``prox-mu``, and

    w_k <- (1/|S_k|) sum_{c in S_k} w_c            (the paper's pseudocode; or by sample counts, D8)

A global re-clustering is k-means with rho and k-means++ seeding for every K in
``k-min..k-max``, the best silhouette wins (D4, D5); each new cluster model is the unweighted
mean of its members' cluster models after the moves (D17). With ``trigger = "pairwise"`` /
``"either"`` a cluster whose diameter exceeds the adaptive Delta also triggers it (D13, D14).

Before the rounds that start a time step (new data: the only time a client's window changes) the
coordinator asks *every* client, sampled for training or not, for its drift report
(``query.fielding_rep``, ``client.py``); clients that have not registered always report (D18).
Every move, rejection and re-clustering is logged in metrics.jsonl (``fielding_*`` keys).

Strategies here: ``fielding``; the ablations ``fielding-tau0`` (global re-clustering on every
drift) and ``fielding-tauinf`` (moves only); ``static-cfl`` (cluster once at the start with the
same routine, never update). All read ``[tool.flwr.app.config.fielding]``. The paper's ablation
"re-cluster only the selected clients" (docs/fielding/README.md, "Baselines and ablations") is
``adjust = "sampled"``: a drifted client's report waits until the client is sampled for
training; then it moves (the same HANDLE_DRIFT, trigger included) and trains its new cluster's
model.
"""

from __future__ import annotations

import math
import time
from logging import INFO
from typing import Any

import numpy as np
import torch
from flwr.common.logger import log
from flwr.serverapp import Grid

from fedcluster_app.core.config import ConfigError, TrainConfig
from fedcluster_app.core.models import SPLIT_CONTRACT, build_model, get_weights
from fedcluster_app.core.server.strategy import ClusteredStrategy, Reply, Task
from fedcluster_app.core.server.updates import weighted_average
from fedcluster_app.core.training import as_tensor, local_train
from fedcluster_app.families.fielding import catalogue
from fedcluster_app.families.fielding import wire as fc
from fedcluster_app.families.fielding.clustering import cluster, handle_drift
from fedcluster_app.families.fielding.distances import Points, distance


def split_budget(sizes: dict[int, int], total: int, mode: str = "floor") -> dict[int, int]:
    """Clients to sample per cluster: floor(M/K) each capped at the cluster's size, the remainder
    one each to the largest clusters (``floor``), or M * size / N (``proportional``, >= 1)."""
    sizes = {m: s for m, s in sizes.items() if s > 0}
    if not sizes:
        return {}
    n, k = sum(sizes.values()), len(sizes)
    if mode == "proportional":
        return {m: min(s, max(1, round(total * s / n))) for m, s in sizes.items()}
    share = {m: min(s, total // k) for m, s in sizes.items()}
    extra = total - k * (total // k)
    for m in sorted(sizes, key=lambda m: (-sizes[m], m)):
        if extra <= 0:
            break
        if share[m] < sizes[m]:
            share[m] += 1
            extra -= 1
    return share


def sample_clusters(strategy: ClusteredStrategy, budget: dict[int, int]) -> dict[int, Task]:
    """Each cluster trains ``budget[id]`` of its members, drawn uniformly without replacement."""
    plan = {}
    for mid, count in budget.items():
        members = strategy.members(mid)
        if count <= 0:
            continue
        chosen = members if count >= len(members) else sorted(
            int(c) for c in strategy.rng.choice(members, size=count, replace=False))
        for cid in chosen:
            plan[cid] = Task(models=[mid])
    return plan


class Fielding(ClusteredStrategy):
    name, description, Params = catalogue.FIELDING.class_attributes()
    fixed_tau: float | None = None       # ablations fix tau
    static = False                       # static CFL: cluster once, never update


    def __init__(self, experiment) -> None:
        super().__init__(experiment)
        p = self.params
        part = ("features" if p.rep == "embedding" else
                "classifier" if p.rep == "gradient" and p.grad_layers == "last" else None)
        if part and not isinstance(getattr(build_model(self.exp.spec, 0), part, None), torch.nn.Module):
            raise ConfigError(f"model: fielding.rep = {p.rep!r} reads the model's `{part}` "
                              f"submodule, which {self.exp.spec.kind!r} does not have (the "
                              f"built-in models have {SPLIT_CONTRACT})")
        n = self.exp.scenario.num_clients
        if p.k_min > n - 1:
            raise ConfigError(f"the K range fielding.k-min..k-max = {p.k_min}..{p.k_max} is "
                              f"larger than the {n} clients allow: K must be <= N - 1 = {n - 1}")
        self.tau = self.fixed_tau if self.fixed_tau is not None else p.tau
        self.reps: dict[int, np.ndarray] = {}
        self.pending: dict[int, np.ndarray] = {}             # adjust = "sampled": not yet acted on
        self.centers: dict[int, np.ndarray] = {}
        self.ref_centers: dict[int, np.ndarray] = {}         # of the last global clustering
        self.reclusters = 0
        self.delta = self.params.delta_floor
        self.last_triggered = False
        self.initialized = False
        self.probe_id: int | None = None
        self.have_probe: set[int] = set()
        self.dim: int | None = None
        self.nonneg = self.nonnegative()
        self.events: dict[str, Any] = {}

    # ------------------------------------------------------------------ probe model
    def on_start(self) -> None:
        if self.params.rep != "label":
            self.probe_id = self.new_model(self.train_probe())
        self.dim = self.rep_dim()

    def train_probe(self) -> list[np.ndarray]:
        """The shared probe model, trained once centrally on a small set: up to
        ``probe-per-class`` samples of every class from the clients' first time step."""
        sc = self.exp.scenario
        parts = [sc.step_data(k, 1) for k in range(sc.num_clients)]
        x = np.concatenate([p.x_train for p in parts])
        y = np.concatenate([p.y_train for p in parts])
        rng = np.random.default_rng([self.cfg.seed, 0xF1E1D])
        keep = np.concatenate([rng.permutation(np.flatnonzero(y == c))[: self.params.probe_per_class]
                               for c in range(sc.num_classes)])
        model = build_model(self.exp.spec, seed=self.cfg.seed * 1000 + 777)
        if self.params.probe_steps:
            local_train(model, x[keep], y[keep],
                        TrainConfig(optimizer="adam", lr=0.01, local_steps=self.params.probe_steps,
                                    batch_size=50), rng)
        return get_weights(model)

    def nonnegative(self) -> bool:
        """Label vectors and ReLU features (every probe but a hidden-less MLP) are >= 0."""
        if self.params.rep == "label":
            return True
        if self.params.rep == "gradient":
            return False
        last = list(build_model(self.exp.spec, 0).features.modules())[-1]
        return isinstance(last, torch.nn.ReLU)

    def rep_dim(self) -> int:
        if self.params.rep == "label":
            return self.exp.scenario.num_classes
        model = build_model(self.exp.spec, 0)
        if self.params.rep == "embedding":
            x = as_tensor(np.zeros((1, *self.exp.scenario.input_shape), dtype=np.float32))
            return int(model.features(x).shape[1])
        params = model.classifier.parameters() if self.params.grad_layers == "last" else model.parameters()
        return int(sum(p.numel() for p in params))

    def cluster_models(self) -> list[int]:
        return [m for m in sorted(self.models) if m != self.probe_id]

    def on_new_client(self, cid: int) -> None:
        """A client that joins later stays unassigned until it registers (before this round):
        it then goes to the nearest center like a drifted client, with no previous model."""

    # ------------------------------------------------------------------ reports
    def collect(self, grid: Grid) -> dict[int, np.ndarray]:
        """Drift reports of every client; returns the valid representations reported."""
        base = {**self.params.to_message(fc.PARAMS, fc.CLIENT_KEYS), fc.METRIC: self.params.metric}
        targets = sorted(self.clients)
        register = [c for c in targets if c not in self.reps]
        replies: dict[int, Reply] = {}
        for cids, reg in ((register, True), ([c for c in targets if c in self.reps], False)):
            if not cids:
                continue
            cfg = {**base, fc.REGISTER: reg}
            need = [c for c in cids if self.probe_id is not None and c not in self.have_probe]
            rest = [c for c in cids if c not in need]
            if need:
                replies.update(self.query(grid, fc.KIND, need, [self.probe_id], cfg))
                self.have_probe.update(need)
            if rest:
                replies.update(self.query(grid, fc.KIND, rest, None, cfg))
        missing = [c for c, r in replies.items() if r.metrics.get(fc.PROBE_MISSING)]
        if missing:  # a client lost its state: broadcast the probe to it again
            again = self.query(grid, fc.KIND, missing, [self.probe_id],
                               {**base, fc.REGISTER: True})
            replies.update(again)
        out: dict[int, np.ndarray] = {}
        nbytes = 0
        for cid, r in sorted(replies.items()):
            if not r.metrics.get(fc.DRIFTED):
                continue
            try:
                vec = self.check(r.metrics.get(fc.REP))
            except ValueError as ex:
                self.courier.fail(cid, f"representation rejected: {ex}; keeps its assignment")
                self.events.setdefault("fielding_rejected", []).append([cid, str(ex)])
                continue
            nbytes += 4 * len(vec)
            if r.metrics.get(fc.REGISTERED) and cid in self.reps and distance(
                    vec, self.reps[cid], self.params.metric) <= self.params.eps_drift:
                continue  # a known client that lost its state re-registered: no drift
            out[cid] = vec
        self.events["fielding_report_bytes"] = nbytes
        return out

    def check(self, value) -> np.ndarray:
        if value is None:
            raise ValueError("drift reported without a representation")
        vec = np.asarray(value if isinstance(value, list) else [value], dtype=np.float64)
        if vec.ndim != 1 or len(vec) != self.dim:
            raise ValueError(f"length {vec.size}, expected {self.dim}")
        if not np.isfinite(vec).all():
            raise ValueError("non-finite entries")
        if self.nonneg and (vec < 0).any():
            raise ValueError(f"negative entries in a {self.params.rep} vector")
        if self.params.rep == "label" and abs(vec.sum() - 1.0) > self.params.label_tol:
            raise ValueError(f"label vector sums to {vec.sum():.6g}, not 1 (tolerance "
                             f"{self.params.label_tol:g})")
        return vec

    # ------------------------------------------------------------------ drift handling
    def before_round(self, grid: Grid, step: int, new_step: bool) -> None:
        self.events = {}
        unregistered = any(c not in self.reps for c in self.clients)
        if not (new_step or unregistered) or (self.static and self.initialized and not unregistered):
            return
        if self.dim is None:          # resumed from a checkpoint
            self.dim = self.rep_dim()
        reports = self.collect(grid)
        self.events["fielding_drifted"] = len(reports)
        t0 = time.perf_counter()
        if not self.initialized:
            self.reps.update(reports)
            if self.reps:
                self.global_recluster("initial")
                self.initialized = True
        elif self.static:
            newcomers = {c: v for c, v in reports.items() if c not in self.reps}
            self.reps.update(newcomers)
            self.place_without_update(newcomers)
        elif reports and self.params.adjust == "sampled":
            # ablation: a drifted client is acted on only when it is sampled (plan_train);
            # clients that never had a cluster are placed now (they could never be sampled)
            newcomers = {c: v for c, v in reports.items() if c not in self.reps}
            self.pending.update({c: v for c, v in reports.items() if c in self.reps})
            if newcomers:
                self.reps.update(newcomers)
                self.handle(set(newcomers))
        elif reports:
            self.reps.update(reports)
            self.handle(set(reports))
        self.events["fielding_handling_s"] = round(time.perf_counter() - t0, 5)

    def rows(self) -> tuple[list[int], Points]:
        cids = sorted(c for c in self.reps if c in self.clients)
        return cids, Points(np.stack([self.reps[c] for c in cids]), self.params.metric)

    def handle(self, drifted: set[int]) -> None:
        cids, pts = self.rows()
        labels = np.array([self.clients[c].cluster if self.clients[c].cluster is not None
                           else -1 for c in cids])
        mask = np.array([c in drifted for c in cids])
        reference = self.centers if self.params.shift_reference == "step" else {
            m: self.ref_centers.get(m, v) for m, v in self.centers.items()}
        out = handle_drift(pts, labels, mask, self.centers, reference, self.tau,
                                self.params.trigger, self.delta)
        for row, _, new in out.moves:
            self.assign(cids[row], new)
        moves = [[cids[row], None if old < 0 else old, new] for row, old, new in out.moves]
        self.events.update(
            fielding_moves=len(moves),
            fielding_moved=moves[: self.params.log_moves],
            fielding_theta=round(out.theta, 6),
            fielding_max_shift=round(max(out.shifts.values()), 6) if out.shifts else None,
            fielding_threshold=round(out.threshold, 6) if math.isfinite(out.threshold) else None,
        )
        if out.max_diameter is not None:
            self.events.update(fielding_diameter=round(out.max_diameter, 6),
                               fielding_delta=round(self.delta, 6))
        for mid in out.emptied:                     # a cluster that lost every member
            self.delete_model(mid)
            self.centers.pop(mid, None)
            self.ref_centers.pop(mid, None)
        if moves:
            log(INFO, "round %d: fielding moved %d drifted client(s)", self.round, len(moves))
        triggered = out.trigger is not None
        if triggered:
            self.global_recluster(out.trigger)
        else:
            self.centers = out.centers
        if self.params.trigger in ("pairwise", "either"):  # adaptive Delta (D13; max, not min)
            if triggered and self.last_triggered:
                self.delta *= 2.0
            elif not triggered:
                self.delta = max(self.params.delta_floor, self.delta - self.params.delta_floor)
        self.last_triggered = triggered

    def place_without_update(self, newcomers: dict[int, np.ndarray]) -> None:
        """Static CFL: a client that joins later goes to the nearest center; nothing else moves."""
        ids = sorted(self.centers)
        if not ids or not newcomers:
            return
        cids = sorted(newcomers)
        pts = Points(np.stack([newcomers[c] for c in cids]), self.params.metric)
        nearest = pts.to_centers(np.stack([self.centers[m] for m in ids])).argmin(1)
        for c, j in zip(cids, nearest):
            self.assign(c, ids[int(j)])

    def global_recluster(self, why: str) -> None:
        cids, pts = self.rows()
        t0 = time.perf_counter()
        k_before = len(self.centers)
        res = cluster(pts.x, self.params.metric, self.params.k_min, self.params.k_max, self.params.n_init,
                           seed=[self.cfg.seed, self.round, 0xC1], min_silhouette=self.params.min_silhouette,
                           pts=pts, keep=self.params.n_keep or None)
        old = self.cluster_models()
        if why == "initial" or not old:
            fresh = self.initial_weights()         # every cluster starts from the same x0
            weights = {k: [a.copy() for a in fresh] for k in range(res.k)}
        else:
            weights = {}
            everyone = weighted_average([(self.models[m], 1.0) for m in old])
            for k in range(res.k):
                counts: dict[int, float] = {}
                for row in np.flatnonzero(res.labels == k):
                    m = self.clients[cids[row]].cluster
                    if m is not None and m in self.models:
                        counts[m] = counts.get(m, 0.0) + 1.0
                weights[k] = (weighted_average([(self.models[m], n) for m, n in sorted(counts.items())])
                              if counts else [a.copy() for a in everyone])
        for m in old:
            self.delete_model(m)
        new_ids = {k: self.new_model(w) for k, w in weights.items()}
        for row, c in enumerate(cids):
            self.assign(c, new_ids[int(res.labels[row])])
        self.centers = {new_ids[k]: res.centers[k] for k in range(res.k)}
        self.ref_centers = dict(self.centers)
        if why != "initial":
            self.reclusters += 1
        self.events.update(
            fielding_recluster=why,
            fielding_k_before=k_before,
            fielding_k_after=res.k,
            fielding_silhouette=round(res.silhouette, 6),
            fielding_silhouettes={str(k): round(s, 6) for k, s in res.scores.items()},
            fielding_cluster_s=round(time.perf_counter() - t0, 5),
        )
        log(INFO, "round %d: fielding %s clustering of %d clients: K %d -> %d (silhouette %.3f)",
            self.round, why, len(cids), k_before, res.k, res.silhouette)

    # ------------------------------------------------------------------ training
    def budget_per_cluster(self) -> dict[int, int]:
        sizes = {m: len(self.members(m)) for m in self.clusters_in_use() if m != self.probe_id}
        n = sum(sizes.values())
        total = self.params.participants or max(1, math.ceil(self.cfg.fraction_train * n))
        return split_budget(sizes, total, self.params.budget)

    def plan_train(self, step: int) -> dict[int, Task]:
        plan = sample_clusters(self, self.budget_per_cluster())
        due = {c for c in plan if c in self.pending}
        if due:
            # adjust = "sampled": the sampled drifted clients move (the same HANDLE_DRIFT,
            # which may re-cluster everybody) and train the model of their new cluster
            self.reps.update({c: self.pending.pop(c) for c in sorted(due)})
            self.handle(due)
            plan = {c: Task(models=[self.clients[c].cluster]) for c in plan
                    if self.clients[c].cluster is not None}
        if self.params.adjust == "sampled":
            self.events["fielding_pending"] = len(self.pending)
        return plan

    def on_train_replies(self, step: int, replies: list[Reply]) -> None:
        for mid, items in self.collect_updates(replies).items():
            if self.params.aggregation == "uniform":
                items = [(w, 1.0) for w, _ in items]
            self.models[mid] = self.aggregate(items)

    # ------------------------------------------------------------------ results and state
    def round_metrics(self) -> dict[str, Any]:
        return {"fielding_reclusters": self.reclusters, **self.events}

    def strategy_state(self) -> dict[str, Any]:
        vec = lambda d: {str(k): [float(x) for x in v] for k, v in d.items()}  # noqa: E731
        return {
            "reps": vec(self.reps), "centers": vec(self.centers), "ref_centers": vec(self.ref_centers),
            "pending": vec(self.pending),
            "reclusters": self.reclusters, "delta": self.delta, "last_triggered": self.last_triggered,
            "initialized": self.initialized, "probe_id": self.probe_id,
        }

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        arr = lambda d: {int(k): np.asarray(v, dtype=np.float64) for k, v in d.items()}  # noqa: E731
        self.reps = arr(state["reps"])
        self.centers = arr(state["centers"])
        self.ref_centers = arr(state["ref_centers"])
        self.pending = arr(state.get("pending", {}))
        self.reclusters = int(state["reclusters"])
        self.delta = float(state["delta"])
        self.last_triggered = bool(state["last_triggered"])
        self.initialized = bool(state["initialized"])
        self.probe_id = state["probe_id"]
        self.have_probe = set()       # fresh client processes: broadcast the probe again


class FieldingTau0(Fielding):
    name, description, Params = catalogue.FIELDING_TAU0.class_attributes()
    fixed_tau = 0.0


class FieldingTauInf(Fielding):
    name, description, Params = catalogue.FIELDING_TAUINF.class_attributes()
    fixed_tau = math.inf


class StaticCFL(Fielding):
    name, description, Params = catalogue.STATIC_CFL.class_attributes()
    static = True

