"""The benchmark matrix: scenarios x strategies x seeds under one common protocol.

A bench scenario is a data set, a kind of shift and a drift pattern:

* data: ``mixture`` (the synthetic 4-class Gaussian mixture), ``digits`` (scikit-learn's 8x8
  digits) and River's bundled tables ``phishing``, ``imagesegments``, ``bananas``, ``shuttle``;
* shift: ``label`` (``<data>-prior``: drifting clients put 90% of their data on half the
  classes), ``feature`` (``<data>-noise``: Gaussian noise on their inputs), ``concept``
  (``<data>-permute`` / ``mixture-swap``: y -> (y+1) % C) and ``mix`` (``<data>-mix``: each
  drifting client gets one of the three);
* pattern: ``sudden``, ``incremental``, ``recurring``, ``staggered`` (the scenarios' drift
  patterns, ``fedcluster list scenarios``), and once per data set ``none`` (no drift);
  ``concept/incremental`` is not run: a label permutation has no intermediate step, so it would
  repeat ``concept/sudden`` run for run (:data:`REPEATS`);
* prior: ``uniform`` (every client the same class frequencies: what tells clients apart is the
  drift) on every shift and pattern, and ``dirichlet`` (each client its own Dirichlet(1) class
  prior: label skew, which rewards personalisation) as its own axis, on sudden drift and no
  drift (:data:`PRIOR_PATTERNS`).

Every run of a scenario shares :data:`PROTOCOL` (clients, steps, rounds, one training recipe,
the scoring rule ``score-next-step``) but the learning rate: each method's is chosen per data
set from :data:`LR_GRID` on :data:`VALIDATION_SEED`, never scored (:func:`tuning_cells`,
:func:`tuned_lrs`); the strategies keep their own algorithms' message schedules (FedDrift's
time steps, FlexCFL's selection, FedCCFA's phases). ``num-clusters`` (the K of IFCA, FedEM, FedRC,
FedSoft) is the number of concepts the scenario uses. Each row of the leaderboard is a
:class:`Method`: a strategy with the settings its paper or its docs give it (:data:`METHODS`,
each with its source), checked before any run starts (:func:`check_methods`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from fedcluster_app.core.config import ConfigValue, suggest
from fedcluster_app.core.results.files import FINISHED

DATASETS = ("mixture", "digits", "phishing", "imagesegments", "bananas", "shuttle")
SHIFTS = ("label", "feature", "concept", "mix")
PATTERNS = ("sudden", "incremental", "recurring", "staggered")
PRIORS = ("uniform", "dirichlet")
#: the clients' class priors: ``dirichlet-alpha`` of each (inf = the same uniform prior for all)
PRIOR_ALPHA: dict[str, float] = {"uniform": math.inf, "dirichlet": 1.0}
#: the drift patterns each prior runs: label skew is an axis of its own, on sudden drift (and
#: once per data set without drift), so every shift runs with and without it
PRIOR_PATTERNS: dict[str, tuple[str, ...]] = {"uniform": PATTERNS, "dirichlet": ("sudden",)}
#: (shift, pattern) pairs that repeat another run for run, and what they repeat
REPEATS = {("concept", "incremental"): "concept/sudden"}

#: what every bench run sets that cannot change its numbers: no progress bar, and no plot.png
#: (0.31 s of a 3.2 s run: a tenth of the matrix)
QUIET_RUN: dict[str, ConfigValue] = {"progress": False, "plot": False}

#: one protocol and one training recipe for every run (the scenario's own paper protocol is
#: off: ``protocol = none``); ``lr`` only where the grid is not tuned (``--set lr=...``)
PROTOCOL: dict[str, ConfigValue] = {
    "protocol": "none",
    "num-clients": 10,
    "num-steps": 6,            # drift from step 3 (the scenarios' drift step)
    "rounds-per-step": 10,     # enough to converge between drifts (the page's curves show it)
    "local-steps": 10,
    "batch-size": 50,
    "optimizer": "sgd",
    "momentum": 0.9,
    "weight-decay": 0.0,
    "lr": 0.03,
    "fraction-train": 1.0,
    "fraction-evaluate": 1.0,
    "eval-every": 1,
    "score-next-step": True,
    "balanced-test": True,     # the global accuracy: a class-balanced test set per client
}
#: the scored seeds: the protocol asks for at least five
SEEDS: tuple[int, ...] = (0, 1, 2, 3, 4)
#: the model of a data set where it is not the scenario's own: an MLP for every data set. On
#: digits a 60-round FedAvg run with the 64-unit MLP took 8.5 s against its CNN's 60.0 s (same
#: load) and scored 0.80 against 0.69: the CNN would take most of the matrix's compute.
DATA_MODEL: dict[str, tuple[tuple[str, ConfigValue], ...]] = {
    "digits": (("model", "mlp"), ("hidden", 64)),
}
#: the learning rates every method is tuned over, per data set, on the validation seed. The grid
#: should bracket the choice: on 0.01-0.1 the top was chosen for 69 of 84 (data set, method)
#: pairs, on 0.01-0.3 for 49, on 0.01-1 for 16; on 0.01-3 for 9 (FedRep 4, FedCCFA 3, FedEM
#: 2), each 0.001-0.017 above 1 on the validation seed, while 3 already leaves 25 of its 168
#: runs degraded or failed (diverging clients' replies rejected): a wider grid would chase
#: one seed's noise (docs/benchmark/tuning.jsonl)
LR_GRID: tuple[float, ...] = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0)
#: the seed the learning rate is chosen on: never one of the scored seeds
VALIDATION_SEED = 1000
#: the scenarios the learning rate is chosen on, per data set (shift, pattern, prior): the mixed
#: shift covers label, feature and concept drift at once
TUNING_SCENARIOS: tuple[tuple[str, str, str], ...] = (("mix", "sudden", "uniform"),
                                                      ("mix", "sudden", "dirichlet"))



@dataclass(frozen=True)
class Method:
    """One row of the leaderboard: a strategy with the settings its paper or its docs give
    it (run-config keys, on top of :data:`PROTOCOL`), and where they come from."""

    strategy: str
    settings: tuple[tuple[str, ConfigValue], ...] = ()
    source: str = "the strategy's defaults"


#: the five papers' algorithms, then the baselines; a method's settings are its own algorithm's
#: (never the shared training recipe, which PROTOCOL sets for all)
METHODS: dict[str, Method] = {
    "fielding": Method("fielding", source="label-histogram representation, the default "
                       "(docs/fielding/README.md): it sees label and feature shift, not a label "
                       "permutation"),
    "fielding-gradient": Method(
        "fielding", (("fielding.rep", "gradient"), ("fielding.distance", "sqeuclidean")),
        "the probe-gradient representation with squared Euclidean distance, which the doc "
        "recommends for concept shift (docs/fielding/README.md, the concept-drift result)"),
    "feddrift": Method("feddrift", source="the strategy's defaults; with `fraction-train` "
                       "below 1 (the 100-client tier) it trains that sample of the clients each "
                       "round while each step's probes, detection and merging hear every client: "
                       "this project's extension, the paper trains every client every round "
                       "(docs/feddrift/README.md D24)"),
    "flexcfl": Method("flexcfl"),
    "fedrc": Method("fedrc", (("init", "normal"),),
                    "N(0, 1/fan_in) initialisation, as its preset: with PyTorch's default the K "
                    "models start too alike for soft EM to separate (docs/fedrc/README.md)"),
    "fedccfa": Method("fedccfa", (("fedccfa.eps", 0.05),
                                  ("fedccfa.align-start", int(PROTOCOL["rounds-per-step"]))),
                      "eps = 0.05 on these small data sets (docs/fedccfa/README.md: 0.1 merges "
                      "drifted with non-drifted clients); alignment from the second time step "
                      "(align-start = rounds-per-step, D13), so it runs in every scored step "
                      "after the drift"),
    "fedavg": Method("fedavg"),
    "ifca": Method("ifca"),
    "cfl": Method("cfl"),
    "fedem": Method("fedem"),
    "fedsoft": Method("fedsoft"),
    "fedrep": Method("fedrep"),
    "local": Method("local"),
    "oracle": Method("oracle", (("oracle.warm-start", True),),
                     "a new concept's model starts from the models its clients were on, so the "
                     "reference keeps what they learnt (docs/foundation/README.md D4); an upper "
                     "reference for concept shift only"),
}
STRATEGIES = tuple(METHODS)


def method(name: str) -> Method:
    """The method ``name``: a row of :data:`METHODS`, or any registered strategy at its
    defaults; an unknown name lists the valid ones."""
    if name in METHODS:
        return METHODS[name]
    from fedcluster_app.families import strategy_infos

    registered = [info.name for info in strategy_infos()]
    if name not in registered:
        valid = sorted({*METHODS, *registered})
        raise ValueError(f"unknown method {name!r}{suggest(name, valid)}; valid: the "
                         f"benchmark's methods ({', '.join(METHODS)}) or any strategy")
    return Method(name)


def check_methods(names: list[str], protocol: dict[str, ConfigValue]) -> None:
    """Every method's settings valid with the protocol: an unknown key or a value its
    declaration refuses raises ValueError naming the method, before any run starts."""
    from fedcluster_app.core.config import default_run_config, merge_overrides, parse_run_config
    from fedcluster_app.families import strategy_info

    for name in names:
        m = method(name)
        try:
            config = merge_overrides(default_run_config(), {**protocol, **dict(m.settings),
                                                             "strategy": m.strategy})
            parse_run_config(config)
            strategy_info(m.strategy).params.from_run_config(config)
        except ValueError as ex:
            raise ValueError(f"bench method {name!r} ({dict(m.settings)}): {ex}") from None


@dataclass(frozen=True)
class Tier:
    """A matrix of the benchmark: its data sets, shifts, patterns and priors, and what it
    changes in :data:`PROTOCOL`."""

    description: str
    datasets: tuple[str, ...] = DATASETS
    shifts: tuple[str, ...] = SHIFTS
    patterns: tuple[str, ...] = PATTERNS
    priors: tuple[str, ...] = PRIORS
    protocol: tuple[tuple[str, ConfigValue], ...] = ()


TIERS: dict[str, Tier] = {
    "headline": Tier("10 clients, every client trains every round, every data set, shift, "
                     "pattern and prior"),
    # the papers run 30 to 5,078 clients with partial participation
    "scale": Tier("the papers' regime: 100 clients, 20 of them train each round (all are "
                  "evaluated), on the three data sets with the cheapest models",
                  datasets=("mixture", "imagesegments", "shuttle"),
                  shifts=("concept", "mix"), patterns=("sudden", "staggered"),
                  priors=("uniform",),
                  protocol=(("num-clients", 100), ("fraction-train", 0.2))),
}


#: the smoke matrix of ``--quick``: 8 short runs, seconds on 2 cores
QUICK = {"datasets": ("mixture",), "shifts": ("concept", "label"), "patterns": ("sudden",),
         "priors": ("uniform",),
         "strategies": ("fedavg", "ifca", "feddrift", "oracle"), "seeds": (0,),
         "protocol": {"num-steps": 4, "rounds-per-step": 3, "local-steps": 10}}

_SCENARIO = {("mixture", "concept"): "mixture-swap"}   # the data sets' own names where they differ
_SHIFT_VARIANT = {"label": "prior", "feature": "noise", "concept": "permute", "mix": "mix"}


@dataclass(frozen=True)
class BenchScenario:
    """One row block of the leaderboard: data x shift x pattern (``none``: no drift) x the
    clients' class prior."""

    data: str
    shift: str
    pattern: str
    prior: str = "uniform"

    @property
    def key(self) -> str:
        return f"{self.data}/{self.shift}/{self.pattern}/{self.prior}"

    @property
    def scenario(self) -> str:
        """The catalogue scenario (``fedcluster list scenarios``)."""
        return _SCENARIO.get((self.data, self.shift), f"{self.data}-{_SHIFT_VARIANT[self.shift]}")

    def run_config(self) -> dict[str, ConfigValue]:
        return {"scenario": self.scenario, "drift-pattern": self.pattern,
                "dirichlet-alpha": PRIOR_ALPHA[self.prior], **dict(DATA_MODEL.get(self.data, ()))}


