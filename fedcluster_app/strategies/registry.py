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
from .feddrift import FedDrift, FedDriftC, FedDriftEager, FedDriftEagerW, FedDriftW  # noqa: E402
from .feddrift_baselines import FEDDRIFT_BASELINES  # noqa: E402
from .feddrift_protocol import Oblivious, OracleT, OracleW, Window, Window2  # noqa: E402

_CLASSES.extend([FedDriftEager, FedDrift, FedDriftC, FedDriftEagerW, FedDriftW, Oblivious, Window,
                 Window2, OracleT, OracleW, *FEDDRIFT_BASELINES])
# -- issue 4: Fielding
from .fielding import Fielding, FieldingTau0, FieldingTauInf, StaticCFL  # noqa: E402
from .fielding_auxo import Auxo  # noqa: E402

_CLASSES.extend([Fielding, FieldingTau0, FieldingTauInf, StaticCFL, Auxo])
# -- issue 5: FlexCFL
from .flexcfl import STRATEGY_CLASSES as _FLEXCFL  # noqa: E402
_CLASSES.extend(_FLEXCFL)  # flexcfl, fedgroup, fesem, flexcfl-ifca, flexcfl-fedavg, flexcfl-ifca-mig, fesem-mig
# -- issue 6: FedRC
from .fedrc import STRATEGY_CLASSES as _FEDRC  # noqa: E402
from .cfl import RoundCFL, RoundCFL3  # noqa: E402
from .fedsoft import FedSoft  # noqa: E402
_CLASSES.extend([*_FEDRC, FedSoft, RoundCFL, RoundCFL3])  # fedrc, fedem, fedsoft, cfl-rounds, cfl3-rounds
# -- issue 7: FedCCFA
from .fedccfa import STRATEGY_CLASSES as _FEDCCFA  # noqa: E402
_CLASSES.extend(_FEDCCFA)  # fedccfa, fedrep, fedbabu, flash

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
