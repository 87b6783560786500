"""Clustered strategies: a shared base, one module per algorithm family, and a name registry."""

from .base import ClientRecord, ClusteredStrategy, Reply, Task
from .registry import STRATEGIES, UnknownStrategy, build_strategy, list_strategies, strategy_class

__all__ = [
    "ClientRecord", "ClusteredStrategy", "Reply", "Task", "STRATEGIES", "UnknownStrategy",
    "build_strategy", "list_strategies", "strategy_class",
]