def scenarios(datasets=DATASETS, shifts=SHIFTS, patterns=PATTERNS, priors=PRIORS,
              no_drift: bool = True) -> list[BenchScenario]:
    """Every (data, shift, pattern, prior) the matrix runs: with each prior the patterns
    :data:`PRIOR_PATTERNS` gives it, plus one no-drift scenario per data set and prior (its
    mixed-shift scenario with the pattern ``none``: every client stays on the original
    concept); never a pair of :data:`REPEATS`."""
    out = []
    for prior in priors:
        for data in datasets:
            if no_drift:
                out.append(BenchScenario(data, "mix" if "mix" in SHIFTS else shifts[0], "none",
                                         prior))
            out += [BenchScenario(data, s, p, prior) for s in shifts for p in patterns
                    if p in PRIOR_PATTERNS[prior] and (s, p) not in REPEATS]
    return out


def check_names(kind: str, given, valid) -> list[str]:
    """``given`` as a list, or ValueError naming the unknown ones, the valid ones and the closest."""
    given = list(given)
    for name in given:
        if name not in valid:
            raise ValueError(f"unknown {kind} {name!r}{suggest(name, list(valid))}; valid: "
                             f"{', '.join(valid)}")
    return given


@dataclass(frozen=True)
class Cell:
    """One run of the matrix: ``lr`` is the method's tuned learning rate (None: the
    protocol's)."""

    scenario: BenchScenario
    strategy: str
    seed: int
    protocol: tuple[tuple[str, ConfigValue], ...] = ()
    lr: float | None = None

    @property
    def name(self) -> str:
        """The cell's name, which is also its run directory under the runs directory."""
        return f"{self.scenario.key}/{self.strategy}/{self.lr_dir}/seed{self.seed}"

    @property
    def lr_dir(self) -> str:
        """The part of the cell's run directory that names its learning rate: a run with
        another rate is another run."""
        return f"lr{self.lr if self.lr is not None else dict(self.protocol).get('lr')}"

    def config(self) -> dict[str, ConfigValue]:
        """The cell's run config but ``num-clusters`` (which :func:`num_concepts` gives): the
        protocol, the scenario, and the method's strategy with its own settings."""
        m = method(self.strategy)
        return {**dict(self.protocol), **dict(m.settings), **self.scenario.run_config(),
                **({"lr": self.lr} if self.lr is not None else {}),
                "strategy": m.strategy, "seed": self.seed, **QUIET_RUN}

    def run_config(self, num_clusters: int) -> dict[str, ConfigValue]:
        return {**self.config(), "num-clusters": num_clusters}


