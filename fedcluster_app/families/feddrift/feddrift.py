"""FedDrift-Eager, FedDrift, FedDrift-C and their window variants (feddrift.md sections 2.4-2.8).

Hyper-parameters, one table shared by the family, ``[tool.flwr.app.config.feddrift]``:

* ``delta``: drift threshold, also the merge threshold (0-1 error units); must be in (0, 1].
  Paper defaults per dataset [ref-code]: SINE 0.20, CIRCLE 0.10, SEA 0.04, MNIST 0.10.
* ``subsample``: points per cluster for the distances L_ij (about 1000, section 7 #4).
* ``init-new``: ``copy`` (the detecting client's best model, ref-code) or ``seeded`` (the run's
  common initialisation).
* ``loss``: ``error`` (0-1 error, ref-code) or ``cross-entropy`` for detection and distances.

Detection (Eq. 4) and clustering decisions read only the clients' loss reports, never the
ground truth. A client whose probe misses a model or is not finite is left out of detection
for that step (it keeps its previous identity); one whose distance report is malformed is left
out of the distance estimate.
"""

from __future__ import annotations

import math
from logging import INFO, WARNING
from typing import Any, ClassVar

from flwr.common.logger import log
from flwr.serverapp import Grid

from fedcluster_app.core import wire as P
from fedcluster_app.families.feddrift.client import (CLUSTERS, COUNTS, DISTANCE_KIND, ERRORS, QUOTA, STEPS)
from fedcluster_app.core.config import ConfigError, section
from fedcluster_app.core.strategy import Task, weighted_average
from fedcluster_app.families.feddrift.protocol import TimeStepProtocol

HPARAMS = "feddrift"


def feddrift_hparams(raw: dict) -> dict[str, Any]:
    """The family's validated hyper-parameters (bad values fail before round 1)."""
    h = section(raw, HPARAMS)
    delta = float(h.get("delta", 0.1))
    if not (math.isfinite(delta) and 0.0 < delta <= 1.0):
        raise ConfigError(f"feddrift.delta (drift and merge threshold) must be in (0, 1], got {delta}")
    sub = int(h.get("subsample", 1000))
    if sub < 1:
        raise ConfigError(f"feddrift.subsample must be >= 1 point per cluster, got {sub}")
    init = str(h.get("init-new", "copy"))
    if init not in ("copy", "seeded"):
        raise ConfigError(f"feddrift.init-new must be 'copy' or 'seeded', got {init!r}")
    loss = str(h.get("loss", "error"))
    if loss not in ("error", "cross-entropy"):
        raise ConfigError(f"feddrift.loss must be 'error' or 'cross-entropy', got {loss!r}")
    return {"delta": delta, "subsample": sub, "init_new": init, "loss": loss}


