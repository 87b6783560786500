"""FedDrift-Eager, FedDrift, FedDrift-C and their window variants.

"Federated Learning under Distributed Concept Drift", Jothimurugesan, Hsieh, Wang, Joshi,
Gibbons, AISTATS 2023, https://arxiv.org/abs/2206.00799 (Algorithms 3 and 4, appendix B).

Under the time-step protocol (``protocol.py``), at the start of step t every client c measures
the loss of every eligible model m on its new batch S_c^(t) and takes m* = argmin_m L(m, S_c^(t)).
It has drifted when (Eq. 4)

    L(m*, S_c^(t)) > L_c^ref + delta,      L_c^ref = its best loss at the previous step.

* FedDrift-Eager (Alg. 3): all clients that drifted at t share ONE new model.
* FedDrift (Alg. 4): each drifted client gets its own new (isolated) model; then, every step,
  clusters i, j are merged hierarchically (complete linkage) while their distance
  D(i, j) = max(L_ij - L_ii, L_ji - L_jj, 0) < delta, where L_ij is the loss of model i on a
  sample of cluster j's data; the merged model is the n-weighted average of the two.
* FedDrift-C: at most one new model per step: the firing clients' local models are resolved
  at the start of the next step, one kept at random.
* ``-w`` variants train on the newest batch only (and cluster on steps t-1 and t).

Detection and clustering read only the clients' loss reports, never the ground truth. A
client whose probe misses a model or is not finite keeps its previous identity for that step;
one whose distance report is malformed is left out of the distance estimate. The choices where
the paper is silent are docs/feddrift/README.md, "Choices where the paper is silent" (Dn below).
"""

from __future__ import annotations

import math
from logging import INFO, WARNING
from typing import Any, ClassVar

from flwr.common.logger import log
from flwr.serverapp import Grid

from fedcluster_app.core import wire as P
from fedcluster_app.core.server.strategy import Task
from fedcluster_app.core.server.updates import weighted_average
from fedcluster_app.families.feddrift import catalogue
from fedcluster_app.families.feddrift.protocol import TimeStepProtocol, TimeStepStrategy
from fedcluster_app.families.feddrift.wire import (
    CLUSTERS,
    COUNTS,
    DISTANCE_KIND,
    ERRORS,
    QUOTA,
    STEPS,
)


