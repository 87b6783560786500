"""The bench's outputs from its per-run rows: the leaderboard (markdown), the rows themselves
(JSON lines, the data behind every number) and the plots.

Every rank, interval and test comes from :mod:`~fedcluster_app.bench.stats` (its docstring
says how they are made): the leaderboard ranks the strategies but the references (the Oracle
and Local, in their own table beside it) by the next-step accuracy (returns of an old concept
scored apart, in their own section) and by the current-step accuracy; the Friedman tests with
their critical-difference diagrams and the pairwise Wilcoxon-Holm tests follow it.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from fedcluster_app.bench import stats as S
from fedcluster_app.bench.matrix import (
    FINISHED,
    PATTERNS,
    PRIORS,
    SHIFTS,
    TUNING_SCENARIOS,
    VALIDATION_SEED,
    method,
)
from fedcluster_app.core.atomic import atomic_write_bytes
from fedcluster_app.core.results.plots import new_figure, save_png


def write_rows(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows).encode())


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


# ---------------------------------------------------------------------- aggregation
def _finite(values: Iterable[Any]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def _pm(values: Iterable[Any], digits: int = 3, scale: float = 1.0) -> str:
    """Mean ± the half-width of its 95% t-interval over the values (seeds); the mean alone
    from one value."""
    vals = _finite(values)
    if not vals:
        return "n/a"
    m, half, _ = S.interval(vals)
    return _ci(m * scale, None if half is None else half * scale, digits)


def _ci(mean: float, half: float | None, digits: int = 3) -> str:
    if mean is None or not math.isfinite(mean):
        return "n/a"
    return f"{mean:.{digits}f}" + (f" ± {half:.{digits}f}" if half is not None
                                   and math.isfinite(half) else "")


def _plain(values: Iterable[Any], digits: int = 1, scale: float = 1.0) -> str:
    vals = _finite(values)
    return "n/a" if not vals else f"{np.mean(vals) * scale:.{digits}f}"


def _p(p: float) -> str:
    return f"{p:.2g}" if p >= 1e-4 else f"{p:.1e}"


def group(rows: list[dict]) -> dict[str, dict[str, list[dict]]]:
    """scenario -> strategy -> rows (every seed), in the rows' order."""
    out: dict[str, dict[str, list[dict]]] = {}
    for r in rows:
        out.setdefault(r["scenario"], {}).setdefault(r["strategy"], []).append(r)
    return out


def rankings(rows: list[dict]) -> dict[str, S.Ranking] | str:
    """Score label -> the ranking on it (:data:`~fedcluster_app.bench.stats.SCORES`), or why
    the rows cannot be ranked."""
    try:
        return {label: S.ranking(rows, key) for label, key in S.SCORES.items()
                if label not in S.OPTIONAL_SCORES or any(r.get(key) is not None for r in rows)}
    except ValueError as ex:
        return str(ex)


def return_ranking(rows: list[dict]) -> S.Ranking | str:
    """The ranking on the first of the return scores over the scenarios with a return of an old
    concept, or why there is none."""
    rows = S.with_event_scores(rows)
    key = S.RETURN_RANKED
    blocks = {r["scenario"] for r in rows if r.get(key) is not None}
    if not blocks:
        return "no scenario of these rows has the return of an old concept"
    try:
        return S.ranking(rows, key, blocks=blocks)
    except ValueError as ex:
        return str(ex)


def _status_cell(rs: list[dict]) -> str | None:
    """Why a strategy has no score on a scenario (cannot run / all seeds failed), else None."""
    if any(r["status"] in FINISHED for r in rs):
        return None
    r = rs[0]
    reason = (r.get("reason") or "").replace("|", "\\|")
    return f"{r['status']}: {reason}"


# ---------------------------------------------------------------------- markdown
def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |",
           "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|"]
    return out + ["| " + " | ".join(r) + " |" for r in rows]


def leaderboard(rows: list[dict]) -> list[str]:
    """The ranked strategies over every scenario: average rank (ties within noise), mean gap to
    the best and mean accuracy with its interval over seeds, on both scores."""
    rs = rankings(S.with_event_scores(rows))
    if isinstance(rs, str):
        return [f"Not ranked: {rs}."]
    sums = {label: S.summary(r) for label, r in rs.items()}
    nxt, cur = sums["next step"], sums["current step"]
    glob = sums.get("global, next step")
    table = [[s, f"{nxt.at[s, 'avg_rank']:.2f}", f"{nxt.at[s, 'gap']:.2f}",
              _ci(nxt.at[s, "mean"], nxt.at[s, "half"]), f"{cur.at[s, 'avg_rank']:.2f}",
              f"{cur.at[s, 'gap']:.2f}", _ci(cur.at[s, "mean"], cur.at[s, "half"]),
              *([f"{glob.at[s, 'avg_rank']:.2f}", _ci(glob.at[s, "mean"], glob.at[s, "half"])]
                if glob is not None else []),
              str(nxt.at[s, "top"])] for s in nxt.index]
    return _table(["strategy", "avg rank, next step", "gap to best, next (points)",
                   "acc next step", "avg rank, current step", "gap to best, current (points)",
                   "acc current step",
                   *(["avg rank, global next step", "acc global next step"]
                     if glob is not None else []), "first (next)"], table)


