"""Which differences between the bench's strategies are real: the statistics of its page.

Pure functions over the bench's rows (one per run, as :mod:`~fedcluster_app.bench.report`
reads them); the plots are the report's. The method is Demšar's (2006, "Statistical comparisons
of classifiers over multiple data sets", JMLR 7), with a scenario in the place of a data set:

* **A cell** (scenario, strategy): the mean over seeds and its 95% t-interval,
  mean ± t(0.975, n-1) · sd / √n (one seed gives no interval).
* **A block** is one scenario; a strategy's score there is its mean over seeds. A block whose
  every run has the same scores as an earlier block's (a label permutation has no intermediate
  step, so ``concept/incremental`` repeats ``concept/sudden``) is a duplicate and counts once.
* **References, not ranks.** The Oracle (told the true concepts) and Local (no federation) are
  reported beside the ranking (:func:`references`), never in it: they are left out of the
  ranks, the Friedman test, the critical differences and the pairwise tests.
* **Ties within noise.** In a block, the noise of a difference of two means is one standard
  error of it, ``s_p · √(1/n_a + 1/n_b)``, with ``s_p`` the block's pooled standard deviation
  over seeds (every ranked strategy's seeds, around its own mean). Sorted by mean, a strategy
  shares the rank of the tie group above it when it is within that noise of the group's best
  member; the group's members get the mean of the places they take. Without a second seed
  there is no noise estimate: only equal means tie.
* **Average rank and mean gap** over the complete blocks (every ranked strategy finished
  there); the gap is the block's best ranked mean minus the strategy's, in accuracy points.
* **Friedman test** (scipy's, on those ranks, with its correction for ties) over every block
  and per group of blocks: by shift, the no-drift scenarios a group of their own. **Nemenyi's
  critical difference** CD = q_α · √(k(k+1) / 6N), q_α = the studentized range's 1-α quantile
  for k means and infinite degrees of freedom over √2: two average ranks further apart than CD
  differ at level α.
* **Pairwise**: Wilcoxon's signed-rank test (two-sided, zero differences dropped) on the block
  means of every pair of ranked strategies, over the blocks where both finished, Holm's
  correction over all the pairs; the direction is the Hodges-Lehmann estimate of the shift
  (the median of the differences' Walsh averages). :func:`beats` answers one pair.
* **Returns of an old concept** are scored as their own kind of event
  (:func:`~fedcluster_app.bench.scores.return_scores`): the ranked next-step score leaves them
  out (:data:`HEADLINE`), and the return has its own scores.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import combinations

import numpy as np
import pandas as pd
from scipy import stats as sps

from fedcluster_app.bench.matrix import FINISHED, SHIFTS
from fedcluster_app.bench.scores import return_scores
from fedcluster_app.core.user_text import suggest

#: strategies reported beside the ranking, never in it
REFERENCES = ("oracle", "local")
ALPHA = 0.05
CONFIDENCE = 0.95
#: the scores the page ranks: label -> row key (the personalised ones: each client's own test
#: split; then the global one, where the rows have it: a class-balanced test set of the
#: client's concept, or the family's own global measure)
SCORES = {"next step": "acc_next_no_return", "current step": "acc_current",
          "global, next step": "acc_global_next"}
HEADLINE = SCORES["next step"]
#: ranked only where some row has it (rows of runs without ``balanced-test`` have no global score)
OPTIONAL_SCORES = ("global, next step",)
#: the scores of the return of an old concept (label -> row key), and the one ranked
RETURN_SCORES = {"at the return, before adapting": "acc_at_return",
                 "after the return's first round": "acc_return_first_round"}
RETURN_RANKED = "acc_return_first_round"
#: the seeds per cell the benchmark's protocol asks for
MIN_SEEDS = 5
#: the group of the no-drift scenarios (their shift is the mixed one, their pattern ``none``)
NO_DRIFT = "no drift"


def with_event_scores(rows: list[dict]) -> list[dict]:
    """The rows with :func:`~fedcluster_app.bench.scores.return_scores` added to every finished
    run (rows that have them already are kept as they are)."""
    return [{**r, **return_scores(r)} if r["status"] in FINISHED and HEADLINE not in r else r
            for r in rows]


def block_group(row: dict) -> str | None:
    """The group of blocks a row's scenario is tested in: its shift, or :data:`NO_DRIFT`."""
    return NO_DRIFT if row.get("pattern") == "none" else row.get("shift")


