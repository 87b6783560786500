"""Concept schedules: which concept every client's data comes from at every time step.

A schedule is an ``int`` matrix of shape ``(num_steps, num_clients)``; row ``t - 1`` holds the
concept ids of time step ``t`` (time steps are 1-based), column ``k`` belongs to client ``k``.
This is the layout of FedDrift's ``.cp`` files (rows = time steps, columns = clients,
whitespace-separated concept ids).

Sources of schedules:

* :func:`load_cp` reads any ``.cp`` file;
* :func:`bundled_schedule` returns one of the ten matrices shipped with the FedDrift authors' code
  (``A`` ... ``F``, ``W`` ... ``Z``; ``Y`` is the paper's 2-concept schedule, ``F`` the 4-concept
  one), bundled in ``feddrift_changepoints.json`` so that nothing outside the package is needed;
* :func:`sudden`, :func:`incremental`, :func:`recurring` and :func:`staggered_random` build
  programmatic patterns.
"""

from __future__ import annotations

import hashlib
import json
import operator
from collections.abc import Iterable, Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np

from fedcluster_app.core.hparams import ConfigError
from fedcluster_app.core.limits import MAX_CLIENT_ROUNDS, MAX_CLIENTS, MAX_STEPS, WHERE

__all__ = [
    "BUNDLED_SCHEDULES_FILE",
    "bundled_schedule",
    "bundled_schedule_names",
    "incremental",
    "load_cp",
    "recurring",
    "staggered_random",
    "sudden",
]

#: The ten FedDrift concept matrices, as JSON (Flower's app bundle ships .py/.toml/.md/.json only).
BUNDLED_SCHEDULES_FILE = Path(__file__).with_name("feddrift_changepoints.json")

# Fixed stream tag of the random draws of staggered_random (see the package docstring: every random
# draw in this package comes from np.random.default_rng([seed, ..., tag]) with a fixed tag).
_TAG_STAGGERED = 12


# ------------------------------------------------------------------------------------- .cp files


#: the largest concept id a ``.cp`` file may hold (ids index a scenario's concepts)
MAX_CONCEPT_ID = 1_000_000


def load_cp(path: str | Path) -> np.ndarray:
    """Read a FedDrift ``.cp`` concept matrix: rows = time steps, columns = clients.

    Returns an ``int64`` array of shape ``(num_steps, num_clients)``. Blank lines are ignored.

    Raises:
        ValueError: the file does not exist or cannot be read, is empty, has rows of different
            lengths, or holds an entry that is not a non-negative integer; ConfigError (a
            ValueError): it has more columns than ``MAX_CLIENTS``, more rows than
            ``MAX_STEPS`` or more entries than ``MAX_CLIENT_ROUNDS`` (``core/limits.py``),
            found while reading, before the rest of the file is read. The message names the
            file and, where it applies, the line.
    """
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"schedule file {str(p)!r} not found (no such file)")
    rows: list[list[int]] = []
    width = None
    try:
        with p.open(encoding="utf-8") as fh:
            lineno = 0
            while line := fh.readline(_MAX_LINE):
                lineno += 1
                if len(line) == _MAX_LINE and not line.endswith("\n"):
                    raise _too_large(p, f"line {lineno} is longer than {_MAX_LINE:,} "
                                        f"characters", f"{MAX_CLIENTS:,} columns (clients)")
                row = _parse_row(p, lineno, line.split())
                if not row:
                    continue
                if width is None:
                    width = len(row)
                    if width > MAX_CLIENTS:
                        raise _too_large(p, f"line {lineno} has {width:,} columns (clients)",
                                         f"{MAX_CLIENTS:,}")
                elif len(row) != width:
                    raise ValueError(
                        f"schedule file {str(p)!r} has ragged rows: line {lineno} has "
                        f"{len(row)} entries, the first row has {width}"
                    )
                rows.append(row)
                if len(rows) > MAX_STEPS or len(rows) * width > MAX_CLIENT_ROUNDS:
                    raise _too_large(p, f"{len(rows):,} rows (time steps) of {width:,} "
                                        f"columns (clients) by line {lineno}",
                                     f"{MAX_STEPS:,} rows and {MAX_CLIENT_ROUNDS:,} entries")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"schedule file {str(p)!r} cannot be read: {exc}") from exc
    if not rows:
        raise ValueError(f"schedule file {str(p)!r} is empty (no rows of concept ids)")
    return np.asarray(rows, dtype=np.int64)