def references_table(rows: list[dict]) -> list[str]:
    """The references beside the ranking: mean accuracy and gap to the best ranked strategy."""
    rs = rankings(S.with_event_scores(rows))
    if isinstance(rs, str) or not rs["next step"].references:
        return ["No reference among the rows." if not isinstance(rs, str) else f"Not ranked: {rs}."]
    refs = {label: S.references(r) for label, r in rs.items()}
    table = []
    for ref in refs["next step"].index:
        cells = [ref]
        for label in refs:
            t = refs[label]
            cells += [_ci(t.at[ref, "mean"], t.at[ref, "half"]), f"{t.at[ref, 'gap']:.2f}",
                      f"{t.at[ref, 'above']} / {t.at[ref, 'blocks']}"]
        table.append(cells)
    return _table(["reference", *(h for label in refs for h in (
        f"acc {label}", f"gap to best ranked, {label} (points)",
        f"above every ranked ({label})"))], table)


#: the scores the priors' table sets side by side: the clients' own test splits, then the
#: class-balanced test set
PRIOR_SCORES = ("next step", "global, next step")


def prior_section(rows: list[dict]) -> list[str]:
    """Label skew told apart from drift: the scenarios the rows hold under more than one class
    prior (the same data, shift and pattern), each strategy's mean accuracy and mean gap to the
    best ranked one under each prior, personalised and global side by side."""
    rows = [r for r in S.with_event_scores(rows) if r.get("prior")]
    priors_of: dict[tuple, set[str]] = {}
    for r in rows:
        priors_of.setdefault((r["data"], r["shift"], r["pattern"]), set()).add(r["prior"])
    twins = {k for k, ps in priors_of.items() if len(ps) > 1}
    priors = [p for p in PRIORS if any(p in priors_of[k] for k in twins)]
    if len(priors) < 2:
        return ["No scenario of these rows runs under more than one class prior."]
    cells: dict[tuple[str, str], dict[str, str]] = {}
    order: list[str] = []
    for prior in priors:
        subset = [r for r in rows if r["prior"] == prior
                  and (r["data"], r["shift"], r["pattern"]) in twins]
        for label in PRIOR_SCORES:
            key = S.SCORES[label]
            if not any(r.get(key) is not None for r in subset):
                continue
            try:
                r = S.ranking(subset, key)
            except ValueError as ex:
                return [f"Not compared: {ex}."]
            column = cells.setdefault((prior, label), {})
            for table in (S.summary(r), S.references(r)):
                for name in table.index:
                    column[name] = (f"{_ci(table.at[name, 'mean'], table.at[name, 'half'])}; "
                                    f"{table.at[name, 'gap']:.2f}")
                    order += [name] if name not in order else []
    header = ["strategy", *(f"{prior}, {label}: acc; gap" for prior, label in cells)]
    return [(f"The {len(twins)} scenarios run under every class prior ({', '.join(priors)}: "
             f"the same data, shift and drift pattern), each prior on its own. "
             f"**{PRIOR_SCORES[0]}** is personalised: each client's own test split, with its "
             f"own class prior; **"
             f"{PRIOR_SCORES[1]}** is global: the same models on a class-balanced test set of the "
             f"client's concept. Under uniform priors the two agree, so what tells the methods "
             f"apart there is the drift; under Dirichlet skew a method that fits each client's "
             f"prior gains on its own split and not on the balanced set. Each cell: the mean "
             f"accuracy ± its 95% interval over seeds; the mean gap to the best ranked strategy "
             f"of that prior, in points (negative: above every ranked one); the references "
             f"last."), "",
            *_table(header, [[name, *(col.get(name, "–") for col in cells.values())]
                             for name in order])]


def friedman_table(rs: dict[str, S.Ranking]) -> list[str]:
    """Friedman's test and Nemenyi's critical difference over every block and per group."""
    first = next(iter(rs.values()))
    table = []
    for g in [None, *S.groups(first)]:
        try:
            tests = {label: S.friedman(r, g) for label, r in rs.items()}
        except ValueError as ex:
            table.append([g or "all", "", "", "", str(ex)] + [""] * (2 * len(rs) - 1))
            continue
        f0 = next(iter(tests.values()))
        table.append([g or "all", str(f0.n), str(f0.k), f"{f0.cd:.2f}"]
                     + [v for f in tests.values() for v in (f"{f.statistic:.1f}", _p(f.p))])
    return _table(["scenarios", "N", "k", f"CD (α = {S.ALPHA})"]
                  + [h for label in rs for h in (f"χ², {label}", f"p, {label}")], table)


def pairwise_table(r: S.Ranking) -> list[str]:
    t = S.pairwise(r)
    rows = []
    for _, x in t.iterrows():
        verdict = (f"**{x['winner']}** higher" if isinstance(x["winner"], str)
                   else "not separated")
        rows.append([x["a"], x["b"], str(x["blocks"]), str(x["a_better"]), str(x["b_better"]),
                     f"{x['shift']:+.2f}", _p(x["p"]), _p(x["p_holm"]), verdict])
    return _table(["A", "B", "scenarios", "A higher in", "B higher in", "shift A - B (points)",
                   "p", "p (Holm)", f"at α = {S.ALPHA}"], rows)