class FedDriftEager(TimeStepStrategy):
    """Algorithm 3: one shared new model for all clients that detect drift in a step."""

    name, description, Params = catalogue.FEDDRIFT_EAGER.class_attributes()
    merging: ClassVar[bool] = False
    # fraction-train < 1 trains a sample of the clients each round; the step's probes,
    # detection and merging still hear every client (this project's extension: the paper
    # trains every client every round; docs/feddrift/README.md)
    trains_a_sample: ClassVar[bool] = True

    def __init__(self, experiment) -> None:
        super().__init__(experiment)
        self.loss_kind = self.params.loss
        self.ref: dict[int, float] = {}
        self.isolated: set[int] = set()
        self.last_distances: dict[str, float] = {}

    # -- helpers ---------------------------------------------------------------------------
    def eligible(self, tau: int) -> list[int]:
        """Models attached to a batch of a step before tau (W variants: of step tau-1 only)."""
        window = self.protocol.train_window
        lo = 1 if window <= 0 else max(1, tau - window)
        ids = {m for t in range(lo, tau) for m in self.W.get(t, {}).values()}
        return sorted(m for m in ids if m is not None and m in self.models)

    def cluster_steps(self, tau: int) -> list[int]:
        """Steps whose identities the clustering sees (W variants: tau-1 and tau, D21)."""
        window = self.protocol.train_window
        lo = 1 if window <= 0 else max(1, tau - window)
        return list(range(lo, tau + 1))

    def init_new_model(self, m_star: int) -> int:
        if self.params.init_new == "copy":
            return self.new_model([a.copy() for a in self.models[m_star]])
        return self.new_model()

    # -- decisions ------------------------------------------------------------------------
    def begin_step(self, grid: Grid, tau: int) -> None:
        self.isolated = set()
        if tau == 1 or not self.models:
            m0 = min(self.models) if self.models else self.new_model()
            errs = self.probe(grid, tau, [m0])
            for cid, e in errs.items():
                self.ref[cid] = e[m0]
            for cid in self.clients:
                self.assign(cid, m0)
            return
        eligible = self.eligible(tau)
        errs = self.probe(grid, tau, eligible)
        fired: list[tuple[int, int]] = []
        for cid in sorted(self.clients):
            if cid not in errs:
                continue        # keeps its previous identity (D19)
            e = errs[cid]
            m_star = self.argmin_random(e)
            best = e[m_star]
            if cid in self.ref and best > self.ref[cid] + self.params.delta:   # Eq. (4)
                fired.append((cid, m_star))
            self.assign(cid, m_star)
            self.remember_ref(cid, best)
        for cid, m_star in fired:
            self.events["detected_clients"].append(cid)
        self.on_detections(tau, fired)
        if fired:
            log(INFO, "step %d: drift detected at clients %s", tau, [c for c, _ in fired])
        if self.merging and len(eligible) >= 2:
            self.cluster_and_merge(grid, tau, eligible)

    def remember_ref(self, cid: int, best: float) -> None:
        self.ref[cid] = best

    def on_detections(self, tau: int, fired: list[tuple[int, int]]) -> None:
        """Eager: all clients that fired share ONE new model, copied from the first one's best."""
        if not fired:
            return
        new = self.init_new_model(fired[0][1])
        for cid, _ in fired:
            self.assign(cid, new)

    # -- clustering (FedDrift) ---------------------------------------------------------------
    def cluster_and_merge(self, grid: Grid, tau: int, eligible: list[int]) -> None:
        steps = self.cluster_steps(tau)
        n_cj = {j: self.protocol.n_attached(j, tau, steps) for j in eligible}
        n_j = {j: sum(v.values()) for j, v in n_cj.items()}
        clusters = [j for j in eligible if n_j[j] > 0]
        if len(clusters) < 2:
            return
        tasks = {}
        for cid in sorted(self.clients):
            cfg: dict[str, Any] = {P.STEP: tau}
            js = []
            for j in clusters:
                n = n_cj[j].get(cid, 0)
                if n <= 0:
                    continue
                js.append(j)
                cfg[f"{STEPS}.{j}"] = self.protocol.attached_steps(cid, j, tau, steps)
                cfg[f"{QUOTA}.{j}"] = max(1, int(round(self.params.subsample * n / n_j[j])))
            if js:
                cfg[CLUSTERS] = js
                tasks[cid] = Task(models=list(clusters), config=cfg)
        E = {(i, j): 0.0 for i in clusters for j in clusters}
        Q = {j: 0.0 for j in clusters}
        for r in self.exchange(grid, DISTANCE_KIND, tasks):
            ids = [int(i) for i in r.metrics.get(P.MODEL_IDS, [])]
            js = [int(j) for j in r.metrics.get(CLUSTERS, [])]
            errors = list(r.metrics.get(ERRORS, []))
            counts = list(r.metrics.get(COUNTS, []))
            if (ids != clusters or js != tasks[r.cid].config[CLUSTERS]
                    or len(errors) != len(ids) * len(js) or len(counts) != len(js)
                    or not all(math.isfinite(float(v)) and v >= 0 for v in errors + counts)):
                log(WARNING, "step %d: client %d's distance report is malformed: left out", tau, r.cid)
                continue
            for a, i in enumerate(ids):
                for b, j in enumerate(js):
                    E[(i, j)] += float(errors[a * len(js) + b])
            for b, j in enumerate(js):
                Q[j] += float(counts[b])
        measured = [j for j in clusters if Q[j] > 0]
        L = {(i, j): E[(i, j)] / Q[j] for i in measured for j in measured}
        D: dict[frozenset, float] = {}
        for a, i in enumerate(measured):
            for j in measured[a + 1:]:
                D[frozenset((i, j))] = max(L[(i, j)] - L[(i, i)], L[(j, i)] - L[(j, j)], 0.0)
        self.last_distances = {f"{min(k)}-{max(k)}": round(v, 5) for k, v in D.items()}
        self.hierarchical_merge(tau, measured, D, n_j)

    def hierarchical_merge(self, tau: int, live: list[int], D: dict[frozenset, float],
                           n_j: dict[int, int]) -> None:
        """Complete linkage: merge the closest pair while its distance is < delta (D5)."""
        live = list(live)
        n = dict(n_j)
        while len(live) >= 2:
            pair = min(D, key=lambda k: (D[k], sorted(k)))
            if D[pair] >= self.params.delta:
                break
            i, j = sorted(pair)
            weights = [float(n[i]), float(n[j])]
            if sum(weights) <= 0:
                weights = [1.0, 1.0]
            k = self.new_model(weighted_average([(self.models[i], weights[0]),
                                                 (self.models[j], weights[1])]), created=False)
            self.relabel(i, k)
            self.relabel(j, k)
            self.delete_model(i)
            self.delete_model(j)
            self.events["merges"].append([i, j, k])
            log(INFO, "step %d: merged models %d and %d (distance %.4f) into %d", tau, i, j, D[pair], k)
            n[k] = n.pop(i) + n.pop(j)
            live = [m for m in live if m not in (i, j)]
            for other in live:
                D[frozenset((k, other))] = max(D.pop(frozenset((i, other))),
                                               D.pop(frozenset((j, other))))
            D.pop(pair)
            live.append(k)

    # -- state ------------------------------------------------------------------------------
    def round_metrics(self) -> dict[str, Any]:
        out = {"distances": dict(self.last_distances)} if self.last_distances else {}
        self.last_distances = {}
        return out

    def strategy_state(self) -> dict[str, Any]:
        return {"ref": {str(c): v for c, v in self.ref.items()},
                "last_distances": self.last_distances}

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        self.ref = {int(c): float(v) for c, v in state["ref"].items()}
        self.last_distances = dict(state["last_distances"])


