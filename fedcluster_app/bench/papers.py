"""Each paper's own protocol, every benchmark method on it: ``fedcluster bench --tier papers``.

The headline matrix runs every method under one common protocol; this tier runs them under each
of the five papers' own, the way a reproduction is presented: per paper (:data:`PAPERS`) its
preset (``presets/<name>.toml``: data, drift, rounds, training recipe, the paper's settings of
its own algorithm), the metric its docs' reproduction reports (a summary key of the run, or one
computed from its ``metrics.jsonl`` the same way for every method), and the numbers it is read
against, each with its source: the paper's table as the family's doc quotes it where the paper
reports a number on this setting, else this project's own reproduction in that doc.

**How a preset and a method combine** (:func:`combine`), in order, a later step winning:

1. the method's settings (:data:`~fedcluster_app.bench.matrix.METHODS`): its own algorithm's
   hyper-parameters as the benchmark configures it;
2. the preset's keys but ``strategy``: its data, drift, protocol and training recipe for every
   method, and the keys of a strategy's hyper-parameter table only for a method whose strategy
   reads that table (the preset's algorithm's settings go with that algorithm; another
   strategy's keys are dropped, never passed on to be ignored). The paper's protocol wins over
   a method's setting where both set a key: the preset is how the paper (or its docs) ran the
   experiment, and a method's benchmark setting was chosen for the common protocol (FedCCFA's
   ``align-start`` there is the headline's rounds per step; on its own preset it is the
   preset's);
3. what the paper's protocol asks of every method beyond the preset (:attr:`Paper.protocol`:
   the scoring rule the metric needs) and of the methods outside the paper's family
   (:attr:`Paper.baselines`: the participation the paper's algorithm sets with its own
   hyper-parameter, FlexCFL's 20 of 100 clients a round);
4. ``--set``: every method, a key of a hyper-parameter table only where its strategy reads it.

The keys the preset and the scenario's paper protocol leave unset keep the scenario's protocol
(``fedcluster list protocols``): the run config says ``protocol = scenario``. ``num-clusters``
is the preset's or the scenario protocol's where either sets it, else the number of concepts
the scenario uses (as in the headline matrix). Two methods whose combined run configs are equal
(Fielding's two representations on a preset that names one) are run once; the page says so.

Runs go through the headline's runner (one directory per run under ``runs/bench-papers``, finished
runs reused, a process pool; a strategy that refuses the paper's scenario is listed with its
reason) and are scored here (:func:`score`). With ``--reuse-rows`` the rows of an earlier page
stand for the runs the runs directory does not hold (:func:`reusable_rows`), so a page grows by
a paper without running the others again.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedcluster_app.bench import matrix as M
from fedcluster_app.bench.matrix import FINISHED
from fedcluster_app.bench.runner import NOT_RUN, canonical, matching_rows
from fedcluster_app.core.config import ConfigValue, suggest

TIER = "papers"
#: the matrix options of ``fedcluster bench`` that have no meaning on a paper's protocol
MATRIX_ONLY = ("quick", "datasets", "shifts", "patterns", "priors", "lr_grid", "skip_static",
               "tune_only")

Scores = Callable[[dict, list[dict], "np.ndarray | None"], "float | None"]


# ------------------------------------------------------------------------------ the metrics
def _finite(value: Any) -> float | None:
    return float(value) if value is not None and math.isfinite(float(value)) else None


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def summary_key(key: str) -> Scores:
    """A metric that is a key of the run's ``summary.json``."""
    return lambda summary, records, concepts: _finite(summary.get(key))


def next_step_pairs(omit_drift: bool) -> Scores:
    """FedDrift's accuracy over (client, step) pairs: each client's model of step t on step
    t+1's data (``client_accuracy_next`` of the common scoring rule, on the held-out test split
    of step t+1), averaged over every pair, or (``omit_drift``) over the pairs whose client's
    concept is the same at t and t+1: the paper's "omitting drift steps"."""
    def compute(summary, records, concepts):
        values = []
        for r in records:
            accs, nxt = r.get("client_accuracy_next"), r.get("next_step")
            if not accs or nxt is None:
                continue
            t = int(nxt) - 1           # the step the models were trained on; row t-1 of concepts
            values += [float(a) for c, a in accs.items()
                       if not (omit_drift and concepts[t - 1, int(c)] != concepts[t, int(c)])]
        return _mean(values)
    return compute


