"""Baselines of the FedDrift paper under its time-step protocol (feddrift.md section 6).

Oblivious, Window, Window-2, Oracle-T and Oracle-W live in ``feddrift_protocol``; this module
adds the IFCA variants and the other baselines. Their hyper-parameters are in
``[tool.flwr.app.config.feddrift-baselines]``; IFCA's number of models is ``num-clusters``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from flwr.serverapp import Grid

from fedcluster_app.core import wire as P
from fedcluster_app.families.feddrift.client import (BOOTSTRAP, CONFUSION, ENS_VOTE, ENS_WEIGHTS, ENSEMBLE_KIND, MASK, MSE, PROBE_KIND, STEP_WEIGHTS)
from fedcluster_app.core.config import ConfigError, section
from fedcluster_app.families.foundation.adaptive_fedavg import AdaptiveLR
from fedcluster_app.core.strategy import Reply, Task
from fedcluster_app.families.foundation.cfl import CFLSplitter, flatten
from fedcluster_app.families.feddrift.protocol import TimeStepProtocol, _average

BASELINES = "feddrift-baselines"


def baseline_hparams(raw: dict) -> dict[str, Any]:
    h = section(raw, BASELINES)
    out = {
        "driftsurf_delta": float(h.get("driftsurf-delta", 0.05)),
        "driftsurf_reactive": int(h.get("driftsurf-reactive", 3)),
        "cfl_gamma": float(h.get("cfl-gamma", 0.1)),
        "afa_lr": float(h.get("afa-lr", 0.1)),
        "afa_beta": float(h.get("afa-beta", 0.5)),
    }
    checks = [
        (0 < out["driftsurf_delta"] <= 1, "feddrift-baselines.driftsurf-delta must be in (0, 1]"),
        (out["driftsurf_reactive"] >= 1, "feddrift-baselines.driftsurf-reactive must be >= 1"),
        (0 < out["cfl_gamma"] < 1, "feddrift-baselines.cfl-gamma must be in (0, 1)"),
        (math.isfinite(out["afa_lr"]) and out["afa_lr"] > 0, "feddrift-baselines.afa-lr must be > 0"),
        (0 < out["afa_beta"] < 1, "feddrift-baselines.afa-beta must be in (0, 1)"),
    ]
    for ok, msg in checks:
        if not ok:
            raise ConfigError(f"{msg}, got {h}")
    return out


class IFCAT(TimeStepProtocol):
    """IFCA(T): k models with distinct inits; once per step each client takes the lowest-error
    model on its new batch (Algorithm 2), training with history attached per step."""

    name = "ifca-t"
    description = "IFCA(T): k models, cluster once per step to the lowest error, all history"

    def on_start(self) -> None:
        for k in range(self.cfg.num_clusters):
            self.new_model(self.initial_weights(salt=k))

    def begin_step(self, grid: Grid, tau: int) -> None:
        ids = sorted(self.models)
        if tau == 1:
            self.W[tau] = {cid: ids[0] for cid in self.clients}
            return
        errs = self.probe(grid, tau, ids)
        self.W[tau] = {cid: (self.argmin_random(errs[cid]) if cid in errs
                             else self.carry_identity(cid, tau)) for cid in sorted(self.clients)}


class IFCAW(TimeStepProtocol):
    """IFCA-W: per-round IFCA on the newest batch only (past identities forgotten)."""

    name = "ifca-w"
    description = "IFCA-W: k models, every round each client trains its lowest-loss one, newest batch"
    train_window = 1

    def on_start(self) -> None:
        for k in range(self.cfg.num_clusters):
            self.new_model(self.initial_weights(salt=k))

    def begin_step(self, grid: Grid, tau: int) -> None:
        ids = sorted(self.models)
        prev = self.W.get(tau - 1, {})
        self.W[tau] = {cid: prev.get(cid, ids[0]) for cid in self.clients}

    def train_tasks(self, tau: int, rnd: int) -> dict[int, Task]:
        ids = sorted(self.models)
        if tau == 1 and rnd == 1:      # everybody starts on model 0 (section 7 #16)
            return {cid: Task(models=[ids[0]], config={P.STEP: tau, P.DATA_STEPS: [tau]})
                    for cid in sorted(self.clients)}
        return {cid: Task(models=ids, config={P.STEP: tau, P.DATA_STEPS: [tau], P.SELECT: "min-loss"})
                for cid in sorted(self.clients)}

    def end_round(self, tau: int, rnd: int, replies: list[Reply]) -> None:
        for r in replies:
            if P.CHOSEN in r.metrics:
                self.W[tau][r.cid] = int(r.metrics[P.CHOSEN])

    def active_models(self, tau: int) -> list[int]:
        return sorted(self.models)


class WeightedLinear(TimeStepProtocol):
    """One model on all history; each minibatch first picks a past step t with prob. ~ t."""

    name = "weighted-linear"
    description = "FedDrift baseline: FedAvg on all history, steps sampled with probability ~ t"

    def step_weight(self, t: int, tau: int) -> float:
        return float(t)

    def train_tasks(self, tau: int, rnd: int) -> dict[int, Task]:
        tasks = super().train_tasks(tau, rnd)
        for task in tasks.values():
            for m in task.models:
                steps = task.config[f"{P.DATA_STEPS}.{m}"]
                task.config[f"{STEP_WEIGHTS}.{m}"] = [self.step_weight(t, tau) for t in steps]
        return tasks


class WeightedExp(WeightedLinear):
    name = "weighted-exp"
    description = "FedDrift baseline: FedAvg on all history, steps sampled with probability ~ 2^t"

    def step_weight(self, t: int, tau: int) -> float:
        return 2.0 ** (t - tau)


class AdaptiveFedAvg(TimeStepProtocol):
    """Adaptive-FedAvg: client SGD on the newest batch with a server lr adapted once per step
    (the shared schedule ``adaptive_lr.AdaptiveLR`` with t = the step, one beta for all three,
    m^_0 = w_1; ``adaptive-fedavg-rounds`` is the per-round version of the FedCCFA paper)."""

    name = "adaptive-fedavg"
    description = "Adaptive-FedAvg: SGD on the newest batch, lr adapted to the model's drift"
    train_window = 1

    def __init__(self, experiment) -> None:
        super().__init__(experiment)
        h = baseline_hparams(self.cfg.raw)
        self.lr0 = h["afa_lr"]
        self.beta = h["afa_beta"]
        self.schedule = AdaptiveLR(self.lr0, self.beta, self.beta, self.beta, zero_start=False)
        self.lr_log: list[float] = []

    @property
    def lr(self) -> float:
        return self.schedule.lr

    def train_tasks(self, tau: int, rnd: int) -> dict[int, Task]:
        tasks = super().train_tasks(tau, rnd)
        for task in tasks.values():
            task.config.update({"optimizer": "sgd", "lr": float(self.lr), "momentum": 0.0})
        return tasks

    def end_step(self, tau: int) -> None:
        self.lr_log.append(self.schedule.update(flatten(self.models[min(self.models)]), tau))

    def step_metrics(self, tau, accs):
        return {**super().step_metrics(tau, accs), "lr": self.lr}

    def strategy_state(self) -> dict[str, Any]:
        return {**super().strategy_state(), **self.schedule.state()}

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        super().load_strategy_state(state)
        self.schedule.load_state(state)


class CFL(TimeStepProtocol):
    """CFL (Sattler et al.) over time steps: clusters only split; a client's history follows it."""

    name = "cfl"
    description = "CFL (Sattler et al.): split clusters by update cosine similarity, all history"

    def __init__(self, experiment) -> None:
        super().__init__(experiment)
        self.splitter = CFLSplitter(gamma=baseline_hparams(self.cfg.raw)["cfl_gamma"])
        self.cluster_of: dict[int, int] = {}
        self.splits: list = []                      # [step, parent, child, moved clients]

    def begin_step(self, grid: Grid, tau: int) -> None:
        if not self.models:
            m0 = self.new_model()
            self.cluster_of = {cid: m0 for cid in self.clients}
        for cid in self.clients:
            self.cluster_of.setdefault(cid, min(self.models))
        self.W[tau] = dict(self.cluster_of)

    def train_tasks(self, tau: int, rnd: int) -> dict[int, Task]:
        steps = self.train_steps(tau)
        return {cid: Task(models=[m], config={P.STEP: tau, f"{P.DATA_STEPS}.{m}": steps})
                for cid, m in sorted(self.cluster_of.items()) if m in self.models}

    def aggregate(self, tau: int, replies: list[Reply]) -> None:
        by_model: dict[int, list[Reply]] = {}
        for r in replies:
            for m in r.models:
                by_model.setdefault(m, []).append(r)
        for m, rs in sorted(by_model.items()):
            base = flatten(self.models[m])
            updates = np.stack([flatten(r.models[m]) - base for r in rs])
            split = self.splitter.propose(updates)
            if split is not None:
                child = self.new_model([a.copy() for a in self.models[m]])
                moved = [rs[i].cid for i in split[1]]
                for cid in moved:
                    self.cluster_of[cid] = child
                    self.W[tau][cid] = child
                self.splits.append([tau, m, child, moved])
                continue                      # that round's aggregation is skipped
            self.models[m] = _average([(r.models[m], float(r.model_metrics[m][P.NUM_EXAMPLES]))
                                       for r in rs])

    def step_metrics(self, tau, accs):
        rec = super().step_metrics(tau, accs)
        rec["splits"] = sum(1 for s in self.splits if s[0] == tau)
        return rec

    def strategy_state(self) -> dict[str, Any]:
        return {**super().strategy_state(), "cluster_of": {str(c): m for c, m in self.cluster_of.items()},
                "max_mean_norm": self.splitter.max_mean_norm, "splits": self.splits}

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        super().load_strategy_state(state)
        self.cluster_of = {int(c): int(m) for c, m in state["cluster_of"].items()}
        self.splitter.max_mean_norm = float(state["max_mean_norm"])
        self.splits = list(state["splits"])


