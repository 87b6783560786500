"""The algorithm families: one folder each, listed once in ``FAMILIES``.

A family folder holds what one paper brings: its strategies (server side), its client
handlers (``client.py``: a ``HANDLERS`` table of message kinds), its scenarios
(``scenarios.py``: a ``SCENARIOS`` list), its pure algorithm code and its wire keys. The
registry reads three conventional modules of every family:

* ``strategies.py``: ``STRATEGIES``, the strategy classes it registers;
* ``client.py``: ``HANDLERS``, the message kinds its clients answer (optional);
* ``scenarios.py``: ``SCENARIOS``, its scenarios: ``(name, description, builder)``, or a
  ``ScenarioDef`` of the core's standard catalogue (optional), and ``PROTOCOLS``, the run-config
  settings its paper uses on them (scenario name -> settings; optional).

The server imports only the strategies, a client only the handlers, so neither side loads the
other's code. Adding an algorithm family means one new folder plus one line in ``FAMILIES``.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

FAMILIES = (
    "foundation",   # FedAvg, FedProx, IFCA, CFL, the Oracle, Local
    "feddrift",     # FedDrift, FedDrift-Eager and the FedDrift paper's baselines
    "fielding",     # Fielding, static CFL, Auxo
    "flexcfl",      # FlexCFL, FedGroup, FeSEM and the FlexCFL paper's baselines
    "fedrc",        # FedRC, FedEM, FedSoft
    "fedccfa",      # FedCCFA, FedRep, FedBABU, Flash
)


def _modules(part: str) -> list[ModuleType]:
    out = []
    for family in FAMILIES:
        name = f"{__name__}.{family}.{part}"
        if importlib.util.find_spec(name) is not None:
            out.append(importlib.import_module(name))
    return out


def strategy_classes() -> list[type]:
    """Every family's strategy classes, in family order (server side)."""
    return [cls for module in _modules("strategies") for cls in module.STRATEGIES]


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
    from fedcluster_app.core.data.catalogue import (ScenarioDef, define_scenario,
                                                    register_scenario, set_protocol)

    for module in _modules("scenarios"):
        for entry in module.SCENARIOS:
            if isinstance(entry, ScenarioDef):
                define_scenario(entry)
            else:
                register_scenario(*entry)
        for name, settings in getattr(module, "PROTOCOLS", {}).items():
            set_protocol(name, settings)
    _registered = True


register_scenarios()
