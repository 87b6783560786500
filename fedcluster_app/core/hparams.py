"""Typed settings: every group of run-config keys is declared once, as a frozen dataclass.

The run's own settings (``config.py``: what runs, the data, the model, the one training recipe,
the federation, defences, results) and every strategy's hyper-parameters are such classes:

    @dataclass(frozen=True)
    class FedDriftParams(HParams):
        delta: float = param(0.1, "drift and merge threshold (0-1 error units)", gt=0, le=1)
        loss: str = param("error", "loss of detection and distances", choices=("error", "cross-entropy"))

Each field's run-config key is its name with ``-`` for ``_`` (``key=`` when it differs, e.g. a
Python keyword). One routine, :func:`check_value`, validates every field of every class when an
instance is built, from a run-config table (:meth:`HParams.from_table`; the public API's
keywords become table entries through :meth:`HParams.key_for`) or from a message
(:meth:`HParams.from_message`, the client side). A bad value raises :class:`ConfigError`
naming the table, the key, the value and what is allowed; an unknown key lists the valid ones
and suggests the closest.
``[tool.flwr.app.config]`` of ``pyproject.toml`` is generated from these classes (a test
compares), so the two cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar, get_type_hints

from fedcluster_app.core.user_text import suggest

T = TypeVar("T", bound="HParams")
_TYPES = (bool, int, float, str)
ConfigValue = bool | int | float | str


class ConfigError(ValueError):
    """A run-config value is invalid; the message names the key."""


#: run-config keys that were replaced -> the key that sets the value now (declared by the
#: classes' ``moved``)
MOVED_KEYS: dict[str, str] = {}


def moved_message(key: str, new: str) -> str:
    return (f"{key} is no longer a run-config key: the shared training setting {new} sets it "
            f"now (every strategy trains with the run's one recipe; set {new.split()[0]} instead)")


def section(raw: Mapping[str, ConfigValue], prefix: str) -> dict[str, ConfigValue]:
    """The keys of one algorithm's table, e.g. ``[tool.flwr.app.config.feddrift]`` -> ``delta``.

    Flower flattens nested tables to ``feddrift.delta``; strategies read their own table with
    this and validate it in their constructor, so a bad value fails before the first round.
    """
    head = f"{prefix}."
    return {k[len(head):]: v for k, v in raw.items() if k.startswith(head)}


@functools.cache
def declared(cls: type) -> tuple[dataclasses.Field, ...]:
    """The fields of a settings class declared with :func:`param` (others, such as the run
    config's nested training recipe, are not run-config keys of their own)."""
    return tuple(f for f in dataclasses.fields(cls) if "doc" in f.metadata)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def param(default: ConfigValue, doc: str, *, ge: float | None = None, gt: float | None = None,
          le: float | None = None, lt: float | None = None, choices: tuple | None = None,
          key: str | None = None, allow_inf: bool = False, lower: bool = False) -> Any:
    """A hyper-parameter field: its default, a one-line description and what is allowed
    (bounds ``ge``/``gt``/``le``/``lt``, or ``choices``); ``allow_inf`` admits infinity,
    ``lower`` takes a string in any case."""
    meta = {"doc": doc, "ge": ge, "gt": gt, "le": le, "lt": lt, "choices": choices, "key": key,
            "allow_inf": allow_inf, "lower": lower}
    return dataclasses.field(default=default, metadata=meta)


def rule(meta: Mapping[str, Any], kind: type) -> str:
    """What a field allows, in words: "one of 'a', 'b'", "in (0, 1]", ">= 0", "an integer >= 1"."""
    if meta.get("choices"):
        return "one of " + ", ".join(repr(c) for c in meta["choices"])
    if kind is bool:
        return "true or false"
    if kind is str:
        return "a string"
    lo = next(((b, meta[k]) for k, b in (("ge", "["), ("gt", "(")) if meta.get(k) is not None), None)
    hi = next(((b, meta[k]) for k, b in (("le", "]"), ("lt", ")")) if meta.get(k) is not None), None)
    what = "an integer " if kind is int else ""
    if lo and hi:
        return f"{what}in {lo[0]}{_bound(lo[1])}, {_bound(hi[1])}{hi[0]}"
    if lo:
        return f"{what}{'>=' if lo[0] == '[' else '>'} {_bound(lo[1])}"
    if hi:
        return f"{what}{'<=' if hi[0] == ']' else '<'} {_bound(hi[1])}"
    return "an integer" if kind is int else "a number"


def _bound(x: float) -> str:
    """A bound as a reader writes it: 0.5, 1e-05, 100,000."""
    return f"{int(x):,}" if float(x).is_integer() and abs(x) >= 10_000 else f"{x:g}"


def check_value(where: str, value: Any, kind: type, meta: Mapping[str, Any]) -> ConfigValue:
    """``value`` as ``kind`` if the field allows it, else a ConfigError naming ``where``.

    Integral floats are accepted for integers (``10.0`` from a loose config) and integers for
    floats; booleans are never numbers; NaN is never allowed, infinity only with ``allow_inf``.
    """
    given = value

    def fail() -> ConfigError:
        return ConfigError(f"{where} must be {rule(meta, kind)}, got {given!r}")

    if kind is bool:
        if not isinstance(value, bool):
            raise fail()
    elif kind is int:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise fail()
        if isinstance(value, float):
            if not value.is_integer():
                raise fail()
            value = int(value)
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise fail()
        value = float(value)
        if math.isnan(value) or (math.isinf(value) and not meta.get("allow_inf")):
            raise fail()
    elif kind is str:
        if not isinstance(value, str):
            raise fail()
        if meta.get("lower"):
            value = value.lower()
    if meta.get("choices") is not None and value not in meta["choices"]:
        raise fail()
    bounds = (("ge", lambda v, b: v >= b), ("gt", lambda v, b: v > b),
              ("le", lambda v, b: v <= b), ("lt", lambda v, b: v < b))
    for name, ok in bounds:
        if meta.get(name) is not None and not ok(value, meta[name]):
            raise fail()
    return value


@dataclasses.dataclass(frozen=True)
class HParams:
    """Base of every strategy's hyper-parameters: a frozen dataclass of :func:`param` fields,
    validated when built. ``table`` is the run-config table the values come from (the
    strategy's name unless the class says otherwise)."""

    table: ClassVar[str] = ""
    #: keys this table once had, each with the run-config key that now sets it: refused,
    #: naming that key (a value set under the old name would otherwise be ignored)
    moved: ClassVar[dict[str, str]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.table:
            MOVED_KEYS.update({f"{cls.table}.{old}": new for old, new in cls.moved.items()})

    def __post_init__(self) -> None:
        hints = _hints(type(self))
        for f in declared(type(self)):
            kind = hints[f.name]
            if kind not in _TYPES:
                raise TypeError(f"{type(self).__name__}.{f.name}: hyper-parameters are bool, int, "
                                f"float or str, not {kind}")
            value = check_value(self.where(f), getattr(self, f.name), kind, f.metadata)
            object.__setattr__(self, f.name, value)
        self.check()

    def check(self) -> None:
        """Rules that involve several fields; raise ConfigError naming them."""

    # -- naming ----------------------------------------------------------------------------
    @classmethod
    def key_of(cls, f: dataclasses.Field) -> str:
        return f.metadata.get("key") or f.name.replace("_", "-")

    def where(self, f: dataclasses.Field | str) -> str:
        """``<table>.<key>``, the name a user sets it by."""
        key = f if isinstance(f, str) else self.key_of(f)
        return f"{self.table}.{key}" if self.table else key

    @classmethod
    def keys(cls) -> list[str]:
        return [cls.key_of(f) for f in declared(cls)]

    @classmethod
    def names(cls) -> list[str]:
        """The fields' Python names (keywords of the public API, beside the keys)."""
        return [f.name for f in declared(cls)]

    @classmethod
    def key_for(cls, name: str) -> str | None:
        """The run-config key of a field named by its Python name or by its key, else None."""
        for f in declared(cls):
            if name in (f.name, cls.key_of(f)):
                return cls.key_of(f)
        return None

    @classmethod
    def describe(cls) -> list[tuple[str, ConfigValue, str, str]]:
        """``(key, default, allowed, description)`` of every field."""
        hints = _hints(cls)
        return [(cls.key_of(f), f.default, rule(f.metadata, hints[f.name]), f.metadata["doc"])
                for f in declared(cls)]

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def from_table(cls: type[T], values: Mapping[str, ConfigValue]) -> T:
        """From a run-config table (keys with ``-``); unknown keys are a ConfigError."""
        names = {cls.key_of(f): f.name for f in declared(cls)}
        for key in sorted(set(values) & set(cls.moved)):
            raise ConfigError(moved_message(f"{cls.table}.{key}", cls.moved[key]))
        unknown = sorted(set(values) - set(names))
        if unknown:
            raise ConfigError(f"unknown {cls.table} hyper-parameter(s) {', '.join(unknown)}"
                              f"{suggest(unknown[0], list(names))}; valid: "
                              f"{', '.join(sorted(names))}")
        return cls(**{names[k]: v for k, v in values.items()})

    @classmethod
    def from_run_config(cls: type[T], raw: Mapping[str, ConfigValue]) -> T:
        """From the ``<table>.*`` keys of a flat run config."""
        return cls.from_table(section(raw, cls.table))

    # -- the wire ----------------------------------------------------------------------------
    def to_table(self) -> dict[str, ConfigValue]:
        return {self.key_of(f): getattr(self, f.name) for f in declared(type(self))}

    def to_message(self, prefix: str, keys: tuple[str, ...] | None = None
                   ) -> dict[str, ConfigValue]:
        """Every value (or those of ``keys``: the share a client needs), as config entries
        ``<prefix><key>`` of a message to a client."""
        table = self.to_table()
        return {f"{prefix}{k}": table[k] for k in (keys or table)}

    @classmethod
    def read_message(cls, config: Mapping[str, Any], prefix: str, keys: tuple[str, ...]
                     ) -> dict[str, ConfigValue]:
        """The share ``keys`` that :meth:`to_message` sent, each checked by its declaration
        (a client has no defaults: a missing key is an error)."""
        fields = {cls.key_of(f): f for f in declared(cls)}
        hints = _hints(cls)
        missing = [k for k in keys if f"{prefix}{k}" not in config]
        if missing:
            raise ValueError(f"the message lacks hyper-parameter(s) "
                             f"{', '.join(prefix + k for k in missing)}")
        return {k: check_value(f"{prefix}{k}", config[f"{prefix}{k}"], hints[fields[k].name],
                               fields[k].metadata) for k in keys}

    @classmethod
    def from_message(cls: type[T], config: Mapping[str, Any], prefix: str) -> T:
        """What :meth:`to_message` sent; every key must be there (clients have no defaults)."""
        keys = cls.keys()
        missing = [k for k in keys if f"{prefix}{k}" not in config]
        if missing:
            raise ValueError(f"the message lacks hyper-parameter(s) "
                             f"{', '.join(prefix + k for k in missing)}")
        return cls.from_table({k: config[f"{prefix}{k}"] for k in keys})


def toml_value(value: ConfigValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return repr(value)


def toml_table(params: type[HParams], comment: str = "") -> str:
    """The ``[tool.flwr.app.config.<table>]`` table of ``params``: every key with its default
    and its description, as pyproject.toml holds it (generated from the class, never by hand)."""
    lines = [f"[tool.flwr.app.config.{params.table}]" + (f"  # {comment}" if comment else "")]
    for key, default, allowed, doc in params.describe():
        lines.append(f"{f'{key} = {toml_value(default)}':<31} # {doc} [{allowed}]")
    return "\n".join(lines) + "\n"


@dataclasses.dataclass(frozen=True)
class NoParams(HParams):
    """A strategy without hyper-parameters of its own (it reads only run-config keys)."""