class FedDrift(FedDriftEager):
    """Algorithm 4: a new isolated model per drifting client, hierarchical merging every step."""

    name, description, Params = catalogue.FEDDRIFT.class_attributes()
    merging = True

    def on_detections(self, tau: int, fired: list[tuple[int, int]]) -> None:
        for cid, m_star in fired:
            k = self.init_new_model(m_star)
            self.assign(cid, k)
            self.isolated.add(k)       # trained only by cid this step; eligible from tau+1


class FedDriftC(FedDrift):
    """FedDrift-C (appendix B): at most one new global model per step.

    As the authors' code (D14): every firing client gets a local model during the step (its
    batch attached to it, used for its inference at this step); at the start of the next step
    one of them, chosen at random, stays as the new global model and the others are deleted,
    their batches left unattached, and their clients keep their pre-drift reference error so
    they can fire again.
    """

    name, description, Params = catalogue.FEDDRIFT_C.class_attributes()

    def __init__(self, experiment) -> None:
        super().__init__(experiment)
        self.pending: dict[int, tuple[int, float | None]] = {}   # model -> (client, old ref)
        self.pre_ref: dict[int, float | None] = {}

    def on_detections(self, tau: int, fired: list[tuple[int, int]]) -> None:
        old = {cid: self.pre_ref.get(cid) for cid, _ in fired}
        super().on_detections(tau, fired)
        self.pending = {self.W[tau][cid]: (cid, old[cid]) for cid, _ in fired}

    def remember_ref(self, cid: int, best: float) -> None:
        self.pre_ref[cid] = self.ref.get(cid)
        super().remember_ref(cid, best)

    def begin_step(self, grid: Grid, tau: int) -> None:
        self.pre_ref = {}
        if len(self.pending) > 1:
            keep = int(self.rng.choice(sorted(self.pending)))
            for mid, (cid, old) in sorted(self.pending.items()):
                if mid == keep:
                    continue
                self.relabel(mid, None)     # its batches are left unattached
                self.delete_model(mid)
                if old is not None:
                    self.ref[cid] = old
        self.pending = {}
        super().begin_step(grid, tau)

    def strategy_state(self) -> dict[str, Any]:
        return {**super().strategy_state(),
                "pending": {str(m): [c, o] for m, (c, o) in self.pending.items()}}

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        super().load_strategy_state(state)
        self.pending = {int(m): (int(c), o) for m, (c, o) in state["pending"].items()}


class FedDriftEagerW(FedDriftEager):
    name, description, Params = catalogue.FEDDRIFT_EAGER_W.class_attributes()
    protocol_factory = TimeStepProtocol.window(1)


class FedDriftW(FedDrift):
    name, description, Params = catalogue.FEDDRIFT_W.class_attributes()
    protocol_factory = TimeStepProtocol.window(1)
