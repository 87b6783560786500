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
FedSoft) is the number of concepts the scenario uses.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedcluster_app.core.config import ConfigValue, suggest

DATASETS = ("mixture", "digits", "phishing", "imagesegments", "bananas", "shuttle")
SHIFTS = ("label", "feature", "concept", "mix")
PATTERNS = ("sudden", "incremental", "recurring", "staggered")

#: the five papers' algorithms, then the baselines
STRATEGIES = ("fielding", "feddrift", "flexcfl", "fedrc", "fedccfa",
              "fedavg", "ifca", "cfl", "fedem", "fedsoft", "fedrep", "local", "oracle")

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
        """The cell's run config but ``num-clusters`` (which :func:`num_concepts` gives)."""
        return {**dict(self.protocol), **self.scenario.run_config(), "strategy": self.strategy,
                "seed": self.seed, "progress": False}

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
        make_strategy(cell.strategy, run_config={k: v for k, v in run_config.items()
                                                 if k != "strategy"})
    except (ConfigError, ValueError) as ex:
        return str(ex).splitlines()[0]
    return None