def last_logged(key: str) -> Scores:
    """A metric that is a ``metrics.jsonl`` key: its value in the last round that logs it."""
    return lambda summary, records, concepts: next(
        (_finite(r[key]) for r in reversed(records) if r.get(key) is not None), None)


#: FlexCFL scores once every client has been seen: after the round-robin phase of N/K rounds
FLEXCFL_FIRST_ROUNDS = 5


def after_round_robin(how: str) -> Scores:
    """FlexCFL's metric: the sample-weighted test accuracy (``weighted_accuracy``) of the
    rounds after the first N/K = 5 (its round-robin selection), its maximum (``max``, the
    paper's tables) or the mean of the last 10 rounds (``last10``)."""
    def compute(summary, records, concepts):
        acc = [float(r["weighted_accuracy"]) for r in records
               if int(r["round"]) > FLEXCFL_FIRST_ROUNDS and r.get("weighted_accuracy") is not None]
        if not acc:
            return None
        return max(acc) if how == "max" else _mean(acc[-10:])
    return compute


@dataclass(frozen=True)
class Metric:
    """A score of a paper's protocol: the row key it is stored under, its label, what it is,
    and how a run gives it (None where the run does not log it)."""

    key: str
    label: str
    description: str
    compute: Scores
    needs_concepts: bool = False


@dataclass(frozen=True)
class Reference:
    """Numbers our runs are read against, as quoted: ``label`` (the paper, or this project's
    earlier reproduction), the source of the quote, the metric they are in, and method -> text."""

    label: str
    source: str
    metric: str
    values: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Paper:
    """One paper's protocol: its preset, its metrics (the first is the headline), the numbers
    beside ours, what it asks of every method (``protocol``) and of the methods outside its
    family (``baselines``) beyond the preset, and what one fedavg run of seed 0 on the full
    preset cost here (``measured_cpu_s``: its process's CPU seconds; ``measured``: in words)."""

    title: str
    preset: str
    setting: str
    metrics: tuple[Metric, ...]
    references: tuple[Reference, ...] = ()
    protocol: tuple[tuple[str, ConfigValue], ...] = ()
    baselines: tuple[tuple[str, ConfigValue], ...] = ()
    measured_cpu_s: float | None = None
    measured: str = ""
    notes: tuple[str, ...] = field(default=())
    percent: bool = False    # our numbers in % on the page, as the numbers quoted beside them