# ---------------------------------------------------------------------- cells
def t_quantile(n):
    """The t-interval's factor for n values (a number or an array): t(0.5 + CONFIDENCE/2, n - 1)."""
    return sps.t.ppf(0.5 + CONFIDENCE / 2, np.asarray(n) - 1)


def interval(values: Iterable) -> tuple[float, float | None, int]:
    """(mean, half-width of the 95% t-interval or None from fewer than two values, count) of the
    finite values; ValueError without any."""
    v = np.array([float(x) for x in values if x is not None and math.isfinite(float(x))])
    if not len(v):
        raise ValueError("no finite value to average")
    if len(v) < 2:
        return float(v.mean()), None, 1
    half = float(t_quantile(len(v))) * v.std(ddof=1) / math.sqrt(len(v))
    return float(v.mean()), float(half), len(v)


def seed_values(rows: list[dict], key: str) -> pd.DataFrame:
    """Columns scenario, strategy, seed, value: ``key`` of every finished run that has a finite
    one."""
    df = pd.DataFrame([(r["scenario"], r["strategy"], r["seed"], r.get(key))
                       for r in rows if r["status"] in FINISHED],
                      columns=["scenario", "strategy", "seed", "value"])
    df["value"] = pd.to_numeric(df["value"], errors="coerce")
    return df[np.isfinite(df["value"])]


def cell_stats(seeds: pd.DataFrame) -> pd.DataFrame:
    """Per (scenario, strategy): mean, sd, n and half (the 95% t-interval's half-width, NaN from
    one seed) of :func:`seed_values`' values."""
    out = seeds.groupby(["scenario", "strategy"], sort=False)["value"].agg(
        mean="mean", sd="std", n="count")
    t = t_quantile(np.maximum(out["n"], 2))
    out["half"] = np.where(out["n"] > 1, t * out["sd"] / np.sqrt(out["n"]), np.nan)
    return out


# ---------------------------------------------------------------------- ranks
def tied_ranks(means: pd.Series, n: pd.Series, pooled_sd: float) -> pd.Series:
    """1 = the highest mean; strategies within noise of their tie group's best share the mean
    of the places the group takes (module docstring). ``n``: seeds per strategy; ``pooled_sd``
    NaN or 0: only equal means tie."""
    sd = pooled_sd if pooled_sd and math.isfinite(pooled_sd) else 0.0
    order = means.sort_values(ascending=False, kind="stable").index.tolist()
    ranks: dict[str, float] = {}
    start = 0
    while start < len(order):
        lead, end = order[start], start + 1
        while end < len(order):
            s = order[end]
            gap = means[lead] - means[s]
            if gap > 0 and gap >= sd * math.sqrt(1 / n[lead] + 1 / n[s]):
                break
            end += 1
        for s in order[start:end]:
            ranks[s] = (start + 1 + end) / 2
        start = end
    return pd.Series(ranks, dtype=float).reindex(means.index)


def pooled_sd(cells: pd.DataFrame) -> float:
    """The pooled standard deviation of one block's cells (NaN without a second seed)."""
    df = (cells["n"] - 1).clip(lower=0)
    return (math.sqrt(float(((cells["sd"].fillna(0.0) ** 2) * df).sum() / df.sum()))
            if df.sum() > 0 else math.nan)


def duplicate_blocks(rows: list[dict]) -> dict[str, str]:
    """Block -> the earlier block whose every finished run has the same scores (strategy, seed,
    current- and next-step accuracy)."""
    runs: dict[str, list] = {}
    for r in rows:
        if r["status"] in FINISHED:
            runs.setdefault(r["scenario"], []).append(
                (r["strategy"], r["seed"], r.get("acc_current"), r.get("acc_next")))
    first: dict[tuple, str] = {}
    out = {}
    for scenario, items in runs.items():
        signature = tuple(sorted(items, key=repr))
        if signature in first:
            out[scenario] = first[signature]
        else:
            first[signature] = scenario
    return out


