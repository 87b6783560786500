"""Streaming federated datasets with concept drift.

Scenarios (:func:`build_scenario`, :func:`list_scenarios`) define, for every client and 1-based
time step, the ground-truth concept and regenerate that (client, step)'s train/test data
deterministically from the scenario arguments, so clients never store data. See ``scenarios.py``
for the families and drift patterns, ``schedules.py`` for FedDrift's ``.cp`` concept matrices and
programmatic schedules, ``generators.py`` / ``drift.py`` for how concepts become data, and
``loaders.py`` for local torchvision datasets, ``sources.py`` for a user's own dataset (run-config
key ``dataset``) and River's bundled tables, ``partition.py`` for how a pool is shared across
clients (nothing is ever downloaded).
"""

from fedcluster_app.core.data.catalogue import (
                                                SCENARIO_NAMES,
                                                list_scenarios,
                                                register_scenario,
                                                scenario_names,
)
from fedcluster_app.core.data.loaders import load_image_dataset
from fedcluster_app.core.data.scenarios import (
                                                DRIFT_PATTERNS,
                                                Scenario,
                                                StepData,
                                                build_scenario,
)
from fedcluster_app.core.data.schedules import (
                                                bundled_schedule,
                                                bundled_schedule_names,
                                                incremental,
                                                load_cp,
                                                recurring,
                                                staggered_random,
                                                sudden,
)

__all__ = [
    "DRIFT_PATTERNS",
    "SCENARIO_NAMES",
    "Scenario",
    "StepData",
    "build_scenario",
    "register_scenario",
    "scenario_names",
    "bundled_schedule",
    "bundled_schedule_names",
    "incremental",
    "list_scenarios",
    "load_cp",
    "load_image_dataset",
    "recurring",
    "staggered_random",
    "sudden",
]
