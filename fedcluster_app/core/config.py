"""Run configuration: the flat ``run_config`` dict Flower hands both apps, typed and validated.

The defaults live in one place, ``[tool.flwr.app.config]`` of ``pyproject.toml``; this module
reads them from there (for the in-process engine and the CLI, which do not go through
``flwr run``) and checks every value before the first round, so a bad hyper-parameter fails
with a message that names the key instead of somewhere inside round 7.
"""

from __future__ import annotations

import dataclasses
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedcluster_app.core.plugins import is_import_path
from fedcluster_app.core.project_files import presets_dir, project_file
from fedcluster_app.core.user_text import read_value, suggest

# checked here, resolved to a torch device by models.resolve_device (this module avoids torch)
DEVICE_RULE = "'auto', 'cpu', 'cuda' or 'cuda:N'"
_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


def is_device_name(device: str) -> bool:
    return bool(_DEVICE.match(str(device)))

ConfigValue = bool | int | float | str


#: sizes beyond which a run cannot work on one machine: refused before round 1, not left to hang
MAX_CLIENTS = 100_000
#: seeds go to NumPy, PyTorch and Python's RNGs: the range every one of them takes
MAX_SEED = 2**32 - 1
MAX_SAMPLES = 1_000_000

#: robust-aggregation values: none (the weighted mean), or Flower's coordinate-wise rules
ROBUST_AGGREGATIONS = ("none", "median", "trimmed-mean")


class ConfigError(ValueError):
    """A run-config value is invalid; the message names the key."""


def default_run_config() -> dict[str, ConfigValue]:
    """The run-config keys and defaults declared in ``pyproject.toml``."""
    with project_file("pyproject.toml").open("rb") as fh:
        data = tomllib.load(fh)
    return _flatten(data["tool"]["flwr"]["app"]["config"])


def _flatten(table: dict[str, Any], prefix: str = "") -> dict[str, ConfigValue]:
    out: dict[str, ConfigValue] = {}
    for key, value in table.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def list_presets() -> list[tuple[str, str]]:
    """``(name, its leading comment, cut to one line)`` of every bundled preset, by name."""
    folder = presets_dir()
    out = []
    for path in sorted(folder.glob("*.toml")) if folder else []:
        lines = path.read_text().splitlines()
        head = " ".join(line.lstrip("# ").strip() for line in
                        lines[:next((i for i, x in enumerate(lines) if not x.startswith("#")),
                                    len(lines))])
        out.append((path.stem, head if len(head) <= 110 else head[:107].rsplit(" ", 1)[0] + " ..."))
    return out


def preset_file(name: str) -> Path:
    """The bundled preset ``name`` (``presets/<name>.toml``); an unknown name lists them."""
    folder = presets_dir()
    path = folder / f"{name}.toml" if folder else None
    if path is None or not path.is_file():
        names = [n for n, _ in list_presets()]
        raise FileNotFoundError(f"unknown preset {name!r}{suggest(name, names)}; presets: "
                                f"{', '.join(names) or 'none'}")
    return path


def parse_assignment(text: str) -> tuple[str, ConfigValue]:
    """Parse ``key=value`` from the command line (TOML value syntax, bare strings allowed)."""
    if "=" not in text:
        raise ConfigError(f"expected key=value, got {text!r}")
    key, raw = (part.strip() for part in text.split("=", 1))
    return key, read_value(raw)


def merge_overrides(
    base: dict[str, ConfigValue], overrides: dict[str, ConfigValue]
) -> dict[str, ConfigValue]:
    """Overrides may only set keys that exist, and keep the declared type (as ``flwr run``).
    A user's strategy brings its own keys: ``api.run_config_defaults`` gives the base."""
    merged = dict(base)
    for key, value in overrides.items():
        if key not in base:
            table = key.rsplit(".", 1)[0] + "." if "." in key else ""
            near = sorted(k for k in base if k.startswith(table) and ("." in k) == bool(table))
            raise ConfigError(
                f"unknown run-config key {key!r}{suggest(key, sorted(base))}; valid "
                f"{'keys of ' + table[:-1] if table and near else 'keys'}: "
                f"{', '.join(near or sorted(base))}"
            )
        merged[key] = _coerce(key, value, base[key])
    return merged