#: the longest line a schedule row may take: MAX_CLIENTS ids of up to 7 digits, with room
#: for generous whitespace
_MAX_LINE = 16 * MAX_CLIENTS


def _too_large(p: Path, found: str, cap: str) -> ConfigError:
    return ConfigError(f"schedule file {str(p)!r}: {found}, over the cap of {cap} (the "
                       f"run-config key schedule; {WHERE})")


def _parse_row(p: Path, lineno: int, tokens: list[str]) -> list[int]:
    row = []
    for tok in tokens:
        try:
            value = int(tok)
        except ValueError:
            raise ValueError(
                f"schedule file {str(p)!r}, line {lineno}: entry {tok!r} is not an integer "
                "concept id"
            ) from None
        if value < 0:
            raise ValueError(
                f"schedule file {str(p)!r}, line {lineno}: concept id {value} is negative"
            )
        if value > MAX_CONCEPT_ID:   # an int64 matrix cannot hold it; no scenario has so many
            raise ValueError(
                f"schedule file {str(p)!r}, line {lineno}: concept id {value} is out of "
                f"range (at most {MAX_CONCEPT_ID})"
            )
        row.append(value)
    return row


@lru_cache(maxsize=1)
def _bundled() -> dict[str, np.ndarray]:
    with open(BUNDLED_SCHEDULES_FILE, encoding="utf-8") as f:
        raw = json.load(f)
    out = {}
    for name, rows in raw.items():
        m = np.asarray(rows, dtype=np.int64)
        m.setflags(write=False)
        out[name] = m
    return out


def bundled_schedule_names() -> list[str]:
    """Names of the bundled FedDrift schedules (``["A", ..., "Z"]``)."""
    return sorted(_bundled())


def bundled_schedule(name: str) -> np.ndarray:
    """One of FedDrift's bundled concept matrices, e.g. ``"Y"`` or ``"F"`` (``"Y.cp"`` works too).

    Returns a fresh (writable) ``int64`` copy of shape ``(11, 10)``.
    """
    key = str(name).strip()
    if key.lower().endswith(".cp"):
        key = key[:-3]
    key = key.upper()
    table = _bundled()
    if key not in table:
        raise ValueError(
            f"unknown bundled schedule {name!r}; valid names: {', '.join(sorted(table))}"
        )
    return table[key].copy()


# ------------------------------------------------------------------------------ programmatic


def _check_shape(num_clients: int, num_steps: int) -> tuple[int, int]:
    num_clients = operator.index(num_clients)
    num_steps = operator.index(num_steps)
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    return num_clients, num_steps


def _check_step(what: str, step: int, num_steps: int) -> int:
    step = operator.index(step)
    if not 1 <= step <= num_steps:
        raise ValueError(f"{what} must be in 1..{num_steps} (time steps are 1-based), got {step}")
    return step


def _check_clients(clients: Iterable[int], num_clients: int) -> list[int]:
    out = [operator.index(c) for c in clients]
    bad = [c for c in out if not 0 <= c < num_clients]
    if bad:
        raise ValueError(f"client ids {bad} out of range 0..{num_clients - 1}")
    return out


def _check_concepts(concepts: Iterable[int]) -> list[int]:
    out = [operator.index(c) for c in concepts]
    if any(c < 0 for c in out):
        raise ValueError(f"concept ids must be >= 0, got {out}")
    return out


def sudden(
    num_clients: int,
    num_steps: int,
    at_step: int,
    clients: Iterable[int],
    to_concept: int = 1,
    from_concept: int = 0,
) -> np.ndarray:
    """Every client starts on ``from_concept``; the listed clients switch to ``to_concept`` at
    ``at_step`` and stay there. Other clients never change."""
    num_clients, num_steps = _check_shape(num_clients, num_steps)
    at_step = _check_step("at_step", at_step, num_steps)
    clients = _check_clients(clients, num_clients)
    to_concept, from_concept = _check_concepts([to_concept, from_concept])
    m = np.full((num_steps, num_clients), from_concept, dtype=np.int64)
    m[at_step - 1 :, clients] = to_concept
    return m


