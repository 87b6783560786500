"""The public API: fedcluster's strategies for any Flower ServerApp."""

from __future__ import annotations

from fedcluster_app import families
from fedcluster_app.core.experiment import Experiment
from fedcluster_app.core.strategy import ClusteredStrategy

STRATEGIES: dict[str, type[ClusteredStrategy]] = {cls.name: cls for cls in families.strategy_classes()}


class UnknownStrategy(ValueError):
    pass


def strategy_class(name: str) -> type[ClusteredStrategy]:
    try:
        return STRATEGIES[name]
    except KeyError:
        raise UnknownStrategy(
            f"unknown strategy {name!r}; valid strategies: {', '.join(sorted(STRATEGIES))}"
        ) from None


def build_strategy(experiment: Experiment) -> ClusteredStrategy:
    return strategy_class(experiment.cfg.strategy)(experiment)


def list_strategies() -> list[tuple[str, str]]:
    return sorted((name, cls.description) for name, cls in STRATEGIES.items())
