"""Comparison of finished runs: a table per run, mean ± std per strategy and scenario, and the
time to a target accuracy (rounds and simulated seconds) against a global-model baseline; as
markdown, CSV or JSON (:data:`FORMATS`).

A run's ``accuracy`` is what its protocol scores (:func:`accuracy_rule`: the current step, or
FedDrift's next step, ...), so runs are compared on it only within one rule: every rule has its
own accuracy columns, and the time to target is measured against a baseline of the same rule.
Runs logged with ``score-next-step = true`` also have the common rule's ``accuracy_current`` and
``accuracy_next``, which every protocol scores alike: their own two columns.
"""

from __future__ import annotations

import io
import json
import math
import os
from pathlib import Path
from typing import Any

from fedcluster_app.core.results.files import is_number, load_run
from fedcluster_app.core.results.plots import plot_comparison

FORMATS = ("md", "csv", "json")
#: the default target of the time to target: this share of the highest accuracy a compared run
#: (same scenario, seed and rule) holds to its end
TARGET_FRACTION = 0.9
#: a cell of a run under another scoring rule than the column's
OTHER_RULE = "—"

def _fmt(x: Any, digits: int = 4) -> str:
    if x is OTHER_RULE:
        return OTHER_RULE
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    if is_number(x):
        return f"{x:.{digits}f}"
    return _cell(x)


def _cell(x: Any) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ")


def _mean_std(values: list[Any], n_runs: int) -> str:
    """'mean ± std' (sample std, ddof=1) over the non-null values; '(n=k)' if some were null."""
    if any(v is OTHER_RULE for v in values):
        return OTHER_RULE
    vals = [float(v) for v in values if is_number(v) and math.isfinite(v)]
    if not vals:
        return "n/a"
    m = sum(vals) / len(vals)
    if len(vals) > 1:
        sd = math.sqrt(sum((v - m) ** 2 for v in vals) / (len(vals) - 1))
        text = f"{m:.4f} ± {sd:.4f}"
    else:
        text = f"{m:.4f}"
    if len(vals) < n_runs:
        text += f" (n={len(vals)})"
    return text


def _run_names(dirs: list[Path]) -> list[str]:
    """Directory names, with parent folders added where two runs share a name."""
    resolved = [d.resolve() for d in dirs]
    depth = 1
    while True:
        names = ["/".join(p.parts[-depth:]) for p in resolved]
        dup = {n for n in names if names.count(n) > 1}
        if not dup or depth >= max(len(p.parts) for p in resolved):
            break
        depth += 1
    # keep the short name where it is unique
    short = [p.name for p in resolved]
    return [s if short.count(s) == 1 else n for s, n in zip(short, names)]


def _table(header: list[str], rows: list[list[str]], align: list[str]) -> list[str]:
    sep = ["---:" if a == "r" else "---" for a in align]
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out



GLOBAL_BASELINES = ("fedavg", "fedprox")   # the default reference of the time-to-target table


def rounds_to_target(rounds: list[dict], target: float) -> int | None:
    """First round after which the (evaluated) accuracy never drops below ``target`` again;
    None if it never gets there."""
    evaluated = [r for r in rounds if r.get("accuracy") is not None]
    for i, r in enumerate(evaluated):
        if all(e["accuracy"] >= target for e in evaluated[i:]):
            return r["round"]
    return None


def held_accuracy(rounds: list[dict]) -> float | None:
    """The highest accuracy a run holds from some round to its end: the largest target
    :func:`rounds_to_target` finds it reaching (None without an evaluated round)."""
    best, floor = None, math.inf
    for r in reversed([r for r in rounds if r.get("accuracy") is not None]):
        floor = min(floor, float(r["accuracy"]))
        best = floor if best is None else max(best, floor)
    return best


