"""The bench's outputs from its per-run rows: the leaderboard (markdown), the rows themselves
(JSON lines, the data behind every number) and the plots.

Ranks: within a scenario, strategies are ranked by their mean over seeds (1 = best, ties share
the mean rank), once by the next-step accuracy and once by the current-step accuracy; a strategy
that cannot run or failed there is not ranked. The average rank is over the scenarios where the
strategy was ranked (how many is in the table).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from fedcluster_app.bench.matrix import PATTERNS, SHIFTS
from fedcluster_app.core.atomic import atomic_write_bytes
from fedcluster_app.core.results.plots import new_figure, save_png

OK = ("completed", "degraded")


def write_rows(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows).encode())


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


# ---------------------------------------------------------------------- aggregation
def _stats(values: Iterable[Any]) -> tuple[float, float, int] | None:
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not vals:
        return None
    sd = float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0
    return float(np.mean(vals)), sd, len(vals)


def _pm(values: Iterable[Any], digits: int = 3, scale: float = 1.0) -> str:
    s = _stats(values)
    if s is None:
        return "n/a"
    m, sd, n = s
    text = f"{m * scale:.{digits}f} ± {sd * scale:.{digits}f}" if n > 1 else f"{m * scale:.{digits}f}"
    return text


def _plain(values: Iterable[Any], digits: int = 1, scale: float = 1.0) -> str:
    s = _stats(values)
    return "n/a" if s is None else f"{s[0] * scale:.{digits}f}"


def group(rows: list[dict]) -> dict[str, dict[str, list[dict]]]:
    """scenario -> strategy -> rows (every seed), in the rows' order."""
    out: dict[str, dict[str, list[dict]]] = {}
    for r in rows:
        out.setdefault(r["scenario"], {}).setdefault(r["strategy"], []).append(r)
    return out


def _ranks(means: dict[str, float]) -> dict[str, float]:
    """1 = highest mean; ties share the mean of their ranks."""
    order = sorted(means.values(), reverse=True)
    return {s: float(np.mean([i + 1 for i, v in enumerate(order) if v == m]))
            for s, m in means.items()}


def ranks(rows: list[dict], key: str) -> dict[str, dict[str, float]]:
    """scenario -> strategy -> rank by the mean of ``key`` over the strategy's finished seeds."""
    out = {}
    for scenario, by_strategy in group(rows).items():
        means = {}
        for strategy, rs in by_strategy.items():
            s = _stats(r.get(key) for r in rs if r["status"] in OK)
            if s is not None:
                means[strategy] = s[0]
        out[scenario] = _ranks(means)
    return out


def _status_cell(rs: list[dict]) -> str | None:
    """Why a strategy has no score on a scenario (cannot run / all seeds failed), else None."""
    if any(r["status"] in OK for r in rs):
        return None
    r = rs[0]
    reason = (r.get("reason") or "").replace("|", "\\|")
    return f"{r['status']}: {reason}"


# ---------------------------------------------------------------------- markdown
def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |",
           "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|"]
    return out + ["| " + " | ".join(r) + " |" for r in rows]


def leaderboard(rows: list[dict], strategies: list[str]) -> list[str]:
    """The overall table: average ranks and mean accuracies over every scenario."""
    by_next, by_current = ranks(rows, "acc_next"), ranks(rows, "acc_current")
    wins: dict[str, int] = {}
    for r in by_next.values():
        for s, v in r.items():
            if v == min(r.values()):
                wins[s] = wins.get(s, 0) + 1
    table = []
    for s in strategies:
        rn = [r[s] for r in by_next.values() if s in r]
        rc = [r[s] for r in by_current.values() if s in r]
        ok = [r for r in rows if r["strategy"] == s and r["status"] in OK]
        unable = {r["scenario"] for r in rows if r["strategy"] == s and r["status"] not in OK}
        table.append([s, _plain(rn, 2), _plain(rc, 2), _pm((r["acc_next"] for r in ok), 3),
                      _pm((r["acc_current"] for r in ok), 3), str(wins.get(s, 0)),
                      f"{len(rn)} / {len(by_next)}" + (f" ({len(unable)} without)" if unable else "")])
    table.sort(key=lambda row: (float(row[1]) if row[1] != "n/a" else math.inf, row[0]))
    return _table(["strategy", "avg rank, next step", "avg rank, current step",
                   "acc next step", "acc current step", "wins (next)", "scenarios ranked"], table)


