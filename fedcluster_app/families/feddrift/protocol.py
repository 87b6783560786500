"""The FedDrift paper's time-step protocol: history per (step, client), test on the next step.

From "Federated Learning under Distributed Concept Drift" (Jothimurugesan, Hsieh, Wang, Joshi,
Gibbons; AISTATS 2023, arXiv:2206.00799), section 3 and its experiments:

* the scenario's last step T+1 is test-only: training runs over steps 1..T, each of
  ``rounds-per-step`` (R) rounds, so a run has T x R rounds;
* at the start of step t the strategy decides the identities W[t, c], the model each client's
  batch of step t belongs to (probes, drift detection, clustering: ``begin_step``). The table
  is kept for the whole history: a merge relabels it, a deleted model leaves its batches
  unattached;
* TRAIN(t): every model some client is clustered to at t is trained, by every client with data
  attached to it within ``train_window`` steps (0 = all history), on exactly that data, and
  averaged with weights n(c, m) = the attached sample counts. Every client trains every round,
  as in the paper; a strategy that declares ``trains_a_sample`` (FedDrift's own) may instead
  train ``fraction-train`` of the clients, drawn each round, while the step's decisions (the
  probes, detection, clustering) still hear every client: this project's extension for the
  papers'-scale benchmark, not the paper's protocol (docs/feddrift/README.md);
* after the R rounds each client's model for step t is tested on its training batch of step
  t+1: one evaluation per step, at its last round.

Any strategy runs under it with ``protocol_factory = TimeStepProtocol.window(k)``: the
foundation's FedAvg is the paper's Oblivious (k = 0) and Window (k = 1), its Oracle, IFCA and
CFL the paper's Oracle, IFCA-W and CFL. Strategies written for it (FedDrift's own and the
paper's other baselines) subclass :class:`TimeStepStrategy`, which adds the protocol's services
(``probe``, the identity table).

Metrics (metrics.jsonl, on the last round of each step): ``accuracy`` (= ``acc_include``, the
mean over clients), ``acc_omit`` (over the clients whose concept at t+1 equals that at t;
computed from the ground truth kept for metrics, never used by the algorithms),
``client_accuracy``, ``identities``, ``models_alive``, ``models_active``, ``detections`` /
``detected_clients``, ``merges``, ``models_new`` and the strategy's own keys; every round:
``models_down`` / ``models_up`` (model transfers), and ``assignments`` = the identities of the
round's step so far (``num_clusters`` counts the distinct ones, ``models_allocated`` the models
alive). The summary adds ``acc_omit``, ``acc_include`` and totals.

The common scoring rule (``score-next-step = true``, core/server/protocol.py) adds, with the same
models as the paper's metric (each client's model of the step, or the strategy's ensemble vote:
the tasks of :meth:`TimeStepProtocol.step_tasks`) but on held-out test splits, as every other
protocol scores: ``accuracy_current`` every ``eval-every`` rounds (not only at a step's last
round, so a drift's drop and the recovery within a step show), on the current step's test
split, and at the last round of step t ``accuracy_next`` on step t+1's test split (where the
paper's ``accuracy`` uses step t+1's training batch). The paper's metrics are unchanged; the
rounds evaluated only for the rule log ``accuracy`` = null and no per-step keys.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from logging import WARNING
from typing import Any, ClassVar

import numpy as np
from flwr.common.logger import log
from flwr.serverapp import Grid

from fedcluster_app.core import wire as P
from fedcluster_app.core.config import ConfigError
from fedcluster_app.core.server.messages import Reply, Task
from fedcluster_app.core.server.protocol import Protocol, adjusted_rand, copy_task
from fedcluster_app.core.server.strategy import ClusteredStrategy
from fedcluster_app.families.feddrift.wire import ERROR_RATES, PROBE_KIND, SELECT_BY, TRAIN_KIND


def _fresh_events() -> dict[str, Any]:
    return {"detected_clients": [], "merges": [], "created": []}


class TimeStepProtocol(Protocol):
    """The time-step protocol (module docstring); ``train_window`` = 0: all history."""

    name = "time-step"
    #: each client's model of step t on its training batch of step t+1 (the paper's metric)
    accuracy_rule = "next step"

    def __init__(self, train_window: int = 0) -> None:
        super().__init__()
        self.train_window = int(train_window)
        self.W: dict[int, dict[int, int | None]] = {}    # step -> client -> model id
        self.N: dict[int, dict[int, int]] = {}           # step -> client -> batch size
        self.step_acc: dict[int, dict[int, float]] = {}  # step -> client -> acc on step+1
        self.step_log: list[dict[str, Any]] = []
        self.models_created = 0
        self.events = _fresh_events()                    # since the last step's report
        self.transfers = {"models_down": 0, "models_up": 0}
        self.transfer_totals = {"models_down": 0, "models_up": 0}
        self.open_step: int | None = None                # the step whose row assign() writes

    @classmethod
    def window(cls, train_window: int) -> Callable[[], TimeStepProtocol]:
        """A factory for ``protocol_factory``: this protocol with a training window."""
        return functools.partial(cls, train_window=train_window)

    def bind(self, strategy: ClusteredStrategy) -> None:
        super().bind(strategy)
        sc = strategy.exp.scenario
        if sc.num_steps < 2:
            raise ConfigError(
                f"{strategy.name} needs at least 2 time steps (the last one is test-only), "
                f"scenario {sc.name!r} has {sc.num_steps}")
        if strategy.cfg.fraction_train < 1 and not getattr(strategy, "trains_a_sample", False):
            raise ConfigError(
                f"{strategy.name} runs FedDrift's time-step protocol, in which every client "
                f"trains every round: fraction-train = {strategy.cfg.fraction_train:g} would be "
                f"ignored; set fraction-train = 1 (of the strategies under this protocol, only "
                f"FedDrift's own train a sample of the clients)")
        own = type(strategy)
        if (strategy.cfg.score_next_step and own.evaluate_step is not ClusteredStrategy.evaluate_step
                and own.step_eval_tasks is ClusteredStrategy.step_eval_tasks):
            raise ConfigError(
                f"score-next-step: {strategy.name} scores its clients with its own evaluate_step, "
                f"which the common rule cannot point at another step's test split; give it "
                f"step_eval_tasks(tau) -> (message kind, client -> Task) instead (see "
                f"TimeStepProtocol.step_tasks)")

    @property
    def T(self) -> int:
        return self.s.exp.scenario.num_steps - 1

    @property
    def R(self) -> int:
        return self.s.cfg.rounds_per_step

    # ------------------------------------------------------------------ time
    def num_rounds(self) -> int:
        return self.T * self.R

    def scheduled(self, server_round: int) -> bool:
        """One evaluation per step, at its last round."""
        return server_round % self.R == 0

    def evaluates(self, server_round: int) -> bool:
        """The step's last round; with ``score-next-step`` also every ``eval-every`` rounds."""
        return self.scheduled(server_round) or (
            self.scores_next_step and server_round % self.s.cfg.eval_every == 0)

    # ------------------------------------------------------------------ the identity table
    def train_steps(self, tau: int) -> list[int]:
        lo = 1 if self.train_window <= 0 else max(1, tau - self.train_window + 1)
        return list(range(lo, tau + 1))

    def attached_steps(self, cid: int, mid: int, tau: int,
                       steps: list[int] | None = None) -> list[int]:
        return [t for t in (steps or self.train_steps(tau)) if self.W.get(t, {}).get(cid) == mid]

    def batch_size(self, t: int, cid: int) -> int:
        return self.N.get(t, {}).get(cid, self.s.exp.scenario.samples_per_step)

    def n_attached(self, mid: int, tau: int, steps: list[int] | None = None) -> dict[int, int]:
        """n(c, m) for every client (zeros omitted)."""
        out = {}
        for cid in self.s.clients:
            n = sum(self.batch_size(t, cid) for t in self.attached_steps(cid, mid, tau, steps))
            if n:
                out[cid] = n
        return out

    def active_models(self, tau: int) -> list[int]:
        """The models trained during step ``tau``."""
        mine = self.s.active_models(tau)
        if mine is not None:
            return mine
        return sorted({m for m in self.W.get(tau, {}).values()
                       if m is not None and m in self.s.models})

    def begin_step(self, grid: Grid, step: int) -> None:
        """Every client's identity at ``step`` starts as the model it is assigned to."""
        s = self.s
        self.W[step] = {cid: (rec.cluster if rec.cluster in s.models else None)
                        for cid, rec in s.clients.items()}
        self.open_step = step

    def start_round(self, server_round: int) -> None:
        self.transfers = {"models_down": 0, "models_up": 0}

    def on_assign(self, cid: int, mid: int | None) -> None:
        if self.open_step is not None:
            self.W[self.open_step][cid] = mid

    def on_relabel(self, old: int, new: int | None) -> None:
        for row in self.W.values():
            for cid, m in row.items():
                if m == old:
                    row[cid] = new

    def on_new_model(self, mid: int, created: bool) -> None:
        if created:
            self.models_created += 1
            self.events["created"].append(mid)

    # ------------------------------------------------------------------ messages
    def default_plan(self, step: int) -> dict[int, Task]:
        """TRAIN(t): each client of the round's sample (:meth:`select`: every client, as
        ``bind`` allows a fraction below 1 only to a strategy that ``trains_a_sample``) trains
        every active model it has data attached to."""
        active = self.active_models(step)
        steps = self.train_steps(step)
        follows = self.s.history_follows_client
        tasks = {}
        for cid in self.select(sorted(self.s.clients)):
            models, config = [], {P.STEP: step}
            for m in active:
                if follows:   # the client's whole window goes with it to its current model
                    att = steps if self.s.clients[cid].cluster == m else []
                else:
                    att = self.attached_steps(cid, m, step, steps)
                if att:
                    models.append(m)
                    config[f"{P.DATA_STEPS}.{m}"] = att
            if models:
                tasks[cid] = Task(models=models, config=config)
        return tasks

    def message_kind(self, kind: str) -> str:
        return TRAIN_KIND if kind == P.TRAIN else super().message_kind(kind)

    def prepare(self, kind: str, tasks: dict[int, Task]) -> None:
        """A training task the strategy planned without data: a client choosing its model
        trains on its steps in the window, one sent a model on that model's attached steps."""
        if kind != P.TRAIN:
            return
        step = self.s.step
        for cid, task in tasks.items():
            config = task.config
            if P.DATA_STEPS in config or any(k.startswith(f"{P.DATA_STEPS}.") for k in config):
                continue
            if config.get(P.SELECT) in SELECT_BY:       # the client chooses its model
                config[P.DATA_STEPS] = self.train_steps(step)
            else:
                for m in task.models:
                    config[f"{P.DATA_STEPS}.{m}"] = self.attached_steps(cid, m, step)

    def on_exchange(self, kind: str, tasks: dict[int, Task], replies: list[Reply]) -> None:
        self.transfers["models_down"] += sum(len(t.models) for t in tasks.values())
        self.transfers["models_up"] += sum(len(r.models) for r in replies)

    def probe(self, grid: Grid, tau: int, model_ids: list[int],
              loss: str = "error") -> dict[int, dict[int, float]]:
        """0-1 error (or cross-entropy) of every model on every client's new batch S_c^(tau).

        Also records N[tau][c]. A client whose reply is missing, rejected (non-finite values),
        or lacks one of the models is left out of the result for this step.
        """
        if not model_ids:
            return {}
        cfg = {P.STEP: tau, P.DATA_STEPS: [tau]}
        tasks = {cid: Task(models=list(model_ids), config=dict(cfg))
                 for cid in sorted(self.s.clients)}
        out: dict[int, dict[int, float]] = {}
        key = ERROR_RATES if loss == "error" else P.LOSSES
        for r in self.s.exchange(grid, PROBE_KIND, tasks):
            ids = [int(i) for i in r.metrics.get(P.MODEL_IDS, [])]
            vals = list(r.metrics.get(key, []))
            got = dict(zip(ids, vals))
            if len(ids) != len(vals) or any(m not in got for m in model_ids):
                log(WARNING, "step %d: client %d's probe lacks models %s: left out of detection",
                    tau, r.cid, sorted(set(model_ids) - set(got)))
                continue
            if not all(math.isfinite(float(got[m])) for m in model_ids):
                continue
            self.N.setdefault(tau, {})[r.cid] = int(r.num_examples)
            out[r.cid] = {m: float(got[m]) for m in model_ids}
        return out

    # ------------------------------------------------------------------ evaluation
    def inference_model(self, cid: int, tau: int) -> int | None:
        m = self.W.get(tau, {}).get(cid)
        return m if m in self.s.models else None

    def step_tasks(self, tau: int) -> tuple[str, dict[int, Task]]:
        """What scores the clients at step ``tau``: the message kind and every client's task
        (the models, the vote), without the data to test on. A strategy with its own rule says
        so with ``step_eval_tasks(tau)`` (AUE's and KUE's ensembles); by default each client's
        model of step ``tau`` (its identity W[tau, c])."""
        own = self.s.step_eval_tasks(tau)
        if own is not None:
            return own
        tasks = {}
        for cid in sorted(self.s.clients):
            m = self.inference_model(cid, tau)
            if m is not None:
                tasks[cid] = Task(models=[m])
        return P.EVALUATE, tasks

    def evaluate_step(self, grid: Grid, tau: int) -> dict[int, float]:
        """The paper's score: :meth:`step_tasks` on each client's training batch of step
        ``tau + 1``."""
        kind, tasks = self.step_tasks(tau)
        for task in tasks.values():
            task.config[P.STEP] = tau + 1
        return self.score(grid, tasks, tau + 1, split="train", kind=kind, counted=True).accs

    def evaluate(self, grid: Grid, step: int) -> dict[str, Any]:
        rec: dict[str, Any] = {"accuracy": None}
        if self.scheduled(self.s.round):
            accs = self.s.evaluate_step(grid, step)
            if accs is None:
                accs = self.evaluate_step(grid, step)
            self.step_acc[step] = accs
            rec = self.step_metrics(step, accs)
            self.step_log.append({"step": step, **{k: v for k, v in rec.items()
                                                   if k not in ("client_accuracy", "identities")}})
            self.events = _fresh_events()
        if self.scores_next_step:
            rec.update(self.score_common(grid, step))
        return rec

    def score_common(self, grid: Grid, step: int) -> dict[str, Any]:
        """The common rule's keys (module docstring) with the tasks of :meth:`step_tasks`."""
        kind, tasks = self.step_tasks(step)
        kept = {c: copy_task(t) for c, t in tasks.items()}
        return {**self.score(grid, tasks, step, kind=kind).keys("current"),
                **self.score_next(grid, step, kept, kind=kind)}

    def step_metrics(self, tau: int, accs: dict[int, float]) -> dict[str, Any]:
        s = self.s
        truth_at = s.concept_for_metrics
        kept = [a for c, a in accs.items()
                if truth_at(c, tau) is None or truth_at(c, tau + 1) is None
                or truth_at(c, tau) == truth_at(c, tau + 1)]
        rec: dict[str, Any] = {
            "accuracy": float(np.mean(list(accs.values()))) if accs else None,
            "acc_include": float(np.mean(list(accs.values()))) if accs else None,
            "acc_omit": float(np.mean(kept)) if kept else None,
            "omit_pairs": len(kept),
            "evaluated_clients": len(accs),
            "client_accuracy": {str(c): round(a, 5) for c, a in sorted(accs.items())},
            "identities": {str(c): m for c, m in sorted(self.W.get(tau, {}).items())},
            "models_alive": len(s.models),
            "models_active": len(self.active_models(tau)),
            "detections": len(self.events["detected_clients"]),
            "detected_clients": sorted(self.events["detected_clients"]),
            "merges": len(self.events["merges"]),
            "merged": self.events["merges"],
            "models_new": len(self.events["created"]),
        }
        truth = {c: truth_at(c, tau) for c in s.clients}
        truth = {c: k for c, k in truth.items() if k is not None}
        if truth:
            rec["ari"] = adjusted_rand(list(truth.values()),
                                       [self.W.get(tau, {}).get(c) for c in truth])
            prev = {c: truth_at(c, tau - 1) for c in truth}
            rec["drifted_clients"] = sum(1 for c in truth
                                         if prev[c] is not None and prev[c] != truth[c])
        return rec

    # ------------------------------------------------------------------ reporting and state
    def assignment(self, cid: int) -> int | None:
        """The client's identity at the round's step: what ``identities`` logs at its end."""
        return self.W.get(self.s.step, {}).get(cid)

    def round_metrics(self, evaluated: bool) -> dict[str, Any]:
        """Model transfers every round; the strategy's own keys once per step."""
        for k, v in self.transfers.items():
            self.transfer_totals[k] += v
        # once per step, at its evaluation (not on rounds evaluated only for score-next-step)
        at_end = evaluated and self.scheduled(self.s.round)
        return {**self.transfers, **(self.s.round_metrics() if at_end else {})}

    def summary_extra(self) -> dict[str, Any]:
        truth_at = self.s.concept_for_metrics
        pairs_all, pairs_kept = [], []
        for tau, accs in sorted(self.step_acc.items()):
            for c, a in accs.items():
                pairs_all.append(a)
                k0, k1 = truth_at(c, tau), truth_at(c, tau + 1)
                if k0 is None or k1 is None or k0 == k1:
                    pairs_kept.append(a)
        return {
            "acc_include": float(np.mean(pairs_all)) if pairs_all else None,
            "acc_omit": float(np.mean(pairs_kept)) if pairs_kept else None,
            "train_steps": self.T,
            "rounds_per_step": self.R,
            "models_final": len(self.s.models),
            "models_created": self.models_created,
            "detections_total": sum(s.get("detections", 0) for s in self.step_log),
            "merges_total": sum(s.get("merges", 0) for s in self.step_log),
            "models_sent_down": self.transfer_totals["models_down"],
            "models_sent_up": self.transfer_totals["models_up"],
            "models_per_step": [s.get("models_alive") for s in self.step_log],
            "active_per_step": [s.get("models_active") for s in self.step_log],
        }

    def state(self) -> dict[str, Any]:
        return {
            "W": {str(t): {str(c): m for c, m in row.items()} for t, row in self.W.items()},
            "N": {str(t): {str(c): n for c, n in row.items()} for t, row in self.N.items()},
            "step_acc": {str(t): {str(c): a for c, a in row.items()}
                         for t, row in self.step_acc.items()},
            "step_log": self.step_log,
            "models_created": self.models_created,
            "transfer_totals": self.transfer_totals,
            "events": self.events,
            "open_step": self.open_step,
        }

    def load_state(self, state: dict[str, Any]) -> None:
        def table(d, cast):
            return {int(t): {int(c): (None if v is None else cast(v)) for c, v in row.items()}
                    for t, row in d.items()}

        self.W = table(state["W"], int)
        self.N = table(state["N"], int)
        self.step_acc = table(state["step_acc"], float)
        self.step_log = list(state["step_log"])
        self.models_created = int(state["models_created"])
        self.transfer_totals = dict(state["transfer_totals"])
        self.events = dict(state["events"])
        self.open_step = state["open_step"]


class TimeStepStrategy(ClusteredStrategy):
    """Base of the strategies written for the time-step protocol: FedDrift's own and the
    paper's other baselines. Adds the protocol's services under short names."""

    protocol_factory: ClassVar[Callable[[], Protocol]] = TimeStepProtocol
    protocol: TimeStepProtocol
    #: may train ``fraction-train`` of the clients a round (the protocol's default plan);
    #: False: every client trains every round, and a fraction below 1 is refused
    trains_a_sample: ClassVar[bool] = False

    def on_start(self) -> None:
        pass    # models are created at the start of the first step

    @property
    def W(self) -> dict[int, dict[int, int | None]]:
        return self.protocol.W

    @property
    def events(self) -> dict[str, Any]:
        return self.protocol.events

    def probe(self, grid: Grid, tau: int, model_ids: list[int]) -> dict[int, dict[int, float]]:
        return self.protocol.probe(grid, tau, model_ids, getattr(self, "loss_kind", "error"))

    def argmin_random(self, values: dict[int, float]) -> int:
        """The key of the smallest value; ties broken at random (the run's generator)."""
        best = min(values.values())
        ties = sorted(k for k, v in values.items() if v <= best)
        return ties[0] if len(ties) == 1 else int(self.rng.choice(ties))