def round_seconds(r: dict, local_steps: int, step_s: float = 0.05, bandwidth: float = 1e6) -> float:
    """Simulated seconds of one round: clients train in parallel, so a round costs one
    participant's model download + upload (bytes_up / trained clients, twice) over ``bandwidth``
    bytes/s, ``local_steps`` SGD steps of ``step_s`` s, and Fielding's drift reports."""
    trained = max(int(r.get("trained_clients") or 0), 1)
    model = (r.get("bytes_up") or 0) / trained
    reports = (r.get("fielding_report_bytes") or 0) / max(int(r.get("fielding_drifted") or 0), 1)
    return local_steps * step_s + (2 * model + reports) / bandwidth


def time_to_target(rounds: list[dict], target: float, local_steps: int, step_s: float = 0.05,
                   bandwidth: float = 1e6) -> float | None:
    """Simulated seconds until :func:`rounds_to_target`; None if the target is never held."""
    hit = rounds_to_target(rounds, target)
    if hit is None:
        return None
    return float(sum(round_seconds(r, local_steps, step_s, bandwidth) for r in rounds
                     if r["round"] <= hit))


def accuracy_rule(summary: dict) -> str:
    """What the run's ``accuracy`` measures (summary.json ``accuracy_rule``). A summary written
    before the field: FedDrift's time-step protocol, whose summaries hold ``acc_include``, scored
    the next step; every other protocol the current step."""
    rule = summary.get("accuracy_rule")
    if rule:
        return str(rule)
    return "next step" if "acc_include" in summary else "current step"


def _mean_of(records: list[dict], key: str) -> float | None:
    vals = [float(r[key]) for r in records if is_number(r.get(key))]
    return sum(vals) / len(vals) if vals else None


#: the accuracy keys of summary.json whose meaning is the run's rule
RULE_KEYS = ("mean_accuracy", "mean_accuracy_after_drift", "final_accuracy")
#: the common rule's means over the rounds (score-next-step), every protocol alike
COMMON_KEYS = ("accuracy_current", "accuracy_next")


def run_rows(runs: list[tuple[Path, dict, list[dict]]], names: list[str]) -> list[dict]:
    """One plain dict per run: what every format shows of it."""
    rows = []
    for name, (_, summary, records) in zip(names, runs):
        mb = ((summary.get("bytes_up") or 0) + (summary.get("bytes_down") or 0)) / 1e6
        row = {"run": name, "strategy": summary["strategy"], "scenario": summary["scenario"],
               "seed": summary["seed"], "rounds": summary["rounds"],
               "accuracy_rule": accuracy_rule(summary),
               **{k: summary.get(k) for k in RULE_KEYS},
               **{f"mean_{k}": _mean_of(records, k) for k in COMMON_KEYS},
               "ari_final": summary.get("ari_final")}
        for k in ("last5_global_accuracy", "final_global_accuracy"):
            if summary.get(k) is not None:
                row[k] = summary[k]
        row.update(mb=mb, wall_time_s=summary.get("wall_time_s"),
                   status=summary.get("status"))
        rows.append(row)
    return rows


def time_to_target_rows(runs: list[tuple[Path, dict, list[dict]]], names: list[str],
                        baseline: str | None = None, target: float | None = None) -> list[dict]:
    """Per run with a baseline run of the same scenario, seed and scoring rule: the target,
    the rounds and simulated seconds until its accuracy stays at or above it (None: not
    reached), and the speed-up over the baseline, computed only when both reach it. The target,
    unless given, is :data:`TARGET_FRACTION` of the highest accuracy a run of that scenario,
    seed and rule holds to its end: a run that collapsed does not pull it down."""
    wanted = (baseline,) if baseline else GLOBAL_BASELINES
    key = lambda s: (s["scenario"], s["seed"], accuracy_rule(s))   # noqa: E731
    refs: dict[tuple, tuple[dict, list[dict]]] = {}
    for strategy in reversed(wanted):    # the first of GLOBAL_BASELINES present wins
        for _, s, r in runs:
            if s["strategy"] == strategy:
                refs.setdefault(key(s), (s, r))
    best: dict[tuple, float] = {}
    for _, s, r in runs:
        if (held := held_accuracy(r)) is not None:
            best[key(s)] = max(best.get(key(s), held), held)
    steps = lambda s: int((s.get("config") or {}).get("local-steps") or 0)  # noqa: E731
    rows = []
    for name, (_, summary, records) in zip(names, runs):
        ref = refs.get(key(summary))
        if ref is None or key(summary) not in best:
            continue
        goal = target if target is not None else TARGET_FRACTION * best[key(summary)]
        mine_r, ref_r = rounds_to_target(records, goal), rounds_to_target(ref[1], goal)
        mine_t = time_to_target(records, goal, steps(summary))
        ref_t = time_to_target(ref[1], goal, steps(ref[0]))
        both = mine_r is not None and ref_r is not None
        rows.append({"run": name, "strategy": summary["strategy"],
                     "accuracy_rule": accuracy_rule(summary), "baseline": ref[0]["strategy"],
                     "target": goal, "rounds_to_target": mine_r, "simulated_s": mine_t,
                     "baseline_reached": ref_r is not None,
                     "speedup_rounds": ref_r / mine_r if both else None,
                     "speedup_time": ref_t / mine_t if both and mine_t else None})
    return rows