def scenario_table(scenario_rows: dict[str, list[dict]], strategies: list[str]) -> list[str]:
    means = {s: _stats(r["acc_next"] for r in rs if r["status"] in OK)
             for s, rs in scenario_rows.items()}
    rank = _ranks({s: m[0] for s, m in means.items() if m is not None})
    table = []
    for s in strategies:
        rs = scenario_rows.get(s)
        if not rs:
            continue
        why = _status_cell(rs)
        if why:
            table.append([s, why] + [""] * 11)
            continue
        ok = [r for r in rs if r["status"] in OK]
        mb = [(r["bytes_up"] or 0) + (r["bytes_down"] or 0) for r in ok]
        seeds = f"{len(ok)}" + (f" ({len(rs) - len(ok)} failed)" if len(ok) < len(rs) else "")
        table.append([s, _pm(r["acc_next"] for r in ok), _pm(r["acc_current"] for r in ok),
                      _pm(r["acc_final"] for r in ok), _pm((r["drop"] for r in ok), 3),
                      _plain((r["recover_rounds"] for r in ok), 1),
                      str(sum(r["not_recovered"] for r in ok)),
                      _plain((r["ari"] for r in ok), 2), _plain((r["clusters"] for r in ok), 1),
                      _plain(mb, 1, 1e-6), _plain((r["wall_time_s"] for r in ok), 1),
                      f"{rank[s]:g}" if s in rank else "n/a", seeds])
    table.sort(key=lambda row: float(row[-2]) if row[-2] not in ("n/a", "") else math.inf)
    return _table(["strategy", "acc next step", "acc current step", "acc end of T", "drop at drift",
                   "rounds to recover", "not recovered", "ARI", "clusters", "MB sent", "s/run",
                   "rank", "seeds"], table)


def cannot_run_list(rows: list[dict]) -> list[str]:
    seen: dict[tuple[str, str], set[str]] = {}
    for r in rows:
        if r["status"] not in OK:
            seen.setdefault((r["strategy"], f"{r['status']}: {r.get('reason') or ''}"),
                            set()).add(r["scenario"])
    return [f"- **{s}** on {', '.join(sorted(scs))}: {why}"
            for (s, why), scs in sorted(seen.items())]


# ---------------------------------------------------------------------- plots
def _ordered_scenarios(rows: list[dict], data: str) -> list[tuple[str, str, str]]:
    found = {(r["shift"], r["pattern"]) for r in rows if r["data"] == data}
    order = [("mix", "none")] + [(s, p) for s in SHIFTS for p in PATTERNS]
    return [(data, s, p) for s, p in order if (s, p) in found]


#: what a per-round plot draws: (y label, y limits or None, a run's series as {round: value})
_SERIES = {
    "accuracy": ("accuracy, current step", (0.0, 1.0),
                 lambda sr: dict(zip(sr["round"], sr["accuracy_current"]))),
    "clusters": ("clusters in use", None, lambda sr: dict(enumerate(sr["clusters"], 1))),
}


def plot_rounds(rows: list[dict], data: str, strategies: list[str], out: Path,
                what: str = "accuracy") -> Path:
    """A per-round series (``what``: current-step accuracy or clusters in use), mean over seeds
    with a min-max band, per scenario of one data set; dotted lines where a drift begins."""
    ylabel, ylim, series_of = _SERIES[what]
    cells = _ordered_scenarios(rows, data)
    cols = min(4, len(cells))
    nrows = math.ceil(len(cells) / cols)
    fig = new_figure((4.2 * cols, 3.0 * nrows + 0.8))
    colours = _colours(strategies)
    by = group(rows)
    for i, (d, shift, pattern) in enumerate(cells):
        ax = fig.add_subplot(nrows, cols, i + 1)
        key = f"{d}/{shift}/{pattern}"
        ax.set_title(f"{shift} shift, {pattern}" if pattern != "none" else "no drift", fontsize=9)
        if ylim:
            ax.set_ylim(*ylim)
        ax.grid(True, alpha=0.3)
        drift_rounds = set()
        for s in strategies:
            ok = [r for r in by.get(key, {}).get(s, []) if r["status"] in OK]
            if not ok:
                continue
            series = [series_of(r["series"]) for r in ok]
            xs = sorted(set().union(*series))
            ys = np.array([[sr.get(x, np.nan) for x in xs] for sr in series], dtype=float)
            ax.plot(xs, np.nanmean(ys, axis=0), color=colours[s], lw=1.1, label=s)
            ax.fill_between(xs, np.nanmin(ys, axis=0), np.nanmax(ys, axis=0), color=colours[s],
                            alpha=0.15, lw=0)
            rps = ok[0]["rounds_per_step"]
            drift_rounds |= {(e["step"] - 1) * rps + 0.5 for e in ok[0]["drift_events"]}
        for x in sorted(drift_rounds):
            ax.axvline(x, color="grey", ls=":", lw=1)
        if i % cols == 0:
            ax.set_ylabel(ylabel)
        if i >= len(cells) - cols:
            ax.set_xlabel("round")
    fig.subplots_adjust(hspace=0.45)   # room for each panel's title under the row above
    handles, labels = fig.axes[0].get_legend_handles_labels() if fig.axes else ([], [])
    if handles:   # beside the panels, where it hides no curve
        fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    fig.suptitle(f"{data}: {ylabel} over rounds (mean over seeds, band = min-max); dotted: "
                 "drift", y=0.0, fontsize=9)
    return save_png(fig, out)


