"""Protocols: how rounds map to time steps, who trains on what, and how clients are scored.

A strategy says *what* its algorithm does (which models exist, who is assigned to which, how
replies are aggregated); its protocol says *when and on what data*: the round loop of
:class:`~fedcluster_app.core.server.strategy.ClusteredStrategy` asks the protocol how many rounds there
are, which step a round belongs to, which rounds evaluate and how, and lets it decorate and
account for every message. The same algorithm class can therefore run under several protocols:
``fedavg`` and FedDrift's ``window`` are one FedAvg under two of them.

:class:`Protocol` is the plain round protocol every family uses unless it says otherwise:

* ``num_steps x rounds-per-step`` rounds; round r belongs to step ``(r - 1) // R + 1``;
* each round the strategy's plan trains some clients on their window of the newest ``window``
  steps (by default ``fraction-train`` of every cluster's members, :meth:`default_plan`);
* every ``eval-every`` rounds (and the last) every participating client is tested on the
  held-out split of the current step with its cluster's model (or the mixture of its soft
  clusters); held-out clients (a scenario's ``holdout_clients``) are scored as newcomers
  (``global_accuracy``); the adjusted Rand index of the clustering against the true concepts,
  the concept-by-cluster mass and the number of clients whose concept changed are recorded;
* every round the cluster each client is in (``assignments``), how many clusters that makes
  (``num_clusters``) and how many cluster models the server holds (``models_allocated``).

Other protocols subclass it: FedDrift's time-step protocol (``families/feddrift/protocol.py``:
history per (step, client), test on the next step) and FlexCFL's paper protocol
(``families/flexcfl/protocol.py``: its client selection and scoring rule).

One scoring rule for every protocol (run-config ``score-next-step = true``), on top of each
protocol's own metrics, which it leaves as they are: ``accuracy_current`` (and
``client_accuracy_current``), every evaluated round, the mean over the evaluated clients of their
accuracy on the *current* step's held-out test split with the model they use now (here: equal
to ``accuracy``); ``accuracy_next`` (``client_accuracy_next``, ``next_step`` = t + 1), at the
last round of every step t < the scenario's last, the same clients with the model they hold at
the end of step t on step t+1's held-out test split, before anything of step t+1 (begin_step,
re-clustering, drift detection) runs: what a drift costs before a method can react. The last
round of every step is then evaluated whatever ``eval-every`` says. :meth:`Protocol.score` is
the one place a set of (client -> task) is scored on a given step; the scoring exchanges are not
counted in ``bytes_up`` / ``bytes_down`` or a protocol's own accounting, and a round evaluated
only for the rule samples its clients with a generator of its own, so training is unchanged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
from flwr.serverapp import Grid

from fedcluster_app.core import wire as P
from fedcluster_app.core.server.messages import Reply, Task

if TYPE_CHECKING:   # the strategy module imports the protocols: its type only, no import
    from fedcluster_app.core.server.strategy import ClusteredStrategy


class Protocol:
    """The plain round protocol (module docstring); the base of every other protocol."""

    name = "rounds"
    #: what ``accuracy`` of metrics.jsonl measures (summary.json ``accuracy_rule``): runs of
    #: different rules are never compared on it (``fedcluster report`` gives each its column)
    accuracy_rule = "current step"

    def __init__(self) -> None:
        # the ClusteredStrategy it serves (not imported here: the strategy imports protocols)
        self.strategy: ClusteredStrategy | None = None
        self.eval_clients: list[int] = []    # the clients the last evaluation sampled
        self._scoring_only = 0               # > 0: inside exchanges made only to score

    def bind(self, strategy: ClusteredStrategy) -> None:
        """Called once by the strategy that runs under this protocol."""
        self.strategy = strategy

    @property
    def s(self) -> ClusteredStrategy:
        """The strategy, as the base declares it: every hook a protocol calls is declared on
        :class:`ClusteredStrategy` with its default (no ``getattr`` for optional ones)."""
        assert self.strategy is not None, "protocol not bound to a strategy"
        return self.strategy

    # ------------------------------------------------------------------ time
    def num_rounds(self) -> int:
        return self.s.exp.scenario.num_steps * self.s.cfg.rounds_per_step

    def time_step(self, server_round: int) -> int:
        """Time steps are 1-based and last ``rounds-per-step`` rounds each."""
        return (server_round - 1) // self.s.cfg.rounds_per_step + 1

    def starts_step(self, server_round: int) -> bool:
        """Round ``server_round`` is the first of its time step."""
        return server_round == 1 or self.time_step(server_round - 1) != self.time_step(server_round)

    def ends_step(self, server_round: int) -> bool:
        """Round ``server_round`` is the last of its time step."""
        return self.starts_step(server_round + 1)

    def scheduled(self, server_round: int) -> bool:
        """The protocol's own evaluation schedule: every ``eval-every`` rounds and the last."""
        return server_round % self.s.cfg.eval_every == 0 or server_round == self.s.num_rounds

    def evaluates(self, server_round: int) -> bool:
        """The schedule, and with ``score-next-step`` every step's last round too."""
        return self.scheduled(server_round) or (self.scores_next_step
                                                and self.ends_step(server_round))

    @property
    def scores_next_step(self) -> bool:
        """The run-config ``score-next-step``: the common scoring rule (module docstring)."""
        return bool(self.s.cfg.score_next_step)

    # ------------------------------------------------------------------ hooks of the loop
    def start_round(self, server_round: int) -> None:
        """At the very start of every round (per-round counters)."""

    def begin_step(self, grid: Grid, step: int) -> None:
        """Before the strategy's own ``begin_step``, at the start of every time step."""

    def before_round(self, grid: Grid, step: int) -> None:
        """Before the strategy's ``before_round``, every round."""

    def select(self, cids: list[int]) -> list[int]:
        """Which of ``cids`` train this round: ``fraction-train`` of them, drawn at random."""
        return self.s.sample(cids, self.s.cfg.fraction_train)

    def default_plan(self, step: int) -> dict[int, Task]:
        """``fraction-train`` of every cluster's members train that cluster's model."""
        plan = {}
        for mid in self.s.clusters_in_use():
            for cid in self.select(self.s.members(mid)):
                plan[cid] = Task(models=[mid])
        return plan

    def message_kind(self, kind: str) -> str:
        """The message type a ``kind`` exchange is sent under (a family's own handlers)."""
        return self.s.message_kinds.get(kind, kind)

    def prepare(self, kind: str, tasks: dict[int, Task]) -> None:
        """Complete the tasks of an exchange before they are sent (e.g. which data to use)."""

    def on_exchange(self, kind: str, tasks: dict[int, Task], replies: list[Reply]) -> None:
        """After every exchange (accounting; ``kind`` as the strategy named it)."""

    def on_new_model(self, mid: int, created: bool) -> None:
        """A model was registered (``created=False``: the result of a merge)."""

    def on_assign(self, cid: int, mid: int | None) -> None:
        """A client's cluster changed."""

    def on_relabel(self, old: int, new: int | None) -> None:
        """Every client of model ``old`` now belongs to ``new`` (a merge; None: to none)."""

    def assignment(self, cid: int) -> int | None:
        """The cluster client ``cid`` is in this round; None for a client not connected (yet)
        and for a held-out one (it picks a model when scored, it is in no cluster)."""
        s = self.s
        if cid not in s.clients or cid in s.holdouts:
            return None
        return s.assigned_model(cid)

    def models_allocated(self) -> int:
        return len(self.s.cluster_models())

    def clustering(self) -> dict[str, Any]:
        """This round's ``num_clusters`` (the clusters in use: distinct assignments),
        ``models_allocated`` and ``assignments`` (every client of the scenario) of metrics.jsonl."""
        assignments = {c: self.assignment(c) for c in range(self.s.exp.scenario.num_clients)}
        return {"num_clusters": len({m for m in assignments.values() if m is not None}),
                "models_allocated": self.models_allocated(),
                "assignments": {str(c): m for c, m in assignments.items()}}

    def round_metrics(self, evaluated: bool) -> dict[str, Any]:
        """This round's protocol and strategy keys of metrics.jsonl."""
        return self.s.round_metrics()

    def summary_extra(self) -> dict[str, Any]:
        return {}

    def state(self) -> dict[str, Any]:
        return {}

    def load_state(self, state: dict[str, Any]) -> None:
        pass

    # ------------------------------------------------------------------ evaluation
    def eval_task(self, cid: int) -> Task | None:
        return self.s.eval_task(cid)

    def global_eval_task(self, cid: int) -> Task | None:
        return self.s.global_eval_task(cid)

    def sample_eval_clients(self) -> list[int]:
        """``fraction-evaluate`` of the training clients; a round evaluated only for
        ``score-next-step`` draws them from a generator of its own (seed, round), so the
        strategy's generator, and with it training, is what it is without the flag."""
        s = self.s
        if self.scheduled(s.round):
            return s.sample(s.training_clients(), s.cfg.fraction_evaluate)
        rng = np.random.default_rng([s.cfg.seed, 0x5C07E, s.round])
        return s.sample(s.training_clients(), s.cfg.fraction_evaluate, rng=rng)

    def evaluate(self, grid: Grid, step: int) -> dict[str, Any]:
        """Local accuracy of the participating clients (each on its own cluster's model or
        mixture), then global accuracy of the held-out clients, the ARI, the concept-by-cluster
        mass and, when a step begins, how many clients drifted; with ``score-next-step`` the
        common rule's keys (module docstring)."""
        s = self.s
        tasks = {}
        self.eval_clients = self.sample_eval_clients()
        for cid in self.eval_clients:
            task = self.eval_task(cid)
            if task is not None:
                tasks[cid] = task
        # for the next step's score: the same tasks, sent again
        kept = {c: copy_task(t) for c, t in tasks.items()} if self.scores_next_step else {}
        if self.scores_next_step:
            self.ask_balanced(tasks)
        replies = s.exchange(grid, P.EVALUATE, tasks)
        accs = {r.cid: float(r.metrics[P.ACCURACY]) for r in replies}
        out: dict[str, Any] = {
            "accuracy": mean_accuracy(replies),
            "weighted_accuracy": weighted_accuracy(replies),
            "evaluated_clients": len(accs),
        }
        if len(accs) <= 200:
            out["client_accuracy"] = {str(c): round(a, 5) for c, a in accs.items()}
        if self.scores_next_step:
            out.update(Scores.of(replies).keys("current"))
            out.update(self.score_next(grid, step, kept))
        if s.holdouts:
            out.update(self.evaluate_holdouts(grid))
        truth = {c: s.concept_for_metrics(c, step) for c in accs}
        truth = {c: k for c, k in truth.items() if k is not None}
        if truth:
            labels = {c: s.cluster_label(c) for c in truth}
            out["ari"] = adjusted_rand([truth[c] for c in truth], [labels[c] for c in truth])
            out["concept_cluster_mass"] = self.concept_cluster_mass(truth)
            if self.starts_step(s.round):
                # a drift happens when a step brings data of another concept: count it once
                before = {c: s.concept_for_metrics(c, step - 1) for c in truth}
                out["drifted_clients"] = sum(
                    1 for c in truth if before[c] is not None and before[c] != truth[c])
        return out

    # ------------------------------------------------------------------ the common scoring rule
    @contextlib.contextmanager
    def scoring_only(self) -> Iterator[None]:
        """Exchanges inside are made only to score (``score-next-step``): they are left out of
        the round's ``bytes_up`` / ``bytes_down`` and of the protocol's ``on_exchange``
        accounting (the strategy skips it), so the run's other numbers stay as without it."""
        stats = self.s.round_stats
        saved = (stats.bytes_up, stats.bytes_down)
        self._scoring_only += 1
        try:
            yield
        finally:
            self._scoring_only -= 1
            stats.bytes_up, stats.bytes_down = saved

    @property
    def in_scoring_only(self) -> bool:
        return self._scoring_only > 0

    def ask_balanced(self, tasks: dict[int, Task]) -> None:
        """With ``balanced-test``: the clients also score the class-balanced test sample of the
        step they are scored on (``balanced-accuracy`` in their replies)."""
        if self.s.cfg.balanced_test:
            for task in tasks.values():
                task.config[P.BALANCED_TEST] = True

    def score(self, grid: Grid, tasks: dict[int, Task], test_step: int, *,
              split: str = "test", kind: str = P.EVALUATE,
              counted: bool = False) -> Scores:
        """Score every client's task (the model it is scored with, as its protocol sends it) on
        the ``split`` ("test": the held-out split, "train": the training batch) of step
        ``test_step``: every answering client's accuracy (and on the test split, with
        ``balanced-test``, its accuracy on the class-balanced sample). The tasks are sent as
        ``kind`` messages (a family's evaluate handler, an ensemble's); every handler reads its
        data through ``StreamClient.eval_data`` (and ``balanced_data``), which honour
        ``test-step`` and ``test-split``, so a personalised model kept on the client is scored
        the same way. ``counted=False``: an exchange only the scoring rule makes
        (:meth:`scoring_only`)."""
        for task in tasks.values():
            task.config[P.TEST_STEP] = int(test_step)
            task.config[P.TEST_SPLIT] = split
        if split == "test":
            self.ask_balanced(tasks)
        with contextlib.nullcontext() if counted else self.scoring_only():
            replies = self.s.exchange(grid, kind, tasks)
        return Scores.of(replies)

    def score_next(self, grid: Grid, step: int, tasks: dict[int, Task],
                   kind: str = P.EVALUATE) -> dict[str, Any]:
        """At the last round of step ``step`` (if a step follows): ``accuracy_next``,
        ``client_accuracy_next`` and ``next_step`` of ``tasks`` (the models the clients hold
        now) on step + 1's held-out test split (with ``balanced-test`` also
        ``balanced_accuracy_next``: on step + 1's class-balanced sample); {} on any other
        round."""
        if not (self.ends_step(self.s.round) and step < self.s.exp.scenario.num_steps):
            return {}
        return {**self.score(grid, tasks, step + 1, kind=kind).keys("next"),
                "next_step": step + 1}

    def evaluate_holdouts(self, grid: Grid) -> dict[str, Any]:
        s = self.s
        tasks = {c: t for c in sorted(s.holdouts & set(s.clients))
                 if (t := self.global_eval_task(c)) is not None}
        replies = s.exchange(grid, P.EVALUATE, tasks)
        accs = {r.cid: float(r.metrics[P.ACCURACY]) for r in replies}
        return {
            "global_accuracy": mean_accuracy(replies),
            "global_client_accuracy": {str(c): round(a, 5) for c, a in accs.items()},
        }

    def concept_cluster_mass(self, truth: dict[int, int]) -> dict[str, dict[str, float]]:
        """Concept -> cluster -> summed assignment weight of that concept's clients (soft
        weights, or 1 on the hard cluster)."""
        mass: dict[str, dict[str, float]] = {}
        for cid, concept in sorted(truth.items()):
            rec = self.s.clients[cid]
            weights = rec.soft or ({rec.cluster: 1.0} if rec.cluster is not None else {})
            row = mass.setdefault(str(concept), {})
            for mid, w in sorted(weights.items()):
                row[str(mid)] = round(row.get(str(mid), 0.0) + float(w), 6)
        return mass