def tuning_cells(datasets, strategies, protocol: tuple[tuple[str, ConfigValue], ...],
                 grid=LR_GRID, priors=PRIORS) -> list[Cell]:
    """The runs that choose each method's learning rate per data set: every rate of ``grid`` on
    the data set's :data:`TUNING_SCENARIOS` with one of ``priors`` (the matrix's) at
    :data:`VALIDATION_SEED`."""
    return [Cell(BenchScenario(data, shift, pattern, prior), strategy, VALIDATION_SEED,
                 protocol, lr)
            for data in datasets for shift, pattern, prior in TUNING_SCENARIOS
            if prior in priors
            for strategy in strategies for lr in grid]


def tuned_lrs(rows: list[dict], score: str = "acc_next") -> dict[tuple[str, str], float]:
    """(data set, method) -> the learning rate of the grid with the best mean ``score`` over
    the tuning scenarios (a failed run scores nothing; an equal mean goes to the smaller rate).
    A method whose every rate failed on a data set has no entry."""
    by: dict[tuple[str, str, float], list[float]] = {}
    for r in rows:
        value = r.get(score) if r.get("status") in FINISHED else None
        by.setdefault((r["data"], r["strategy"], float(r["lr"])), []).append(
            float(value) if value is not None else -math.inf)
    best: dict[tuple[str, str], tuple[float, float]] = {}
    for (data, strategy, lr), values in sorted(by.items()):
        mean = sum(values) / len(values)
        if math.isfinite(mean) and ((data, strategy) not in best
                                    or mean > best[(data, strategy)][0]):
            best[(data, strategy)] = (mean, lr)
    return {key: lr for key, (_, lr) in best.items()}


