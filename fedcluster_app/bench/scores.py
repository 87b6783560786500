"""One run's scores under the benchmark's common rule, from its ``metrics.jsonl``.

The rule (``score-next-step = true``, every protocol logs it the same way):

* ``accuracy_current``: every evaluated round, the clients' mean accuracy on the current step's
  test split with the model they use after that round's training;
* ``accuracy_next``: at the end of step t, the same models on step t+1's test split, before
  anything adapts to step t+1.

Only steps 1..T (T = the scenario's steps - 1) are scored: every strategy trains on them and each
has a next step (FedDrift's time-step protocol never trains on the last step). From these:

* ``acc_current`` / ``acc_next``: means over the scored rounds / steps; ``acc_final``: the
  current-step accuracy at the end of step T;
* a drift into step t (some client's true concept differs from step t-1) costs
  ``drop`` = accuracy_current - accuracy_next at the end of step t-1: what the drift took before
  the method could react; it is ``recovered`` after the first round of step t whose
  accuracy_current is back within :data:`RECOVERY_TOLERANCE` of the accuracy before the drift
  (``None``: not within step t);
* ``ari``: the mean adjusted Rand index of the clustering against the true concepts over the
  evaluated rounds; ``clusters``: the mean number of clusters in use per round;
* bytes up and down and wall time come from the run's summary;
* ``acc_global_current`` / ``acc_global_next``: the **global** accuracy beside the personalised
  ``acc_current`` / ``acc_next`` (each client's own test split, drawn with its own class prior):
  where the run logs a global measure of its family's own, that one (:data:`OWN_GLOBAL`:
  FedCCFA's generalised accuracy, the held-out clients of FedRC's scenarios), else the
  class-balanced test sample of each client's concept (run-config ``balanced-test``:
  ``balanced_accuracy_current`` / ``balanced_accuracy_next``); means over the same scored rounds
  / steps, None where the run logged none. ``global_measures`` names the metrics.jsonl key each
  comes from. The family measures score the current step only, so the next-step one is always
  the balanced sample's.

A **return** is a drift into a step where every client that changes goes back to a concept it
held before (the ``recurring`` pattern's step 5). The next-step rule rewards not adapting there:
a method that adapted to the drifted concept pays the drop again when the old one comes back,
one that never adapted does not. :func:`return_scores` therefore scores a return as its own kind
of event, apart from the next-step average. A step where some clients return while others drift
for the first time (the ``staggered`` pattern's step 5) cannot be split: a run's accuracies are
means over its clients, so it stays in the average.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fedcluster_app.core.data.scenarios import concept_changes

#: accuracy within this of the pre-drift accuracy counts as recovered
RECOVERY_TOLERANCE = 0.02

#: the global measures a family or a scenario defines itself (metrics.jsonl keys of the current
#: step), preferred in this order to the class-balanced sample's
OWN_GLOBAL = ("generalized_accuracy", "global_accuracy")
BALANCED_CURRENT, BALANCED_NEXT = "balanced_accuracy_current", "balanced_accuracy_next"


def _mean(values) -> float | None:
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return float(np.mean(vals)) if vals else None


def drift_steps(concepts: np.ndarray) -> list[int]:
    """The steps t >= 2 at which some client's concept differs from step t-1 (``concepts``:
    steps x clients, step 1 in row 0)."""
    return sorted({t for t, *_ in concept_changes(concepts)})


def global_scores(scored: list[dict]) -> dict[str, Any]:
    """The global accuracy of the scored rounds (module docstring): ``acc_global_current``,
    ``acc_global_next``, ``global_measures`` and the series the report may draw."""
    def logged(key: str) -> bool:
        return any(r.get(key) is not None for r in scored)

    current = next((k for k in (*OWN_GLOBAL, BALANCED_CURRENT) if logged(k)), None)
    nxt = BALANCED_NEXT if logged(BALANCED_NEXT) else None
    by_round = ({int(r["round"]): float(r[current]) for r in scored if r.get(current) is not None}
                if current else {})
    by_step = ({int(r["next_step"]): float(r[nxt]) for r in scored if r.get(nxt) is not None}
               if nxt else {})
    return {
        "acc_global_current": _mean(by_round.values()),
        "acc_global_next": _mean(by_step.values()),
        "global_measures": {"current": current, "next": nxt},
        "series": {"global_current": {str(rnd): round(a, 5) for rnd, a in sorted(by_round.items())},
                   "global_next": {str(t): round(a, 5) for t, a in sorted(by_step.items())}},
    }


def score_run(summary: dict, records: list[dict], concepts: np.ndarray,
              rounds_per_step: int) -> dict[str, Any]:
    """The bench scores of one finished run (module docstring), and the per-round series the
    report's plots draw."""
    last = concepts.shape[0] - 1          # T: the last scored step
    scored = [r for r in records if int(r.get("time_step", 0)) <= last]
    current = {int(r["round"]): float(r["accuracy_current"]) for r in scored
               if r.get("accuracy_current") is not None}
    nxt = {int(r["next_step"]) - 1: float(r["accuracy_next"]) for r in scored
           if r.get("accuracy_next") is not None}
    if not current or not nxt:
        missing = " or ".join(k for k, v in (("accuracy_current", current),
                                             ("accuracy_next", nxt)) if not v)
        if not (summary.get("config") or {}).get("score-next-step"):
            raise ValueError(f"the run has no {missing}: it ran without score-next-step = true")
        raise ValueError(f"no scored round of the run recorded {missing}"   # it diverged, say
                         + (f" ({summary['reason']})" if summary.get("reason") else ""))
    round_times = {int(r["round"]): r.get("round_time_s") for r in scored}
    end_of = {t: t * rounds_per_step for t in range(1, last + 1)}   # a step's last round

    events = []
    drifts = drift_steps(concepts)
    for t in drifts:
        before = current.get(end_of.get(t - 1, -1))
        if before is None or (t - 1) not in nxt:
            continue
        event = {"step": t, "drop": before - nxt[t - 1], "recovered": None}
        if t <= last:
            for rnd in range((t - 1) * rounds_per_step + 1, end_of[t] + 1):
                if rnd in current and current[rnd] >= before - RECOVERY_TOLERANCE:
                    event["recovered"] = rnd - (t - 1) * rounds_per_step
                    break
        events.append(event)
    recovered = [e["recovered"] for e in events if e["recovered"] is not None]
    clusters = [int(r["num_clusters"]) for r in scored if r.get("num_clusters") is not None]
    glob = global_scores(scored)
    return {
        "acc_current": _mean(current.values()),
        "acc_next": _mean(nxt.values()),
        "acc_global_current": glob["acc_global_current"],
        "acc_global_next": glob["acc_global_next"],
        "global_measures": glob["global_measures"],
        "acc_final": current.get(end_of[last]),
        "drop": _mean(e["drop"] for e in events),
        "recover_rounds": _mean(recovered),
        "not_recovered": sum(1 for e in events if e["recovered"] is None and e["step"] <= last),
        "drift_events": events,
        "ari": _mean(r.get("ari") for r in scored),
        "clusters": _mean(clusters),
        "models_allocated_final": summary.get("models_allocated_final"),
        "bytes_up": summary.get("bytes_up"),
        "bytes_down": summary.get("bytes_down"),
        "wall_time_s": summary.get("wall_time_s"),
        "rounds_per_step": rounds_per_step,
        "series": {
            "round": sorted(current),
            "accuracy_current": [round(current[r], 5) for r in sorted(current)],
            # seconds of each of those rounds: time to a target accuracy
            "round_time_s": [round_times.get(r) for r in sorted(current)],
            "accuracy_next": {str(t + 1): round(a, 5) for t, a in sorted(nxt.items())},
            "clusters": clusters,
            "assignments": [[r.get("assignments", {}).get(str(c))
                             for c in range(concepts.shape[1])] for r in scored],
            "concept_cluster_mass": next((r["concept_cluster_mass"] for r in reversed(scored)
                                          if r.get("concept_cluster_mass")), None),
            **glob["series"],
        },
    }


