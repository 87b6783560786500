"""The pool arguments of a scenario (the user's ``dataset`` and how to read it, ``partition``,
``disjoint``, ``oversample``, ...) and the pools a user's dataset or a River table makes.

A pool family (images, ``dataset-*``, River's tables) draws each (client, step) sample from a
train pool and a test pool; these arguments say where the pool comes from (``sources.py``)
and how it is shared across clients (``partition.py``). Other scenarios refuse them.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fedcluster_app.core.data.catalogue import _DEFS, METADATA_ONLY, ScenarioDef, reads_dataset
from fedcluster_app.core.data.drift import ClassRealisation, ImageSource


@dataclass(frozen=True)
class PoolSpec:
    """The pool-only arguments of a scenario (user data, partition), resolved and checked
    (``pool_args``): part of a scenario's :class:`~fedcluster_app.core.data.scenarios.ScenarioSpec`.
    The defaults are the "scenario default" of each argument, and what a scenario that is not
    a pool family holds: ``classes_per_client`` is resolved only for the pathological partition
    (0 otherwise), ``test_fraction`` only for a user's pool (0.0 otherwise)."""

    dataset: str = ""
    partition: str = ""
    disjoint: bool = False
    classes_per_client: int = 0
    test_fraction: float = 0.0
    num_classes: int = 0
    input_shape: str = ""
    label_column: str = ""
    feature_columns: str = ""
    partition_column: str = ""
    dataset_args: str = ""
    remap_labels: bool = False
    oversample: bool = False


# the pool-only arguments and their "scenario default" values
POOL_DEFAULTS = dataclasses.asdict(PoolSpec())
#: the arguments that say how to read the user's dataset (only ``dataset-*`` reads them)
READ_ARGS = ("label_column", "feature_columns", "partition_column", "dataset_args",
             "remap_labels")
_FLAGS = ("disjoint", "remap_labels", "oversample")


def nonneg_int(key: str, value: object) -> int:
    if isinstance(value, float) and value.is_integer():  # e.g. 10.0 from a loose config
        value = int(value)
    try:
        v = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(f"{key} must be an integer, got {value!r}") from None
    if v < 0:
        raise ValueError(f"{key} must be >= 0 (0 = the scenario's default), got {v}")
    return v


def _dataset_scenarios() -> str:
    return ", ".join(n for n in sorted(_DEFS) if reads_dataset(n))


def _pool_scenarios() -> str:
    return ", ".join(sorted({n.rsplit("-", 1)[0] + "-*" for n, d in _DEFS.items()
                             if d.pool}))


def _key(name: str) -> str:
    return name.replace("_", "-")


def check_not_pool(key: str, args: dict) -> None:
    """A registered scenario reads none of the pool arguments: refuse any that is set."""
    if str(args["dataset"]).strip():
        raise ValueError(f"scenario {key} does not read the run-config key `dataset`; only "
                         f"{_dataset_scenarios()} do")
    for name in ("partition", "disjoint", "num_classes", "input_shape", *READ_ARGS,
                 "oversample"):
        if _pool_value(name, args[name]) != POOL_DEFAULTS[name]:
            which = (_dataset_scenarios() if name in READ_ARGS else
                     f"the pool families ({_pool_scenarios()})")
            raise ValueError(f"scenario {key} does not read `{_key(name)}`; it applies to "
                             f"{which}")


def _pool_value(name: str, value: object) -> object:
    """One pool argument in its canonical type (the run config's strings, bools, numbers)."""
    if name in _FLAGS:
        if isinstance(value, str) and value.strip().lower() in ("", "false", "0", "no"):
            return False
        if isinstance(value, str) and value.strip().lower() in ("true", "1", "yes"):
            return True
        if isinstance(value, (bool, int, np.bool_)):
            return bool(value)
        raise ValueError(f"{_key(name)} must be true or false, got {value!r}")
    if name == "feature_columns":
        from fedcluster_app.core.data.tables import column_names

        return ",".join(column_names(value))
    if name == "dataset_args":
        from fedcluster_app.core.data.tables import dataset_args

        dataset_args(value)   # checked here, read as given
        return str(value).strip()
    if name in ("classes_per_client", "num_classes"):
        return nonneg_int(name, 0 if value == "" else value)
    if name == "test_fraction":
        try:
            return float(value or 0.0)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise ValueError(f"test_fraction must be a number in (0, 1), got {value!r}") from None
    if name == "input_shape":
        return ",".join(str(v) for v in input_shape_arg(value))
    return str(value).strip()