def _coerce(key: str, value: ConfigValue, default: ConfigValue) -> ConfigValue:
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        if str(value).lower() in ("true", "1", "yes"):
            return True
        if str(value).lower() in ("false", "0", "no"):
            return False
    elif isinstance(default, int) and not isinstance(value, bool):
        if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
            return int(value)
    elif isinstance(default, float) and not isinstance(value, bool):
        if isinstance(value, (int, float)):
            return float(value)
    elif isinstance(default, str):
        return str(value)
    raise ConfigError(f"{key} must be of type {type(default).__name__}, got {value!r}")


@dataclass(frozen=True)
class TrainConfig:
    """How a client trains a model locally in one round (sent to clients in every message)."""

    optimizer: str = "adam"
    lr: float = 0.01
    momentum: float = 0.0
    weight_decay: float = 0.0
    local_steps: int = 20
    local_epochs: int = 1
    batch_size: int = 50
    drop_last: bool = False
    prox_mu: float = 0.0
    optimizer_state: str = "round"     # round: a fresh optimizer every round | step: kept per time step


@dataclass(frozen=True)
class RunConfig:
    """Everything a run needs, validated. Field names are the run-config keys with ``_``."""

    strategy: str
    scenario: str
    seed: int
    data_seed: int
    out_dir: str
    rounds_per_step: int
    num_steps: int
    num_clients: int
    samples_per_step: int
    test_samples: int
    window: int
    schedule: str
    drift_pattern: str
    drift_step: int
    dirichlet_alpha: float
    data_dir: str
    dataset: str
    partition: str
    disjoint: bool
    classes_per_client: int
    test_fraction: float
    num_classes: int
    input_shape: str
    label_column: str
    feature_columns: str
    partition_column: str
    dataset_args: str
    remap_labels: bool
    oversample: bool
    model: str
    hidden: int
    init: str
    device: str
    batch_clients: bool
    deterministic: bool
    protocol: str
    train: TrainConfig
    fraction_train: float
    fraction_evaluate: float
    eval_every: int
    score_next_step: bool
    num_clusters: int
    min_nodes: int
    node_wait_s: float
    round_timeout: float
    update_norm_bound: float
    robust_aggregation: str
    trim_fraction: float
    checkpoint_every: int
    checkpoint_every_s: float
    checkpoint_client_state: bool
    resume_from: str
    overwrite: bool
    plot: bool
    progress: bool
    raw: dict[str, ConfigValue] = field(default_factory=dict, compare=False)

    @property
    def effective_data_seed(self) -> int:
        return self.seed if self.data_seed < 0 else self.data_seed

    def scenario_kwargs(self) -> dict[str, Any]:
        """Arguments of ``datasets.build_scenario`` taken from this config."""
        return dict(
            seed=self.effective_data_seed,
            num_clients=self.num_clients,
            num_steps=self.num_steps,
            samples_per_step=self.samples_per_step,
            test_samples=self.test_samples,
            schedule=self.schedule,
            drift_pattern=self.drift_pattern,
            drift_step=self.drift_step,
            dirichlet_alpha=self.dirichlet_alpha,
            data_dir=self.data_dir,
            dataset=self.dataset,
            partition=self.partition,
            disjoint=self.disjoint,
            classes_per_client=self.classes_per_client,
            test_fraction=self.test_fraction,
            num_classes=self.num_classes,
            input_shape=self.input_shape,
            label_column=self.label_column,
            feature_columns=self.feature_columns,
            partition_column=self.partition_column,
            dataset_args=self.dataset_args,
            remap_labels=self.remap_labels,
            oversample=self.oversample,
        )


_TRAIN_KEYS = {f.name for f in dataclasses.fields(TrainConfig)}


def parse_run_config(run_config: dict[str, ConfigValue]) -> RunConfig:
    """Type and validate a flat run config (defaults filled in from pyproject.toml)."""
    values = merge_overrides(default_run_config(), dict(run_config)) if _needs_defaults(
        run_config
    ) else dict(run_config)
    kwargs: dict[str, Any] = {}
    train: dict[str, Any] = {}
    known = {f.name for f in dataclasses.fields(RunConfig)}
    for key, value in values.items():
        name = key.replace("-", "_").replace(".", "_")
        if name in _TRAIN_KEYS:
            train[name] = value
        elif name in known:
            kwargs[name] = value
        # keys of strategies added later live in ``raw`` only
    kwargs["train"] = TrainConfig(**train)
    cfg = RunConfig(**kwargs, raw=values)
    validate(cfg)
    return cfg


