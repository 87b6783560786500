"""FedRC and FedEM: soft clustering in which every client trains all K models with per-sample
weights.

FedRC: "FedRC: Tackling Diverse Distribution Shifts Challenge in Federated Learning by Robust
Clustering", Guo, Tang, Lin, ICML 2024, https://arxiv.org/abs/2301.12379.
FedEM: "Federated Multi-Task Learning under a Mixture of Distributions", Marfoq, Neglia,
Bellet, Kameni, Vidal, NeurIPS 2021, https://arxiv.org/abs/2108.10252.

Each client c runs one E-step per round (``em.py``), gamma[j, k] = softmax_k(log omega_c[k] -
loss_k(x_j, y_j) - log P~[k, y_j]), omega_c <- mean_j gamma[j, :], and trains every model k
with the gamma[:, k]-weighted cross-entropy.
The server keeps K models, every client's cluster weights omega (``ClientRecord.soft``: they go
down in the message and come back updated, so nothing is lost when a client restarts), the last
class-by-cluster mass S_c every client reported, and FedRC's label-frequency estimates

    P~[k, y] = A[k, y] / sum_y' A[k, y'],   A[k, y] = max(sum_c S_c[k, y], 1e-8)

over the latest S_c of every client ever seen (the authors' code; docs/fedrc/README.md, D1). Each
model is the FedAvg of the clients' trained copies with weights N_c (not omega: docs/fedrc/README.md,
D6). FedEM is FedRC with P~ fixed to uniform, the one place the two differ.

Variants (``[tool.flwr.app.config.fedrc]``, shared by both): test-time hard clustering
(``hard-test``, TeHC), training-time hard clustering (``hard-train``, TrHC), removal of clusters
whose share of the sample mass falls below ``prune-threshold`` once the weights have converged
(adaptive FedRC), an omega floor and Gaussian noise on S_c (label privacy).
Held-out clients estimate omega by EM on their labelled adaptation split, then predict with the
mixture.
"""

from __future__ import annotations

from logging import INFO
from typing import Any, ClassVar

import numpy as np
from flwr.common.logger import log

from fedcluster_app.core import wire as P
from fedcluster_app.core.config import ConfigError
from fedcluster_app.core.limits import ModelCount
from fedcluster_app.core.server.strategy import ClusteredStrategy, RejectedReply, Reply, Task
from fedcluster_app.families.fedrc import catalogue
from fedcluster_app.families.fedrc import wire as C

MASS_FLOOR = 1e-8           # A[k, y] is clamped here before normalising (code)
OMEGA_SUM_TOL = 1e-4        # a reply's omega must sum to 1 within this


