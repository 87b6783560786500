"""A user dataset's class labels as the classes ``0..C-1`` (run-config key ``remap-labels``).

``remap-labels = false`` (the default) takes integer labels as the class numbers and refuses
anything else with the reason: text, non-integral or negative labels, and classes that never
occur (labels ``1..3`` or ``{0, 2, 5}``, whose empty classes a model would still predict and
``dataset-permute`` would map data onto). With ``num-classes`` set the labels may leave classes
empty (a SuperNode's file need not hold every class), but must be below it.

``remap-labels = true`` numbers the distinct labels ``0..C-1`` in sorted order (numbers by
value, text alphabetically) and says so in one log line with the mapping. The mapping is the
file's own: in a deployment whose devices hold different classes, give integer labels and
``num-classes`` instead.
"""

from __future__ import annotations

import numpy as np

__all__ = ["class_codes"]


def _preview(values, limit: int = 8) -> str:
    shown = ", ".join(repr(v.item() if isinstance(v, np.generic) else v)
                      for v in list(values)[:limit])
    return shown + (", ..." if len(values) > limit else "")


def _check_kind(y: np.ndarray, where: str, name: str, remap: bool) -> None:
    if y.dtype.kind in "b" or (y.dtype.kind in "iu"):
        return
    if y.dtype.kind == "f":
        bad = ~(np.isfinite(y) & (y == np.round(y)))
        if bad.any():
            raise ValueError(f"{where}: {name} holds the non-integral label {y[bad][0].item()!r}; "
                             f"expected integers 0..C-1 (class labels, not a regression target)")
        return
    if remap:
        return
    example = y[0].item() if len(y) else ""
    kind = "text" if y.dtype.kind in "USO" else f"non-integer ({y.dtype})"
    raise ValueError(f"{where}: {name} holds {kind} labels such as "
                     f"{example!r}; expected integers 0..C-1: map class names to integers "
                     f"first, or set remap-labels = true to number the distinct labels in "
                     f"sorted order")


def class_codes(parts: list[tuple[np.ndarray, str]], where: str, remap: bool,
                num_classes: int = 0, source_classes: int = 0
                ) -> tuple[list[np.ndarray], int, str, tuple]:
    """The labels of every part (train, test) as ``int64`` classes, the number of classes ``C``,
    the log line of a remap (``""`` when nothing was renumbered) and, after a remap, each
    class's label as the data wrote it (class ``i`` is ``names[i]``; ``()`` otherwise).

    ``parts`` are ``(labels, name)``; ``num_classes`` is the run config's (0 = from the data),
    ``source_classes`` the classes the source declares (an image folder's class folders).
    """
    for y, name in parts:
        _check_kind(y, where, name, remap)
    whole = np.concatenate([y for y, _ in parts]) if len(parts) > 1 else parts[0][0]
    names = " and ".join(name for _, name in parts)
    if remap:
        values = np.unique(whole)
        if num_classes and len(values) > num_classes:
            raise ValueError(f"{where}: {names} hold {len(values)} distinct labels, more than "
                             f"num-classes = {num_classes}")
        codes = [np.searchsorted(values, y).astype(np.int64) for y, _ in parts]
        written = tuple(v.item() if isinstance(v, np.generic) else v for v in values)
        if np.array_equal(values, np.arange(len(values))):
            return codes, len(values), "", ()
        mapping = ", ".join(f"{_preview([v])} -> {i}" for i, v in enumerate(values[:12]))
        note = (f"{where}: remap-labels: the {len(values)} distinct labels of {names} are "
                f"numbered 0..{len(values) - 1} in sorted order: {mapping}"
                f"{', ...' if len(values) > 12 else ''}")
        return codes, len(values), note, written
    ints = [y.astype(np.int64) for y, _ in parts]
    low = min(int(y.min()) for y in ints if len(y))
    if low < 0:
        raise ValueError(f"{where}: {names} holds the negative label {low}; expected integers "
                         f"0..C-1 (or set remap-labels = true to number the labels in sorted "
                         f"order)")
    values = np.unique(np.concatenate(ints))
    c = max(int(values[-1]) + 1, source_classes)
    if num_classes:
        if c > num_classes:
            raise ValueError(f"{where}: {names} holds labels up to {c - 1}, but num-classes = "
                             f"{num_classes}; expected labels 0..{num_classes - 1}")
        return ints, c, "", ()
    if len(values) < c:
        empty = sorted(set(range(c)) - set(values.tolist()))
        gap = (f"class {empty[0]} has" if len(empty) == 1 else f"classes {_preview(empty)} have")
        raise ValueError(f"{where}: {names} holds the labels {{{_preview(values)}}}, so {gap} no "
                         f"rows; expected every class 0..C-1 to occur. "
                         f"Set remap-labels = true to number the {len(values)} labels that occur "
                         f"0..{len(values) - 1}, or num-classes = {c} to keep these numbers (and "
                         f"the empty classes)")
    return ints, c, "", ()
