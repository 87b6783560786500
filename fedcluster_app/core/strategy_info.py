"""A strategy as the registry lists it, declared apart from its class.

A family's ``catalogue.py`` declares each strategy once: its run-config name, its one-line
description, its typed hyper-parameters and where its class is. ``fedcluster list`` reads only
these, so it never imports a strategy's module (and with it torch and Flower, seconds of
start-up). The class takes the same three attributes from its declaration::

    class FedDrift(FedDriftEager):
        name, description, Params = FEDDRIFT.class_attributes()
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from fedcluster_app.core.hparams import HParams, NoParams


@dataclass(frozen=True)
class StrategyInfo:
    name: str                       # the run-config value of `strategy`
    description: str                # one line
    cls: str                        # "package.module:Class", imported only to run the strategy
    params: type[HParams] = NoParams

    def class_attributes(self) -> tuple[str, str, type[HParams]]:
        """``name``, ``description`` and ``Params`` of the class that implements it."""
        return self.name, self.description, self.params

    def load(self) -> type:
        """The class, imported; it must take its attributes from this declaration."""
        module, _, attr = self.cls.partition(":")
        cls = getattr(importlib.import_module(module), attr)
        if (cls.name, cls.description, cls.Params) != self.class_attributes():
            raise TypeError(f"{self.cls} is not the strategy {self.name!r} its catalogue "
                            f"declares: set `name, description, Params = "
                            f"<its StrategyInfo>.class_attributes()` on the class")
        return cls