def _needs_defaults(run_config: dict[str, ConfigValue]) -> bool:
    # ``flwr run`` already merged the defaults; the Python API passes {} or a partial dict.
    return not set(default_run_config()).issubset(run_config)


def validate(cfg: RunConfig) -> None:
    """Raise ConfigError naming the first invalid key."""
    t = cfg.train
    checks: list[tuple[bool, str]] = [
        (cfg.rounds_per_step >= 1, f"rounds-per-step must be >= 1, got {cfg.rounds_per_step}"),
        (cfg.num_steps >= 0, f"num-steps must be >= 0 (0 = scenario default), got {cfg.num_steps}"),
        (cfg.num_clients >= 0, f"num-clients must be >= 0 (0 = scenario default), got {cfg.num_clients}"),
        (cfg.num_clients <= MAX_CLIENTS,
         f"num-clients = {cfg.num_clients} is more than the {MAX_CLIENTS:,} clients a run can "
         "hold (every client has its own data stream and record)"),
        (cfg.samples_per_step >= 0, f"samples-per-step must be >= 0, got {cfg.samples_per_step}"),
        (cfg.test_samples >= 0, f"test-samples must be >= 0, got {cfg.test_samples}"),
        (max(cfg.samples_per_step, cfg.test_samples) <= MAX_SAMPLES,
         f"samples-per-step and test-samples must be at most {MAX_SAMPLES:,} per client and "
         f"step (the data of a step are generated in memory), got {cfg.samples_per_step:,} and "
         f"{cfg.test_samples:,}"),
        (cfg.window >= 1, f"window must be >= 1 step, got {cfg.window}"),
        (cfg.hidden >= 0, f"hidden must be >= 0, got {cfg.hidden}"),
        (cfg.model in ("", "mlp", "cnn") or is_import_path(cfg.model),
         f"model must be '', 'mlp', 'cnn' or 'package.module:callable' (your own model), got "
         f"{cfg.model!r}"),
        (is_device_name(cfg.device), f"device must be {DEVICE_RULE}, got {cfg.device!r}"),
        (cfg.protocol in ("scenario", "none"),
         f"protocol must be 'scenario' or 'none', got {cfg.protocol!r}"),
        (cfg.init in ("torch", "normal"), f"init must be 'torch' or 'normal', got {cfg.init!r}"),
        (t.optimizer in ("adam", "sgd"), f"optimizer must be 'adam' or 'sgd', got {t.optimizer!r}"),
        (t.optimizer_state in ("round", "step"),
         f"optimizer-state must be 'round' or 'step', got {t.optimizer_state!r}"),
        (_positive(t.lr), f"lr must be a positive finite number, got {t.lr}"),
        (0.0 <= t.momentum < 1.0, f"momentum must be in [0, 1), got {t.momentum}"),
        (_finite_nonneg(t.weight_decay), f"weight-decay must be a finite number >= 0, got "
                                         f"{t.weight_decay}"),
        (t.local_steps >= 0, f"local-steps must be >= 0, got {t.local_steps}"),
        (t.local_steps > 0 or t.local_epochs >= 1,
         f"local-epochs must be >= 1 when local-steps = 0, got {t.local_epochs}"),
        (t.batch_size >= 1, f"batch-size must be >= 1, got {t.batch_size}"),
        (_finite_nonneg(t.prox_mu), f"prox-mu must be a finite number >= 0, got {t.prox_mu}"),
        (0.0 < cfg.fraction_train <= 1.0, f"fraction-train must be in (0, 1], got {cfg.fraction_train}"),
        (0.0 < cfg.fraction_evaluate <= 1.0,
         f"fraction-evaluate must be in (0, 1], got {cfg.fraction_evaluate}"),
        (cfg.eval_every >= 1, f"eval-every must be >= 1, got {cfg.eval_every}"),
        (cfg.num_clusters >= 1, f"num-clusters (K) must be >= 1, got {cfg.num_clusters}"),
        (cfg.min_nodes >= 0, f"min-nodes must be >= 0, got {cfg.min_nodes}"),
        (_finite_nonneg(cfg.node_wait_s),
         f"node-wait-s must be a finite number >= 0, got {cfg.node_wait_s}"),
        (_positive(cfg.round_timeout), f"round-timeout must be > 0, got {cfg.round_timeout}"),
        (_finite_nonneg(cfg.update_norm_bound),
         f"update-norm-bound must be a finite number >= 0, got {cfg.update_norm_bound}"),
        (cfg.robust_aggregation in ROBUST_AGGREGATIONS,
         f"robust-aggregation must be one of {', '.join(ROBUST_AGGREGATIONS)}, got "
         f"{cfg.robust_aggregation!r}"),
        (0.0 <= cfg.trim_fraction < 0.5, f"trim-fraction must be in [0, 0.5), got {cfg.trim_fraction}"),
        (cfg.checkpoint_every >= 0, f"checkpoint-every must be >= 0, got {cfg.checkpoint_every}"),
        (_finite_nonneg(cfg.checkpoint_every_s),
         f"checkpoint-every-s must be a finite number >= 0, got {cfg.checkpoint_every_s}"),
        (0 <= cfg.seed <= MAX_SEED, f"seed must be an integer in 0..{MAX_SEED} (2^32 - 1), got "
                                    f"{cfg.seed}"),
        (cfg.data_seed <= MAX_SEED,
         f"data-seed must be negative (= seed) or an integer in 0..{MAX_SEED} (2^32 - 1), got "
         f"{cfg.data_seed}"),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)
    _validate_data_keys(cfg)
    if cfg.schedule and not Path(cfg.schedule).is_file():
        from fedcluster_app.core.data.schedules import bundled_schedule_names

        if cfg.schedule not in bundled_schedule_names():
            raise ConfigError(
                f"schedule file not found: {cfg.schedule} (or name a bundled FedDrift "
                f"schedule: {', '.join(bundled_schedule_names())})"
            )