def _separated(r: S.Ranking) -> tuple[int, int]:
    t = S.pairwise(r)
    return int(t["winner"].map(lambda w: isinstance(w, str)).sum()), len(t)


def _seeds_line(rows: list[dict]) -> str:
    """How many seeds the cells have, and what fewer than the protocol's do to the page."""
    per_cell = Counter((r["scenario"], r["strategy"]) for r in rows if r["status"] in FINISHED)
    if not per_cell:
        return "No finished run."
    least = min(per_cell.values())
    line = (f"Seeds per scenario and strategy: {least}"
            + (f" to {max(per_cell.values())}" if max(per_cell.values()) > least else "") + ".")
    if least == 1:
        line += (f" **That is below the {S.MIN_SEEDS} seeds the protocol asks**: one seed gives "
                 f"no interval and no noise estimate (only equal means tie).")
    elif least < S.MIN_SEEDS:
        line += (f" **That is below the {S.MIN_SEEDS} seeds the protocol asks**, so the "
                 f"intervals are wide (with {least} seeds the 95% half-width is "
                 f"{S.t_quantile(least):.2f} · sd / √{least}) and fewer differences are told "
                 f"apart than more seeds would tell.")
    return line


def statistics_section(rows: list[dict], cd_plots: list[str]) -> list[str]:
    """The tests behind the leaderboard: how ties, intervals and tests are made, Friedman and
    the critical-difference diagrams, the pairwise tests, the duplicate blocks left out."""
    rows = S.with_event_scores(rows)
    lines = [_seeds_line(rows), "",
             ("- **Intervals**: mean ± the half-width of the 95% t-interval over seeds. For a "
              "strategy over all scenarios, each seed's mean over them is one value."),
             ("- **Ties within noise**: within a scenario, two means closer than one standard "
              "error of their difference, s_p · √(1/n_a + 1/n_b) (s_p: the scenario's pooled "
              "standard deviation over seeds), are within noise. Sorted by mean, a strategy "
              "shares the rank of the tie group above it when it is within noise of that "
              "group's best; the group shares the mean of its places."),
             ("- **Friedman test** on those ranks (scipy, corrected for ties) over every "
              "scenario and per shift (the no-drift scenarios a group of their own), with "
              "Nemenyi's critical difference CD = q_α · √(k(k+1) / 6N): two average ranks "
              "further apart than CD differ at α = 0.05. In the diagrams, a bar joins "
              "strategies whose average ranks are within CD of each other."),
             ("- **Pairwise**: Wilcoxon's signed-rank test on the scenario means of every pair "
              "of ranked strategies (two-sided, zero differences dropped), Holm's correction "
              "over all the pairs; the shift is the Hodges-Lehmann estimate (the median of "
              "the differences' Walsh averages). \"A beats B\" on this page means A is the "
              "higher with Holm's p below 0.05. `fedcluster_app.bench.stats.beats(rows, a, b)` "
              "answers it for any pair. Each \"A beats B\" of the reading carries a claim "
              "marker, checked against these rows by the same test, on the scenarios it names "
              "(`fedcluster_app/bench/claims.py`)."),
             ""]
    rs = rankings(rows)
    if isinstance(rs, str):
        return lines + [f"Not ranked: {rs}.", ""]
    first = next(iter(rs.values()))
    if first.left_out:
        lines += ["Left out of the ranks and the tests (a duplicate counts once; a scenario "
                  "without every ranked strategy is not a complete block):", ""]
        lines += [f"- `{b}`: {why}" for b, why in first.left_out.items()] + [""]
    lines += ["### Friedman test", "", *friedman_table(rs), ""]
    for path in cd_plots:
        lines += [f"![{Path(path).stem}]({path})", ""]
    lines += ["### Pairwise tests", ""]
    for label, r in rs.items():
        sep, pairs = _separated(r)
        lines += [f"**{label.capitalize()}** (`{r.key}`): {sep} of {pairs} pairs separated at "
                  f"α = {S.ALPHA} after Holm's correction.", "", *pairwise_table(r), ""]
    return lines