PAPERS: dict[str, Paper] = {
    "fielding": Paper(
        "Fielding (label drift, a small drift then a large one)", "fielding-small-large",
        "`labels-small-large`: 30 clients, 30% train each round, 12 steps of 5 rounds, a small "
        "label drift at round 21 and a large one at round 41; multinomial logistic regression, "
        "SGD lr 0.3, 5 local steps of batch 20; Fielding with M = 9 participants",
        (Metric("mean_accuracy_after_drift", "mean acc. after the drifts",
                "the clients' mean test accuracy averaged over the rounds from the first drift "
                "(rounds 21-60): the docs' 'mean 21-60'",
                summary_key("mean_accuracy_after_drift")),
         Metric("last5_accuracy", "final acc. (last 5 rounds)",
                "the mean over the last five rounds (56-60): the docs' 'final 56-60'",
                summary_key("last5_accuracy"))),
        (Reference("this project's reproduction, mean 21-60",
                   "docs/fielding/README.md, 'Small drift, then large drift', 3 seeds (the paper "
                   "reports no number on this population: its experiments are FMoW, Cityscapes, "
                   "Waymo and Open Images)", "mean_accuracy_after_drift",
                   (("fedavg", "0.837"), ("fielding", "0.909"))),
         Reference("this project's reproduction, final 56-60", "the same table",
                   "last5_accuracy", (("fedavg", "0.838"), ("fielding", "0.901")))),
        measured_cpu_s=7.5, measured="21 s of run time, 7.5 s of CPU, at load 8 on 2 cores"),
    "feddrift": Paper(
        "FedDrift (CIRCLE-2, the paper's Table 2)", "feddrift-circle2",
        "`circle2`: 10 clients, 10 training steps and a test step of 500 samples, R = 100 "
        "rounds per step, K = 50 local Adam steps (amsgrad, weight decay 1e-3) of batch 50, "
        "lr 0.01; FedDrift delta 0.10",
        (Metric("acc_omit", "acc. omitting drift steps",
                "each client's model of step t on step t+1's held-out test split, averaged over "
                "the (client, step) pairs whose concept does not change from t to t+1 (the "
                "paper's headline metric; the paper and feddrift's own `acc_omit` test on step "
                "t+1's training batch, the same distribution)",
                next_step_pairs(omit_drift=True), needs_concepts=True),
         Metric("acc_include", "acc. including drift steps",
                "the same over every (client, step) pair", next_step_pairs(omit_drift=False),
                needs_concepts=True)),
        (Reference("the paper (%, mean ± std, 5 trials)",
                   "the paper's Table 2 (FedDrift) and Table 4 (CFL), CIRCLE-2, as quoted in "
                   "docs/feddrift/README.md", "acc_omit",
                   (("feddrift", "97.82 ± 0.19"), ("cfl", "86.59 ± 3.42"))),
         Reference("this project's reproduction (%, mean ± std, 3 seeds)",
                   "docs/feddrift/README.md, 'Reproduction: the paper's full protocol (R = 100)'",
                   "acc_omit", (("feddrift", "97.97 ± 0.05"), ("cfl", "88.85 ± 0.28")))),
        protocol=(("score-next-step", True),),
        percent=True,
        measured_cpu_s=106.0,
        measured="689 s of run time, 106 s of CPU, at load 12 on 2 cores (1,100 rounds "
                 "of 50 local steps)",
        notes=("The paper's Oracle (97.84 ± 0.22) is `oracle-t`, FedDrift's time-step oracle, "
               "not the benchmark's round-based `oracle`; its Oblivious (88.38 ± 0.17) trains on "
               "all history, not the benchmark's `fedavg` on the current step: neither is quoted "
               "beside a benchmark method.",)),
    "flexcfl": Paper(
        "FlexCFL (Synthetic(1,1), swap-all shift)", "flexcfl-synthetic",
        "`synthetic-1-1-swap`: 100 users of FedProx's Synthetic(1,1), MCLR, T = 100 rounds "
        "(one round a step), swap-all shift with p = 0.05, m = 5 groups, 20 clients trained a "
        "round (FlexCFL's own selection; `fraction-train = 0.2` for the other methods), E = 10 "
        "epochs of batch 10, SGD lr 0.01, weight decay 0.002; alpha = 4 pre-training clients "
        "per group",
        (Metric("max_weighted_accuracy", "max acc. after round 5",
                "the maximum over the rounds after the round-robin phase (N/K = 5 rounds) of "
                "the sample-weighted test accuracy (the paper's tables)",
                after_round_robin("max")),
         Metric("last10_weighted_accuracy", "last-10 mean acc.",
                "the mean of the last 10 rounds of the same", after_round_robin("last10"))),
        (Reference("the paper (%, Table IV, swap-all, T = 300)",
                   "the paper's Table IV as quoted in docs/flexcfl/README.md (the paper's own "
                   "Synthetic(1,1) data, T = 300 rounds; this preset runs T = 100)",
                   "max_weighted_accuracy", (("fedavg", "63.4"), ("flexcfl", "85.0"))),),
        baselines=(("fraction-train", 0.2),),
        percent=True,
        measured_cpu_s=221.0,
        measured="1,528 s of run time, 221 s of CPU, at load 8-12 on 2 cores (100 rounds, 20 "
                 "clients of 10 epochs each)"),
    "fedrc": Paper(
        "FedRC (feature, label and concept shift at once)", "fedrc-shifts3",
        "`shifts-3`: 30 clients with Dirichlet(0.1) label skew, feature shift on some, three "
        "concepts, plus 3 held-out clients (one per concept, clean, balanced); MLP 20-32-10 "
        "with N(0, 1/fan_in) weights, K = 3, T = 150 rounds, E = 1 epoch of batch 32, plain "
        "SGD lr 0.2",
        (Metric("final_global_accuracy", "global acc. (held-out clients)",
                "the mean accuracy of the 3 held-out clients after the last round (FedRC's "
                "primary metric); not defined for Local, which has no model for a client that "
                "never trained", summary_key("final_global_accuracy")),
         Metric("final_weighted_accuracy", "local acc.",
                "the sample-weighted accuracy on the participants' own test splits after the "
                "last round", summary_key("final_weighted_accuracy"))),
        (Reference("this project's reproduction, global (mean ± std, 3 seeds)",
                   "docs/fedrc/README.md, 'The small experiment' (the paper reports no number "
                   "on this population: its experiments are FashionMNIST-C, CIFAR-10/100-C and "
                   "Tiny-ImageNet-C)", "final_global_accuracy",
                   (("fedavg", "0.333 ± 0.039"), ("ifca", "0.321 ± 0.041"),
                    ("fedem", "0.393 ± 0.039"), ("fedrc", "0.593 ± 0.115"),
                    ("oracle", "0.780 ± 0.026"))),
         Reference("this project's reproduction, local", "the same table",
                   "final_weighted_accuracy",
                   (("fedavg", "0.461 ± 0.003"), ("ifca", "0.653 ± 0.008"),
                    ("fedem", "0.688 ± 0.011"), ("fedrc", "0.769 ± 0.060"),
                    ("oracle", "0.846 ± 0.016")))),
        measured_cpu_s=10.1,
        measured="34 s of run time, 10.1 s of CPU, at load 8 on 2 cores",
        notes=("FedCCFA and FedRep score a held-out client after it learns a classifier on its "
               "adaptation split (`newcomer-epochs`, 10 epochs, over the frozen global "
               "extractor: docs/fedccfa/README.md, D22); the other methods only choose among "
               "their models (or weight them) with that split. Their global accuracies are "
               "not the same test of a newcomer.",)),
    "fedccfa": Paper(
        "FedCCFA (digits, sudden label swaps)", "fedccfa-digits",
        "`digits-ccfa`: 10 clients with Dirichlet(0.5) priors, 12 steps of 5 rounds, label "
        "swaps from step 7 (round 31) in the paper's three groups; MLP extractor 64-64 and a "
        "linear classifier, SGD lr 0.01, momentum 0.9, weight decay 1e-5, 5 epochs of batch "
        "64; FedCCFA eps 0.05, alignment from round 6",
        (Metric("final_generalized_accuracy", "generalised acc.",
                "every client's model on the whole test pool relabelled with its current "
                "concept, after the last round (the paper's main metric); logged by FedCCFA's "
                "family only (fedccfa, fedrep here)",
                summary_key("final_generalized_accuracy")),
         Metric("final_balanced_accuracy", "class-balanced acc.",
                "the same models as the personalised accuracy on a class-balanced test sample "
                "of each client's current concept, after the last round: the generalised "
                "accuracy's measure for every method (`balanced-test`)",
                last_logged("balanced_accuracy_current")),
         Metric("final_accuracy", "personalised acc.",
                "each client's own test split of the current step, after the last round (the "
                "docs' 'own-split')", summary_key("final_accuracy"))),
        (Reference("this project's reproduction, generalised (%, 3 seeds)",
                   "docs/fedccfa/README.md, 'Evidence: the small experiment on the digits', "
                   "sudden (the paper reports no number on the digits: its experiments are "
                   "Fashion-MNIST, CIFAR-10 and CINIC-10 with CNNs; FedAvg's value there comes "
                   "from its final global model, which this tier does not score)",
                   "final_generalized_accuracy",
                   (("fedccfa", "94.2 (0.8)"), ("fedavg", "73.8 (0.9)"),
                    ("fedrep", "90.2 (0.4)"))),
         Reference("this project's reproduction, own-split (%)", "the same table",
                   "final_accuracy",
                   (("fedccfa", "94.6"), ("fedavg", "73.0"), ("fedrep", "94.8")))),
        protocol=(("score-next-step", True), ("balanced-test", True)),
        percent=True,
        measured_cpu_s=8.3,
        measured="22 s of run time, 8.3 s of CPU, at load 8 on 2 cores"),
}


