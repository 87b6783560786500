"""The FedDrift paper's time-step protocol, a reusable base for that family and its baselines.

feddrift.md sections 1.2-1.4 and 2.1:

* the scenario's last row is the test-only step T+1; training runs over steps 1..T, each of
  ``rounds-per-step`` (R) rounds;
* at the start of step tau a strategy decides the identities W[tau, c] (``begin_step``: probes,
  detection, clustering); each (client, step) batch belongs to at most one model and the table
  is kept for the whole history (merges relabel it);
* TRAIN(tau): every model some client is clustered to at tau is trained, by every client with
  data attached to it (within ``train_window`` steps: 0 = all history), on exactly that data,
  and averaged with weights n(c, m) (the attached sample counts);
* after the R rounds each client's inference model for step tau is tested on the training batch
  of step tau+1 (``test-step`` = tau+1, ``test-split`` = train): one evaluation per step, not per
  round.

Metrics (metrics.jsonl, on the last round of each step): ``accuracy`` (= ``acc_include``, mean
over clients), ``acc_omit`` (clients whose concept at tau+1 equals that at tau; computed from the
ground truth the base records for metrics, never used by the algorithms), ``client_accuracy``,
``models_alive``, ``models_active``, ``detections`` / ``detected_clients``, ``merges``,
``models_created``; every round: ``models_down`` / ``models_up`` (model transfers). The summary
adds run-level ``acc_omit``, ``acc_include`` and totals (``summary_extra``).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from flwr.common.logger import log
from flwr.serverapp import Grid
from logging import INFO, WARNING

from fedcluster_app.core import wire as P
from fedcluster_app.families.feddrift.client import ERROR_RATES, PROBE_KIND, TRAIN_KIND
from fedcluster_app.core.config import ConfigError
from fedcluster_app.core.results import RunRecorder, format_round_line
from fedcluster_app.core.strategy import CHECKPOINT_FILE, ClusteredStrategy, Reply, Task


class TimeStepProtocol(ClusteredStrategy):
    """Base of the FedDrift family: identities per (step, client), TRAIN(tau), test on tau+1."""

    description = "FedDrift time-step protocol base"
    train_window: ClassVar[int] = 0          # 0 = all history; k = the newest k steps
    fresh_model_per_client: ClassVar[bool] = False

    def __init__(self, experiment) -> None:
        super().__init__(experiment)
        sc = experiment.scenario
        if sc.num_steps < 2:
            raise ConfigError(
                f"{self.name} needs at least 2 time steps (the last one is test-only), "
                f"scenario {sc.name!r} has {sc.num_steps}")
        self.T = sc.num_steps - 1
        self.R = self.cfg.rounds_per_step
        self.W: dict[int, dict[int, int | None]] = {}    # step -> client -> model id
        self.N: dict[int, dict[int, int]] = {}           # step -> client -> batch size
        self.step_acc: dict[int, dict[int, float]] = {}  # step -> client -> acc on step+1
        self.step_log: list[dict[str, Any]] = []
        self.models_created = 0
        self._events = self._fresh_events()
        self._transfers = {"models_down": 0, "models_up": 0}
        self._transfer_totals = {"models_down": 0, "models_up": 0}

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _fresh_events() -> dict[str, Any]:
        return {"detected_clients": [], "merges": [], "created": []}

    def new_model(self, weights=None, *, created: bool = True) -> int:
        """Register a model; ``created=False`` for merge results (not counted as new models)."""
        mid = super().new_model(weights)
        if created:
            self.models_created += 1
            self._events["created"].append(mid)
        return mid

    def train_steps(self, tau: int) -> list[int]:
        lo = 1 if self.train_window <= 0 else max(1, tau - self.train_window + 1)
        return list(range(lo, tau + 1))

    def attached_steps(self, cid: int, mid: int, tau: int, steps: list[int] | None = None) -> list[int]:
        return [t for t in (steps or self.train_steps(tau)) if self.W.get(t, {}).get(cid) == mid]

    def batch_size(self, t: int, cid: int) -> int:
        return self.N.get(t, {}).get(cid, self.exp.scenario.samples_per_step)

    def n_attached(self, mid: int, tau: int, steps: list[int] | None = None) -> dict[int, int]:
        """n(c, m) for every client (zeros omitted)."""
        out = {}
        for cid in self.clients:
            n = sum(self.batch_size(t, cid) for t in self.attached_steps(cid, mid, tau, steps))
            if n:
                out[cid] = n
        return out

    def relabel(self, old: int, new: int) -> None:
        for row in self.W.values():
            for cid, m in row.items():
                if m == old:
                    row[cid] = new

    def argmin_random(self, values: dict[int, float]) -> int:
        best = min(values.values())
        ties = sorted(k for k, v in values.items() if v <= best)
        return ties[0] if len(ties) == 1 else int(self.rng.choice(ties))

    def send(self, grid: Grid, kind: str, tasks: dict[int, Task]) -> list[Reply]:
        """``exchange`` plus the count of model transfers (down and up)."""
        tasks = {c: t for c, t in tasks.items() if c in self.clients}
        self._transfers["models_down"] += sum(len(t.models) for t in tasks.values())
        replies = self.exchange(grid, kind, tasks)
        self._transfers["models_up"] += sum(len(r.models) for r in replies)
        return replies

    def probe(self, grid: Grid, tau: int, model_ids: list[int]) -> dict[int, dict[int, float]]:
        """0-1 error of every model on every client's new batch S_c^(tau) (section 2.2).

        Also records N[tau][c]. A client whose reply is missing, rejected (non-finite values),
        or lacks one of the models is left out of the result for this step.
        """
        if not model_ids:
            return {}
        cfg = {P.STEP: tau, P.DATA_STEPS: [tau]}
        tasks = {cid: Task(models=list(model_ids), config=dict(cfg)) for cid in sorted(self.clients)}
        out: dict[int, dict[int, float]] = {}
        key = ERROR_RATES if self.loss_kind == "error" else P.LOSSES
        for r in self.send(grid, PROBE_KIND, tasks):
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

    loss_kind: ClassVar[str] = "error"

    # ------------------------------------------------------------------ hooks
    def on_start(self) -> None:
        pass

    def begin_step(self, grid: Grid, tau: int) -> None:
        """Decide W[tau, c] for every client. Default: one model, everybody on it."""
        if not self.models:
            self.new_model()
        mid = min(self.models)
        self.W[tau] = {cid: mid for cid in self.clients}

    def carry_identity(self, cid: int, tau: int) -> int | None:
        """Identity of a client that takes no part in this step's decision (section 7 #20)."""
        prev = self.W.get(tau - 1, {}).get(cid)
        return prev if prev in self.models else None

    def active_models(self, tau: int) -> list[int]:
        return sorted({m for m in self.W.get(tau, {}).values() if m is not None and m in self.models})

    def train_tasks(self, tau: int, rnd: int) -> dict[int, Task]:
        """TRAIN(tau): each client trains every active model it has data attached to."""
        active = self.active_models(tau)
        steps = self.train_steps(tau)
        tasks = {}
        for cid in sorted(self.clients):
            models, config = [], {P.STEP: tau}
            for m in active:
                att = self.attached_steps(cid, m, tau, steps)
                if att:
                    models.append(m)
                    config[f"{P.DATA_STEPS}.{m}"] = att
            if models:
                tasks[cid] = Task(models=models, config=config)
        return tasks

    def aggregate(self, tau: int, replies: list[Reply]) -> None:
        for mid, items in self.collect_updates(replies).items():
            if mid in self.models:
                self.models[mid] = _average(items)

    def end_round(self, tau: int, rnd: int, replies: list[Reply]) -> None:
        """After a round's aggregation (per-round baselines hook in here)."""

    def inference_model(self, cid: int, tau: int) -> int | None:
        m = self.W.get(tau, {}).get(cid)
        return m if m in self.models else None

    def eval_tasks(self, tau: int) -> dict[int, Task]:
        """Test what each client uses after step tau on the batch of step tau+1."""
        cfg = {P.STEP: tau + 1, P.TEST_STEP: tau + 1, P.TEST_SPLIT: "train"}
        tasks = {}
        for cid in sorted(self.clients):
            m = self.inference_model(cid, tau)
            if m is not None:
                tasks[cid] = Task(models=[m], config=dict(cfg))
        return tasks

    def evaluate_step(self, grid: Grid, tau: int) -> dict[int, float]:
        replies = self.send(grid, P.EVALUATE, self.eval_tasks(tau))
        return {r.cid: float(r.metrics[P.ACCURACY]) for r in replies if P.ACCURACY in r.metrics}

    def end_step(self, tau: int) -> None:
        """After the step's evaluation."""

    def cluster_label(self, cid: int) -> int | None:
        tau = max(self.W) if self.W else 0
        return self.W.get(tau, {}).get(cid)

    def num_clusters(self) -> int:
        return len(self.models)

    # ------------------------------------------------------------------ metrics
    def _truth_at(self, cid: int, t: int) -> int | None:
        return self._truth.get(cid, {}).get(t)

    def step_metrics(self, tau: int, accs: dict[int, float]) -> dict[str, Any]:
        kept = [a for c, a in accs.items()
                if self._truth_at(c, tau) is None or self._truth_at(c, tau + 1) is None
                or self._truth_at(c, tau) == self._truth_at(c, tau + 1)]
        rec: dict[str, Any] = {
            "accuracy": float(np.mean(list(accs.values()))) if accs else None,
            "acc_include": float(np.mean(list(accs.values()))) if accs else None,
            "acc_omit": float(np.mean(kept)) if kept else None,
            "omit_pairs": len(kept),
            "evaluated_clients": len(accs),
            "client_accuracy": {str(c): round(a, 5) for c, a in sorted(accs.items())},
            "identities": {str(c): m for c, m in sorted(self.W.get(tau, {}).items())},
            "models_alive": len(self.models),
            "models_active": len(self.active_models(tau)),
            "detections": len(self._events["detected_clients"]),
            "detected_clients": sorted(self._events["detected_clients"]),
            "merges": len(self._events["merges"]),
            "merged": self._events["merges"],
            "models_new": len(self._events["created"]),
        }
        truth = {c: self._truth_at(c, tau) for c in self.clients}
        truth = {c: k for c, k in truth.items() if k is not None}
        if truth:
            from sklearn.metrics import adjusted_rand_score

            lab = [self.W.get(tau, {}).get(c) for c in truth]
            rec["ari"] = float(adjusted_rand_score(list(truth.values()),
                                                   [-1 if m is None else m for m in lab]))
            prev = {c: self._truth_at(c, tau - 1) for c in truth}
            rec["drifted_clients"] = sum(1 for c in truth if prev[c] is not None and prev[c] != truth[c])
        return rec

    def summary_extra(self) -> dict[str, Any]:
        pairs_all, pairs_kept = [], []
        for tau, accs in sorted(self.step_acc.items()):
            for c, a in accs.items():
                pairs_all.append(a)
                k0, k1 = self._truth_at(c, tau), self._truth_at(c, tau + 1)
                if k0 is None or k1 is None or k0 == k1:
                    pairs_kept.append(a)
        return {
            "acc_include": float(np.mean(pairs_all)) if pairs_all else None,
            "acc_omit": float(np.mean(pairs_kept)) if pairs_kept else None,
            "train_steps": self.T,
            "rounds_per_step": self.R,
            "models_final": len(self.models),
            "models_created": self.models_created,
            "detections_total": sum(s.get("detections", 0) for s in self.step_log),
            "merges_total": sum(s.get("merges", 0) for s in self.step_log),
            "models_sent_down": self._transfer_totals["models_down"],
            "models_sent_up": self._transfer_totals["models_up"],
            "models_per_step": [s.get("models_alive") for s in self.step_log],
            "active_per_step": [s.get("models_active") for s in self.step_log],
        }

    # ------------------------------------------------------------------ the loop
    def start(self, grid: Grid, recorder: RunRecorder, checkpoint_dir: Path | None = None) -> dict:
        self.summary()
        t0 = time.monotonic()
        total = self.T * self.R
        resumed = self.round > 0
        self.wait_for_nodes(grid)
        self.discover(grid)
        if not resumed:
            self.on_start()
        first = self.round // self.R + 1
        for tau in range(first, self.T + 1):
            self._events = self._fresh_events()
            self.round = (tau - 1) * self.R
            for cid in self.discover(grid):
                self.on_new_client(cid)
            self._round_stats = self._fresh_stats()
            self._transfers = {"models_down": 0, "models_up": 0}
            self.begin_step(grid, tau)
            for r in range(1, self.R + 1):
                self.round = (tau - 1) * self.R + r
                t_round = time.monotonic()
                if r > 1:
                    self._round_stats = self._fresh_stats()
                    self._transfers = {"models_down": 0, "models_up": 0}
                replies = self.send(grid, TRAIN_KIND, self.train_tasks(tau, r))
                self.aggregate(tau, replies)
                self.end_round(tau, r, replies)
                record: dict[str, Any] = {"round": self.round, "time_step": tau, "accuracy": None}
                if r == self.R:
                    accs = self.evaluate_step(grid, tau)
                    self.step_acc[tau] = accs
                    step_rec = self.step_metrics(tau, accs)
                    self.step_log.append({"step": tau, **{k: v for k, v in step_rec.items()
                                                           if k not in ("client_accuracy", "identities")}})
                    record.update(step_rec)
                    self.end_step(tau)
                record.update(num_clusters=self.num_clusters(), trained_clients=len(replies),
                              round_time_s=round(time.monotonic() - t_round, 4),
                              **self._round_stats, **self._transfers, **self.round_metrics())
                for k, v in self._transfers.items():
                    self._transfer_totals[k] += v
                recorder.log_round(record)
                if self.cfg.progress and (r == self.R or r == 1):
                    log(INFO, "%s", format_round_line(record, total))
            if checkpoint_dir and self.cfg.checkpoint_every:
                self.save_checkpoint(checkpoint_dir / CHECKPOINT_FILE)
        if checkpoint_dir:
            self.save_checkpoint(checkpoint_dir / CHECKPOINT_FILE)
        return {"wall_time_s": time.monotonic() - t0}

    # ------------------------------------------------------------------ checkpoint state
    def strategy_state(self) -> dict[str, Any]:
        return {
            "W": {str(t): {str(c): m for c, m in row.items()} for t, row in self.W.items()},
            "N": {str(t): {str(c): n for c, n in row.items()} for t, row in self.N.items()},
            "step_acc": {str(t): {str(c): a for c, a in row.items()} for t, row in self.step_acc.items()},
            "step_log": self.step_log,
            "models_created": self.models_created,
            "transfer_totals": self._transfer_totals,
        }

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        def table(d, cast):
            return {int(t): {int(c): (None if v is None else cast(v)) for c, v in row.items()}
                    for t, row in d.items()}

        self.W = table(state["W"], int)
        self.N = table(state["N"], int)
        self.step_acc = table(state["step_acc"], float)
        self.step_log = list(state["step_log"])
        self.models_created = int(state["models_created"])
        self._transfer_totals = dict(state["transfer_totals"])