class CFLW(CFL):
    name = "cfl-w"
    description = "CFL-W: CFL where each client trains on its newest batch only"
    train_window = 1


class DriftSurf(TimeStepProtocol):
    """DriftSurf (feddrift.md section 6): a server-side stable/reactive state machine."""

    name = "driftsurf"
    description = "DriftSurf: centralised drift detector with stable and reactive models"
    MAX_STEPS = 10

    def __init__(self, experiment) -> None:
        super().__init__(experiment)
        h = baseline_hparams(self.cfg.raw)
        self.delta, self.r = h["driftsurf_delta"], h["driftsurf_reactive"]
        self.state = "stable"
        self.p = self.s = self.rm = None            # predictive, stable, reactive model ids
        self.steps: dict[int, list[int]] = {}       # model -> its training steps
        self.acc_best = 0.0
        self.reactive_acc: dict[str, list[float]] = {"p": [], "r": []}
        self.use: int | None = None                  # model used for inference this step
        self.switches = 0

    def _pooled_acc(self, errs: dict[int, dict[int, float]], m: int, tau: int) -> float:
        n = {c: self.batch_size(tau, c) for c in errs}
        tot = sum(n.values())
        return sum((1 - e[m]) * n[c] for c, e in errs.items()) / tot if tot else 0.0

    def _add(self, m: int, tau: int) -> None:
        self.steps.setdefault(m, []).append(tau)
        self.steps[m] = self.steps[m][-self.MAX_STEPS:]

    def begin_step(self, grid: Grid, tau: int) -> None:
        if tau == 1:
            self.p, self.s = self.new_model(), self.new_model()
            self._add(self.p, 1)
            self._add(self.s, 1)
            self.use = self.p
        else:
            live = [m for m in (self.p, self.s, self.rm) if m is not None]
            errs = self.probe(grid, tau, live)
            acc = {m: self._pooled_acc(errs, m, tau) for m in live} if errs else {}
            if self.state == "stable":
                acc_p, acc_s = acc.get(self.p, 0.0), acc.get(self.s, 0.0)
                if errs and (acc_p < self.acc_best - self.delta or acc_p < acc_s - self.delta / 2):
                    self.state = "reactive"
                    self.delete_model(self.s)
                    self.steps.pop(self.s, None)
                    self.s = None
                    self.rm = self.new_model()
                    self._add(self.rm, tau)
                    self._add(self.p, tau)
                    self.reactive_acc = {"p": [], "r": []}
                    self._events["detected_clients"] = sorted(self.clients)
                else:
                    self._add(self.p, tau)
                    self._add(self.s, tau)
                self.acc_best = max(self.acc_best, acc_p)
                self.use = self.p
            else:
                acc_p, acc_r = acc.get(self.p, 0.0), acc.get(self.rm, 0.0)
                self.reactive_acc["p"].append(acc_p)
                self.reactive_acc["r"].append(acc_r)
                if len(self.reactive_acc["r"]) >= self.r:
                    if np.mean(self.reactive_acc["r"]) > np.mean(self.reactive_acc["p"]):
                        self.delete_model(self.p)
                        self.steps.pop(self.p, None)
                        self.p = self.rm
                        self.acc_best = max(self.reactive_acc["r"])
                        self.switches += 1
                    else:
                        self.delete_model(self.rm)
                        self.steps.pop(self.rm, None)
                    self.rm = None
                    self.state = "stable"
                    self.s = self.new_model()
                    self._add(self.s, tau)
                    self._add(self.p, tau)
                    self.use = self.p
                else:
                    self._add(self.p, tau)
                    self._add(self.rm, tau)
                    self.use = self.rm if acc_r > acc_p else self.p
        self.W[tau] = {cid: self.use for cid in self.clients}

    def active_models(self, tau: int) -> list[int]:
        return sorted(m for m in (self.p, self.s, self.rm) if m is not None)

    def train_tasks(self, tau: int, rnd: int) -> dict[int, Task]:
        live = self.active_models(tau)
        cfg: dict[str, Any] = {P.STEP: tau}
        for m in live:
            cfg[f"{P.DATA_STEPS}.{m}"] = list(self.steps[m])
        return {cid: Task(models=live, config=dict(cfg)) for cid in sorted(self.clients)}

    def step_metrics(self, tau, accs):
        return {**super().step_metrics(tau, accs), "driftsurf_state": self.state,
                "switches": self.switches}

    def strategy_state(self) -> dict[str, Any]:
        return {**super().strategy_state(), "ds": {
            "state": self.state, "p": self.p, "s": self.s, "rm": self.rm, "use": self.use,
            "steps": {str(m): v for m, v in self.steps.items()}, "acc_best": self.acc_best,
            "reactive_acc": self.reactive_acc, "switches": self.switches}}

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        super().load_strategy_state(state)
        d = state["ds"]
        self.state, self.p, self.s, self.rm, self.use = d["state"], d["p"], d["s"], d["rm"], d["use"]
        self.steps = {int(m): list(v) for m, v in d["steps"].items()}
        self.acc_best, self.reactive_acc, self.switches = d["acc_best"], d["reactive_acc"], d["switches"]