class FedRC(ClusteredStrategy):
    name, description, Params = catalogue.FEDRC.class_attributes()
    message_kinds: ClassVar[dict[str, str]] = {P.TRAIN: C.TRAIN_KIND, P.EVALUATE: C.EVAL_KIND}
    label_correction: ClassVar[bool] = True          # False: FedEM

    def __init__(self, experiment) -> None:
        super().__init__(experiment)
        k = self.cfg.num_clusters
        if not self.params.omega_floor < 1.0 / k:
            raise ConfigError(f"fedrc.omega-floor must be in [0, 1/K) = [0, {1.0 / k:.4g}) with "
                              f"num-clusters = {k}, got {self.params.omega_floor}")
        self.num_classes = experiment.scenario.num_classes
        self.prior = np.full((0, self.num_classes), 1.0 / self.num_classes)   # K x C, by sorted id
        self.mass_cache: dict[int, np.ndarray] = {}   # cid -> last S_c (K x C, by sorted id)
        self.omega_change: float | None = None         # largest |delta omega| of the last round
        self.pruned: list[dict[str, Any]] = []         # {"round", "model", "mass"}

    # ---------------------------------------------------------------- hooks
    def model_count(self) -> ModelCount:
        return ModelCount(self.cfg.num_clusters, self.cfg.num_clusters, "num-clusters")

    def on_start(self) -> None:
        k = self.cfg.num_clusters
        for j in range(k):
            self.new_model(self.initial_weights(salt=j))   # distinct seeds (docs/fedrc/README.md, D11)
        self.prior = np.full((k, self.num_classes), 1.0 / self.num_classes)
        for cid in self.clients:
            self.on_new_client(cid)

    def on_new_client(self, cid: int) -> None:
        ids = sorted(self.models)
        self.clients[cid].soft = {m: 1.0 / len(ids) for m in ids}

    def omega(self, cid: int) -> list[float]:
        soft = self.clients[cid].soft or {}
        return [float(soft.get(m, 0.0)) for m in sorted(self.models)]

    def common_config(self) -> dict[str, Any]:
        cfg: dict[str, Any] = self.params.to_message(C.PARAMS)
        if self.label_correction:
            cfg[C.PRIOR] = self.prior.ravel().tolist()
        return cfg

    def plan_train(self, step: int) -> dict[int, Task]:
        ids, common = sorted(self.models), self.common_config()
        return {cid: Task(models=ids, config={**common, C.OMEGA: self.omega(cid)})
                for cid in self.sample(self.training_clients(), self.cfg.fraction_train)}

    def check_reply(self, kind: str, reply: Reply) -> None:
        if kind != C.TRAIN_KIND:
            return
        k, c = len(self.models), self.num_classes
        omega = np.asarray(reply.metrics.get(C.OMEGA_REPLY, []), dtype=np.float64)
        if omega.shape != (k,):
            raise RejectedReply(f"cluster weights have {omega.size} entries, expected K = {k}")
        if (omega < 0).any() or abs(float(omega.sum()) - 1.0) > OMEGA_SUM_TOL:
            raise RejectedReply(f"cluster weights must be >= 0 and sum to 1, got "
                                f"{np.round(omega, 6).tolist()} (sum {omega.sum():.6f})")
        mass = np.asarray(reply.metrics.get(C.MASS, []), dtype=np.float64)
        if mass.size != k * c:
            raise RejectedReply(f"class-by-cluster mass has {mass.size} entries, expected "
                                f"K x C = {k} x {c}")
        if sorted(reply.models) != sorted(self.models):
            raise RejectedReply(f"returned models {sorted(reply.models)}, expected all of "
                                f"{sorted(self.models)}")

    def on_train_replies(self, step: int, replies: list[Reply]) -> None:
        super().on_train_replies(step, replies)        # each model: FedAvg with weights N_c
        ids, change = sorted(self.models), 0.0
        for r in replies:
            omega = np.asarray(r.metrics[C.OMEGA_REPLY], dtype=np.float64)
            change = max(change, float(np.abs(omega - self.omega(r.cid)).max()))
            self.clients[r.cid].soft = {m: float(w) for m, w in zip(ids, omega)}
            self.mass_cache[r.cid] = np.asarray(r.metrics[C.MASS], np.float64).reshape(len(ids), -1)
        self.omega_change = change if replies else None
        if self.label_correction and self.mass_cache:
            self.prior = label_prior(list(self.mass_cache.values()))
        self.maybe_prune()

    # ---------------------------------------------------------------- adaptive number of clusters
    def cluster_mass(self) -> np.ndarray:
        """Share of the total sample mass of each model (sorted ids), from the cached S_c."""
        if not self.mass_cache:
            return np.full(len(self.models), 1.0 / max(len(self.models), 1))
        total = np.maximum(sum(s.sum(axis=1) for s in self.mass_cache.values()), 0.0)
        return total / total.sum() if total.sum() > 0 else np.full(len(total), 1.0 / len(total))

    def maybe_prune(self) -> None:
        p = self.params
        if p.prune_threshold <= 0 or self.round <= p.prune_warmup:
            return
        converged = self.omega_change is not None and self.omega_change < p.prune_tol
        if not (converged or p.prune_every_round):
            return
        ids, mass = sorted(self.models), self.cluster_mass()
        drop = [j for j in range(len(ids)) if mass[j] < p.prune_threshold]
        if len(drop) == len(ids):                   # never remove every model
            drop.remove(int(np.argmax(mass)))
        if not drop:
            return
        keep = [j for j in range(len(ids)) if j not in drop]
        for j in drop:
            self.delete_model(ids[j])
            self.pruned.append({"round": self.round, "model": ids[j], "mass": float(mass[j])})
            log(INFO, "round %d: fedrc removed cluster model %d (mass share %.4f < %.4f)",
                self.round, ids[j], mass[j], p.prune_threshold)
        self.prior = self.prior[keep]
        self.prior /= self.prior.sum(axis=1, keepdims=True)
        self.mass_cache = {c: s[keep] for c, s in self.mass_cache.items()}
        for rec in self.clients.values():           # renormalise omega over what is left
            if rec.soft:
                total = sum(rec.soft.values())
                rec.soft = ({m: w / total for m, w in rec.soft.items()} if total > 0
                            else {m: 1.0 / len(self.models) for m in self.models})

    # ---------------------------------------------------------------- evaluation
    def eval_task(self, cid: int) -> Task | None:
        if cid not in self.mass_cache:    # never trained (partial participation): it has no
            return self.global_eval_task(cid)   # omega yet, so it estimates one as a newcomer
        if not self.params.hard_test:
            return super().eval_task(cid)             # the omega-mixture
        return Task(models=[self.assigned_model(cid)])  # TeHC: the argmax-omega model

    def global_eval_task(self, cid: int) -> Task | None:
        config: dict[str, Any] = {C.ESTIMATE: True, **self.params.to_message(C.PARAMS)}
        if self.label_correction and self.params.test_use_label_prior:
            config[C.PRIOR] = self.prior.ravel().tolist()
        return Task(models=sorted(self.models), config=config)

    def round_metrics(self) -> dict[str, Any]:
        return {"omega_change": self.omega_change,
                "cluster_mass": [round(float(m), 6) for m in self.cluster_mass()]}

    def summary_extra(self) -> dict[str, Any]:
        ids = sorted(self.models)
        return {"model_ids": ids, "label_prior": np.round(self.prior, 6).tolist(),
                "cluster_mass_final": [round(float(m), 6) for m in self.cluster_mass()],
                "pruned": self.pruned}

    # ---------------------------------------------------------------- checkpoint
    def strategy_state(self) -> dict[str, Any]:
        return {"prior": self.prior.tolist(), "omega_change": self.omega_change,
                "mass_cache": {str(c): s.tolist() for c, s in self.mass_cache.items()},
                "pruned": self.pruned}

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        self.prior = np.asarray(state["prior"], dtype=np.float64).reshape(-1, self.num_classes)
        self.omega_change = state["omega_change"]
        self.mass_cache = {int(c): np.asarray(s, np.float64) for c, s in state["mass_cache"].items()}
        self.pruned = list(state["pruned"])


class FedEM(FedRC):
    name, description, Params = catalogue.FEDEM.class_attributes()
    label_correction = False


def label_prior(masses: list[np.ndarray]) -> np.ndarray:
    """P~ (K x C) from clients' class-by-cluster masses: clamped column sums, rows normalised."""
    a = np.maximum(np.sum(masses, axis=0), MASS_FLOOR)
    return a / a.sum(axis=1, keepdims=True)

