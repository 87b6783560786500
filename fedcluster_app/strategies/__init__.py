"""Clustered strategies: a shared base, one module per algorithm family, and a name registry.

The registry (which imports every family) loads on first use of one of its names, so a module
that needs only a family's pure helpers (e.g. the Fielding client importing ``fielding_core``)
does not pull in every strategy and, through them, every family's client module.
"""

from .base import ClientRecord, ClusteredStrategy, Reply, Task

_REGISTRY_NAMES = ("STRATEGIES", "UnknownStrategy", "build_strategy", "list_strategies",
                   "strategy_class")

__all__ = ["ClientRecord", "ClusteredStrategy", "Reply", "Task", *_REGISTRY_NAMES]


def __getattr__(name: str):
    if name in _REGISTRY_NAMES:
        from . import registry

        return getattr(registry, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