def _average(items):
    from fedcluster_app.core.strategy import weighted_average

    return weighted_average(items)


# ---------------------------------------------------------------------------- baselines
class Oblivious(TimeStepProtocol):
    name = "oblivious"
    description = "FedDrift baseline: one model, FedAvg on all of each client's history"


class Window(TimeStepProtocol):
    name = "window"
    description = "FedDrift baseline: one model, FedAvg on the newest batch only"
    train_window = 1


class Window2(TimeStepProtocol):
    name = "window-2"
    description = "FedDrift baseline: one model, FedAvg on the last two batches"
    train_window = 2


class OracleT(TimeStepProtocol):
    """Oracle under the time-step protocol (section 2.9): W[t, c] = true concept k(c, t)."""

    name = "oracle-t"
    description = "FedDrift protocol Oracle: one model per true concept, all history"
    uses_ground_truth = True

    def __init__(self, experiment) -> None:
        super().__init__(experiment)
        self.concept_model: dict[int, int] = {}

    def begin_step(self, grid: Grid, tau: int) -> None:
        self.send(grid, P.QUERY_INFO, {c: Task(config={P.STEP: tau}) for c in self.clients})
        row = {}
        for cid in sorted(self.clients):
            k = self.true_concept(cid, tau)
            if k is None:
                row[cid] = self.carry_identity(cid, tau)
                continue
            if k not in self.concept_model:
                self.concept_model[k] = self.new_model()
            row[cid] = self.concept_model[k]
        self.W[tau] = row

    def strategy_state(self) -> dict[str, Any]:
        return {**super().strategy_state(),
                "concept_model": {str(k): v for k, v in self.concept_model.items()}}

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        super().load_strategy_state(state)
        self.concept_model = {int(k): int(v) for k, v in state["concept_model"].items()}


class OracleW(OracleT):
    name = "oracle-w"
    description = "FedDrift protocol Oracle-W: one model per true concept, newest batch only"
    train_window = 1