def paper(name: str) -> Paper:
    """The entry ``name`` of :data:`PAPERS`; an unknown name lists them with the closest."""
    if name not in PAPERS:
        raise ValueError(f"unknown paper {name!r}{suggest(name, list(PAPERS))}; papers: "
                         f"{', '.join(PAPERS)}")
    return PAPERS[name]


# ------------------------------------------------------------------- a preset x a method
def _strategy_tables() -> dict[str, set[str]]:
    """Hyper-parameter table -> the strategies that read it."""
    from fedcluster_app.families import hyperparameter_users

    out: dict[str, set[str]] = {}
    for params, names in hyperparameter_users().items():
        out.setdefault(params.table, set()).update(names)
    return out


def _table(key: str) -> str:
    return key.split(".", 1)[0] if "." in key else ""


def _reads(strategy: str, key: str, tables: dict[str, set[str]]) -> bool:
    """Whether a run of ``strategy`` reads ``key``: every key outside the strategies'
    hyper-parameter tables, and the keys of the tables it reads."""
    table = _table(key)
    return table not in tables or strategy in tables[table]


def preset_config(name: str) -> dict[str, ConfigValue]:
    from fedcluster_app.core.config import preset_file

    return tomllib.loads(preset_file(name).read_text())


def combine(entry: Paper, method_name: str,
            overrides: dict[str, ConfigValue] | None = None) -> dict[str, ConfigValue]:
    """The run config of ``method_name`` on ``entry``'s protocol (the module docstring's four
    steps), ``strategy`` included, ``seed`` not."""
    m = M.method(method_name)
    tables = _strategy_tables()
    preset = {k: v for k, v in preset_config(entry.preset).items() if k != "strategy"}
    config = {k: v for k, v in m.settings if k not in preset}
    config.update({k: v for k, v in preset.items() if _reads(m.strategy, k, tables)})
    family = {s for k in preset if _table(k) in tables for s in tables[_table(k)]}
    if m.strategy not in family:
        config.update(dict(entry.baselines))
    config.update(dict(entry.protocol))
    config.update({k: v for k, v in (overrides or {}).items() if _reads(m.strategy, k, tables)})
    return {**config, "strategy": m.strategy}