def copy_task(task: Task) -> Task:
    """A task that can be sent again: its own lists and config."""
    return dataclasses.replace(task, models=list(task.models), config=dict(task.config),
                               train_ids=None if task.train_ids is None else list(task.train_ids))


@dataclasses.dataclass(frozen=True)
class Scores:
    """What one scoring exchange gave: client -> accuracy, and client -> accuracy on the
    class-balanced test sample for the clients that report one (``balanced-test``)."""

    accs: dict[int, float]
    balanced: dict[int, float]

    @classmethod
    def of(cls, replies: list[Reply]) -> Scores:
        scored = [r for r in replies if P.ACCURACY in r.metrics]
        return cls({r.cid: float(r.metrics[P.ACCURACY]) for r in scored},
                   {r.cid: float(r.metrics[P.BALANCED_ACCURACY]) for r in scored
                    if P.BALANCED_ACCURACY in r.metrics})

    @property
    def mean(self) -> float | None:
        """The mean over the clients that answered (each counts once)."""
        return float(np.mean(list(self.accs.values()))) if self.accs else None

    def keys(self, which: str) -> dict[str, Any]:
        """``accuracy_<which>`` and (for at most 200 clients) ``client_accuracy_<which>``; where
        clients reported a balanced accuracy, ``balanced_accuracy_<which>`` and
        ``client_balanced_accuracy_<which>`` too."""
        out = score_keys(which, self.mean, self.accs)
        if self.balanced:
            out.update(score_keys(which, float(np.mean(list(self.balanced.values()))),
                                  self.balanced, prefix="balanced_"))
        return out