class AUE(TimeStepProtocol):
    """Accuracy Updated Ensemble: up to 5 members, member j trains on the last j+1 batches,
    weights from the pooled MSE on the newest batch, prediction by weighted hard vote."""

    name = "aue"
    description = "AUE: ensemble of up to 5 models on sliding windows, MSE-based weights"
    SIZE = 5
    EPS = 1e-20

    def __init__(self, experiment) -> None:
        super().__init__(experiment)
        self.members: list[int] = []              # newest first
        self.weights: dict[int, float] = {}

    def begin_step(self, grid: Grid, tau: int) -> None:
        C = self.exp.scenario.num_classes
        mse_r = (1.0 - 1.0 / C) ** 2
        mse: dict[int, float] = {}
        if self.members:
            tasks = {cid: Task(models=list(self.members), config={P.STEP: tau, P.DATA_STEPS: [tau]})
                     for cid in sorted(self.clients)}
            num = {m: 0.0 for m in self.members}
            den = 0.0
            for r in self.send(grid, PROBE_KIND, tasks):
                ids = [int(i) for i in r.metrics.get(P.MODEL_IDS, [])]
                vals = list(r.metrics.get(MSE, []))
                if ids != sorted(self.members) or len(vals) != len(ids):
                    continue
                n = float(r.num_examples)
                for m, v in zip(ids, vals):
                    num[m] += v * n
                den += n
            if den > 0:
                mse = {m: num[m] / den for m in self.members}
        self.weights = {m: 1.0 / (mse_r + mse[m] + self.EPS) for m in self.members if m in mse}
        new = self.new_model()
        self.weights[new] = 1.0 / (mse_r + self.EPS)
        self.members.insert(0, new)
        while len(self.members) > self.SIZE:
            old = self.members.pop()
            self.weights.pop(old, None)
            self.delete_model(old)
        for m in self.members:
            self.weights.setdefault(m, 1.0 / (mse_r + self.EPS))
        self.W[tau] = {cid: new for cid in self.clients}

    def active_models(self, tau: int) -> list[int]:
        return sorted(self.members)

    def train_tasks(self, tau: int, rnd: int) -> dict[int, Task]:
        cfg: dict[str, Any] = {P.STEP: tau}
        for j, m in enumerate(self.members):
            cfg[f"{P.DATA_STEPS}.{m}"] = list(range(max(1, tau - j), tau + 1))
        return {cid: Task(models=sorted(self.members), config=dict(cfg)) for cid in sorted(self.clients)}

    def evaluate_step(self, grid: Grid, tau: int) -> dict[int, float]:
        ids = sorted(self.members)
        cfg = {P.STEP: tau + 1, P.TEST_STEP: tau + 1, P.TEST_SPLIT: "train",
               ENS_WEIGHTS: [float(self.weights[m]) for m in ids], ENS_VOTE: "hard"}
        replies = self.send(grid, ENSEMBLE_KIND, {c: Task(models=ids, config=dict(cfg))
                                                  for c in sorted(self.clients)})
        return {r.cid: float(r.metrics[P.ACCURACY]) for r in replies if P.ACCURACY in r.metrics}

    def strategy_state(self) -> dict[str, Any]:
        return {**super().strategy_state(), "members": self.members,
                "weights": {str(m): w for m, w in self.weights.items()}}

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        super().load_strategy_state(state)
        self.members = [int(m) for m in state["members"]]
        self.weights = {int(m): float(w) for m, w in state["weights"].items()}


