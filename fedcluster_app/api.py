"""The public API: fedcluster's clustered strategies for any Flower ServerApp.

As with scikit-learn estimators, a strategy is built by name with keyword hyper-parameters,
validated when it is built::

    from fedcluster_app.api import make_strategy

    strategy = make_strategy("feddrift", delta=0.1, scenario="sea4", rounds_per_step=20)
    result = strategy.start(grid)          # Flower's Strategy.start; results also on disk

Keywords are the strategy's own hyper-parameters (``FedDrift.Params``: ``delta``,
``subsample``, ...) and any run-config key (``scenario``, ``seed``, ``num_clusters``,
``rounds_per_step``, ...; ``_`` for ``-``); ``run_config`` passes a whole run config (e.g. a
ServerApp's ``context.run_config``), which the keywords override. An unknown name lists the
valid ones and suggests the closest; an unknown, mistyped or out-of-range keyword is a
:class:`ConfigError` that names it. Nothing is sent before the strategy is built.

Your own strategy subclasses :class:`ClusteredStrategy` (hooks such as ``plan_train`` and
``on_train_replies``; ``Task``, ``weighted_average``) with typed hyper-parameters (a frozen
dataclass of :func:`param` fields under ``HParams`` with a ``table``), and runs by import path:
``strategy = "package.module:Class"``, its keys set as ``--set <table>.<key>=...``.

A finished run is served by ``load_run(RUN_DIR)`` (``serving.py``): its cluster models as
``torch.nn.Module``s, its final assignments, ``predict(x, client_id=...)`` and ``route(x, y)``
for a client that was not in the run.

The strategy classes are importable from here by their class names (``FedAvg``, ``IFCA``,
``FedDrift``, ``Fielding``, ``FlexCFL``, ``FedRC``, ``FedCCFA``, ...); ``STRATEGIES`` maps
run-config names to them. Clients must run fedcluster's ClientApp (``fedcluster_app.client_app``),
which answers the message kinds the strategies send.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from fedcluster_app import families
from fedcluster_app.core.config import (ConfigError, ConfigValue, default_run_config,
                                        merge_overrides)
from fedcluster_app.core.data import build_scenario, list_scenarios, scenario_names
from fedcluster_app.core.experiment import Experiment, load_experiment
from fedcluster_app.core.hparams import HParams, param, suggest
from fedcluster_app.core.limits import check_models
from fedcluster_app.core.models import parameter_count
from fedcluster_app.core.plugins import import_object, is_import_path
from fedcluster_app.core.server.strategy import ClusteredResult, ClusteredStrategy, Task
from fedcluster_app.core.server.updates import weighted_average
from fedcluster_app.families import (UnknownStrategy, hyperparameter_tables,
                                     hyperparameter_users, list_strategies)

_CLASSES = families.strategy_classes()

#: run-config name -> strategy class
STRATEGIES: dict[str, type[ClusteredStrategy]] = {cls.name: cls for cls in _CLASSES}

globals().update({cls.__name__: cls for cls in _CLASSES})   # FedAvg, IFCA, FedDrift, ...

__all__ = ["ClusteredResult", "ClusteredStrategy", "ConfigError", "HParams", "STRATEGIES",
           "UnknownStrategy", "build_scenario", "build_strategy", "check_tables_read",
           "default_run_config",
           "hyperparameter_tables", "hyperparameter_users",
           "list_scenarios",
           "list_strategies", "load_run", "load_strategy", "make_strategy", "param",
           "run_config_defaults",
           "scenario_names", "strategy_class", "Task", "weighted_average",
           *sorted(cls.__name__ for cls in _CLASSES)]


def load_strategy(path: str) -> type:
    """A user's strategy class, ``package.module:Class``: a subclass of the public base
    (``fedcluster_app.api.ClusteredStrategy``) whose ``Params`` (if it has any fields) name
    their run-config ``table``."""
    try:
        cls = import_object(path, "strategy")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if not (isinstance(cls, type) and issubclass(cls, ClusteredStrategy)):
        raise ConfigError(f"strategy: {path!r} is {cls!r}, not a subclass of "
                          "fedcluster_app.api.ClusteredStrategy")
    if dataclasses.fields(cls.Params) and not cls.Params.table:
        raise ConfigError(f"strategy: {path!r}'s hyper-parameters {cls.Params.__name__} need a "
                          "run-config table: set `table = \"<name>\"` on the class, then "
                          "`--set <name>.<key>=...` sets them")
    return cls


def strategy_defaults(path: str) -> dict:
    """The run-config keys (``<table>.<key>``) and defaults of a user's strategy's
    hyper-parameters: the table ``pyproject.toml`` holds for the built-in strategies."""
    params = load_strategy(path).Params
    return {f"{params.table}.{key}": default for key, default, _, _ in params.describe()}


def run_config_defaults(overrides: Mapping[str, ConfigValue] | None = None
                        ) -> dict[str, ConfigValue]:
    """Every run-config key and its default (``pyproject.toml``), plus the table of a user's
    strategy when ``overrides`` name one: the base that overrides are merged into."""
    strategy = (overrides or {}).get("strategy", "")
    return {**default_run_config(),
            **(strategy_defaults(str(strategy)) if is_import_path(strategy) else {})}


def strategy_class(name: str) -> type[ClusteredStrategy]:
    """A registered strategy by name, or a user's by import path (``package.module:Class``)."""
    if is_import_path(name):
        return load_strategy(name)
    return STRATEGIES[families.strategy_info(name).name]   # UnknownStrategy lists the valid ones