def check_overrides(overrides: dict[str, ConfigValue], methods: list[str]) -> None:
    """A ``--set`` key of a hyper-parameter table that no chosen method reads would be ignored:
    refused."""
    tables = _strategy_tables()
    strategies = {M.method(m).strategy for m in methods}
    for key in overrides:
        if not any(_reads(s, key, tables) for s in strategies):
            raise ValueError(f"--set {key}: read only by {', '.join(sorted(tables[_table(key)]))}"
                             f", none of this run's methods ({', '.join(methods)})")


def check_config(name: str, method_name: str, config: dict[str, ConfigValue]) -> None:
    """The combined run config valid (keys, types, the strategy's hyper-parameters), or
    ValueError naming the paper and the method, before any run starts."""
    from fedcluster_app.api import run_config_defaults
    from fedcluster_app.core.config import merge_overrides, parse_run_config
    from fedcluster_app.families import strategy_info

    try:
        full = merge_overrides(run_config_defaults(config), config)
        parse_run_config(full)
        strategy_info(str(config["strategy"])).params.from_run_config(full)
    except ValueError as ex:
        raise ValueError(f"paper {name!r}, method {method_name!r}: {ex}") from None


def sets_clusters(config: dict[str, ConfigValue]) -> bool:
    """Whether ``num-clusters`` is left to the number of concepts: neither the combined config
    nor the scenario's paper protocol sets it."""
    from fedcluster_app.core.data.catalogue import scenario_protocol

    return "num-clusters" not in config and "num-clusters" not in scenario_protocol(
        str(config.get("scenario", "")))


@dataclass(frozen=True)
class PaperCell:
    """One run of the tier: a method (``strategy``, the runner's word) on a paper's protocol,
    with its combined run config (``settings``); the runner's :class:`~.matrix.Cell` for a
    paper."""

    paper: str
    strategy: str
    seed: int
    settings: tuple[tuple[str, ConfigValue], ...]
    concepts_as_clusters: bool = False

    @property
    def name(self) -> str:
        """The cell's name, which is also its run directory under the runs directory."""
        return f"{self.paper}/{self.strategy}/seed{self.seed}"

    def config(self) -> dict[str, ConfigValue]:
        return {**dict(self.settings), "seed": self.seed, **M.QUIET_RUN}

    def run_config(self, num_clusters: int) -> dict[str, ConfigValue]:
        return {**self.config(),
                **({"num-clusters": num_clusters} if self.concepts_as_clusters else {})}