def cohen_kappa(confusion: np.ndarray) -> float:
    n = confusion.sum()
    if n <= 0:
        return 0.0
    po = np.trace(confusion) / n
    pe = float((confusion.sum(axis=0) * confusion.sum(axis=1)).sum()) / (n * n)
    return float((po - pe) / (1 - pe)) if pe < 1 else 0.0


class KUE(TimeStepProtocol):
    """Kappa Updated Ensemble: 10 models on random feature subspaces, trained on Poisson(1)
    bootstraps of the newest batch; weights = Cohen's kappa on the newest pooled data; the
    lowest-kappa model is replaced by a fresh one each step; kappa-weighted soft vote."""

    name = "kue"
    description = "KUE: 10 models on random feature subspaces, kappa weights, replace the worst"
    SIZE = 10

    def __init__(self, experiment) -> None:
        super().__init__(experiment)
        self.members: list[int] = []
        self.masks: dict[int, list[float]] = {}
        self.kappa: dict[int, float] = {}
        self.salt = 0

    def _fresh(self) -> int:
        d = int(np.prod(self.exp.scenario.input_shape))
        r = int(self.rng.integers(1, d + 1))
        feats = self.rng.choice(d, size=r, replace=False)
        mask = np.zeros(d)
        mask[feats] = 1.0
        self.salt += 1
        m = self.new_model(self.initial_weights(salt=self.salt))
        self.masks[m] = mask.tolist()
        return m

    def begin_step(self, grid: Grid, tau: int) -> None:
        if not self.members:
            self.members = [self._fresh() for _ in range(self.SIZE)]
            self.kappa = {m: 1.0 for m in self.members}
        else:
            ids = sorted(self.members)
            cfg = {P.STEP: tau, P.DATA_STEPS: [tau], **self._mask_cfg(ids)}
            C = self.exp.scenario.num_classes
            conf = {m: np.zeros((C, C)) for m in ids}
            for r in self.send(grid, PROBE_KIND, {c: Task(models=ids, config=dict(cfg))
                                                  for c in sorted(self.clients)}):
                flat = list(r.metrics.get(CONFUSION, []))
                if [int(i) for i in r.metrics.get(P.MODEL_IDS, [])] != ids or len(flat) != len(ids) * C * C:
                    continue
                for k, m in enumerate(ids):
                    conf[m] += np.asarray(flat[k * C * C:(k + 1) * C * C]).reshape(C, C)
            self.kappa = {m: cohen_kappa(conf[m]) for m in ids}
            worst = min(ids, key=lambda m: (self.kappa[m], m))
            self.members.remove(worst)
            self.delete_model(worst)
            self.masks.pop(worst, None)
            self.kappa.pop(worst, None)
            new = self._fresh()
            self.members.append(new)
            self.kappa[new] = 0.0                   # unknown until measured: not in the vote
        self.W[tau] = {cid: self.members[0] for cid in self.clients}

    def _mask_cfg(self, ids: list[int]) -> dict[str, Any]:
        return {f"{MASK}.{m}": self.masks[m] for m in ids}

    def active_models(self, tau: int) -> list[int]:
        return sorted(self.members)

    def train_tasks(self, tau: int, rnd: int) -> dict[int, Task]:
        ids = sorted(self.members)
        cfg = {P.STEP: tau, P.DATA_STEPS: [tau], BOOTSTRAP: True, **self._mask_cfg(ids)}
        return {cid: Task(models=ids, config=dict(cfg)) for cid in sorted(self.clients)}

    def evaluate_step(self, grid: Grid, tau: int) -> dict[int, float]:
        voters = sorted(m for m in self.members if self.kappa.get(m, 0.0) > 0) or sorted(self.members)
        weights = [max(self.kappa.get(m, 0.0), 0.0) or 1.0 for m in voters]
        cfg = {P.STEP: tau + 1, P.TEST_STEP: tau + 1, P.TEST_SPLIT: "train",
               ENS_WEIGHTS: weights, ENS_VOTE: "soft", **self._mask_cfg(voters)}
        replies = self.send(grid, ENSEMBLE_KIND, {c: Task(models=voters, config=dict(cfg))
                                                  for c in sorted(self.clients)})
        return {r.cid: float(r.metrics[P.ACCURACY]) for r in replies if P.ACCURACY in r.metrics}

    def step_metrics(self, tau, accs):
        return {**super().step_metrics(tau, accs),
                "kappa": {str(m): round(k, 4) for m, k in sorted(self.kappa.items())}}

    def strategy_state(self) -> dict[str, Any]:
        return {**super().strategy_state(), "members": self.members, "salt": self.salt,
                "masks": {str(m): v for m, v in self.masks.items()},
                "kappa": {str(m): v for m, v in self.kappa.items()}}

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        super().load_strategy_state(state)
        self.members = [int(m) for m in state["members"]]
        self.salt = int(state["salt"])
        self.masks = {int(m): list(v) for m, v in state["masks"].items()}
        self.kappa = {int(m): float(v) for m, v in state["kappa"].items()}