def _colours(strategies: list[str]) -> dict[str, Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab20"]
    # the strong colours of tab20 first, then their light partners
    return {s: cmap((2 * i) % 20 + (2 * i // 20) % 2) for i, s in enumerate(strategies)}


def _one_seed(rows: list[dict], scenario: str, strategies: list[str], seed: int | None
              ) -> tuple[int, dict[str, dict], list[str]] | None:
    """The finished runs of one scenario and seed (``None``: the first seed there is):
    (seed, strategy -> row, the strategies shown in order), or None when there is none."""
    picked = [r for r in rows if r["scenario"] == scenario and r["status"] in OK
              and (seed is None or r["seed"] == seed)]
    if not picked:
        return None
    seed = picked[0]["seed"] if seed is None else seed
    runs = {r["strategy"]: r for r in picked if r["seed"] == seed}
    return seed, runs, [s for s in strategies if s in runs]


def plot_assignments(rows: list[dict], scenario: str, strategies: list[str], out: Path,
                     seed: int | None = None) -> Path | None:
    """Client x round heat maps of the cluster each client is in (one panel per strategy) on one
    scenario and seed; white: in no cluster. The first panel is the true concepts."""
    picked = _one_seed(rows, scenario, strategies, seed)
    if picked is None:
        return None
    seed, runs, shown = picked
    cols = 4
    nrows = math.ceil((len(shown) + 1) / cols)
    fig = new_figure((4.0 * cols, 2.9 * nrows))
    fig.subplots_adjust(hspace=0.5)
    truth = runs[shown[0]].get("concepts")
    panels = ([("true concept", truth)] if truth else []) + [
        (s, runs[s]["series"]["assignments"]) for s in shown]
    for i, (title, grid) in enumerate(panels):
        ax = fig.add_subplot(nrows, cols, i + 1)
        a = np.array([[np.nan if v is None else float(v) for v in row] for row in grid]).T
        # columns are steps (truth) or rounds, 1-based; rows are clients
        ax.imshow(a, aspect="auto", interpolation="nearest", cmap="tab10", vmin=0, vmax=9,
                  extent=(0.5, a.shape[1] + 0.5, a.shape[0] - 0.5, -0.5))
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step" if title == "true concept" else "round", fontsize=8)
        ax.set_ylabel("client", fontsize=8)
    fig.suptitle(f"{scenario}, seed {seed}: cluster of each client (colour = cluster id)",
                 fontsize=10, y=1.02)
    return save_png(fig, out)


def concept_cluster_mass(row: dict) -> dict[str, dict[str, float]] | None:
    """Concept -> cluster -> clients' assignment weight at the last scored round: the run's own
    log (soft weights where the strategy has them), else counted from its hard assignments and
    the true concepts (protocols that log no mass, e.g. FedDrift's); None without any cluster."""
    series = row.get("series") or {}
    logged = series.get("concept_cluster_mass")
    if logged and any(logged.values()):
        return logged
    concepts, rps = row.get("concepts"), row.get("rounds_per_step")
    rounds, grids = series.get("round") or [], series.get("assignments") or []
    for rnd, grid in reversed(list(zip(rounds, grids))):
        if concepts and rps and any(a is not None for a in grid):
            step = min(math.ceil(rnd / rps), len(concepts) - 1)   # round r is in step ceil(r/R)
            mass: dict[str, dict[str, float]] = {}
            for c, a in enumerate(grid):
                row_mass = mass.setdefault(str(concepts[step][c]), {})
                if a is not None:
                    row_mass[str(a)] = row_mass.get(str(a), 0.0) + 1.0
            return mass
    return None


def plot_confusion(rows: list[dict], scenario: str, strategies: list[str], out: Path,
                   seed: int | None = None) -> Path | None:
    """Concept x cluster mass at the last scored round (share of each concept's clients per
    cluster) for each strategy with clusters on one scenario and seed; the title names the
    strategies left out (no clusters: every client its own model)."""
    picked = _one_seed(rows, scenario, strategies, seed)
    if picked is None:
        return None
    seed, runs, listed = picked
    masses = {s: concept_cluster_mass(runs[s]) for s in listed}
    shown = [s for s in listed if masses[s]]
    if not shown:
        return None
    cols = 4
    nrows = math.ceil(len(shown) / cols)
    fig = new_figure((3.4 * cols, 2.9 * nrows))
    fig.subplots_adjust(hspace=0.5)      # room for each row's axis label under the next title
    for i, s in enumerate(shown):
        mass = masses[s]
        concepts = sorted(mass, key=int)
        clusters = sorted({c for row in mass.values() for c in row}, key=int)
        m = np.array([[mass[k].get(c, 0.0) for c in clusters] for k in concepts])
        m = m / np.maximum(m.sum(axis=1, keepdims=True), 1e-12)
        ax = fig.add_subplot(nrows, cols, i + 1)
        ax.imshow(m, cmap="Blues", vmin=0, vmax=1, aspect="auto")
        ax.set_xticks(range(len(clusters)), clusters, fontsize=7)
        ax.set_yticks(range(len(concepts)), concepts, fontsize=7)
        for (y, x), v in np.ndenumerate(m):
            if v > 0.005:
                ax.text(x, y, f"{v:.2f}", ha="center", va="center", fontsize=6)
        ax.set_title(s, fontsize=9)
        ax.set_xlabel("cluster", fontsize=8)
        ax.set_ylabel("concept", fontsize=8)
    left_out = [s for s in listed if s not in shown]
    fig.suptitle(f"{scenario}, seed {seed}: concept x cluster at the last scored round"
                 + (f" (no clusters: {', '.join(left_out)})" if left_out else ""),
                 fontsize=10, y=1.02)
    return save_png(fig, out)


def plot_bytes(rows: list[dict], strategies: list[str], out: Path) -> Path:
    """Mean next-step accuracy against megabytes sent (up + down) per run, over all scenarios."""
    fig = new_figure((7.5, 5.0))
    ax = fig.add_subplot(1, 1, 1)
    colours = _colours(strategies)
    for s in strategies:
        ok = [r for r in rows if r["strategy"] == s and r["status"] in OK]
        if not ok:
            continue
        mb = np.mean([((r["bytes_up"] or 0) + (r["bytes_down"] or 0)) / 1e6 for r in ok])
        acc = np.mean([r["acc_next"] for r in ok])
        ax.scatter([mb], [acc], color=colours[s])
        ax.annotate(s, (mb, acc), fontsize=8, xytext=(3, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel("MB sent per run (up + down, log scale)")
    ax.set_ylabel("accuracy on the next step before adapting")
    ax.grid(True, alpha=0.3)
    ax.set_title("accuracy against communication (means over every scenario and seed)")
    return save_png(fig, out)


def plot_all(rows: list[dict], strategies: list[str], folder: Path,
             heatmap_scenarios: list[str]) -> list[Path]:
    paths = []
    for data in sorted({r["data"] for r in rows}):
        for what in _SERIES:
            paths.append(plot_rounds(rows, data, strategies, folder / f"{what}-{data}.png", what))
    for scenario in heatmap_scenarios:
        tag = scenario.replace("/", "-")
        for fn, name in ((plot_assignments, "assignments"), (plot_confusion, "confusion")):
            p = fn(rows, scenario, strategies, folder / f"{name}-{tag}.png")
            if p is not None:
                paths.append(p)
    paths.append(plot_bytes(rows, strategies, folder / "bytes.png"))
    return paths


# ---------------------------------------------------------------------- the document
def _rounds_line(protocol: dict) -> str:
    steps, rps = int(protocol["num-steps"]), int(protocol["rounds-per-step"])
    return (f"{protocol['num-clients']} clients, {steps} time steps of {rps} rounds "
            f"(scored: steps 1-{steps - 1}, the rounds 1-{(steps - 1) * rps}), "
            f"{protocol['local-steps']} local SGD steps of batch {protocol['batch-size']} at lr "
            f"{protocol['lr']} per round unless the algorithm has its own local schedule")


def render(rows: list[dict], strategies: list[str], protocol: dict, command: str,
           plots: list[Path], doc: Path, data_file: Path, run_info: dict,
           reading: str | None = None) -> str:
    """A leaderboard page's markdown, e.g. ``docs/benchmark/README.md`` (every number from ``rows``)."""
    by = group(rows)
    ok = sum(1 for r in rows if r["status"] in OK)
    seeds = sorted({r["seed"] for r in rows})
    rel = lambda p: Path(p).resolve().relative_to(doc.parent.resolve()).as_posix()
    lines = [
        "# Benchmark: clustered FL under drift on one protocol",
        "",
        "Generated by `fedcluster bench`; regenerate with:",
        "",
        "```bash",
        command,
        "```",
        "",
        (f"Finished runs are reused (their run directories, or with `--reuse-rows` the rows of "
        f"an earlier run of the command), so it re-renders this page in seconds and runs only "
        f"what is missing. Every number below is in "
        f"[`{rel(data_file)}`]({rel(data_file)}) (one JSON line per run: its scores, its drift "
        f"events, the per-round series the plots draw)."),
        "",
        (f"- Matrix: {len(by)} scenarios x {len(strategies)} strategies x {len(seeds)} seeds "
        f"({', '.join(map(str, seeds))}) = {len(rows)} runs; {ok} finished, "
        f"{len(rows) - ok} could not run or failed (listed below with the reason)."),
        (f"- Compute: {run_info['compute_min']:.1f} min of run time (the runs' own wall times, "
        f"summed; `s/run` below). The invocation that wrote this page ran "
        f"{run_info['ran']} of the runs in {run_info['elapsed_min']:.1f} min {run_info['where']} "
        f"(this machine: {run_info['cores']} cores, load average {run_info['load']}); the others "
        f"were finished before and reused."),
        "",
        "## Protocol",
        "",
        (f"- Every run: {_rounds_line(protocol)}; every client trains and is evaluated every "
        f"round (`fraction-train = {protocol['fraction-train']}`, `eval-every = "
        f"{protocol['eval-every']}`); `protocol = \"{protocol['protocol']}\"` (no scenario's "
        f"paper protocol); `num-clusters` (K of IFCA, FedEM, FedRC, FedSoft) = the number of "
        f"concepts the scenario uses. The algorithms keep their own message schedules "
        f"(FedDrift's time steps, FlexCFL's client selection, FedCCFA's phases)."),
        ("- Scoring (`score-next-step = true`): **current step** = after each round's training, "
        "each client's accuracy on the current step's test split with the model it uses; **next "
        "step** = at the end of step t, the same models on step t+1's test split, before "
        "anything adapts. Means over clients, then over the scored rounds (current) or steps "
        "(next). Only steps 1 to T = steps - 1 are scored: FedDrift's protocol never trains on "
        "the last step, and each of them has a next step."),
        ("- Drift: **drop** = current-step minus next-step accuracy at the end of the step before "
        "a drift (what the drift takes before a method can react); **rounds to recover** = "
        "rounds into the drifted step until the current-step accuracy is back within 0.02 of "
        "its value before the drift (mean over recovered drifts; **not recovered**: drifts "
        "after which it was not back by the step's end, summed over seeds)."),
        ("- **ARI**: adjusted Rand index of the clusters against the true concepts, mean over the "
        "evaluated rounds (one cluster for everyone scores 0); **clusters**: clusters in use "
        "(clients assigned), mean per round; **MB sent**: bytes up + down per run."),
        ("- Scenarios: data x shift x drift pattern. Shift: label = `<data>-prior`, feature = "
        "`<data>-noise`, concept = `<data>-permute` (`mixture-swap`), mix = `<data>-mix` (each "
        "drifting client one of the three); drifting clients and targets as in `fedcluster list "
        "scenarios`, from step 3; pattern via `drift-pattern`; no drift = the mix scenario with "
        "`drift-pattern = none`."),
        "",
    ]
    if reading:
        lines += ["## Reading", "", reading.strip(), ""]
    lines += [f"## Leaderboard: average rank over {len(by)} scenarios", "",
              *leaderboard(rows, strategies), "",
              ("Rank 1 = best mean over seeds within a scenario (ties share the mean rank); "
              "wins = scenarios ranked first on the next-step accuracy."), "",
              "## Plots", ""]
    for p in plots:
        lines += [f"![{p.stem}]({rel(p)})", ""]
    lines += ["## Per scenario", "",
              "Columns as in Protocol; mean ± std over seeds; sorted by rank (next step).", ""]
    for scenario, by_strategy in by.items():
        r0 = next(iter(by_strategy.values()))[0]
        lines += [f"### {scenario}", "",
                  f"`scenario = \"{r0['catalogue']}\"`, `drift-pattern = \"{r0['pattern']}\"`",
                  "", *scenario_table(by_strategy, strategies), ""]
    unable = cannot_run_list(rows)
    lines += ["## Could not run or failed", ""] + (unable or ["Every run finished."]) + [""]
    return "\n".join(lines)
