"""Run-config names -> strategy classes."""

from __future__ import annotations

from ..experiment import Experiment
from .base import ClusteredStrategy
from .fedavg import FedAvg, FedProx
from .ifca import IFCA
from .local import Local
from .oracle import Oracle

_CLASSES: list[type[ClusteredStrategy]] = [FedAvg, FedProx, IFCA, Oracle, Local]
# Each family adds its classes under its own marker (an import and an _CLASSES.extend line):
# -- issue 3: FedDrift family and its baselines
# -- issue 4: Fielding
# -- issue 5: FlexCFL
# -- issue 6: FedRC
# -- issue 7: FedCCFA

STRATEGIES: dict[str, type[ClusteredStrategy]] = {cls.name: cls for cls in _CLASSES}


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