def incremental(
    num_clients: int,
    num_steps: int,
    start_step: int,
    clients: Iterable[int],
    concepts: Sequence[int],
    from_concept: int = 0,
) -> np.ndarray:
    """The listed clients walk through ``concepts`` one per step: step ``start_step`` is on
    ``concepts[0]``, ``start_step + 1`` on ``concepts[1]``, ..., and they stay on
    ``concepts[-1]`` once the list is used up (steps past ``num_steps`` are cut off). Before
    ``start_step``, and for all other clients throughout, the concept is ``from_concept``."""
    num_clients, num_steps = _check_shape(num_clients, num_steps)
    start_step = _check_step("start_step", start_step, num_steps)
    clients = _check_clients(clients, num_clients)
    concepts = _check_concepts(concepts)
    (from_concept,) = _check_concepts([from_concept])
    if not concepts:
        raise ValueError("incremental() needs at least one concept to walk through")
    m = np.full((num_steps, num_clients), from_concept, dtype=np.int64)
    for t in range(start_step, num_steps + 1):
        m[t - 1, clients] = concepts[min(t - start_step, len(concepts) - 1)]
    return m


def recurring(
    num_clients: int,
    num_steps: int,
    at_step: int,
    period: int,
    clients: Iterable[int],
    concepts: Sequence[int] = (0, 1),
) -> np.ndarray:
    """The listed clients are on ``concepts[0]`` before ``at_step``, switch to ``concepts[1]`` at
    ``at_step`` and then move on every ``period`` steps, cycling through ``concepts`` (with two
    concepts: back and forth). Other clients stay on ``concepts[0]``."""
    num_clients, num_steps = _check_shape(num_clients, num_steps)
    at_step = _check_step("at_step", at_step, num_steps)
    clients = _check_clients(clients, num_clients)
    concepts = _check_concepts(concepts)
    period = operator.index(period)
    if period < 1:
        raise ValueError(f"period must be >= 1, got {period}")
    if len(concepts) < 2:
        raise ValueError(f"recurring() needs at least two concepts, got {concepts}")
    m = np.full((num_steps, num_clients), concepts[0], dtype=np.int64)
    for t in range(at_step, num_steps + 1):
        m[t - 1, clients] = concepts[(1 + (t - at_step) // period) % len(concepts)]
    return m


def staggered_random(
    num_clients: int,
    num_steps: int,
    num_concepts: int,
    seed: int,
    first_step: int = 3,
    every: int = 2,
) -> np.ndarray:
    """FedDrift's MNIST-R pattern: every client is on concept 0 before ``first_step``; at
    ``first_step`` and every ``every`` steps after, each client independently draws a concept
    uniformly from ``0..num_concepts-1`` (0 included, so a draw may be "no change") and keeps it
    until its next draw. Deterministic given ``seed``."""
    num_clients, num_steps = _check_shape(num_clients, num_steps)
    first_step = _check_step("first_step", first_step, num_steps)
    num_concepts = operator.index(num_concepts)
    every = operator.index(every)
    seed = operator.index(seed)
    if num_concepts < 1:
        raise ValueError(f"num_concepts must be >= 1, got {num_concepts}")
    if every < 1:
        raise ValueError(f"every must be >= 1, got {every}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    rng = np.random.default_rng([seed, _TAG_STAGGERED])
    m = np.zeros((num_steps, num_clients), dtype=np.int64)
    current = np.zeros(num_clients, dtype=np.int64)
    for t in range(1, num_steps + 1):
        if t >= first_step and (t - first_step) % every == 0:
            current = rng.integers(0, num_concepts, size=num_clients)
        m[t - 1] = current
    return m


def schedule_digest(matrix: np.ndarray, labels: tuple[str, ...] | list[str]) -> str:
    """A fingerprint of a scenario's concept schedule (steps x clients) and the concepts it
    uses: two runs with equal digests of their first ``t`` steps saw the same drift."""
    matrix = np.ascontiguousarray(matrix, dtype=np.int64)
    h = hashlib.sha256(str(matrix.shape).encode() + matrix.tobytes())
    h.update(json.dumps([labels[c] if c < len(labels) else str(c)
                         for c in np.unique(matrix).tolist()]).encode())
    return h.hexdigest()
