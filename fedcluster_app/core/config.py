"""Run configuration: the flat ``run_config`` dict Flower hands both apps, typed and validated.

Every key is declared once, as a field of one of the groups below (what runs, the data, the
model, the one training recipe every strategy trains with, the federation, defences against
poisoned replies, results): its default, what it allows and a one-line description. The
``[tool.flwr.app.config]`` table of ``pyproject.toml``, which ``flwr run`` reads, is generated
from them (:func:`run_config_table`; a test compares). The in-process engine and the CLI read
the defaults from there too, and every value is checked before the first round (the fields'
bounds, then a few rules across keys), so a bad setting fails with a message that names the
key instead of somewhere inside round 7.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedcluster_app.core.hparams import (  # noqa: F401  (ConfigError & co. are imported from here)
    MOVED_KEYS,
    ConfigError,
    ConfigValue,
    HParams,
    moved_message,
    param,
    section,
    toml_value,
)
from fedcluster_app.core.limits import (  # noqa: F401  (sizes beyond which a run cannot work)
    MAX_CLASSES,
    MAX_CLIENTS,
    MAX_CLUSTERS,
    MAX_EPOCHS,
    MAX_HIDDEN,
    MAX_ITERATIONS,
    MAX_ROUNDS,
    MAX_SAMPLES,
    MAX_STEPS,
    check_client_classes,
    check_client_steps,
)
from fedcluster_app.core.plugins import is_import_path
from fedcluster_app.core.project_files import presets_dir, project_file
from fedcluster_app.core.user_text import read_value, suggest

# checked here, resolved to a torch device by models.resolve_device (this module avoids torch)
DEVICE_RULE = "'auto', 'cpu', 'cuda' or 'cuda:N'"
_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


def is_device_name(device: str) -> bool:
    return bool(_DEVICE.match(str(device)))


MAX_SEED = 2**32 - 1        # the range of seeds NumPy's and PyTorch's users know

#: robust-aggregation values: none (the weighted mean), or Flower's coordinate-wise rules
ROBUST_AGGREGATIONS = ("none", "median", "trimmed-mean")

#: where else a run may be logged (run-config key tracking; core/results/tracking.py)
TRACKING_BACKENDS = ("mlflow", "tensorboard", "csv")




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
        if key not in base and key in MOVED_KEYS:
            raise ConfigError(moved_message(key, MOVED_KEYS[key]))
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


# ----------------------------------------------------------------------------- the groups
@dataclass(frozen=True)
class RunSettings(HParams):
    """What runs: the algorithm, the scenario, the seeds and the rounds."""

    strategy: str = param("ifca", "algorithm (fedcluster list strategies)")
    scenario: str = param("mixture-swap", "data + drift scenario (fedcluster list scenarios)")
    protocol: str = param("scenario", "scenario: keys left at their defaults take the scenario's "
                          "paper protocol (fedcluster list protocols) | none",
                          choices=("scenario", "none"))
    seed: int = param(0, "model init, sampling and minibatch randomness", ge=0, le=MAX_SEED)
    data_seed: int = param(-1, "data generation seed; -1 = same as seed", ge=-1, le=MAX_SEED)
    out_dir: str = param("", "results directory; \"\" = runs/<strategy>-<scenario>-s<seed>")
    rounds_per_step: int = param(5, "communication rounds per time step", ge=1,
                                 le=MAX_ROUNDS)


@dataclass(frozen=True)
class DataSettings(HParams):
    """The time steps and the data, everything the scenario is built from.

    ``0`` / ``""`` leave a setting to the scenario."""

    num_steps: int = param(0, "0 = the scenario's number of time steps", ge=0, le=MAX_STEPS)
    num_clients: int = param(0, f"0 = the scenario's number of clients (at most "
                             f"{MAX_CLIENTS:,}: each has its own data stream and record)",
                             ge=0, le=MAX_CLIENTS)
    samples_per_step: int = param(0, "training samples per client and step; 0 = scenario "
                                  "default", ge=0, le=MAX_SAMPLES)
    test_samples: int = param(0, "test samples per client and step; 0 = scenario default",
                              ge=0, le=MAX_SAMPLES)
    schedule: str = param("", "path of a FedDrift .cp concept matrix that replaces the "
                          "scenario's")
    drift_pattern: str = param("", "\"\" = scenario's own | none | sudden | incremental | "
                               "recurring | staggered")
    drift_step: int = param(0, "first drifted step for drift-pattern; 0 = scenario default", ge=0,
                            le=MAX_STEPS)
    dirichlet_alpha: float = param(0.0, "label skew across clients for pool datasets; 0 = "
                                   "scenario default", ge=0, allow_inf=True)
    data_dir: str = param("", "local directory of torchvision datasets (mnist-*, fmnist-*, "
                          "cifar10-*)")
    dataset: str = param("", "your data for dataset-*: npz:PATH | csv:PATH | parquet:PATH | "
                         "imagefolder:PATH | hf-disk:PATH | river:<Table> | "
                         "package.module:callable")
    partition: str = param("", "how a pool is shared: \"\" = scenario default | iid | dirichlet "
                           "(dirichlet-alpha) | pathological")
    disjoint: bool = param(False, "true = clients draw only from disjoint shards of the train "
                           "pool (Flower Datasets partitioners)")
    classes_per_client: int = param(2, "classes of each client with partition = pathological",
                                    ge=1, le=MAX_CLASSES)
    test_fraction: float = param(0.25, "share of a dataset without a test split held out "
                                 "(stratified) for testing", gt=0, lt=1)
    num_classes: int = param(0, "classes of dataset when the server cannot read it; 0 = from "
                             "the data", ge=0, le=MAX_CLASSES)
    input_shape: str = param("", "input shape of dataset when the server cannot read it, "
                             "\"1,28,28\" or \"18\"; \"\" = from the data")
    label_column: str = param("", "csv: / parquet: / hf-disk: / a DataFrame: the column of the "
                              "class labels; \"\" = the one column named label, labels, y, "
                              "target, class or fine_label (README, Your own dataset)")
    feature_columns: str = param("", "the input columns, comma-separated: "
                                 "\"sepal_length,sepal_width\"; \"\" = every column but the label "
                                 "and partition columns (one number per column), or the one "
                                 "column of images or arrays")
    partition_column: str = param("", "a column naming the user or device of each row: each "
                                  "distinct value is one client's rows (num-clients = 0: one "
                                  "client per value)")
    dataset_args: str = param("", "keyword arguments of a package.module:callable dataset, "
                              "comma-separated key=value (values as in --set): "
                              "\"path=data/iris.csv,rows=100\"")
    remap_labels: bool = param(False, "false = refuse labels that are not the integers 0..C-1 "
                               "with every class present; true = number the distinct labels "
                               "0..C-1 in sorted order (logged)")
    oversample: bool = param(False, "false = a client whose pool (or shard) holds fewer rows "
                             "than samples-per-step / test-samples uses each row once and "
                             "reports that count; true = draw that many with replacement")

    def check(self) -> None:
        if self.num_classes == 1:
            raise ConfigError("num-classes must be 0 (from the data) or >= 2, got 1")
        _check_data_keys(self)


@dataclass(frozen=True)
class ModelSettings(HParams):
    """The model, where clients train it and on how much of their past."""

    model: str = param("", "\"\" = scenario's choice | mlp | cnn | package.module:callable (your "
                       "own: README, Bring your own)")
    hidden: int = param(0, "MLP hidden width; 0 = scenario default", ge=0, le=MAX_HIDDEN)
    init: str = param("torch", "initial weights: torch (PyTorch's defaults) | normal "
                      "(N(0, 1/fan_in), biases 0)", choices=("torch", "normal"))
    device: str = param("auto", "where clients train: auto (a GPU if the process sees one, else "
                        "the CPU) | cpu | cuda | cuda:N")
    batch_clients: bool = param(True, "the in-process engine trains a round's clients as one "
                                "batched program (equal up to float rounding); false = one "
                                "client after the other")
    deterministic: bool = param(True, "on a GPU: cuDNN's deterministic algorithms, so a seed "
                                "repeats bit for bit; false = its fastest ones (batched CNN "
                                "rounds up to 2.3x faster on an H200, docs/operations/performance.md)")
    window: int = param(1, "past steps of data a client trains on (1 = newest only)", ge=1,
                        le=MAX_STEPS)

    def check(self) -> None:
        if not (self.model in ("", "mlp", "cnn") or is_import_path(self.model)):
            raise ConfigError(f"model must be '', 'mlp', 'cnn' or 'package.module:callable' "
                              f"(your own model), got {self.model!r}")
        if not is_device_name(self.device):
            raise ConfigError(f"device must be {DEVICE_RULE}, got {self.device!r}")


@dataclass(frozen=True)
class TrainConfig(HParams):
    """The one training recipe every strategy's clients train with locally in a round.

    A family adds only what its paper defines on top (its own table); a message may change
    only the keys of ``wire.TRAIN_OVERRIDES`` for its round."""

    optimizer: str = param("adam", "adam (with amsgrad) | sgd", choices=("adam", "sgd"))
    lr: float = param(0.01, "learning rate of the local optimizer", gt=0)
    momentum: float = param(0.0, "SGD momentum", ge=0, lt=1)
    weight_decay: float = param(0.0, "L2 weight decay of the local optimizer", ge=0)
    local_steps: int = param(20, "minibatch steps per round; 0 = use local-epochs", ge=0,
                             le=MAX_ITERATIONS)
    local_epochs: int = param(1, "epochs per round when local-steps = 0", ge=0, le=MAX_EPOCHS)
    batch_size: int = param(50, "minibatch size", ge=1, le=MAX_SAMPLES)
    drop_last: bool = param(False, "local-epochs mode: skip each epoch's last partial batch")
    prox_mu: float = param(0.0, "FedProx proximal term; 0 = FedAvg", ge=0)
    optimizer_state: str = param("round", "round: a fresh optimizer every round | step: each "
                                 "client keeps its optimizer's state per model through a time "
                                 "step (the FedDrift authors' clients)",
                                 choices=("round", "step"))

    def check(self) -> None:
        if self.local_steps == 0 and self.local_epochs < 1:
            raise ConfigError(f"local-epochs must be >= 1 when local-steps = 0, got "
                              f"{self.local_epochs}")


@dataclass(frozen=True)
class FederationSettings(HParams):
    """Who takes part in a round, how long the server waits, and the clusters."""

    fraction_train: float = param(1.0, "fraction of each cluster's clients sampled for training",
                                  gt=0, le=1)
    fraction_evaluate: float = param(1.0, "fraction of clients evaluated per round", gt=0, le=1)
    eval_every: int = param(1, "evaluate every N rounds (the last round is always evaluated)",
                            ge=1)
    score_next_step: bool = param(False, "true = every protocol also logs accuracy_current "
                                  "(every evaluated round: the current step's test split) and "
                                  "accuracy_next (end of step t: the same models on step t+1's "
                                  "test split, before they adapt); the last round of each step "
                                  "is then always evaluated")
    balanced_test: bool = param(False, "true (with score-next-step) = the same models are also "
                                "scored on a class-balanced test set of each client's concept "
                                "(every class equally often, its label map and input shift): "
                                "balanced_accuracy_current / balanced_accuracy_next, the global "
                                "accuracy beside the personalised one; class-based scenarios")
    num_clusters: int = param(2, "K for ifca", ge=1, le=MAX_CLUSTERS)
    min_nodes: int = param(0, "wait for this many nodes; 0 = the scenario's number of clients",
                           ge=0, le=MAX_CLIENTS)
    node_wait_s: float = param(10.0, "how long to wait for min-nodes before starting with fewer",
                               ge=0)
    round_timeout: float = param(600.0, "seconds a round may take: one deadline for all its "
                                 "exchanges; an instruction expires with it and a later reply "
                                 "is dropped", gt=0)
    bind_client_ids: bool = param(False, "true (with SuperNode authentication, where a node id "
                                  "is its device's key): the first node that claims a client "
                                  "id owns it for the run, also after a resume; another node "
                                  "claiming it is refused, and personal state goes only to its "
                                  "owner")

    def check(self) -> None:
        if self.balanced_test and not self.score_next_step:
            raise ConfigError("balanced-test = true scores the models of the common scoring "
                              "rule and would be ignored without it: set score-next-step = true")


@dataclass(frozen=True)
class DefenceSettings(HParams):
    """Defences against poisoned replies (docs/operations/reliability.md)."""

    update_norm_bound: float = param(10.0, "an update (returned - sent model) longer than this x "
                                     "the median update of the same model in the exchange (3 or "
                                     "more) is scaled down to it; 0 = off", ge=0)
    robust_aggregation: str = param("none", "none (num-examples-weighted mean) | median | "
                                    "trimmed-mean: coordinate-wise, for the averaging of client "
                                    "updates", choices=ROBUST_AGGREGATIONS)
    trim_fraction: float = param(0.1, "trimmed-mean: share of the values cut at each end, per "
                                 "coordinate", ge=0, lt=0.5)


@dataclass(frozen=True)
class ResultSettings(HParams):
    """Results and state: checkpoints, resuming, what is written."""

    checkpoint_every: int = param(0, "also write a checkpoint every N rounds; 0 = by time only",
                                  ge=0)
    checkpoint_every_s: float = param(30.0, "write a checkpoint at the end of the first round "
                                      "that ends this many seconds after the last one (and on "
                                      "SIGINT/SIGTERM, and at the end); 0 = off", ge=0)
    checkpoint_client_state: bool = param(True, "the checkpoint also keeps every client's "
                                          "context.state (personal models, ...), put back on "
                                          "resume; false = it stays on the devices only")
    export: bool = param(False, "true = at the end, write every cluster model (state_dicts, "
                         "TorchScript) and a manifest to out-dir/export (docs/guides/export.md), as "
                         "`fedcluster export` does")
    resume_from: str = param("", "checkpoint file or run directory to resume from")
    overwrite: bool = param(False, "true = a new run may replace the finished run in out-dir "
                            "(refused otherwise)")
    plot: bool = param(True, "write plot.png at the end of the run")
    progress: bool = param(True, "log a line per round")
    tracking: str = param("", "where else the run is logged, comma-separated: mlflow | "
                          "tensorboard | csv, e.g. \"mlflow,tensorboard\" (the extra "
                          "fedcluster[tracking]; README, Follow a run in MLflow / TensorBoard); "
                          "\"\" = only the run's own files")
    tracking_uri: str = param("", "mlflow: its tracking URI (http://HOST:PORT, sqlite:///PATH, "
                              "...); \"\" = a local store in the run directory "
                              "(sqlite:///<out-dir>/mlflow.db, no server)")

    @property
    def tracking_backends(self) -> tuple[str, ...]:
        """The backends ``tracking`` names, in its order."""
        return tracking_backends(self.tracking)

    def check(self) -> None:
        """Names only: whether a backend is installed and its URI reachable is the server's
        question (``results.tracking.check``), since clients never log to it."""
        for name in self.tracking_backends:
            if name not in TRACKING_BACKENDS:
                raise ConfigError(f"tracking: unknown backend {name!r}"
                                  f"{suggest(name, list(TRACKING_BACKENDS))}; valid: "
                                  f"{', '.join(TRACKING_BACKENDS)} (comma-separated, e.g. "
                                  f"\"mlflow,tensorboard\"), or \"\" for none")
        if self.tracking_uri.strip() and "mlflow" not in self.tracking_backends:
            raise ConfigError(f"tracking-uri = {self.tracking_uri!r} is MLflow's and would be "
                              f"ignored: tracking = {self.tracking!r} does not name mlflow")


#: the groups, in the order of pyproject.toml; the training recipe is ``RunConfig.train``
GROUPS: tuple[type[HParams], ...] = (RunSettings, DataSettings, ModelSettings, TrainConfig,
                                     FederationSettings, DefenceSettings, ResultSettings)


@dataclass(frozen=True)
class RunConfig(ResultSettings, DefenceSettings, FederationSettings, ModelSettings, DataSettings,
                RunSettings):
    """Everything a run needs, validated: every group's keys as attributes (names with ``_``),
    the training recipe as ``train``, and every key as given (strategies' tables too) in
    ``raw``."""

    train: TrainConfig = field(default_factory=TrainConfig)
    raw: dict[str, ConfigValue] = field(default_factory=dict, compare=False)

    def check(self) -> None:
        for group in (DataSettings, ModelSettings, FederationSettings, ResultSettings):
            group.check(self)
        # products of sizes given here, before the scenario builds arrays of them (the rest,
        # with the scenario's own sizes, once it exists: experiment.py)
        if self.num_clients and self.num_steps:
            check_client_steps(self.num_clients, self.num_steps)
        if self.num_clients and self.num_classes:
            check_client_classes(self.num_clients, self.num_classes)
        if self.schedule and not Path(self.schedule).is_file():
            from fedcluster_app.core.data.schedules import bundled_schedule_names

            if self.schedule not in bundled_schedule_names():
                raise ConfigError(f"schedule file not found: {self.schedule} (or name a bundled "
                                  f"FedDrift schedule: {', '.join(bundled_schedule_names())})")

    @property
    def effective_data_seed(self) -> int:
        return self.seed if self.data_seed < 0 else self.data_seed

    @property
    def data(self) -> DataSettings:
        """The data settings: what the scenario is built from."""
        return DataSettings(**{f.name: getattr(self, f.name) for f in _DATA_FIELDS})


_DATA_FIELDS = dataclasses.fields(DataSettings)


def run_config_table() -> str:
    """``[tool.flwr.app.config]``'s own keys, as pyproject.toml holds them: each group under
    its docstring's first line, each key with its default, description and what it allows
    (generated from the groups, never by hand)."""
    lines = ["[tool.flwr.app.config]"]
    for group in GROUPS:
        lines.append("# " + group.__doc__.split("\n")[0].rstrip(".").lower())
        for key, default, allowed, doc in group.describe():
            rule = "" if allowed in ("a string", "true or false") else f" [{allowed}]"
            lines.append(f"{f'{key} = {toml_value(default)}':<31} # {doc}{rule}")
    return "\n".join(lines) + "\n"


def tracking_backends(value: str) -> tuple[str, ...]:
    """``"mlflow, tensorboard"`` -> ``("mlflow", "tensorboard")``: the comma-separated names
    of the run-config key ``tracking`` (a run config holds no lists), each once."""
    names = [n.strip().lower() for n in str(value).split(",")]
    return tuple(dict.fromkeys(n for n in names if n))


def parse_run_config(run_config: dict[str, ConfigValue]) -> RunConfig:
    """Type and validate a flat run config (defaults filled in from pyproject.toml)."""
    values = merge_overrides(default_run_config(), dict(run_config)) if _needs_defaults(
        run_config
    ) else dict(run_config)
    own = {f.name: f.name.replace("_", "-") for f in dataclasses.fields(RunConfig)}
    kwargs = {name: values[key] for name, key in own.items() if key in values}
    train = {f.name: values[k] for f in dataclasses.fields(TrainConfig)
             if (k := f.name.replace("_", "-")) in values}
    # keys of strategies (and of a user's strategy) live in ``raw`` only
    return RunConfig(**kwargs, train=TrainConfig(**train), raw=values)


def _needs_defaults(run_config: dict[str, ConfigValue]) -> bool:
    # ``flwr run`` already merged the defaults; the Python API passes {} or a partial dict.
    return not set(default_run_config()).issubset(run_config)


def _check_data_keys(cfg: DataSettings) -> None:
    """The user-data and partition keys (their meaning: ``core/data/sources.py``,
    ``core/data/partition.py``); whether the scenario reads them is checked when it is built."""
    from fedcluster_app.core.data.partition import PARTITIONS
    from fedcluster_app.core.data.pools import input_shape_arg
    from fedcluster_app.core.data.sources import parse_dataset_spec
    from fedcluster_app.core.data.tables import column_names, dataset_args

    if cfg.partition not in ("", *PARTITIONS):
        raise ConfigError(f"partition must be '' (the scenario's default), "
                          f"{', '.join(repr(p) for p in PARTITIONS)}, got {cfg.partition!r}")
    for check, value in ((parse_dataset_spec, cfg.dataset), (input_shape_arg, cfg.input_shape),
                         (column_names, cfg.feature_columns), (dataset_args, cfg.dataset_args)):
        if str(value).strip():
            try:
                check(value)
            except ValueError as exc:  # the message names the key
                raise ConfigError(str(exc)) from None