class FedDriftEager(TimeStepProtocol):
    """Algorithm 3: one shared new model for all clients that detect drift in a step."""

    name = "feddrift-eager"
    description = "FedDrift-Eager: local drift detection, one new cluster per step, no merging"
    merging: ClassVar[bool] = False

    def __init__(self, experiment) -> None:
        super().__init__(experiment)
        h = feddrift_hparams(self.cfg.raw)
        self.delta = h["delta"]
        self.subsample = h["subsample"]
        self.init_new = h["init_new"]
        self.loss_kind = "error" if h["loss"] == "error" else "cross-entropy"
        self.ref: dict[int, float] = {}
        self.isolated: set[int] = set()
        self.last_distances: dict[str, float] = {}

    # -- helpers ---------------------------------------------------------------------------
    def eligible(self, tau: int) -> list[int]:
        """Models attached to a batch of a step before tau (W variants: of step tau-1 only)."""
        lo = 1 if self.train_window <= 0 else max(1, tau - self.train_window)
        ids = {m for t in range(lo, tau) for m in self.W.get(t, {}).values()}
        return sorted(m for m in ids if m is not None and m in self.models)

    def cluster_steps(self, tau: int) -> list[int]:
        """Steps whose identities the clustering sees (W variants: tau-1 and tau, section 2.8)."""
        lo = 1 if self.train_window <= 0 else max(1, tau - self.train_window)
        return list(range(lo, tau + 1))

    def init_new_model(self, m_star: int) -> int:
        if self.init_new == "copy":
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
            self.W[tau] = {cid: m0 for cid in self.clients}
            return
        eligible = self.eligible(tau)
        errs = self.probe(grid, tau, eligible)
        row: dict[int, int | None] = {}
        fired: list[tuple[int, int]] = []
        for cid in sorted(self.clients):
            if cid not in errs:
                row[cid] = self.carry_identity(cid, tau)
                continue
            e = errs[cid]
            m_star = self.argmin_random(e)
            best = e[m_star]
            if cid in self.ref and best > self.ref[cid] + self.delta:   # Eq. (4)
                fired.append((cid, m_star))
            row[cid] = m_star
            self.remember_ref(cid, best)
        self.W[tau] = row
        for cid, m_star in fired:
            self._events["detected_clients"].append(cid)
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
            self.W[tau][cid] = new

    # -- clustering (FedDrift) ---------------------------------------------------------------
    def cluster_and_merge(self, grid: Grid, tau: int, eligible: list[int]) -> None:
        steps = self.cluster_steps(tau)
        n_cj = {j: self.n_attached(j, tau, steps) for j in eligible}
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
                cfg[f"{STEPS}.{j}"] = self.attached_steps(cid, j, tau, steps)
                cfg[f"{QUOTA}.{j}"] = max(1, int(round(self.subsample * n / n_j[j])))
            if js:
                cfg[CLUSTERS] = js
                tasks[cid] = Task(models=list(clusters), config=cfg)
        E = {(i, j): 0.0 for i in clusters for j in clusters}
        Q = {j: 0.0 for j in clusters}
        for r in self.send(grid, DISTANCE_KIND, tasks):
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
        """Complete linkage: merge the closest pair while its distance is < delta."""
        live = list(live)
        n = dict(n_j)
        while len(live) >= 2:
            pair = min(D, key=lambda k: (D[k], sorted(k)))
            if D[pair] >= self.delta:
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
            self._events["merges"].append([i, j, k])
            log(INFO, "step %d: merged models %d and %d (distance %.4f) into %d", tau, i, j, D[pair], k)
            n[k] = n.pop(i) + n.pop(j)
            live = [m for m in live if m not in (i, j)]
            for l in live:
                D[frozenset((k, l))] = max(D.pop(frozenset((i, l))), D.pop(frozenset((j, l))))
            D.pop(pair)
            live.append(k)

    # -- state ------------------------------------------------------------------------------
    def round_metrics(self) -> dict[str, Any]:
        return {}

    def step_metrics(self, tau, accs):
        rec = super().step_metrics(tau, accs)
        if self.last_distances:
            rec["distances"] = dict(self.last_distances)
            self.last_distances = {}
        return rec

    def strategy_state(self) -> dict[str, Any]:
        return {**super().strategy_state(), "ref": {str(c): v for c, v in self.ref.items()}}

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        super().load_strategy_state(state)
        self.ref = {int(c): float(v) for c, v in state["ref"].items()}


class FedDrift(FedDriftEager):
    """Algorithm 4: a new isolated model per drifting client, hierarchical merging every step."""

    name = "feddrift"
    description = "FedDrift: local drift detection, one new model per drifted client, merging"
    merging = True

    def on_detections(self, tau: int, fired: list[tuple[int, int]]) -> None:
        for cid, m_star in fired:
            k = self.init_new_model(m_star)
            self.W[tau][cid] = k
            self.isolated.add(k)       # trained only by cid this step; eligible from tau+1


class FedDriftC(FedDrift):
    """FedDrift-C (section 2.7): at most one new global model per step.

    As the reference code: every firing client gets a local model during the step (its batch
    attached to it, used for its inference at this step); at the start of the next step one of
    them, chosen at random, stays as the new global model and the others are deleted, their
    batches left unattached, and their clients keep their pre-drift reference error so they can
    fire again (section 7 #15).
    """

    name = "feddrift-c"
    description = "FedDrift-C: FedDrift with at most one new global model per step"

    def __init__(self, experiment) -> None:
        super().__init__(experiment)
        self.pending: dict[int, tuple[int, float | None]] = {}   # model -> (client, old ref)

    def on_detections(self, tau: int, fired: list[tuple[int, int]]) -> None:
        old = {cid: self.pre_ref.get(cid) for cid, _ in fired}
        super().on_detections(tau, fired)
        self.pending = {self.W[tau][cid]: (cid, old[cid]) for cid, _ in fired}

    def remember_ref(self, cid: int, best: float) -> None:
        self.pre_ref[cid] = self.ref.get(cid)
        super().remember_ref(cid, best)

    def begin_step(self, grid: Grid, tau: int) -> None:
        self.pre_ref: dict[int, float | None] = {}
        if len(self.pending) > 1:
            keep = int(self.rng.choice(sorted(self.pending)))
            for mid, (cid, old) in sorted(self.pending.items()):
                if mid == keep:
                    continue
                for row in self.W.values():
                    for c, m in row.items():
                        if m == mid:
                            row[c] = None
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
    name = "feddrift-eager-w"
    description = "FedDrift-Eager-W: FedDrift-Eager training on the newest batch only"
    train_window = 1


class FedDriftW(FedDrift):
    name = "feddrift-w"
    description = "FedDrift-W: FedDrift training on the newest batch only"
    train_window = 1