def returns_section(rows: list[dict], cd_plots: list[str]) -> list[str]:
    """The return of an old concept, scored as its own event."""
    rows = S.with_event_scores(rows)
    r = return_ranking(rows)
    lines = [("A return is a drift into a step where every client that changes goes back to "
              "a concept it held before (the `recurring` pattern's step 5). The next-step "
              "score rewards not adapting there: a method that adapted to the drifted concept "
              "pays the drop again when the old one comes back. So the ranked next-step score "
              "leaves the returns out (`acc_next_no_return`), and the return is scored here: "
              "**at the return** = the next-step accuracy on the returning step, before "
              "adapting (what the next-step score used to count); **after the first round** = "
              "the current-step accuracy after the returning step's first round (a method that "
              "kept the old concept's model has it back at once). Ranks, the Friedman test and "
              "the tests are those of the first round. The `staggered` pattern's step 5 mixes "
              "returning clients with clients drifting for the first time; a run's accuracies "
              "are means over its clients, so that step cannot be split and stays in the "
              "next-step score."), ""]
    if isinstance(r, str):
        return lines + [f"Not ranked: {r}.", ""]
    sums = S.summary(r)
    table = []
    for s in [*sums.index, *r.references]:
        cells = [s if s in sums.index else f"{s} (reference)"]
        for key in S.RETURN_SCORES.values():
            vals = S.seed_values([x for x in rows if x["strategy"] == s
                                  and x["scenario"] in r.means.index], key)
            per_seed = vals.groupby("seed")["value"].mean()
            cells.append(_ci(*S.interval(per_seed)[:2]) if len(per_seed) else "n/a")
        cells += ([f"{sums.at[s, 'avg_rank']:.2f}", f"{sums.at[s, 'gap']:.2f}"]
                  if s in sums.index else ["ref", "ref"])
        table.append(cells)
    lines += [f"Over the {len(r.means)} scenarios with a return:", "",
              *_table(["strategy", *(f"acc {label}" for label in S.RETURN_SCORES),
                       "avg rank (first round)", "gap to best (first round, points)"], table), ""]
    try:
        f = S.friedman(r)
        sep, pairs = _separated(r)
        lines += [f"Friedman test on the first round's ranks: χ² = {f.statistic:.1f}, p = "
                  f"{_p(f.p)} (N = {f.n}, k = {f.k}, CD = {f.cd:.2f}); {sep} of {pairs} pairs "
                  f"separated (Wilcoxon, Holm).", ""]
    except ValueError as ex:
        lines += [f"No Friedman test: {ex}.", ""]
    for path in cd_plots:
        lines += [f"![{Path(path).stem}]({path})", ""]
    return lines


def scenario_table(scenario_rows: dict[str, list[dict]], strategies: list[str],
                   ranks: dict[str, float] | None = None,
                   references: Iterable[str] = ()) -> list[str]:
    """One scenario: every strategy's scores (mean ± 95% interval over seeds), its rank (``ranks``;
    ``ref`` for a reference) and seeds; two columns more where the scenario has a return."""
    scenario_rows = {s: S.with_event_scores(rs) for s, rs in scenario_rows.items()}
    ranks, references = ranks or {}, set(references)
    returns = any(r.get("acc_at_return") is not None
                  for rs in scenario_rows.values() for r in rs)
    extra = list(S.RETURN_SCORES.items()) if returns else []
    table = []
    for s in strategies:
        rs = scenario_rows.get(s)
        if not rs:
            continue
        why = _status_cell(rs)
        if why:
            table.append((math.inf, [s, why] + [""] * (13 + len(extra))))
            continue
        ok = [r for r in rs if r["status"] in FINISHED]
        mb = [(r["bytes_up"] or 0) + (r["bytes_down"] or 0) for r in ok]
        seeds = f"{len(ok)}" + (f" ({len(rs) - len(ok)} failed)" if len(ok) < len(rs) else "")
        rank = "ref" if s in references else (f"{ranks[s]:g}" if s in ranks
                                              and math.isfinite(ranks[s]) else "n/a")
        mean = _finite(r.get(S.HEADLINE) for r in ok)
        table.append((-np.mean(mean) if mean else math.inf, [
            s, _pm(r.get(S.HEADLINE) for r in ok), *(_pm(r.get(k) for r in ok) for _, k in extra),
            _pm(r["acc_current"] for r in ok),
            _pm(r.get("acc_global_next") for r in ok), _pm(r.get("acc_global_current") for r in ok),
            _pm(r["acc_final"] for r in ok),
            _pm((r["drop"] for r in ok), 3), _plain((r["recover_rounds"] for r in ok), 1),
            str(sum(r["not_recovered"] for r in ok)), _plain((r["ari"] for r in ok), 2),
            _plain((r["clusters"] for r in ok), 1), _plain(mb, 1, 1e-6),
            _plain((r["wall_time_s"] for r in ok), 1), rank, seeds]))
    table.sort(key=lambda row: row[0])
    return _table(["strategy", "acc next step", *(f"acc {label}" for label, _ in extra),
                   "acc current step", "global acc next step", "global acc current step",
                   "acc end of T", "drop at drift", "rounds to recover",
                   "not recovered", "ARI", "clusters", "MB sent", "s/run", "rank", "seeds"],
                  [row for _, row in table])


def cannot_run_list(rows: list[dict]) -> list[str]:
    seen: dict[tuple[str, str], set[str]] = {}
    for r in rows:
        if r["status"] not in FINISHED:
            seen.setdefault((r["strategy"], f"{r['status']}: {r.get('reason') or ''}"),
                            set()).add(r["scenario"])
    return [f"- **{s}** on {', '.join(sorted(scs))}: {why}"
            for (s, why), scs in sorted(seen.items())]