def check_tables_read(strategy: str, keys: Iterable[str]) -> None:
    """Refuse a key of a strategy's hyper-parameter table (``feddrift.delta``) that ``strategy``
    does not read: it would be ignored. Give only the keys a user set one by one (``--set``,
    keywords): a preset or a run-config file may hold the tables of several strategies (a
    paper's experiment, run with any of them), and pyproject.toml holds every table."""
    own = strategy_class(strategy).Params.table
    readers: dict[str, list[str]] = {}
    for params, names in hyperparameter_users().items():
        readers.setdefault(params.table, []).extend(names)
    for key in keys:
        table = key.split(".", 1)[0] if "." in key else ""
        if table in readers and table != own:
            raise ConfigError(f"{key} is read only by {', '.join(sorted(readers[table]))} (its "
                              f"table {table}); this run's strategy {strategy} would ignore it")


def build_strategy(experiment: Experiment) -> ClusteredStrategy:
    """The strategy the experiment's run config names, refused before round 1 when the models
    it keeps, or those a round exchanges, would not fit (``limits.check_models``)."""
    strategy = strategy_class(experiment.cfg.strategy)(experiment)
    check_models(strategy.name, strategy.model_count(), parameter_count(experiment.spec),
                 experiment.cfg.fraction_train, experiment.scenario.num_clients)
    return strategy


def make_strategy(name: str, *, run_config: Mapping[str, ConfigValue] | None = None,
                  **kwargs: Any) -> ClusteredStrategy:
    """The strategy ``name``, configured and validated (module docstring).

    >>> make_strategy("ifca", num_clusters=3, scenario="mixture-swap").params
    NoParams()
    """
    cls = strategy_class(name)
    base = run_config_defaults({"strategy": name})
    config = dict(run_config or {})
    config["strategy"] = name
    for key, value in kwargs.items():
        own = cls.Params.key_for(key)
        dashed = key.replace("_", "-")
        if own is not None:
            config[f"{cls.Params.table}.{own}"] = value
        elif dashed in base:
            config[dashed] = value
        else:
            own_names = sorted(cls.Params.names())
            run_names = sorted(k.replace("-", "_") for k in base if "." not in k)
            raise ConfigError(f"{name}: unknown keyword {key!r}"
                              f"{suggest(key, own_names + run_names)}; valid: its "
                              f"hyper-parameters ({', '.join(own_names) or 'none'}) or a "
                              f"run-config key ({', '.join(run_names)})")
    check_tables_read(name, [key.replace("_", "-") for key in kwargs])
    merged = merge_overrides(base, config)
    return build_strategy(load_experiment(merged, server=True))


def __getattr__(name: str) -> Any:
    # load_run lives in serving.py, which runs client code (a family's newcomer rule) in this
    # process: imported when asked for, so that a ServerApp importing this module loads none
    if name == "load_run":
        import importlib

        return importlib.import_module("fedcluster_app.serving").load_run
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
