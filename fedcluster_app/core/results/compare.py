"""Comparison of finished runs: a table per run, mean ± std per strategy and scenario, and the
time to a target accuracy (rounds and simulated seconds) against a global-model baseline."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from fedcluster_app.core.results.files import is_number, load_run
from fedcluster_app.core.results.plots import plot_comparison

def _fmt(x: Any, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    if is_number(x):
        return f"{x:.{digits}f}"
    return _cell(x)


def _cell(x: Any) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ")


def _mean_std(values: list[Any], n_runs: int) -> str:
    """'mean ± std' (sample std, ddof=1) over the non-null values; '(n=k)' if some were null."""
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


def time_to_target_table(runs: list[tuple[Path, dict, list[dict]]], names: list[str],
                         baseline: str | None = None, target: float | None = None) -> list[str]:
    """Markdown lines: per run, rounds and simulated seconds until its accuracy stays above the
    target, and the speed-up over the baseline run of the same scenario and seed. The target,
    unless given, is one every compared run of that scenario and seed reaches: the lowest of
    their :func:`held_accuracy`. Empty when no run has a baseline."""
    wanted = (baseline,) if baseline else GLOBAL_BASELINES
    refs = {(s["scenario"], s["seed"]): (s, r) for _, s, r in runs if s["strategy"] in wanted}
    reached: dict[tuple, list[float]] = {}
    for _, s, r in runs:
        if (held := held_accuracy(r)) is not None:
            reached.setdefault((s["scenario"], s["seed"]), []).append(held)
    rows = []
    for name, (_, summary, records) in zip(names, runs):
        ref = refs.get((summary["scenario"], summary["seed"]))
        if ref is None:
            continue
        goal = target if target is not None else min(
            reached.get((summary["scenario"], summary["seed"])) or [None])
        if goal is None:
            continue
        steps = lambda s: int((s.get("config") or {}).get("local-steps") or 0)  # noqa: E731
        mine_r, ref_r = rounds_to_target(records, goal), rounds_to_target(ref[1], goal)
        mine_t = time_to_target(records, goal, steps(summary))
        ref_t = time_to_target(ref[1], goal, steps(ref[0]))
        rows.append([_cell(name), _cell(summary["strategy"]), _fmt(goal),
                     "not reached" if mine_r is None else str(mine_r),
                     _fmt(mine_t, 1), _fmt(ref_r / mine_r if mine_r and ref_r else None, 2),
                     _fmt(ref_t / mine_t if mine_t and ref_t else None, 2)])
    if not rows:
        return []
    what = baseline or "/".join(GLOBAL_BASELINES)
    lines = ["", "## Time to target accuracy (target, unless --target: the highest accuracy "
             "that every compared run of the same scenario and seed holds to its end, so each "
             "reaches it; simulated time as docs/fielding/README.md, D11 defines it)", ""]
    return lines + _table(["run", "strategy", "target", "rounds to target", "simulated s",
                           f"speed-up vs {what} (rounds)", "speed-up (simulated time)"], rows,
                          ["l", "l", "r", "r", "r", "r", "r"])


def compare_runs(run_dirs: list, out_path: str | os.PathLike | None = None,
                 baseline: str | None = None, target: float | None = None) -> str:
    """Markdown comparison of runs: a per-run table and a per-(strategy, scenario) table.

    The group table gives mean ± sample std (ddof=1) over the group's runs of each metric,
    ignoring null values (then "(n=k)" tells how many runs had one). If ``out_path`` is given a
    comparison plot is written there: one accuracy line per run when every group has a single
    run, else the mean per group with a ±1 std band.
    """
    dirs = [Path(d) for d in run_dirs]
    if not dirs:
        raise ValueError("compare_runs: no run directories given")
    runs = [(d, *load_run(d)) for d in dirs]
    names = _run_names(dirs)

    # runs with held-out clients (FedRC's populations) also report global accuracy
    extra = [k for k in ("last5_global_accuracy", "final_global_accuracy")
             if any(summary.get(k) is not None for _, summary, _ in runs)]
    header = ["run", "strategy", "scenario", "seed", "rounds", "mean_accuracy",
              "mean_accuracy_after_drift", "final_accuracy", "ari_final", *extra, "MB (up+down)",
              "wall_time_s", "status"]
    align = ["l", "l", "l", "r", "r", "r", "r", "r", "r", *["r"] * len(extra), "r", "r", "l"]
    rows = []
    groups: dict[tuple[str, str], list[dict]] = {}
    for name, (_, summary, _records) in zip(names, runs):
        mb = ((summary.get("bytes_up") or 0) + (summary.get("bytes_down") or 0)) / 1e6
        rows.append([
            _cell(name), _cell(summary["strategy"]), _cell(summary["scenario"]),
            _cell(summary["seed"]), _cell(summary["rounds"]),
            _fmt(summary.get("mean_accuracy")), _fmt(summary.get("mean_accuracy_after_drift")),
            _fmt(summary.get("final_accuracy")), _fmt(summary.get("ari_final")),
            *[_fmt(summary.get(k)) for k in extra], _fmt(mb, 2), _fmt(summary.get("wall_time_s"), 2),
            _cell(summary.get("status", "n/a")),
        ])
        groups.setdefault((str(summary["strategy"]), str(summary["scenario"])), []).append(summary)

    metrics = ["mean_accuracy", "mean_accuracy_after_drift", "final_accuracy", "ari_final", *extra]
    g_rows = []
    for (strategy, scenario), members in groups.items():
        n = len(members)
        g_rows.append([_cell(strategy), _cell(scenario), str(n)]
                      + [_mean_std([m.get(k) for m in members], n) for k in metrics])

    lines = ["## Runs", ""]
    lines += _table(header, rows, align)
    lines += ["", "## By strategy and scenario (mean ± sample std over seeds)", ""]
    lines += _table(["strategy", "scenario", "n seeds"] + metrics, g_rows,
                    ["l", "l", "r"] + ["r"] * len(metrics))
    lines += time_to_target_table(runs, names, baseline, target)
    text = "\n".join(lines) + "\n"

    if out_path is not None:
        plot_comparison(runs, names, Path(out_path))
    return text
