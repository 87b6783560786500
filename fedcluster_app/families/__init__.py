"""The algorithm families: one folder each, listed once in ``FAMILIES``.

A family folder holds what one paper brings: its strategies (server side), its client
handlers (``client.py``: a ``HANDLERS`` table of message kinds), its scenarios, its pure
algorithm code and its wire keys. The registry reads two conventional modules of every family:

* ``catalogue.py``: what the family offers, declared without importing its code (so neither
  torch nor numpy: ``fedcluster list`` answers at once):

  - ``STRATEGIES``: a :class:`~fedcluster_app.core.strategy_info.StrategyInfo` per strategy it
    registers (name, description, hyper-parameters, class), in order;
  - ``SCENARIOS`` (optional): ``(name, description, builder)``, the builder usually a
    ``lazy_builder`` naming a function of the family's data code, or a ``ScenarioDef`` of the
    core's standard catalogue;
  - ``PROTOCOLS`` (optional): the run-config settings its paper uses on them (scenario name ->
    settings);

* ``client.py``: ``HANDLERS``, the message kinds its clients answer (optional).

The server imports only the strategies (when it runs one), a client only the handlers, so
neither side loads the other's code. Adding an algorithm family means one new folder plus one
line in ``FAMILIES``.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from fedcluster_app.core.config import ConfigError, suggest
from fedcluster_app.core.hparams import HParams, toml_table
from fedcluster_app.core.strategy_info import StrategyInfo

FAMILIES = (
    "foundation",   # FedAvg, FedProx, IFCA, CFL, the Oracle, Local
    "feddrift",     # FedDrift, FedDrift-Eager and the FedDrift paper's baselines
    "fielding",     # Fielding, static CFL, Auxo
    "flexcfl",      # FlexCFL, FedGroup, FeSEM and the FlexCFL paper's baselines
    "fedrc",        # FedRC, FedEM, FedSoft
    "fedccfa",      # FedCCFA, FedRep, FedBABU, Flash
)


class UnknownStrategy(ConfigError):
    """A strategy name that is not registered; the message lists the valid ones."""


def _modules(part: str) -> list[ModuleType]:
    out = []
    for family in FAMILIES:
        name = f"{__name__}.{family}.{part}"
        if importlib.util.find_spec(name) is not None:
            out.append(importlib.import_module(name))
    return out


def strategy_infos() -> list[StrategyInfo]:
    """Every family's strategies as declared, in family order (imports no strategy)."""
    return [info for module in _modules("catalogue") for info in module.STRATEGIES]


def strategy_info(name: str) -> StrategyInfo:
    """The registered strategy ``name``; :class:`UnknownStrategy` lists the valid ones."""
    infos = {info.name: info for info in strategy_infos()}
    try:
        return infos[name]
    except KeyError:
        raise UnknownStrategy(f"unknown strategy {name!r}{suggest(str(name), sorted(infos))}; "
                              f"valid strategies: {', '.join(sorted(infos))}, or your own as "
                              "'package.module:Class'") from None


def strategy_classes() -> list[type]:
    """Every family's strategy classes, in family order (server side: imports them all)."""
    return [info.load() for info in strategy_infos()]


def list_strategies() -> list[tuple[str, str]]:
    """``(name, one-line description)`` of every registered strategy, sorted by name."""
    return sorted((info.name, info.description) for info in strategy_infos())


def hyperparameter_users() -> dict[type[HParams], list[str]]:
    """Every hyper-parameter class with a run-config table and the strategies that read it,
    in the order of the families."""
    users: dict[type[HParams], list[str]] = {}
    for info in strategy_infos():
        if info.params.table:
            users.setdefault(info.params, []).append(info.name)
    return users


def hyperparameter_tables() -> str:
    """Every strategy's hyper-parameter table, in the order of the families, as
    ``[tool.flwr.app.config.<table>]`` sections of pyproject.toml (which holds exactly this)."""
    def doc(params: type[HParams]) -> str:
        return f"docs/{params.__module__.split('.')[2]}/README.md"

    return "\n".join(toml_table(params, f"{', '.join(names)} (Dn: {doc(params)})")
                     for params, names in hyperparameter_users().items())


def client_handlers() -> dict:
    """Every family's message kinds and their handlers (client side)."""
    table: dict = {}
    for module in _modules("client"):
        clash = sorted(set(table) & set(module.HANDLERS))
        if clash:
            raise ValueError(f"{module.__name__} handles message kinds another family has: {clash}")
        table.update(module.HANDLERS)
    return table


_registered = False


def register_scenarios() -> None:
    """Add every family's named scenarios to the scenario registry (once)."""
    global _registered
    if _registered:
        return
    from fedcluster_app.core.data.catalogue import (
        ScenarioDef,
        define_scenario,
        register_scenario,
        set_protocol,
    )

    for module in _modules("catalogue"):
        for entry in getattr(module, "SCENARIOS", []):
            if isinstance(entry, ScenarioDef):
                define_scenario(entry)
            else:
                register_scenario(*entry)
        for name, settings in getattr(module, "PROTOCOLS", {}).items():
            set_protocol(name, settings)
    _registered = True


register_scenarios()