def _speedup_cell(row: dict, key: str) -> str:
    if row["rounds_to_target"] is None:
        return "not reached"
    if not row["baseline_reached"]:
        return f"{row['baseline']} not reached"
    return _fmt(row[key], 2)


def time_to_target_table(rows: list[dict], baseline: str | None, target: float | None
                         ) -> list[str]:
    """Markdown lines of :func:`time_to_target_rows` (empty without rows)."""
    if not rows:
        return []
    what = baseline or "/".join(GLOBAL_BASELINES)
    goal = ("--target" if target is not None else
            f"{TARGET_FRACTION:g} x the highest accuracy a compared run of the same scenario, "
            f"seed and scoring rule holds to its end")
    lines = ["", f"## Time to target accuracy (target: {goal}; a speed-up only where the run "
             f"and the baseline both reach it; simulated time as docs/fielding/README.md, D11 "
             f"defines it)", ""]
    table = [[_cell(r["run"]), _cell(r["strategy"]), _cell(r["accuracy_rule"]),
              _fmt(r["target"]),
              "not reached" if r["rounds_to_target"] is None else str(r["rounds_to_target"]),
              _fmt(r["simulated_s"], 1), _speedup_cell(r, "speedup_rounds"),
              _speedup_cell(r, "speedup_time")] for r in rows]
    return lines + _table(["run", "strategy", "scoring rule", "target", "rounds to target",
                           "simulated s", f"speed-up vs {what} (rounds)",
                           "speed-up (simulated time)"], table,
                          ["l", "l", "l", "r", "r", "r", "r", "r"])


def _rule_columns(rows: list[dict]) -> tuple[list[str], list[tuple[str, str, str]]]:
    """The scoring rules present (first seen first) and the accuracy columns: (header, key,
    rule) per rule-bound key and rule, then the common rule's where a run has them."""
    rules = list(dict.fromkeys(r["accuracy_rule"] for r in rows))
    columns = [(f"{k} [{rule}]", k, rule) for rule in rules for k in RULE_KEYS]
    columns += [(f"{k} [common rule]", f"mean_{k}", "") for k in COMMON_KEYS
                if any(r.get(f"mean_{k}") is not None for r in rows)]
    return rules, columns


def _in_rule(row: dict, key: str, rule: str) -> Any:
    return row.get(key) if not rule or row["accuracy_rule"] == rule else OTHER_RULE


def markdown(rows: list[dict], tt_rows: list[dict], baseline: str | None,
             target: float | None) -> str:
    _, acc = _rule_columns(rows)
    extra = [k for k in ("last5_global_accuracy", "final_global_accuracy")
             if any(r.get(k) is not None for r in rows)]
    header = ["run", "strategy", "scenario", "seed", "rounds", *[h for h, _, _ in acc],
              "ari_final", *extra, "MB (up+down)", "wall_time_s", "status"]
    align = ["l", "l", "l", "r", "r", *["r"] * len(acc), "r", *["r"] * len(extra), "r", "r", "l"]
    table = [[_cell(r["run"]), _cell(r["strategy"]), _cell(r["scenario"]), _cell(r["seed"]),
              _cell(r["rounds"]), *[_fmt(_in_rule(r, k, rule)) for _, k, rule in acc],
              _fmt(r["ari_final"]), *[_fmt(r.get(k)) for k in extra], _fmt(r["mb"], 2),
              _fmt(r["wall_time_s"], 2), _cell(r["status"] or "n/a")] for r in rows]

    groups: dict[tuple[str, str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((str(r["strategy"]), str(r["scenario"]), r["accuracy_rule"]),
                          []).append(r)
    metrics = [*acc, ("ari_final", "ari_final", ""), *[(k, k, "") for k in extra]]
    g_rows = [[_cell(strategy), _cell(scenario), str(len(members))]
              + [_mean_std([_in_rule(m, k, rule) for m in members], len(members))
                 for _, k, rule in metrics]
              for (strategy, scenario, _), members in groups.items()]

    lines = ["## Runs", "", *_table(header, table, align), "",
             "## By strategy and scenario (mean ± sample std over seeds)", "",
             *_table(["strategy", "scenario", "n seeds", *[h for h, _, _ in metrics]], g_rows,
                     ["l", "l", "r"] + ["r"] * len(metrics))]
    if len({r["accuracy_rule"] for r in rows}) > 1:
        lines += ["", f"Accuracy columns per scoring rule ([rule]: what a run's `accuracy` "
                  f"measures, summary.json `accuracy_rule`); {OTHER_RULE}: the run is scored "
                  f"by another rule."]
    lines += time_to_target_table(tt_rows, baseline, target)
    return "\n".join(lines) + "\n"


def compare_runs(run_dirs: list, out_path: str | os.PathLike | None = None,
                 baseline: str | None = None, target: float | None = None,
                 fmt: str = "md") -> str:
    """The comparison of runs as ``fmt`` (:data:`FORMATS`): ``md`` a per-run table, a
    per-(strategy, scenario, rule) table and the time to target; ``csv`` one row per run (its
    accuracy columns per rule as in the tables, its time to target included); ``json``
    ``{"runs", "time_to_target"}``, each run with its ``accuracy_rule``.

    The group table gives mean ± sample std (ddof=1) over the group's runs of each metric,
    ignoring null values (then "(n=k)" tells how many runs had one). If ``out_path`` is given a
    comparison plot is written there: one accuracy line per run when every group has a single
    run, else the mean per group with a ±1 std band.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; valid: {', '.join(FORMATS)}")
    dirs = [Path(d) for d in run_dirs]
    if not dirs:
        raise ValueError("compare_runs: no run directories given")
    runs = [(d, *load_run(d)) for d in dirs]
    names = _run_names(dirs)
    rows = run_rows(runs, names)
    tt_rows = time_to_target_rows(runs, names, baseline, target)
    if out_path is not None:
        plot_comparison(runs, names, Path(out_path), [r["accuracy_rule"] for r in rows])
    if fmt == "json":
        return json.dumps({"runs": rows, "time_to_target": tt_rows}, indent=2,
                          allow_nan=False) + "\n"
    if fmt == "csv":
        import pandas as pd

        # as in the tables: an accuracy column per scoring rule, empty for another rule's runs
        rules, _ = _rule_columns(rows)
        by_run = {r["run"]: r for r in tt_rows}
        merged = []
        for r in rows:
            row = {k: v for k, v in r.items() if k not in RULE_KEYS}
            row.update({f"{k} [{rule}]": r[k] if r["accuracy_rule"] == rule else None
                        for rule in rules for k in RULE_KEYS})
            merged.append({**row, **{k: v for k, v in by_run.get(r["run"], {}).items()
                                     if k not in row}})
        buf = io.StringIO()
        pd.DataFrame(merged).to_csv(buf, index=False)
        return buf.getvalue()
    return markdown(rows, tt_rows, baseline, target)
