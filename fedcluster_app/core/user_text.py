"""What a user types, read one way everywhere: the closest valid name to a misspelt one, and
a value as ``--set`` reads it. A leaf module (no package imports), so the run config and the
readers of a user's dataset share it without an import cycle."""

from __future__ import annotations

import difflib
import tomllib


def suggest(name: str, valid: list[str], cutoff: float = 0.6) -> str:
    """`` (did you mean 'x'?)`` for the closest valid name, case ignored (``IFCA``, ``Sea4``),
    or nothing: every unknown name (strategy, scenario, key, preset, a dataset's column) gets
    it from here; ``cutoff`` is difflib's least similarity for a suggestion."""
    by_lower = {v.lower(): v for v in valid}
    close = difflib.get_close_matches(str(name).lower(), list(by_lower), n=1, cutoff=cutoff)
    return f" (did you mean {by_lower[close[0]]!r}?)" if close else ""


def read_value(raw: str) -> object:
    """A value as typed after ``key=``: TOML (numbers, booleans, quoted strings), else the
    bare word itself (``strategy=ifca``, a path)."""
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw
