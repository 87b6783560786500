"""The FedDrift paper's baselines under its time-step protocol.

"Federated Learning under Distributed Concept Drift", Jothimurugesan et al., AISTATS 2023,
https://arxiv.org/abs/2206.00799, section 5 and appendix C. The foundation's strategies serve
here under the time-step protocol (one implementation for every protocol):

* Oblivious, Window, Window-2: FedAvg on all history / the newest batch / the last two;
* Oracle-T, Oracle-W: one model per true concept, on all history / the newest batch;
* IFCA-W: per-round IFCA on the newest batch; CFL, CFL-W: CFL whose clients train on their
  whole history / the newest batch; Adaptive-FedAvg: its lr adapted once per step.

The paper's other baselines are written for the protocol:

* IFCA(T): K models; once per step each client takes the model of lowest 0-1 error on its new
  batch (ties at random), then trains it with its history attached per step;
* Weighted-Linear / Weighted-Exp: FedAvg on all history, every minibatch first drawing a past
  step t with probability proportional to t / to 2^t;
* DriftSurf (Tahmasbi et al., ICML 2021): a server-side state machine with a stable and a
  reactive model;
* AUE (Brzezinski & Stefanowski 2014): an ensemble of up to 5 models on sliding windows,
  weighted by their mean squared error on the newest batch, hard vote;
* KUE (Cano & Krawczyk 2020): 10 models on random feature subspaces and Poisson(1) bootstraps,
  weighted by Cohen's kappa on the newest batch, the worst replaced every step, soft vote.

Details the paper leaves open follow the authors' code: docs/feddrift/README.md D15, D16 and D22.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from flwr.serverapp import Grid

from fedcluster_app.core import wire as P
from fedcluster_app.core.limits import ModelCount
from fedcluster_app.core.server.strategy import Task
from fedcluster_app.families.feddrift import catalogue
from fedcluster_app.families.feddrift.protocol import TimeStepProtocol, TimeStepStrategy
from fedcluster_app.families.feddrift.wire import (
    BOOTSTRAP,
    CONFUSION,
    ENS_VOTE,
    ENS_WEIGHTS,
    ENSEMBLE_KIND,
    MASK,
    MIN_ERROR,
    MSE,
    PROBE_KIND,
    STEP_WEIGHTS,
)
from fedcluster_app.families.foundation.adaptive_fedavg import AdaptiveFedAvg
from fedcluster_app.families.foundation.cfl import CFL
from fedcluster_app.families.foundation.fedavg import FedAvg
from fedcluster_app.families.foundation.ifca import IFCA
from fedcluster_app.families.foundation.oracle import Oracle


# ------------------------------------------------------------------ the foundation's, here
class Oblivious(FedAvg):
    name, description, Params = catalogue.OBLIVIOUS.class_attributes()
    protocol_factory = TimeStepProtocol.window(0)


class Window(FedAvg):
    name, description, Params = catalogue.WINDOW.class_attributes()
    protocol_factory = TimeStepProtocol.window(1)


class Window2(FedAvg):
    name, description, Params = catalogue.WINDOW_2.class_attributes()
    protocol_factory = TimeStepProtocol.window(2)


class OracleT(Oracle):
    name, description, Params = catalogue.ORACLE_T.class_attributes()
    protocol_factory = TimeStepProtocol.window(0)


class OracleW(Oracle):
    name, description, Params = catalogue.ORACLE_W.class_attributes()
    protocol_factory = TimeStepProtocol.window(1)


class IFCAW(IFCA):
    """IFCA-W: per-round IFCA on the newest batch. Every round each client trains the model of
    lowest 0-1 error on its newest batch (``ifca-choice = "error"``, the FedDrift authors'
    code: highest accuracy, ties to the lowest id; docs/feddrift/README.md, D23) or of lowest
    cross-entropy (``"loss"``, IFCA's rule); each model is the sample-weighted mean of the
    clients that trained it. "An Efficient Framework for Clustered Federated Learning", Ghosh
    et al., NeurIPS 2020, https://arxiv.org/abs/2006.04088, as the FedDrift paper runs it."""

    name, description, Params = catalogue.IFCA_W.class_attributes()
    protocol_factory = TimeStepProtocol.window(1)
    warm_start = True        # everybody trains model 0 in round 1 (D15)

    def select_rule(self) -> str:
        return MIN_ERROR if self.params.ifca_choice == "error" else super().select_rule()


class CFLT(CFL):
    name, description, Params = catalogue.CFL.class_attributes()
    protocol_factory = TimeStepProtocol.window(0)
    aggregate_before_split = False      # the authors' code: a split skips the round's average
    min_split_members = 2

    def split_settings(self) -> tuple[float, float | None, float | None, int]:
        return self.params.cfl_gamma, None, None, 0     # the heuristic thresholds, no cap (D16)


class CFLW(CFLT):
    name, description, Params = catalogue.CFL_W.class_attributes()
    protocol_factory = TimeStepProtocol.window(1)


class AdaptiveFedAvgT(AdaptiveFedAvg):
    name, description, Params = catalogue.ADAPTIVE_FEDAVG.class_attributes()
    protocol_factory = TimeStepProtocol.window(1)
    per = "step"
    zero_start = False

    def schedule_constants(self) -> tuple[float, float, float, float]:
        p = self.params
        return self.cfg.train.lr, p.afa_beta, p.afa_beta, p.afa_beta


# ------------------------------------------------------------------ written for the protocol
class IFCAT(TimeStepStrategy):
    """IFCA(T): k models with distinct inits; once per step each client takes the lowest-error
    model on its new batch (ties at random), training with history attached per step."""

    name, description, Params = catalogue.IFCA_T.class_attributes()

    def model_count(self) -> ModelCount:
        return ModelCount(self.cfg.num_clusters, self.cfg.num_clusters, "num-clusters")

    def on_start(self) -> None:
        for k in range(self.cfg.num_clusters):
            self.new_model(self.initial_weights(salt=k))

    def begin_step(self, grid: Grid, tau: int) -> None:
        ids = sorted(self.models)
        if tau == 1:
            for cid in self.clients:
                self.assign(cid, ids[0])
            return
        errs = self.probe(grid, tau, ids)
        for cid in sorted(self.clients):
            if cid in errs:
                self.assign(cid, self.argmin_random(errs[cid]))


class WeightedLinear(Oblivious):
    """One model on all history; each minibatch first picks a past step t with prob. ~ t."""

    name, description, Params = catalogue.WEIGHTED_LINEAR.class_attributes()

    def step_weight(self, t: int, tau: int) -> float:
        return float(t)

    def plan_train(self, step: int) -> dict[int, Task]:
        tasks = super().plan_train(step)
        for task in tasks.values():
            for m in task.models:
                steps = task.config[f"{P.DATA_STEPS}.{m}"]
                task.config[f"{STEP_WEIGHTS}.{m}"] = [self.step_weight(t, step) for t in steps]
        return tasks


class WeightedExp(WeightedLinear):
    name, description, Params = catalogue.WEIGHTED_EXP.class_attributes()

    def step_weight(self, t: int, tau: int) -> float:
        return 2.0 ** (t - tau)


class DriftSurf(TimeStepStrategy):
    """DriftSurf: a server-side stable/reactive state machine over pooled probe accuracies.

    "DriftSurf: Stable-State / Reactive-State Learning under Concept Drift", Tahmasbi et al.,
    ICML 2021, https://arxiv.org/abs/2003.06508; federated as in the FedDrift paper (the server
    pools every client's accuracy on its new batch). Each step tau, with a = the predictive
    model's accuracy and acc_best = max(acc_best, a) (in either state):

    * stable: drift when a < acc_best - delta or a < a_stable - delta / 2 (a_stable = 0 while
      the stable model has not trained yet); then the stable model goes, a fresh reactive
      model starts and both it and the predictive model train on tau. Else both the predictive
      and the stable model train on tau (a fresh stable model starts here after a period).
    * reactive, for r steps counting the one that entered it (so r - 1 comparisons): each step
      the better of the two on the new batch serves it, and both train. At the last step the
      reactive model replaces the predictive one if its mean accuracy over the comparisons is
      higher (acc_best = its best); a losing reactive model still trains and serves that step
      and is dropped at the next. The state is stable again.

    As the authors' code (``DriftSurfState.run_ds_algo`` in the FedDrift repository; their
    aggregator serves only a model trained at the step, which is why a losing reactive model
    is dropped at the next step here).
    """

    name, description, Params = catalogue.DRIFTSURF.class_attributes()
    MAX_STEPS = 10

    def __init__(self, experiment) -> None:
        super().__init__(experiment)
        self.delta, self.r = self.params.driftsurf_delta, self.params.driftsurf_reactive
        self.mode = "stable"
        self.p = self.s = self.rm = None            # predictive, stable, reactive model ids
        self.retiring: int | None = None            # a losing reactive model, dropped next step
        self.steps: dict[int, list[int]] = {}       # model -> its training steps
        self.acc_best = 0.0
        self.reactive_acc: dict[str, list[float]] = {"p": [], "r": []}
        self.use: int | None = None                  # model used for inference this step
        self.switches = 0

    def _pooled_acc(self, errs: dict[int, dict[int, float]], m: int, tau: int) -> float:
        n = {c: self.protocol.batch_size(tau, c) for c in errs}
        tot = sum(n.values())
        return sum((1 - e[m]) * n[c] for c, e in errs.items()) / tot if tot else 0.0

    def _add(self, m: int, tau: int) -> None:
        self.steps.setdefault(m, []).append(tau)
        self.steps[m] = self.steps[m][-self.MAX_STEPS:]

    def _drop(self, m: int) -> None:
        self.delete_model(m)
        self.steps.pop(m, None)

    def begin_step(self, grid: Grid, tau: int) -> None:
        if self.retiring is not None:
            self._drop(self.retiring)
            self.retiring = None
        if tau == 1:
            self.p, self.s = self.new_model(), self.new_model()
            self._add(self.p, 1)
            self._add(self.s, 1)
            self.use = self.p
        else:
            live = [m for m in (self.p, self.s, self.rm) if m is not None]
            errs = self.probe(grid, tau, live)
            acc = {m: self._pooled_acc(errs, m, tau) for m in live} if errs else {}
            acc_p = acc.get(self.p, 0.0)
            if errs:
                self.acc_best = max(self.acc_best, acc_p)
            if self.mode == "stable":
                self._stable_step(tau, acc_p, acc.get(self.s, 0.0), bool(errs))
            else:
                self._reactive_step(tau, acc_p, acc.get(self.rm, 0.0))
        for cid in self.clients:
            self.assign(cid, self.use)

    def _stable_step(self, tau: int, acc_p: float, acc_s: float, probed: bool) -> None:
        self.use = self.p
        if probed and (acc_p < self.acc_best - self.delta or acc_p < acc_s - self.delta / 2):
            self.mode = "reactive"
            if self.s is not None:
                self._drop(self.s)
                self.s = None
            self.rm = self.new_model()
            self._add(self.rm, tau)
            self._add(self.p, tau)
            self.reactive_acc = {"p": [], "r": []}
            self.events["detected_clients"] = sorted(self.clients)
            return
        if self.s is None:       # the period is over: a fresh stable model starts here
            self.s = self.new_model()
        self._add(self.p, tau)
        self._add(self.s, tau)

    def _reactive_step(self, tau: int, acc_p: float, acc_r: float) -> None:
        self.reactive_acc["p"].append(acc_p)
        self.reactive_acc["r"].append(acc_r)
        self.use = self.rm if acc_r > acc_p else self.p
        if len(self.reactive_acc["r"]) < self.r - 1:
            self._add(self.p, tau)
            self._add(self.rm, tau)
            return
        # the last step of the period
        self.mode = "stable"
        if np.mean(self.reactive_acc["r"]) > np.mean(self.reactive_acc["p"]):
            self._drop(self.p)
            self.p, self.use = self.rm, self.rm
            self.acc_best = max(self.reactive_acc["r"])
            self.switches += 1
        else:
            self.retiring = self.rm
            self._add(self.rm, tau)
        self._add(self.p, tau)
        self.rm = None

    def active_models(self, step: int) -> list[int]:
        return sorted(m for m in (self.p, self.s, self.rm, self.retiring) if m is not None)

    def plan_train(self, step: int) -> dict[int, Task]:
        live = self.active_models(step)
        cfg: dict[str, Any] = {P.STEP: step}
        for m in live:
            cfg[f"{P.DATA_STEPS}.{m}"] = list(self.steps[m])
        return {cid: Task(models=live, config=dict(cfg)) for cid in sorted(self.clients)}

    def round_metrics(self) -> dict[str, Any]:
        return {"driftsurf_state": self.mode, "switches": self.switches}

    def strategy_state(self) -> dict[str, Any]:
        return {"ds": {
            "state": self.mode, "p": self.p, "s": self.s, "rm": self.rm, "use": self.use,
            "retiring": self.retiring,
            "steps": {str(m): v for m, v in self.steps.items()}, "acc_best": self.acc_best,
            "reactive_acc": self.reactive_acc, "switches": self.switches}}

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        d = state["ds"]
        self.mode, self.p, self.s, self.rm, self.use = d["state"], d["p"], d["s"], d["rm"], d["use"]
        self.retiring = d.get("retiring")
        self.steps = {int(m): list(v) for m, v in d["steps"].items()}
        self.acc_best, self.reactive_acc, self.switches = d["acc_best"], d["reactive_acc"], d["switches"]


class _Ensemble(TimeStepStrategy):
    """What AUE and KUE share: members that all train every step, a weighted vote to test."""

    vote: ClassVar[str] = "hard"

    def __init__(self, experiment) -> None:
        super().__init__(experiment)
        self.ensemble: list[int] = []

    def active_models(self, step: int) -> list[int]:
        return sorted(self.ensemble)

    def voters(self) -> tuple[list[int], list[float], dict[str, Any]]:
        """(model ids, their weights, extra config) of this step's vote."""
        raise NotImplementedError

    def step_eval_tasks(self, tau: int) -> tuple[str, dict[int, Task]]:
        """Every client scores this step's weighted vote (the protocol adds the data)."""
        ids, weights, extra = self.voters()
        cfg = {ENS_WEIGHTS: weights, ENS_VOTE: self.vote, **extra}
        return ENSEMBLE_KIND, {c: Task(models=ids, config=dict(cfg)) for c in sorted(self.clients)}


class AUE(_Ensemble):
    """Accuracy Updated Ensemble: up to 5 members, member j trains on the last j+1 batches,
    weights from the pooled MSE on the newest batch, prediction by weighted hard vote."""

    name, description, Params = catalogue.AUE.class_attributes()
    SIZE = 5
    EPS = 1e-20

    def __init__(self, experiment) -> None:
        super().__init__(experiment)
        self.weights: dict[int, float] = {}       # ensemble: newest first

    def begin_step(self, grid: Grid, tau: int) -> None:
        C = self.exp.scenario.num_classes
        mse_r = (1.0 - 1.0 / C) ** 2
        mse: dict[int, float] = {}
        if self.ensemble:
            tasks = {cid: Task(models=list(self.ensemble), config={P.STEP: tau, P.DATA_STEPS: [tau]})
                     for cid in sorted(self.clients)}
            num = {m: 0.0 for m in self.ensemble}
            den = 0.0
            for r in self.exchange(grid, PROBE_KIND, tasks):
                ids = [int(i) for i in r.metrics.get(P.MODEL_IDS, [])]
                vals = list(r.metrics.get(MSE, []))
                if ids != sorted(self.ensemble) or len(vals) != len(ids):
                    continue
                n = float(r.num_examples)
                for m, v in zip(ids, vals):
                    num[m] += v * n
                den += n
            if den > 0:
                mse = {m: num[m] / den for m in self.ensemble}
        self.weights = {m: 1.0 / (mse_r + mse[m] + self.EPS) for m in self.ensemble if m in mse}
        new = self.new_model()
        self.weights[new] = 1.0 / (mse_r + self.EPS)
        self.ensemble.insert(0, new)
        while len(self.ensemble) > self.SIZE:
            old = self.ensemble.pop()
            self.weights.pop(old, None)
            self.delete_model(old)
        for m in self.ensemble:
            self.weights.setdefault(m, 1.0 / (mse_r + self.EPS))
        for cid in self.clients:
            self.assign(cid, new)

    def plan_train(self, step: int) -> dict[int, Task]:
        cfg: dict[str, Any] = {P.STEP: step}
        for j, m in enumerate(self.ensemble):
            cfg[f"{P.DATA_STEPS}.{m}"] = list(range(max(1, step - j), step + 1))
        return {cid: Task(models=sorted(self.ensemble), config=dict(cfg))
                for cid in sorted(self.clients)}

    def voters(self) -> tuple[list[int], list[float], dict[str, Any]]:
        ids = sorted(self.ensemble)
        return ids, [float(self.weights[m]) for m in ids], {}

    def strategy_state(self) -> dict[str, Any]:
        return {"members": self.ensemble, "weights": {str(m): w for m, w in self.weights.items()}}

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        self.ensemble = [int(m) for m in state["members"]]
        self.weights = {int(m): float(w) for m, w in state["weights"].items()}


def cohen_kappa(confusion: np.ndarray) -> float:
    n = confusion.sum()
    if n <= 0:
        return 0.0
    po = np.trace(confusion) / n
    pe = float((confusion.sum(axis=0) * confusion.sum(axis=1)).sum()) / (n * n)
    return float((po - pe) / (1 - pe)) if pe < 1 else 0.0


class KUE(_Ensemble):
    """Kappa Updated Ensemble: 10 models on random feature subspaces, trained on Poisson(1)
    bootstraps of the newest batch; weights = Cohen's kappa on the newest pooled data; the
    lowest-kappa model is replaced by a fresh one each step; kappa-weighted soft vote."""

    name, description, Params = catalogue.KUE.class_attributes()
    vote = "soft"
    SIZE = 10

    def __init__(self, experiment) -> None:
        super().__init__(experiment)
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
        if not self.ensemble:
            self.ensemble = [self._fresh() for _ in range(self.SIZE)]
            self.kappa = {m: 1.0 for m in self.ensemble}
        else:
            ids = sorted(self.ensemble)
            cfg = {P.STEP: tau, P.DATA_STEPS: [tau], **self._mask_cfg(ids)}
            C = self.exp.scenario.num_classes
            conf = {m: np.zeros((C, C)) for m in ids}
            for r in self.exchange(grid, PROBE_KIND, {c: Task(models=ids, config=dict(cfg))
                                                      for c in sorted(self.clients)}):
                flat = list(r.metrics.get(CONFUSION, []))
                if [int(i) for i in r.metrics.get(P.MODEL_IDS, [])] != ids or len(flat) != len(ids) * C * C:
                    continue
                for k, m in enumerate(ids):
                    conf[m] += np.asarray(flat[k * C * C:(k + 1) * C * C]).reshape(C, C)
            self.kappa = {m: cohen_kappa(conf[m]) for m in ids}
            worst = min(ids, key=lambda m: (self.kappa[m], m))
            self.ensemble.remove(worst)
            self.delete_model(worst)
            self.masks.pop(worst, None)
            self.kappa.pop(worst, None)
            new = self._fresh()
            self.ensemble.append(new)
            self.kappa[new] = 0.0                   # unknown until measured: not in the vote
        for cid in self.clients:
            self.assign(cid, self.ensemble[0])

    def _mask_cfg(self, ids: list[int]) -> dict[str, Any]:
        return {f"{MASK}.{m}": self.masks[m] for m in ids}

    def plan_train(self, step: int) -> dict[int, Task]:
        ids = sorted(self.ensemble)
        cfg = {P.STEP: step, P.DATA_STEPS: [step], BOOTSTRAP: True, **self._mask_cfg(ids)}
        return {cid: Task(models=ids, config=dict(cfg)) for cid in sorted(self.clients)}

    def voters(self) -> tuple[list[int], list[float], dict[str, Any]]:
        ids = sorted(m for m in self.ensemble if self.kappa.get(m, 0.0) > 0) or sorted(self.ensemble)
        weights = [max(self.kappa.get(m, 0.0), 0.0) or 1.0 for m in ids]
        return ids, weights, self._mask_cfg(ids)

    def round_metrics(self) -> dict[str, Any]:
        return {"kappa": {str(m): round(k, 4) for m, k in sorted(self.kappa.items())}}

    def strategy_state(self) -> dict[str, Any]:
        return {"members": self.ensemble, "salt": self.salt,
                "masks": {str(m): v for m, v in self.masks.items()},
                "kappa": {str(m): v for m, v in self.kappa.items()}}

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        self.ensemble = [int(m) for m in state["members"]]
        self.salt = int(state["salt"])
        self.masks = {int(m): list(v) for m, v in state["masks"].items()}
        self.kappa = {int(m): float(v) for m, v in state["kappa"].items()}