def return_steps(concepts: np.ndarray) -> list[int]:
    """The drift steps t at which every client whose concept changes goes back to a concept it
    held at some step before t - 1 (an old concept returns; module docstring)."""
    m = np.asarray(concepts)
    out = []
    for t in drift_steps(m):
        moved = np.flatnonzero(m[t - 1] != m[t - 2])
        if all(m[t - 1, k] in m[:t - 2, k] for k in moved):
            out.append(t)
    return out


def return_scores(row: dict[str, Any]) -> dict[str, float | None]:
    """A finished bench row's scores with the returns of an old concept apart:

    * ``acc_next_no_return``: the next-step accuracy averaged over the steps that are not a
      return (``acc_next`` itself when the run has none);
    * ``acc_at_return``: the next-step accuracy on the returning steps (the old concept's test
      split, with the models of the step before, before anything adapts);
    * ``acc_return_first_round``: the current-step accuracy after the first round of a returning
      step: a method that kept the old concept's model has it back at once.

    From the row's own series (accuracies rounded to 5 decimals there); None where the run has
    no return."""
    steps = return_steps(np.array(row["concepts"])) if row.get("concepts") else []
    none = {"acc_next_no_return": row.get("acc_next"), "acc_at_return": None,
            "acc_return_first_round": None}
    if not steps:
        return none
    series, rps = row["series"], int(row["rounds_per_step"])
    nxt = {int(step): a for step, a in series["accuracy_next"].items()}   # scored step -> acc
    current = dict(zip(series["round"], series["accuracy_current"]))
    return {
        "acc_next_no_return": _mean(a for step, a in nxt.items() if step not in steps),
        "acc_at_return": _mean(nxt.get(t) for t in steps),
        "acc_return_first_round": _mean(current.get((t - 1) * rps + 1) for t in steps),
    }