def input_shape_arg(value: object) -> tuple[int, ...]:
    """``"1,28,28"`` (images: channels, height, width) or ``"18"`` (features) as a tuple;
    ``""`` = ``()`` (from the data)."""
    if isinstance(value, (tuple, list)):
        parts = [str(v) for v in value]
    else:
        text = str(value).strip().strip("()[]")
        parts = [v for v in text.replace("x", ",").split(",") if v.strip()] if text else []
    try:
        shape = tuple(int(v) for v in parts)
    except ValueError:
        shape = ()
        parts = ["?"]
    if parts and (len(shape) not in (1, 3) or min(shape) < 1):
        raise ValueError(f"input-shape must be \"C,H,W\" (images) or \"F\" (features) with "
                         f"positive sizes, e.g. \"1,28,28\" or \"18\" (\"\" = from the data), "
                         f"got {value!r}")
    return shape


def pool_args(d: ScenarioDef, args: dict) -> PoolSpec:
    """The canonical pool arguments of ``d``, checked (``args``: every name of
    ``POOL_DEFAULTS``, as the user gave it)."""
    v = {name: _pool_value(name, args[name]) for name in POOL_DEFAULTS}
    if d.data == "dataset":
        if not v["dataset"]:
            raise ValueError(f"scenario {d.name} reads your data: set the run-config key "
                             f"`dataset` (npz:PATH, imagefolder:PATH, hf-disk:PATH, "
                             f"river:<Table> or package.module:callable)")
        from fedcluster_app.core.data.sources import parse_dataset_spec

        kind, ref = parse_dataset_spec(str(v["dataset"]))
        v["dataset"] = ref if kind == "module" else f"{kind}:{ref}"
    elif v["dataset"]:
        raise ValueError(f"scenario {d.name} does not read the run-config key `dataset` (its data "
                         f"are its own); the scenarios that read it are {_dataset_scenarios()}")
    elif v["num_classes"] or v["input_shape"]:
        raise ValueError(f"num-classes and input-shape describe the data of {_dataset_scenarios()}"
                         f"; scenario {d.name} does not read them (leave them 0 and \"\")")
    if d.data != "dataset":
        for name in READ_ARGS:
            if v[name] != POOL_DEFAULTS[name]:
                raise ValueError(f"`{_key(name)}` says how to read your dataset, which only "
                                 f"{_dataset_scenarios()} read; scenario {d.name}'s data are its "
                                 f"own (leave it at its default)")
    if v["oversample"] and not d.pool:
        raise ValueError(f"scenario {d.name} generates its data: oversample applies to the pool "
                         f"families ({_pool_scenarios()}), whose pools may be smaller than "
                         f"samples-per-step")
    if v["partition_column"] and (str(v["partition"]).strip() or v["disjoint"]):
        raise ValueError(f"partition-column = {v['partition_column']!r} gives each client its "
                         f"own rows; partition and disjoint would be ignored (leave them \"\" "
                         f"and false)")
    from fedcluster_app.core.data.partition import PARTITIONS

    part = str(v["partition"]).lower()
    if part and part not in PARTITIONS:
        raise ValueError(f"unknown partition {v['partition']!r}; valid: {', '.join(PARTITIONS)} "
                         f"(or \"\" for the scenario's default)")
    v["partition"] = part
    if (part or v["disjoint"]) and not (d.pool or (d.data == "mixture" and not
                                                         v["disjoint"])):
        raise ValueError(f"scenario {d.name} has no data pool: partition and disjoint apply to "
                         f"the pool families ({_pool_scenarios()}; a mixture takes partition "
                         f"without disjoint)")
    v["classes_per_client"] = (v["classes_per_client"] or 2) if part == "pathological" else 0
    if d.user_pool:
        tf = v["test_fraction"] or 0.25
        if not 0.0 < tf < 1.0:
            raise ValueError(f"test-fraction must be in (0, 1) (0 = 0.25), got {tf}")
        v["test_fraction"] = float(tf)
    else:
        v["test_fraction"] = 0.0
    return PoolSpec(**v)