@dataclass
class Plan:
    """The tier's runs: its papers, methods, seeds and cells, and the methods run once for
    another whose combined config is the same ((paper, method) -> that method)."""

    papers: list[str]
    methods: list[str]
    seeds: list[int]
    cells: list[PaperCell]
    same_as: dict[tuple[str, str], str]
    overrides: dict[str, ConfigValue]


def plan(papers: list[str] | None = None, methods: list[str] | None = None,
         seeds: list[int] | None = None,
         overrides: dict[str, ConfigValue] | None = None) -> Plan:
    """Every (paper, method, seed), each method's config combined and checked before any run."""
    names = [n for n in (papers or list(PAPERS)) if paper(n)]
    methods = list(methods or M.STRATEGIES)
    for name in methods:
        M.method(name)                       # an unknown method lists the valid ones
    seeds = list(seeds if seeds is not None else M.SEEDS)
    overrides = dict(overrides or {})
    check_overrides(overrides, methods)
    cells, same_as = [], {}
    for name in names:
        seen: dict[str, str] = {}
        for method_name in methods:
            config = combine(PAPERS[name], method_name, overrides)
            check_config(name, method_name, config)
            key = canonical(config)
            if key in seen:
                same_as[(name, method_name)] = seen[key]
                continue
            seen[key] = method_name
            frozen = tuple(sorted(config.items()))
            cells += [PaperCell(name, method_name, seed, frozen, sets_clusters(config))
                      for seed in seeds]
    return Plan(names, methods, seeds, cells, same_as, overrides)


# ------------------------------------------------------------------------------ scoring
def row(cell: PaperCell, status: str, reason: str | None = None, **scores: Any) -> dict:
    return {"paper": cell.paper, "preset": PAPERS[cell.paper].preset, "strategy": cell.strategy,
            "seed": cell.seed, "config": dict(cell.settings), "status": status,
            "reason": reason, **scores}


def score(cell: PaperCell, out: Path) -> dict:
    """A finished run's row: the paper's metrics, the effective recipe, the seconds it took."""
    from fedcluster_app.bench.runner import effective_recipe
    from fedcluster_app.core.results import load_run

    summary, records = load_run(out)
    if summary.get("status") not in FINISHED:
        return row(cell, "failed", summary.get("error") or summary.get("reason"))
    entry = PAPERS[cell.paper]
    concepts = (M.bench_scenario(cell).concept_matrix()
                if any(m.needs_concepts for m in entry.metrics) else None)
    values = {m.key: m.compute(summary, records, concepts) for m in entry.metrics}
    return row(cell, summary["status"], summary.get("reason"), **values,
               rounds=summary.get("rounds"), wall_time_s=summary.get("wall_time_s"),
               bytes_up=summary.get("bytes_up"), bytes_down=summary.get("bytes_down"),
               recipe=effective_recipe(summary, records))


def reusable_rows(rows: list[dict], cells: list[PaperCell]) -> dict[PaperCell, dict]:
    """The finished (or failed) rows among ``rows`` that match a cell: same paper, method, seed
    and combined run config (the preset's, the method's and ``--set``'s keys together)."""
    return matching_rows(
        rows, cells,
        row_key=lambda r: (r["paper"], r["strategy"], r["seed"], canonical(r["config"])),
        cell_key=lambda c: (c.paper, c.strategy, c.seed, canonical(dict(c.settings))))


# ------------------------------------------------------------------------------- the page
def _ci(values: list, percent: bool = False) -> str:
    """mean ± the 95% interval's half-width, as a fraction or (``percent``) in % as the
    paper's numbers beside it."""
    from fedcluster_app.bench.stats import interval

    try:
        mean, half, _ = interval(v for v in values if v is not None)
    except ValueError:
        return "not logged"
    scale, digits = (100.0, 2) if percent else (1.0, 3)
    text = f"{scale * mean:.{digits}f}"
    return f"{text} ± {scale * half:.{digits}f}" if half is not None else f"{text} (1 seed)"