@dataclass(frozen=True)
class Ranking:
    """The strategies' ranks on one score over the blocks.

    ``strategies``: the ranked ones; ``references``: those reported beside. ``all_means`` /
    ``all_ranks``: every block (scenario) x ranked strategy, NaN where it has no finished run,
    ranked among those present; ``means`` / ``ranks`` / ``gaps`` (points): the complete,
    non-duplicate blocks the average ranks and the Friedman test use. ``left_out``: block -> why
    it is not among them; ``cells``: :func:`cell_stats` of every strategy (references too);
    ``seeds``: :func:`seed_values`; ``groups``: block -> :func:`block_group`."""

    key: str
    strategies: list[str]
    references: list[str]
    all_means: pd.DataFrame
    all_ranks: pd.DataFrame
    means: pd.DataFrame
    ranks: pd.DataFrame
    gaps: pd.DataFrame
    left_out: dict[str, str]
    cells: pd.DataFrame
    seeds: pd.DataFrame
    groups: pd.Series
    duplicates: dict[str, str]


def _check_strategy(name: str, strategies: list[str], what: str) -> None:
    if name not in strategies:
        raise ValueError(f"unknown {what} {name!r}{suggest(name, strategies)}; the rows' "
                         f"strategies: {', '.join(strategies)}")


def ranking(rows: list[dict], key: str = HEADLINE, references: Iterable[str] | None = None,
            blocks: Iterable[str] | None = None) -> Ranking:
    """Rank the rows' strategies on ``key`` over their scenarios (module docstring).

    ``references``: the strategies reported beside the ranking (default: those of
    :data:`REFERENCES` in the rows; a name given that is not in the rows is refused);
    ``blocks``: only these scenarios. ValueError when fewer than two strategies are left to
    rank, or no block has them all."""
    rows = with_event_scores(rows)
    strategies = list(dict.fromkeys(r["strategy"] for r in rows))
    if references is None:
        refs = [s for s in REFERENCES if s in strategies]
    else:
        refs = list(references)
        for name in refs:
            _check_strategy(name, strategies, "reference")
    if blocks is not None:
        keep = set(blocks)
        rows = [r for r in rows if r["scenario"] in keep]
    seeds = seed_values(rows, key)
    if seeds.empty:
        raise ValueError(f"no finished run has a value of {key!r}")
    cells = cell_stats(seeds)
    scenarios = list(dict.fromkeys(seeds["scenario"]))
    ranked = [s for s in strategies if s not in refs and s in set(seeds["strategy"])]
    if len(ranked) < 2:
        raise ValueError(
            f"a ranking needs at least two strategies with a finished run besides the "
            f"references ({', '.join(refs) or 'none'}); the rows have "
            f"{', '.join(ranked) or 'none'}")
    means = cells["mean"].unstack("strategy").reindex(index=scenarios, columns=ranked)
    counts = cells["n"].unstack("strategy").reindex(index=scenarios, columns=ranked)
    ranked_cells = cells[cells.index.get_level_values("strategy").isin(ranked)]
    all_ranks = pd.DataFrame(
        {sc: tied_ranks(means.loc[sc].dropna(), counts.loc[sc], pooled_sd(ranked_cells.loc[sc]))
         for sc in scenarios}).T.reindex(index=scenarios, columns=ranked)
    duplicates = {b: d for b, d in duplicate_blocks(rows).items() if b in means.index}
    left_out = {b: f"repeats {d}" for b, d in duplicates.items()}
    for b in scenarios:
        missing = [s for s in ranked if pd.isna(means.at[b, s])]
        if missing and b not in left_out:
            left_out[b] = f"no finished run of {', '.join(missing)}"
    used = [b for b in scenarios if b not in left_out]
    if not used:
        raise ValueError(f"no scenario has a finished run of every ranked strategy "
                         f"({', '.join(ranked)}) on {key!r}")
    groups = pd.Series({r["scenario"]: block_group(r) for r in rows})
    complete = means.loc[used]
    return Ranking(key=key, strategies=ranked, references=refs, all_means=means,
                   all_ranks=all_ranks, means=complete, ranks=all_ranks.loc[used],
                   gaps=(complete.max(axis=1).to_numpy()[:, None] - complete) * 100.0,
                   left_out=left_out, cells=cells, seeds=seeds,
                   groups=groups.reindex(scenarios), duplicates=duplicates)


