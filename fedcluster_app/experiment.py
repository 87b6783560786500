"""What both apps derive from the run config: the validated config, the scenario and the model."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .config import ConfigValue, RunConfig, parse_run_config
from .datasets import Scenario, build_scenario
from .models import ModelSpec


@dataclass(frozen=True)
class Experiment:
    cfg: RunConfig
    scenario: Scenario
    spec: ModelSpec

    @property
    def num_rounds(self) -> int:
        return self.scenario.num_steps * self.cfg.rounds_per_step

    def time_step(self, server_round: int) -> int:
        """Time steps are 1-based and last ``rounds-per-step`` rounds each."""
        return (server_round - 1) // self.cfg.rounds_per_step + 1


def model_spec(cfg: RunConfig, scenario: Scenario) -> ModelSpec:
    kind = cfg.model or scenario.model
    hidden = cfg.hidden or scenario.hidden
    return ModelSpec(kind, tuple(scenario.input_shape), scenario.num_classes, hidden)


def load_experiment(run_config: dict[str, ConfigValue]) -> Experiment:
    """Cached: the ClientApp calls this for every message."""
    return _load(tuple(sorted(run_config.items())))


@lru_cache(maxsize=16)
def _load(items: tuple[tuple[str, ConfigValue], ...]) -> Experiment:
    cfg = parse_run_config(dict(items))
    scenario = build_scenario(cfg.scenario, **cfg.scenario_kwargs())
    return Experiment(cfg, scenario, model_spec(cfg, scenario))