def score_keys(which: str, mean: float | None, accs: dict[int, float],
               prefix: str = "") -> dict[str, Any]:
    """``<prefix>accuracy_<which>`` and (for at most 200 clients)
    ``client_<prefix>accuracy_<which>``."""
    out: dict[str, Any] = {f"{prefix}accuracy_{which}": mean}
    if len(accs) <= 200:
        out[f"client_{prefix}accuracy_{which}"] = {str(c): round(a, 5)
                                                   for c, a in sorted(accs.items())}
    return out



def adjusted_rand(truth: list[int], labels: list[int | None]) -> float:
    """Adjusted Rand index of a clustering (None = unassigned, its own label) against the
    true concepts."""
    from sklearn.metrics import adjusted_rand_score

    return float(adjusted_rand_score(truth, [-1 if m is None else m for m in labels]))


def mean_accuracy(replies: list[Reply]) -> float | None:
    """The mean of the clients' accuracies (each client counts once)."""
    accs = {r.cid: float(r.metrics[P.ACCURACY]) for r in replies}
    return float(np.mean(list(accs.values()))) if accs else None


def weighted_accuracy(replies: list[Reply]) -> float | None:
    """Test accuracy over all evaluated samples (clients weighted by their test-set size)."""
    pairs = [(float(r.metrics[P.ACCURACY]), r.num_examples) for r in replies
             if r.num_examples > 0 and math.isfinite(float(r.metrics[P.ACCURACY]))]
    total = sum(n for _, n in pairs)
    return sum(a * n for a, n in pairs) / total if total else None