def paper_section(name: str, rows: list[dict], methods: list[str],
                  same_as: dict[tuple[str, str], str]) -> list[str]:
    """One paper's section: its protocol, metrics, a table of every method (mean ± 95% interval
    over seeds per metric, the quoted numbers beside, seeds, seconds per run), the compute."""

    entry = PAPERS[name]
    rows = [r for r in rows if r.get("paper") == name]
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r["strategy"], []).append(r)
    refs = entry.references
    metric_of = {m.key: m for m in entry.metrics}
    unit = " (%)" if entry.percent else ""
    header = (["method"] + [f"{m.label}{unit}, mean ± 95% CI" for m in entry.metrics]
              + [f"{ref.label}: {metric_of[ref.metric].label}" for ref in refs]
              + ["seeds", "s / run"])
    table = []
    for method_name in methods:
        quoted = [dict(ref.values).get(method_name, "") for ref in refs]
        if (name, method_name) in same_as:
            other = same_as[(name, method_name)]
            table.append([method_name] + [f"= {other}"] * len(entry.metrics) + quoted
                         + [f"the same run as {other}", ""])
            continue
        rs = by.get(method_name, [])
        ok = [r for r in rs if r["status"] in FINISHED]
        if not ok:
            why = next((f"{r['status']}: {r.get('reason') or ''}".strip() for r in rs), "not run")
            table.append([method_name, why.replace("|", "/")] + ["-"] * (len(entry.metrics) - 1)
                         + quoted + ["0", ""])
            continue
        cells = [_ci([r.get(m.key) for r in ok], entry.percent) for m in entry.metrics]
        secs = [float(r["wall_time_s"]) for r in ok if r.get("wall_time_s") is not None]
        pending = sum(1 for r in rs if r["status"] == NOT_RUN)
        failed = len(rs) - len(ok) - pending
        notes = [f"{failed} failed"] * bool(failed) + [f"{pending} {NOT_RUN}"] * bool(pending)
        table.append([method_name] + cells + quoted
                     + [f"{len(ok)}" + (f" ({', '.join(notes)})" if notes else ""),
                        f"{np.mean(secs):.1f}" if secs else "-"])
    compute = sum(float(r.get("wall_time_s") or 0) for r in rows) / 60.0
    lines = [f"## {entry.title}", "",
             f"Preset `presets/{entry.preset}.toml`: {entry.setting}."
             + (" Every method also runs with "
                + ", ".join(f"`{k} = {json.dumps(v)}`" for k, v in entry.protocol)
                + " (the metric needs it)." if entry.protocol else "")
             + (" The methods outside the paper's family run with "
                + ", ".join(f"`{k} = {json.dumps(v)}`" for k, v in entry.baselines)
                + " (the paper's participation)." if entry.baselines else ""), ""]
    lines += [f"* **{m.label}** (`{m.key}`): {m.description}." for m in entry.metrics]
    lines += ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in table]
    lines += [""] + [f"* {ref.label}: {ref.source}." for ref in refs]
    lines += [f"* {note}" for note in entry.notes]
    finished = sum(r["status"] in FINISHED for r in rows)
    lines += [f"* Compute: {compute:.1f} min of run time over the {finished} finished runs."]
    return lines + [""]


def render(rows: list[dict], p: Plan, command: str, info: dict[str, Any]) -> str:
    lines = ["# Each paper's protocol, every benchmark method on it", "",
             "```bash", command, "```", "",
             f"Seeds {', '.join(map(str, p.seeds))}; a method's cell is the mean over its "
             "finished seeds ± the half-width of the 95% t-interval. Each method runs with its "
             "benchmark settings (the headline page's methods table) where the paper's preset "
             "does not set the same key; the preset's data, protocol and training recipe hold "
             "for every method, the keys of the preset's own algorithm only for it "
             "(`fedcluster_app/bench/papers.py`). The numbers beside ours are quoted with their "
             "source: the paper's where it reports one on this setting, else this project's "
             "earlier reproduction in the family's doc."
             + (f" Changed for every run: {', '.join(f'{k}={v}' for k, v in p.overrides.items())}"
                " (not the papers' protocols)." if p.overrides else ""), "",
             f"Compute: {info['compute_min']:.1f} min of run time; this command ran "
             f"{info['ran']} runs in {info['elapsed_min']:.1f} min {info['where']} on "
             f"{info['cores']} cores (load average {info['load']})."
             + (f" **{pending} runs are not run yet**: this page was written with "
                "`--render-only` from the runs finished so far; the same command without it, "
                "with `--reuse-rows` of this page's rows, runs only those."
                if (pending := sum(r["status"] == NOT_RUN for r in rows)) else ""), ""]
    for name in p.papers:
        lines += paper_section(name, rows, p.methods, p.same_as)
    return "\n".join(lines)


