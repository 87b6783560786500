"""Streaming federated datasets with concept drift.

Scenarios (:func:`build_scenario`, :func:`list_scenarios`) define, for every client and 1-based
time step, the ground-truth concept and regenerate that (client, step)'s train/test data
deterministically from the scenario arguments, so clients never store data. See ``scenarios.py``
for the families and drift patterns, ``schedules.py`` for FedDrift's ``.cp`` concept matrices and
programmatic schedules, ``generators.py`` / ``drift.py`` for how concepts become data, and
``loaders.py`` for local torchvision datasets, ``sources.py`` for a user's own dataset (run-config
key ``dataset``) and River's bundled tables, ``partition.py`` for how a pool is shared across
clients (nothing is ever downloaded).

The names below are imported from their modules on first use: the catalogue of scenario names
(``catalogue.py``) loads without numpy and the data code, so ``fedcluster list`` stays instant.
"""

import importlib

#: public name -> the module of this package that defines it
_EXPORTS = {
    "SCENARIO_NAMES": "catalogue",
    "list_scenarios": "catalogue",
    "register_scenario": "catalogue",
    "scenario_names": "catalogue",
    "load_image_dataset": "loaders",
    "DRIFT_PATTERNS": "scenarios",
    "Scenario": "scenarios",
    "ScenarioSpec": "scenarios",
    "StepData": "scenarios",
    "build_scenario": "scenarios",
    "bundled_schedule": "schedules",
    "bundled_schedule_names": "schedules",
    "incremental": "schedules",
    "load_cp": "schedules",
    "recurring": "schedules",
    "staggered_random": "schedules",
    "sudden": "schedules",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value