def overall_interval(r: Ranking, strategy: str) -> tuple[float, float | None, int]:
    """A strategy's mean over the ranking's complete blocks, with the 95% t-interval over seeds
    (each seed's mean over those blocks is one value)."""
    s = r.seeds[(r.seeds["strategy"] == strategy) & r.seeds["scenario"].isin(r.means.index)]
    per_seed = s.groupby("seed")["value"].mean()
    return interval(per_seed) if len(per_seed) else (math.nan, None, 0)


def summary(r: Ranking) -> pd.DataFrame:
    """Per ranked strategy, best average rank first: ``avg_rank``, ``gap`` (mean gap to the
    best, points), ``top`` (blocks where it is in the first tie group), ``mean``, ``half`` and
    ``seeds`` (:func:`overall_interval`)."""
    out = pd.DataFrame({"avg_rank": r.ranks.mean(), "gap": r.gaps.mean(),
                        "top": r.ranks.eq(r.ranks.min(axis=1), axis=0).sum()})
    cis = {s: overall_interval(r, s) for s in r.strategies}
    out["mean"] = [cis[s][0] for s in out.index]
    out["half"] = [cis[s][1] for s in out.index]
    out["seeds"] = [cis[s][2] for s in out.index]
    return out.sort_values(["avg_rank", "gap"], kind="stable")


def references(r: Ranking) -> pd.DataFrame:
    """Per reference, over the ranking's complete blocks: its mean with the interval over seeds,
    the mean gap to the best ranked strategy (points; negative: above every ranked one) and the
    blocks where it is above the best ranked strategy."""
    best = r.means.max(axis=1)
    out = {}
    for ref in r.references:
        own = r.cells["mean"].xs(ref, level="strategy").reindex(r.means.index)
        present = own.notna()
        mean, half, seeds = overall_interval(r, ref)
        out[ref] = {"mean": mean, "half": half, "seeds": seeds,
                    "gap": float(((best - own) * 100.0)[present].mean()),
                    "above": int((own[present] > best[present]).sum()),
                    "blocks": int(present.sum())}
    return pd.DataFrame.from_dict(out, orient="index")


# ---------------------------------------------------------------------- tests
def q_alpha(k: int, alpha: float = ALPHA) -> float:
    """Nemenyi's q_α for k strategies: the studentized range's 1-α quantile (k means, infinite
    degrees of freedom) over √2 (Demšar 2006, Table 5: 2.569 for k = 4 at α = 0.05)."""
    return float(sps.studentized_range.ppf(1 - alpha, k, np.inf) / math.sqrt(2))


def nemenyi_cd(k: int, n: int, alpha: float = ALPHA) -> float:
    """The critical difference of average ranks of k strategies over n blocks."""
    return q_alpha(k, alpha) * math.sqrt(k * (k + 1) / (6.0 * n))


@dataclass(frozen=True)
class Friedman:
    group: str
    k: int
    n: int
    statistic: float
    p: float
    cd: float
    avg_ranks: pd.Series


def friedman(r: Ranking, group: str | None = None, alpha: float = ALPHA) -> Friedman:
    """Friedman's test on the ranking's ranks (every complete block, or one group's) and
    Nemenyi's critical difference; ValueError below 3 strategies or 2 blocks."""
    ranks = r.ranks if group is None else r.ranks[r.groups.reindex(r.ranks.index) == group]
    n, k = ranks.shape
    if k < 3:
        raise ValueError(f"the Friedman test needs at least 3 ranked strategies, not {k} "
                         f"({', '.join(r.strategies)}): compare two with beats()")
    if n < 2:
        raise ValueError(f"the Friedman test needs at least 2 blocks; {group or 'all'} has {n}")
    if (ranks.to_numpy() == (k + 1) / 2).all():   # every strategy tied everywhere: no evidence
        statistic, p = 0.0, 1.0
    else:
        res = sps.friedmanchisquare(*ranks.to_numpy().T)
        statistic, p = float(res.statistic), float(res.pvalue)
    return Friedman(group=group or "all", k=k, n=n, statistic=statistic, p=p,
                    cd=nemenyi_cd(k, n, alpha), avg_ranks=ranks.mean().sort_values())


