"""What both apps derive from the run config: the validated config, the scenario and the model."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

from fedcluster_app.core.data.schedules import schedule_digest
from fedcluster_app.core.config import (ConfigError, ConfigValue, RunConfig,
                                        default_run_config, parse_run_config)
from fedcluster_app.core.data import Scenario, build_scenario
from fedcluster_app.core.data.catalogue import METADATA_ONLY, scenario_protocol
from fedcluster_app.core.limits import check_run
from fedcluster_app.core.models import ModelSpec, check_model, parameter_count


@dataclass(frozen=True)
class Experiment:
    cfg: RunConfig
    scenario: Scenario
    spec: ModelSpec
    #: the settings the scenario's protocol set (keys the run config left at their defaults)
    protocol: tuple[tuple[str, ConfigValue], ...] = ()


def apply_protocol(cfg: RunConfig) -> tuple[RunConfig, dict[str, ConfigValue]]:
    """The scenario's paper protocol for every key the run config leaves at its default
    (``protocol = "scenario"``); ``protocol = "none"`` keeps the defaults. Server and clients
    apply the same rule to the same run config, so they agree."""
    if cfg.protocol == "none":
        return cfg, {}
    defaults = default_run_config()
    applied = {k: v for k, v in scenario_protocol(cfg.scenario).items()
               if k in defaults and cfg.raw.get(k) == defaults[k] and v != defaults[k]}
    if not applied:
        return cfg, {}
    return parse_run_config({**cfg.raw, **applied}), applied


def model_spec(cfg: RunConfig, scenario: Scenario) -> ModelSpec:
    kind = cfg.model or scenario.model
    hidden = cfg.hidden or scenario.hidden
    return ModelSpec(kind, tuple(scenario.input_shape), scenario.num_classes, hidden, cfg.init)


def resolved_config(exp: Experiment) -> dict[str, ConfigValue]:
    """The run config with the values the run used where it says "the scenario's choice"
    (0 or ""): sizes, drift step, data seed, model, classes and input shape. Keys the scenario's
    paper protocol set are already in ``exp.cfg`` (``apply_protocol``)."""
    cfg, scenario, spec = exp.cfg, exp.scenario, exp.spec
    alpha = scenario.dirichlet_alpha
    return {**cfg.raw,
            "data-seed": cfg.effective_data_seed,
            "num-clients": scenario.num_clients,
            "num-steps": scenario.num_steps,
            "samples-per-step": scenario.samples_per_step,
            "test-samples": scenario.test_samples,
            "drift-step": scenario.drift_step,
            "dirichlet-alpha": alpha if math.isfinite(alpha) else "inf",
            "num-classes": scenario.num_classes,
            "input-shape": ",".join(map(str, scenario.input_shape)),
            "model": spec.kind,
            "hidden": spec.hidden,
            "min-nodes": cfg.min_nodes or scenario.num_clients}


def data_fingerprint(scenario: Scenario) -> str:
    """A SHA-256 of the data spec: the scenario, its build arguments (the data directory
    left out: where the same data live on this machine) and its concept schedule."""
    spec = {k: v for k, v in scenario.params.items() if k != "data_dir"}
    spec["schedule_digest"] = schedule_digest(scenario.concept_matrix(), scenario.concept_labels)
    text = json.dumps(spec, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def load_experiment(run_config: dict[str, ConfigValue], server: bool = False) -> Experiment:
    """Cached: the ClientApp calls this for every message.

    ``server=True``: the server needs only the scenario's metadata, so when the data directory
    is not on this machine (a deployment whose devices hold the data) it does without it.
    """
    # a node hands the same run-config dict with every message: compared with the copy kept
    # for it (one C-level dict comparison) it skips sorting ~150 keys per message
    last = _LAST.get((id(run_config), server))
    if last is not None and last[0] is run_config and last[1] == run_config:
        return last[2]
    experiment = _load(tuple(sorted(run_config.items())), server)
    if len(_LAST) > 64:
        _LAST.clear()
    _LAST[(id(run_config), server)] = (run_config, dict(run_config), experiment)
    return experiment


#: (id of a run-config dict, server) -> (that dict, a copy of it, its experiment)
_LAST: dict[tuple[int, bool], tuple[dict, dict, Experiment]] = {}


@lru_cache(maxsize=16)
def _load(items: tuple[tuple[str, ConfigValue], ...], server: bool) -> Experiment:
    cfg, applied = apply_protocol(parse_run_config(dict(items)))
    data = cfg.data
    if server and not (data.data_dir and Path(data.data_dir).is_dir()):
        data = replace(data, data_dir=METADATA_ONLY)
    scenario = build_scenario(cfg.scenario, data, seed=cfg.effective_data_seed)
    spec = model_spec(cfg, scenario)
    if spec.custom:
        check_model(spec)   # a user's model: import, output shape and weights, before round 1
    check_run(cfg, scenario, parameter_count(spec))   # sizes and their products, before round 1
    if cfg.balanced_test and scenario.has_balanced_test() is False:
        raise ConfigError(f"balanced-test = true needs a class-based scenario (a class pool or a "
                          f"mixture); {scenario.name} draws its data from decision rules, so it "
                          f"has no class-balanced test set: set balanced-test = false")
    return Experiment(cfg, scenario, spec, tuple(sorted(applied.items())))