# ---------------------------------------------------------------------------- the command
def refuse_matrix_options(args) -> None:
    given = [f"--{o.replace('_', '-')}" for o in MATRIX_ONLY if getattr(args, o, None)]
    if given:
        raise ValueError(f"{', '.join(given)}: an option of the benchmark matrix, which --tier "
                         f"{TIER} does not run (each paper's protocol is its preset)")


def estimate(p: Plan, states: dict[PaperCell, str]) -> list[str]:
    """What the plan will cost: per paper its runs still to run (those finished before, given by
    earlier rows or refused by their strategy left out) times the
    CPU seconds one fedavg run of seed 0 took on the full preset here. A lower bound for the
    methods that train several models a round (IFCA, FedEM, FedRC, FedSoft: up to K times),
    an upper one for FedDrift's family, whose clients are batched; ``--set`` shortening a
    protocol shortens the runs too, which this does not count."""
    lines, total = [], 0.0
    for name in p.papers:
        n = sum(1 for c in p.cells if c.paper == name and states[c] == "to run")
        entry = PAPERS[name]
        minutes = n * (entry.measured_cpu_s or 0.0) / 60.0
        total += minutes
        lines.append(f"papers: {name}: {n} runs to run; one fedavg run took {entry.measured}: about "
                     f"{minutes:.0f} min of CPU at that rate")
    lines.append(f"papers: about {total:.0f} min of CPU in all ({total / 120:.1f} h of wall "
                 f"time on 2 idle cores with --workers 2); the methods that train K models a "
                 f"round take up to K times fedavg's")
    return lines


def run(args, folder: Path, argv: list[str] | None = None) -> int:
    """``fedcluster bench --tier papers``: run what is missing, write the page (``args.report``)
    and its rows (``folder``/runs.jsonl)."""
    from fedcluster_app.bench import report as R
    from fedcluster_app.bench.runner import run_matrix, run_states
    from fedcluster_app.core.atomic import atomic_write_bytes
    from fedcluster_app.core.config import parse_assignment

    refuse_matrix_options(args)
    p = plan(args.papers, args.strategies, args.seeds,
             dict(parse_assignment(s) for s in args.set))
    reuse = R.read_rows(args.reuse_rows) if args.reuse_rows else None
    if args.dry_run:
        states = run_states(p.cells, args.runs_dir, args.retry_failed, reuse, reusable_rows)
        for cell, state in states.items():
            print(f"{cell.name}: {state}")
        for (name, method_name), other in p.same_as.items():
            print(f"{name}/{method_name}: the same run as {name}/{other}")
        print("\n".join(estimate(p, states)))
        return 0
    log = lambda line: print(line, flush=True)
    t0, load0 = time.time(), os.getloadavg()[0]
    rows, ran = run_matrix(p.cells, args.runs_dir.resolve(), workers=args.workers,
                           retry_failed=args.retry_failed, log=log,
                           ray_address=args.ray_address, reuse=reuse, score=score, row=row,
                           match=reusable_rows, render_only=args.render_only)
    data_file = folder / "runs.jsonl"
    R.write_rows(rows, data_file)
    info = {"compute_min": sum(float(r.get("wall_time_s") or 0) for r in rows) / 60.0,
            "where": (f"on the Ray cluster at {args.ray_address}" if args.ray_address
                      else f"on {args.workers} worker process(es)"),
            "cores": os.cpu_count(), "ran": ran, "elapsed_min": (time.time() - t0) / 60.0,
            "load": f"{load0:.1f} at its start, {os.getloadavg()[0]:.1f} at its end"}
    command = "fedcluster " + " ".join(shlex.quote(a) for a in (argv or ["bench"]))
    args.report.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(args.report, render(rows, p, command, info).encode())
    ok = sum(1 for r in rows if r["status"] in FINISHED)
    print(f"bench: {ok} of {len(rows)} runs finished; {time.time() - t0:.0f} s; page "
          f"{args.report}, data {data_file}")
    return 0