def _validate_data_keys(cfg: RunConfig) -> None:
    """The user-data and partition keys (their meaning: ``core/data/sources.py``,
    ``core/data/partition.py``); whether the scenario reads them is checked when it is built."""
    from fedcluster_app.core.data.partition import PARTITIONS
    from fedcluster_app.core.data.pools import input_shape_arg
    from fedcluster_app.core.data.sources import parse_dataset_spec
    from fedcluster_app.core.data.tables import column_names, dataset_args

    if cfg.partition not in ("", *PARTITIONS):
        raise ConfigError(f"partition must be '' (the scenario's default), "
                          f"{', '.join(repr(p) for p in PARTITIONS)}, got {cfg.partition!r}")
    if cfg.classes_per_client < 1:
        raise ConfigError(f"classes-per-client must be >= 1, got {cfg.classes_per_client}")
    if not 0.0 < cfg.test_fraction < 1.0:
        raise ConfigError(f"test-fraction must be in (0, 1), got {cfg.test_fraction}")
    if cfg.num_classes < 0 or cfg.num_classes == 1:
        raise ConfigError(f"num-classes must be 0 (from the data) or >= 2, got {cfg.num_classes}")
    for check, value in ((parse_dataset_spec, cfg.dataset), (input_shape_arg, cfg.input_shape),
                         (column_names, cfg.feature_columns), (dataset_args, cfg.dataset_args)):
        if str(value).strip():
            try:
                check(value)
            except ValueError as exc:  # the message names the key
                raise ConfigError(str(exc)) from None


def _positive(x: float) -> bool:
    return math.isfinite(x) and x > 0


def _finite_nonneg(x: float) -> bool:
    return math.isfinite(x) and x >= 0


def section(raw: dict[str, ConfigValue], prefix: str) -> dict[str, ConfigValue]:
    """The keys of one algorithm's table, e.g. ``[tool.flwr.app.config.feddrift]`` -> ``delta``.

    Flower flattens nested tables to ``feddrift.delta``; strategies read their own table with
    this and validate it in their constructor, so a bad value fails before the first round.
    """
    head = f"{prefix}."
    return {k[len(head):]: v for k, v in raw.items() if k.startswith(head)}