def with_tuned_lrs(cells: list[Cell], lrs: dict[tuple[str, str], float]) -> list[Cell]:
    """The matrix's cells, each with its method's tuned rate on its data set (a method without
    one keeps the protocol's, and its rows say so by their ``lr``)."""
    return [replace(c, lr=lrs.get((c.scenario.data, c.strategy))) for c in cells]


def bench_scenario(cell: Cell):
    """The scenario the cell's run builds: from its own run config, by the run's own path, so
    every key the protocol sets (``drift-step``, ``schedule``, ``data-seed``, ...) counts."""
    from fedcluster_app.api import run_config_defaults
    from fedcluster_app.core.config import merge_overrides
    from fedcluster_app.core.experiment import load_experiment

    config = cell.config()
    return load_experiment(merge_overrides(run_config_defaults(config), config),
                           server=True).scenario


def num_concepts(cell: Cell) -> int:
    """The concepts the cell's scenario uses over its steps and clients."""
    return len(set(bench_scenario(cell).concept_matrix().flat))


def cannot_run(cell: Cell, run_config: dict[str, ConfigValue]) -> str | None:
    """Why the strategy cannot run on the cell's scenario (its own check when it is built), or
    None when it can."""
    from fedcluster_app.api import make_strategy
    from fedcluster_app.core.config import ConfigError

    try:
        make_strategy(method(cell.strategy).strategy,
                      run_config={k: v for k, v in run_config.items() if k != "strategy"})
    except (ConfigError, ValueError) as ex:
        return str(ex).splitlines()[0]
    return None