@dataclass(frozen=True)
class PoolInfo:
    """What a user pool contributes to a scenario: its classes, input shape and (unless the
    process cannot read it) its data."""

    num_classes: int
    input_shape: tuple[int, ...]
    image: bool
    data: object | None  # sources.UserData


def read_options(pool: PoolSpec):
    """The arguments of ``READ_ARGS`` (how to read the user's dataset) as
    ``tables.ReadOptions``."""
    from fedcluster_app.core.data import tables

    return tables.ReadOptions(pool.label_column, tables.column_names(pool.feature_columns),
                              pool.partition_column, tables.dataset_args(pool.dataset_args),
                              bool(pool.remap_labels))


def user_pool_info(d: ScenarioDef, pool: PoolSpec, seed: int, data_dir: str) -> PoolInfo:
    """The pool of a user's dataset or a River table, read as ``pool`` says (unless this
    process cannot read it: ``data_dir = METADATA_ONLY``)."""
    import fedcluster_app.core.data.sources as sources

    read = read_options(pool)
    num_classes, input_shape = pool.num_classes, pool.input_shape
    spec = pool.dataset if d.data == "dataset" else "river:" + d.data.split(":", 1)[1]
    shape = input_shape_arg(input_shape)
    if data_dir == METADATA_ONLY and not sources.spec_is_readable(spec):
        if not (num_classes and shape):
            raise ValueError(
                f"scenario {d.name}: this process (the server of a deployment) cannot read "
                f"dataset {spec!r}; set the run-config keys num-classes and input-shape (e.g. "
                f"\"1,28,28\" or \"18\") so that it knows the model without the data")
        return PoolInfo(num_classes, shape, len(shape) == 3, None)
    data = sources.load_user_data(spec, seed, pool.test_fraction, read, num_classes)
    c = data.num_classes
    if num_classes:
        if num_classes < c:
            raise ValueError(f"num-classes = {num_classes}, but dataset {spec!r} has labels up to "
                             f"{c - 1}; expected num-classes >= {c} (0 = from the data)")
        c = num_classes
    if shape and shape != data.input_shape:
        raise ValueError(f"input-shape = {input_shape!r}, but dataset {spec!r} has inputs of "
                         f"shape {data.input_shape}; expected the same (\"\" = from the data)")
    return PoolInfo(c, data.input_shape, data.image, data)


def user_source(info: PoolInfo):
    """The train/test pools of a user pool (images or flat features)."""
    from fedcluster_app.core.data.generators import ImagePool
    from fedcluster_app.core.data.partition import FeaturePool, FeatureSource

    data = info.data
    if info.image:
        return ImageSource(ImagePool(data.x_train, data.y_train, info.num_classes, data.max_value),
                           ImagePool(data.x_test, data.y_test, info.num_classes, data.max_value))
    return FeatureSource(FeaturePool(data.x_train, data.y_train, info.num_classes),
                         FeaturePool(data.x_test, data.y_test, info.num_classes))


def partitioned(base_factory: Callable[[], ClassRealisation], partition: str, disjoint: bool,
                 num_clients: int, alpha: float, k: int, seed: int
                 ) -> Callable[[], ClassRealisation]:
    """The factory of ``base_factory``'s realisation shared across clients as ``partition`` and
    ``disjoint`` say (``partition.py``)."""
    def factory():
        from fedcluster_app.core.data.partition import partition_realisation

        return partition_realisation(base_factory(), partition, disjoint, num_clients, alpha, k,
                                     seed)
    return factory