def groups(r: Ranking) -> list[str]:
    """The groups of the ranking's complete blocks, in the bench's order (shifts, then no drift)."""
    present = set(r.groups.reindex(r.ranks.index).dropna())
    order = [*SHIFTS, NO_DRIFT]
    return [g for g in order if g in present] + sorted(present - set(order))


def holm(p: Iterable[float]) -> np.ndarray:
    """Holm's step-down adjusted p-values, in the order given."""
    p = np.asarray(list(p), dtype=float)
    m = len(p)
    order = np.argsort(p, kind="stable")
    adjusted = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    out = np.empty(m)
    out[order] = adjusted
    return out


def hodges_lehmann(d: np.ndarray) -> float:
    """The median of the Walsh averages (d_i + d_j) / 2, i <= j: the shift Wilcoxon's test
    estimates."""
    i, j = np.triu_indices(len(d))
    return float(np.median((d[i] + d[j]) / 2.0))


def pairwise(r: Ranking, alpha: float = ALPHA) -> pd.DataFrame:
    """Every pair (a, b) of ranked strategies: the blocks where both finished (duplicates
    counted once), those where each is better, the shift (Hodges-Lehmann, points, > 0: a
    higher), Wilcoxon's p, Holm's p over all the pairs and the ``winner`` (None: not separated
    at ``alpha``)."""
    means = r.all_means.drop(index=list(r.duplicates))
    out = []
    for a, b in combinations(r.strategies, 2):
        both = means[[a, b]].dropna()
        d = (both[a] - both[b]).to_numpy()
        p = float(sps.wilcoxon(d).pvalue) if np.any(d != 0) else 1.0
        out.append({"a": a, "b": b, "blocks": len(d), "a_better": int((d > 0).sum()),
                    "b_better": int((d < 0).sum()),
                    "shift": hodges_lehmann(d) * 100.0 if len(d) else math.nan, "p": p})
    table = pd.DataFrame(out)
    table["p_holm"] = holm(table["p"])
    table["winner"] = pd.Series(
        [(a if shift > 0 else b if shift < 0 else None) if p < alpha else None
         for a, b, shift, p in table[["a", "b", "shift", "p_holm"]].itertuples(index=False)],
        dtype=object)
    return table.sort_values(["p_holm", "p"], kind="stable").reset_index(drop=True)


def beats(rows: list[dict], a: str, b: str, alpha: float = ALPHA, key: str = HEADLINE,
          references: Iterable[str] | None = None) -> tuple[bool, float, int]:
    """Whether ``a`` beats ``b`` on ``key``: Wilcoxon over the blocks, Holm-corrected over every
    pair of the rows' ranked strategies, significant at ``alpha`` with ``a`` the higher.
    Returns (a beats b, Holm's p, blocks compared)."""
    winner, p, blocks = pair_winner(rows, a, b, alpha, key, references)
    return winner == a, p, blocks


def pair_winner(rows: list[dict], a: str, b: str, alpha: float = ALPHA, key: str = HEADLINE,
                references: Iterable[str] | None = None) -> tuple[str | None, float, int]:
    """The pairwise test of :func:`beats` for ``a`` and ``b``, either way round: (the
    strategy that wins, None within noise; Holm's p; blocks compared)."""
    r = ranking(rows, key, references)
    for name in (a, b):
        if name in r.references:
            raise ValueError(f"{name!r} is a reference ({', '.join(r.references)}): it is "
                             f"reported beside the ranking, not tested in it")
        _check_strategy(name, r.strategies, "strategy")
    if a == b:
        raise ValueError(f"beats() compares two strategies; both are {a!r}")
    t = pairwise(r, alpha)
    row = t[((t["a"] == a) & (t["b"] == b)) | ((t["a"] == b) & (t["b"] == a))].iloc[0]
    winner = row["winner"]
    return (winner if winner in (a, b) else None), float(row["p_holm"]), int(row["blocks"])
