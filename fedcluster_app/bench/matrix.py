"""The benchmark matrix: scenarios x strategies x seeds under one common protocol.

A bench scenario is a data set, a kind of shift and a drift pattern:

* data: ``mixture`` (the synthetic 4-class Gaussian mixture), ``digits`` (scikit-learn's 8x8
  digits) and River's bundled tables ``phishing``, ``imagesegments``, ``bananas``, ``shuttle``;
* shift: ``label`` (``<data>-prior``: drifting clients put 90% of their data on half the
  classes), ``feature`` (``<data>-noise``: Gaussian noise on their inputs), ``concept``
  (``<data>-permute`` / ``mixture-swap``: y -> (y+1) % C) and ``mix`` (``<data>-mix``: each
  drifting client gets one of the three);
* pattern: ``sudden``, ``incremental``, ``recurring``, ``staggered`` (the scenarios' drift
  patterns, ``fedcluster list scenarios``), and once per data set ``none`` (no drift).

Every run of a scenario shares :data:`PROTOCOL` (clients, steps, rounds, local work, the scoring
rule ``score-next-step``); the strategies keep their own algorithms' message schedules (FedDrift's
time steps, FlexCFL's selection, FedCCFA's phases). ``num-clusters`` (the K of IFCA, FedEM, FedRC,
FedSoft) is the number of concepts the scenario uses. Each row of the leaderboard is a
:class:`Method`: a strategy with the settings its paper or its docs give it (:data:`METHODS`,
each with its source), checked before any run starts (:func:`check_methods`).
"""

from __future__ import annotations

from dataclasses import dataclass

from fedcluster_app.core.config import ConfigValue, suggest

DATASETS = ("mixture", "digits", "phishing", "imagesegments", "bananas", "shuttle")
SHIFTS = ("label", "feature", "concept", "mix")
PATTERNS = ("sudden", "incremental", "recurring", "staggered")

#: one protocol for every run (the scenario's own paper protocol is off: ``protocol = none``)
PROTOCOL: dict[str, ConfigValue] = {
    "protocol": "none",
    "num-clients": 10,
    "num-steps": 6,            # drift from step 3 (the scenarios' drift step)
    "rounds-per-step": 4,
    "local-steps": 20,
    "batch-size": 50,
    "lr": 0.01,
    "fraction-train": 1.0,
    "fraction-evaluate": 1.0,
    "eval-every": 1,
    "score-next-step": True,
}



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
    "feddrift": Method("feddrift"),
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


#: the smoke matrix of ``--quick``: 8 short runs, seconds on 2 cores
QUICK = {"datasets": ("mixture",), "shifts": ("concept", "label"), "patterns": ("sudden",),
         "strategies": ("fedavg", "ifca", "feddrift", "oracle"), "seeds": (0,),
         "protocol": {"num-steps": 4, "rounds-per-step": 3, "local-steps": 10}}

_SCENARIO = {("mixture", "concept"): "mixture-swap"}   # the data sets' own names where they differ
_SHIFT_VARIANT = {"label": "prior", "feature": "noise", "concept": "permute", "mix": "mix"}


@dataclass(frozen=True)
class BenchScenario:
    """One row block of the leaderboard: data x shift x pattern (``none``: no drift)."""

    data: str
    shift: str
    pattern: str

    @property
    def key(self) -> str:
        return f"{self.data}/{self.shift}/{self.pattern}"

    @property
    def scenario(self) -> str:
        """The catalogue scenario (``fedcluster list scenarios``)."""
        return _SCENARIO.get((self.data, self.shift), f"{self.data}-{_SHIFT_VARIANT[self.shift]}")

    def run_config(self) -> dict[str, ConfigValue]:
        return {"scenario": self.scenario, "drift-pattern": self.pattern}


def scenarios(datasets=DATASETS, shifts=SHIFTS, patterns=PATTERNS,
              no_drift: bool = True) -> list[BenchScenario]:
    """Every (data, shift, pattern), plus one no-drift scenario per data set (its mixed-shift
    scenario with the pattern ``none``: every client stays on the original concept)."""
    out = []
    for data in datasets:
        if no_drift:
            out.append(BenchScenario(data, "mix" if "mix" in SHIFTS else shifts[0], "none"))
        out += [BenchScenario(data, s, p) for s in shifts for p in patterns]
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
    """One run of the matrix."""

    scenario: BenchScenario
    strategy: str
    seed: int
    protocol: tuple[tuple[str, ConfigValue], ...] = ()

    @property
    def name(self) -> str:
        return f"{self.scenario.key}/{self.strategy}/seed{self.seed}"

    def config(self) -> dict[str, ConfigValue]:
        """The cell's run config but ``num-clusters`` (which :func:`num_concepts` gives): the
        protocol, the scenario, and the method's strategy with its own settings."""
        m = method(self.strategy)
        return {**dict(self.protocol), **dict(m.settings), **self.scenario.run_config(),
                "strategy": m.strategy, "seed": self.seed, "progress": False}

    def run_config(self, num_clusters: int) -> dict[str, ConfigValue]:
        return {**self.config(), "num-clusters": num_clusters}


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