# ---------------------------------------------------------------------- plots
def _ordered_scenarios(rows: list[dict], data: str) -> list[tuple[str, str, str, str]]:
    """A data set's scenarios in the page's order: without skew, then with it; each time no
    drift first, then shift by shift and pattern by pattern."""
    found = {(r["shift"], r["pattern"], r.get("prior", "dirichlet")) for r in rows
             if r["data"] == data}
    order = [(s, p, prior) for prior in PRIORS
             for s, p in [("mix", "none")] + [(s, p) for s in SHIFTS for p in PATTERNS]]
    return [(data, *key) for key in order if key in found]


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
    for i, (d, shift, pattern, prior) in enumerate(cells):
        ax = fig.add_subplot(nrows, cols, i + 1)
        key = next(r["scenario"] for r in rows if r["data"] == d and r["shift"] == shift
                   and r["pattern"] == pattern and r.get("prior", "dirichlet") == prior)
        ax.set_title((f"{shift} shift, {pattern}" if pattern != "none" else "no drift")
                     + f", {prior} priors", fontsize=9)
        if ylim:
            ax.set_ylim(*ylim)
        ax.grid(True, alpha=0.3)
        drift_rounds = set()
        for s in strategies:
            ok = [r for r in by.get(key, {}).get(s, []) if r["status"] in FINISHED]
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
    picked = [r for r in rows if r["scenario"] == scenario and r["status"] in FINISHED
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
        ok = [r for r in rows if r["strategy"] == s and r["status"] in FINISHED]
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


def _cliques(ranks: np.ndarray, cd: float) -> list[tuple[int, int]]:
    """The maximal runs i..j of the sorted average ranks spanning less than ``cd`` (the
    strategies no test tells apart), as index pairs."""
    out: list[tuple[int, int]] = []
    for i in range(len(ranks)):
        j = max(j for j in range(i, len(ranks)) if ranks[j] - ranks[i] < cd)
        if j > i and (not out or j > out[-1][1]):
            out.append((i, j))
    return out


def _draw_cd(ax, f: S.Friedman, title: str) -> None:
    """One critical-difference diagram (Demšar 2006, Fig. 1): the axis of average ranks, each
    strategy hung from its rank (the better half on the left), bars joining strategies whose
    average ranks are within the critical difference, the CD itself above the axis."""
    names, r = list(f.avg_ranks.index), f.avg_ranks.to_numpy()
    lo, hi = 1.0, float(f.k)
    span = hi - lo
    cliques = _cliques(r, f.cd)
    half = (len(names) + 1) // 2
    first_label = 0.35 + 0.18 * len(cliques)
    step = 0.32
    bottom = first_label + step * max(half, len(names) - half)
    ax.set_xlim(lo - 0.42 * span, hi + 0.42 * span)
    ax.set_ylim(-bottom - 0.2, 1.15)
    ax.axis("off")
    ax.plot([lo, hi], [0, 0], color="black", lw=1)
    for x in range(1, f.k + 1):
        ax.plot([x, x], [0, 0.1], color="black", lw=1)
        ax.text(x, 0.16, str(x), ha="center", va="bottom", fontsize=8)
    ax.plot([lo, lo + f.cd], [0.75, 0.75], color="black", lw=1.5)
    for x in (lo, lo + f.cd):
        ax.plot([x, x], [0.7, 0.8], color="black", lw=1)
    ax.text(lo + f.cd / 2, 0.85, f"CD = {f.cd:.2f}", ha="center", va="bottom", fontsize=8)
    for m, (i, j) in enumerate(cliques):
        y = -(0.2 + 0.18 * m)
        ax.plot([r[i] - 0.04, r[j] + 0.04], [y, y], color="black", lw=3, solid_capstyle="round")
    for i, (name, x) in enumerate(zip(names, r)):
        left = i < half
        level = i if left else len(names) - 1 - i
        y = -(first_label + step * level)
        end = lo - 0.05 * span if left else hi + 0.05 * span
        ax.plot([x, x, end], [0, y, y], color="grey", lw=0.8)
        ax.text(end + (-0.02 if left else 0.02) * span, y, f"{name} ({x:.2f})",
                ha="right" if left else "left", va="center", fontsize=8)
    ax.set_title(title, fontsize=9)


def plot_cd(tests: list[tuple[str, S.Friedman]], title: str, out: Path) -> Path:
    """Critical-difference diagrams, one panel per (title, test), stacked."""
    k = max(f.k for _, f in tests)
    height = (1.4 + 0.32 * ((k + 1) // 2)) * len(tests) + 0.5
    fig = new_figure((8.0, height))
    fig.subplots_adjust(top=1 - 0.5 / height, bottom=0.1 / height, hspace=0.3)
    for i, (name, f) in enumerate(tests):
        ax = fig.add_subplot(len(tests), 1, i + 1)
        _draw_cd(ax, f, f"{name}: N = {f.n} scenarios, Friedman p = {_p(f.p)}")
    fig.suptitle(title, fontsize=9, y=1 - 0.1 / height)
    return save_png(fig, out)


def plot_critical_differences(rows: list[dict], folder: Path) -> list[Path]:
    """``cd-<score>.png`` per ranked score (every scenario, then each group of scenarios) and
    ``cd-return.png`` (the return of an old concept), where a Friedman test can be made."""
    rows = S.with_event_scores(rows)
    paths = []
    rs = rankings(rows)
    for label, r in (rs.items() if isinstance(rs, dict) else []):
        tests = []
        for g in [None, *S.groups(r)]:
            try:
                tests.append((g or "all", S.friedman(r, g)))
            except ValueError:
                continue
        if tests:
            paths.append(plot_cd(tests, f"{label}: average ranks (1 = best) of the ranked "
                                 "strategies; a bar joins those within the critical "
                                 f"difference (Nemenyi, α = {S.ALPHA})",
                                 folder / f"cd-{label.replace(' ', '-')}.png"))
    ret = return_ranking(rows)
    if not isinstance(ret, str):
        try:
            f = S.friedman(ret)
        except ValueError:
            f = None
        if f is not None:
            paths.append(plot_cd([("scenarios with a return", f)],
                                 "the return of an old concept, accuracy after its first "
                                 "round: average ranks (1 = best)", folder / "cd-return.png"))
    return paths


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
    return paths + plot_critical_differences(rows, folder)


# ---------------------------------------------------------------------- the document
def _rounds_line(protocol: dict, tuned: bool) -> str:
    steps, rps = int(protocol["num-steps"]), int(protocol["rounds-per-step"])
    recipe = str(protocol.get("optimizer", "adam"))
    if recipe == "sgd" and protocol.get("momentum"):
        recipe += f" with momentum {protocol['momentum']}"
    lr = ("each method's learning rate tuned per data set (Learning rates)" if tuned
          else f"learning rate {protocol['lr']} for every method")
    model = "each data set's MLP (digits: 64 hidden units, not its CNN), "
    return (f"{protocol['num-clients']} clients, {steps} time steps of {rps} rounds "
            f"(scored: steps 1-{steps - 1}, the rounds 1-{(steps - 1) * rps}); one model and "
            f"training recipe for every method: {model}{protocol['local-steps']} local steps "
            f"of batch {protocol['batch-size']} per round with {recipe}, {lr} (a method with a local "
            f"schedule of its own, such as FedCCFA's phases, runs it with these settings)")


def learning_rates_table(tuning_rows: list[dict]) -> list[str]:
    """Each method's learning rate per data set, and its tuning score there."""
    from fedcluster_app.bench.matrix import tuned_lrs

    if not tuning_rows:
        return []
    chosen = tuned_lrs(tuning_rows)
    datasets = list(dict.fromkeys(r["data"] for r in tuning_rows))
    strategies = list(dict.fromkeys(r["strategy"] for r in tuning_rows))
    grid = sorted({float(r["lr"]) for r in tuning_rows})
    score = {}
    for r in tuning_rows:
        if r["status"] in FINISHED and r.get("acc_next") is not None:
            score.setdefault((r["data"], r["strategy"], float(r["lr"])), []).append(r["acc_next"])
    table = []
    for s in strategies:
        cells = []
        for d in datasets:
            lr = chosen.get((d, s))
            if lr is not None:
                cells.append(f"{lr:g} ({np.mean(score[(d, s, lr)]):.3f})")
            elif all(r["status"] == "cannot run" for r in tuning_rows
                     if r["data"] == d and r["strategy"] == s):
                cells.append("cannot run")
            else:
                cells.append("every rate failed")
        table.append([s, *cells])
    where = ", ".join(f"{sh}/{p}/{pr}" for sh, p, pr in TUNING_SCENARIOS)
    return ["### Learning rates", "",
            (f"Every method's learning rate is chosen per data set from one grid, "
             f"{', '.join(f'{g:g}' for g in grid)}, on seed {VALIDATION_SEED}, which is never "
             f"scored: the rate with the best mean next-step accuracy over the data set's "
             f"scenarios {where} (those of the matrix's priors; "
             f"an equal mean goes to the smaller rate). Chosen rate (its mean next-step "
             f"accuracy there); the tuning runs are in `{TUNING_FILE}`."), "",
            *_table(["method", *datasets], table), ""]


TUNING_FILE = "tuning.jsonl"
#: a target accuracy is this share of the best method's accuracy at the end of the first step
TARGET_SHARE = 0.9
#: a step's last rounds, whose gain says whether a method has converged before the next drift
LAST_ROUNDS = 3


def convergence_table(rows: list[dict]) -> list[str]:
    """Rounds and seconds to a target accuracy in the first step (before any drift), and what
    the last rounds of a step still gain: is the step long enough to converge?"""
    ok = [r for r in rows if r["status"] in FINISHED and r.get("series")]
    if not ok:
        return []
    end1: dict[str, dict[str, list[float]]] = {}
    for r in ok:
        sr, rps = r["series"], int(r["rounds_per_step"])
        acc = dict(zip(sr["round"], sr["accuracy_current"]))
        if rps in acc:
            end1.setdefault(r["scenario"], {}).setdefault(r["strategy"], []).append(acc[rps])
    target = {sc: TARGET_SHARE * max(np.mean(v) for v in by.values())
              for sc, by in end1.items()}
    per: dict[str, dict[str, list]] = {}
    for r in ok:
        sr, rps = r["series"], int(r["rounds_per_step"])
        out = per.setdefault(r["strategy"], {"rounds": [], "seconds": [], "runs": 0,
                                             "late_gain": []})
        acc = dict(zip(sr["round"], sr["accuracy_current"]))
        times = dict(zip(sr["round"], sr.get("round_time_s") or [None] * len(sr["round"])))
        out["runs"] += 1
        hit = next((rnd for rnd in range(1, rps + 1) if rnd in acc
                    and acc[rnd] >= target.get(r["scenario"], math.inf)), None)
        if hit is not None:
            out["rounds"].append(hit)
            spent = [times.get(rnd) for rnd in range(1, hit + 1)]
            if all(t is not None for t in spent):
                out["seconds"].append(sum(spent))
        last = max(sr["round"]) // rps
        for t in range(1, last + 1):
            end, before = t * rps, t * rps - LAST_ROUNDS
            if end in acc and before in acc:
                out["late_gain"].append(acc[end] - acc[before])
    table = [[s, f"{len(v['rounds'])} of {v['runs']}", _plain(v["rounds"], 1),
              _plain(v["seconds"], 2), _pm(v["late_gain"], 2, 100)]
             for s, v in per.items()]
    return ["### Convergence: rounds and time to a target", "",
            (f"Target: {TARGET_SHARE:.0%} of the best method's mean accuracy at the end of the "
             f"first step, per scenario. **Reached**: runs that reach it within the first step; "
             f"**rounds** and **seconds** to it: mean over those runs (seconds: the rounds' own "
             f"wall time). **Last {LAST_ROUNDS} rounds gain**: accuracy points the last "
             f"{LAST_ROUNDS} rounds of a step add, mean ± 95% interval over every step of every "
             f"run: near zero, the step is long enough to converge before the next drift (the "
             f"accuracy-against-rounds curves under Plots show it)."), "",
            *_table(["method", "reached", "rounds to target", "seconds to target",
                     f"last {LAST_ROUNDS} rounds gain (points)"], table), ""]


def methods_table(strategies: list[str], rows: list[dict]) -> list[str]:
    """Each method's own settings (on top of the protocol) and their source; a note where the
    rows were run with other settings than the table gives now."""
    lines = ["### Methods: each as its paper and docs configure it", "",
             "| method | strategy | its own settings | source |", "|---|---|---|---|"]
    stale = []
    for name in strategies:
        m = method(name)
        settings = ", ".join(f"`{k} = {v}`" for k, v in m.settings) or "none"
        lines.append(f"| {name} | `{m.strategy}` | {settings} | {m.source} |")
        ran = {json.dumps(r.get("settings") or {}, sort_keys=True)
               for r in rows if r["strategy"] == name}
        if ran and ran != {json.dumps(dict(m.settings), sort_keys=True)}:
            stale.append(name)
    if stale:
        lines += ["", f"The rows of {', '.join(stale)} were run before this table and without "
                  f"these settings (a run of the command runs them again with them)."]
    return lines + [""]


def render(rows: list[dict], strategies: list[str], protocol: dict, command: str,
           plots: list[Path], doc: Path, data_file: Path, run_info: dict,
           reading: str | None = None, tuning_rows: list[dict] | None = None) -> str:
    """A leaderboard page's markdown, e.g. ``docs/benchmark/README.md`` (every number from ``rows``)."""
    rows = S.with_event_scores(rows)
    by = group(rows)
    ok = sum(1 for r in rows if r["status"] in FINISHED)
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
        f"an earlier run of the command), so it re-renders this page from the rows alone and "
        f"runs only what is missing. Every number below is in "
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
        *([f"- Matrix: {run_info['tier'].description}."] if run_info.get("tier") else []),
        (f"- Every run: {_rounds_line(protocol, bool(tuning_rows))}; "
        f"`fraction-train = {protocol['fraction-train']}` of the clients train each round, every "
        f"client is evaluated every round (`eval-every = "
        f"{protocol['eval-every']}`); `protocol = \"{protocol['protocol']}\"` (no scenario's "
        f"paper protocol); `num-clusters` (K of IFCA, FedEM, FedRC, FedSoft) = the number of "
        f"concepts the scenario uses. The algorithms keep their own message schedules "
        f"(FedDrift's time steps, FlexCFL's client selection, FedCCFA's phases)."),
        ("- Scoring (`score-next-step = true`): **current step** = after each round's training, "
        "each client's accuracy on the current step's test split with the model it uses; **next "
        "step** = at the end of step t, the same models on step t+1's test split, before "
        "anything adapts. Means over clients, then over the scored rounds (current) or steps "
        "(next). Only steps 1 to T = steps - 1 are scored: FedDrift's protocol never trains on "
        "the last step, and each of them has a next step. The ranked next-step score leaves "
        "out the steps where an old concept returns (the `recurring` pattern), which are scored "
        "as their own event (section Recurring drift)."),
        ("- **Global** accuracy, beside the personalised one above (each client's own test "
        "split, with its own class prior): the same models on a class-balanced test set of the "
        "client's current concept (`balanced-test = true`), next step and current step; for "
        "the current step a family's own global measure where it has one (FedCCFA's "
        "generalised accuracy, FedRC's held-out clients; a row's `global_measures` names it). "
        "Under label skew the personalised score rewards fitting the client's prior, the "
        "global one does not."),
        ("- Drift: **drop** = current-step minus next-step accuracy at the end of the step before "
        "a drift (what the drift takes before a method can react); **rounds to recover** = "
        "rounds into the drifted step until the current-step accuracy is back within 0.02 of "
        "its value before the drift (mean over recovered drifts; **not recovered**: drifts "
        "after which it was not back by the step's end, summed over seeds)."),
        ("- **ARI**: adjusted Rand index of the clusters against the true concepts, mean over the "
        "evaluated rounds (one cluster for everyone scores 0); **clusters**: clusters in use "
        "(clients assigned), mean per round; **MB sent**: bytes up + down per run."),
        ("- Scenarios: data x shift x drift pattern x class prior. Shift: label = "
        "`<data>-prior`, feature = `<data>-noise`, concept = `<data>-permute` (`mixture-swap`), "
        "mix = `<data>-mix` (each drifting client one of the three); drifting clients and "
        "targets as in `fedcluster list scenarios`, from step 3; pattern via `drift-pattern`; no "
        "drift = the mix scenario with `drift-pattern = none`. Concept shift has no incremental "
        "pattern: a label permutation has no intermediate step, so it would repeat the sudden "
        "one run for run. Prior: **uniform** (`dirichlet-alpha = inf`: every client the same "
        "class frequencies, so what sets clients apart is the drift) on every shift and "
        "pattern; **dirichlet** (`dirichlet-alpha = 1`: each client its own class prior, label "
        "skew that rewards personalisation) as its own axis, on sudden drift and no drift."),
        "",
        *methods_table(strategies, rows),
        *learning_rates_table(tuning_rows or []),
        *convergence_table(rows),
    ]
    if reading:
        lines += ["## Reading", "", reading.strip(), ""]
    cd = {Path(p).stem: rel(p) for p in plots if Path(p).stem.startswith("cd-")}
    rs = rankings(rows)
    first = next(iter(rs.values())) if isinstance(rs, dict) else None
    complete = (f" over {len(first.means)} scenarios" + (
        f" ({len(first.left_out)} left out: Statistics)" if first.left_out else "")
        if first is not None else "")
    lines += [f"## Leaderboard: average rank{complete}", "",
              *leaderboard(rows), "",
              ("Ranked: every strategy but the references (the Oracle and Local, in the next "
               "table). Rank 1 = the best mean over seeds within a scenario; strategies within "
               "noise of each other there share a rank (Statistics). **Next step** leaves out "
               "the returns of an old concept, scored in their own section. **Gap to best** = "
               "the scenario's best ranked mean minus the strategy's, in accuracy points, "
               "averaged over the scenarios; **acc** = the mean over the scenarios ± the "
               "half-width of its 95% interval over seeds; **first** = scenarios where the "
               "strategy is in the first tie group on the next step."), "",
              "## References: the Oracle and Local", "",
              ("Reported beside the ranking, not in it: the Oracle is told every client's "
               "true concept, Local trains every client alone. The Oracle (warm-started: a "
               "new concept's model starts from its clients' models) is an upper reference for "
               "concept shift only, where a concept id is the whole task; under label or "
               "feature shift the clients of one concept id still have their own class priors "
               "or inputs, and one model per concept id bounds nothing. Gap = the best ranked "
               "strategy's mean minus the reference's, per scenario, averaged (negative: above "
               "every ranked strategy); above every ranked = the scenarios where it is."), "",
              *references_table(rows), "",
              "## Label skew and drift: uniform and Dirichlet class priors", "",
              *prior_section(rows), "",
              "## Statistics", "",
              *statistics_section(rows, [v for k, v in cd.items() if k != "cd-return"]),
              "## Recurring drift: the return of an old concept", "",
              *returns_section(rows, [v for k, v in cd.items() if k == "cd-return"]),
              "## Plots", ""]
    for p in plots:
        if not Path(p).stem.startswith("cd-"):
            lines += [f"![{p.stem}]({rel(p)})", ""]
    lines += ["## Per scenario", "",
              ("Columns as in Protocol; mean ± the half-width of the 95% interval over seeds "
               "(the mean alone from one seed); sorted by the next-step accuracy (returns of an "
               "old concept apart: where a scenario has one, its two scores have their own "
               "columns); rank on the next step, ties within noise shared, `ref` for a "
               "reference."), ""]
    ranked = rs["next step"] if isinstance(rs, dict) else None
    for scenario, by_strategy in by.items():
        r0 = next(iter(by_strategy.values()))[0]
        ranks = (ranked.all_ranks.loc[scenario].dropna().to_dict()
                 if ranked is not None and scenario in ranked.all_ranks.index else {})
        refs = ranked.references if ranked is not None else list(S.REFERENCES)
        lines += [f"### {scenario}", "",
                  f"`scenario = \"{r0['catalogue']}\"`, `drift-pattern = \"{r0['pattern']}\"`",
                  "", *scenario_table(by_strategy, strategies, ranks, refs), ""]
    unable = cannot_run_list(rows)
    lines += ["## Could not run or failed", ""] + (unable or ["Every run finished."]) + [""]
    return "\n".join(lines)
