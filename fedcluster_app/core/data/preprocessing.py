"""How a raw input becomes what a run's model sees, as a small JSON-able description.

Training applies it when the data are read (``sources.py`` standardises flat features,
``generators.ImagePool`` divides pixel values by the pool's maximum); a run's export writes the
description into its manifest, and serving applies it to new inputs, so that a model scores raw
data exactly as it was trained. Three kinds:

``{"kind": "none"}``
    the inputs are used as given: the generated scenarios (SINE, SEA, Gaussian mixtures, ...)
    whose inputs are the model's inputs;
``{"kind": "scale", "divide_by": m}``
    images: ``x / m`` (255 for ``uint8`` pixels, 16 for scikit-learn's 8x8 digits);
``{"kind": "standardise", "mean": [...], "std": [...]}``
    flat features of a user's table: ``(x - mean) / std`` with the train split's per-feature
    statistics (float32, a constant feature's std is 1).
"""

from __future__ import annotations

from typing import Any

import numpy as np

NONE: dict[str, Any] = {"kind": "none"}
KINDS = ("none", "scale", "standardise")


def scaling(divide_by: float) -> dict[str, Any]:
    return NONE if float(divide_by) == 1.0 else {"kind": "scale", "divide_by": float(divide_by)}


def standardisation(mean: np.ndarray, std: np.ndarray) -> dict[str, Any]:
    # float32 values written as Python floats: their float32 round trip is exact
    return {"kind": "standardise", "mean": np.asarray(mean, np.float32).tolist(),
            "std": np.asarray(std, np.float32).tolist()}


def apply(rule: dict[str, Any], x: np.ndarray) -> np.ndarray:
    """``x`` (raw inputs, a batch) as the model sees it, float32."""
    kind = rule.get("kind")
    x = np.asarray(x)
    if kind == "none":
        return np.ascontiguousarray(x, dtype=np.float32)
    if kind == "scale":
        return x.astype(np.float32) / np.float32(rule["divide_by"])
    if kind == "standardise":
        mean = np.asarray(rule["mean"], dtype=np.float32)
        std = np.asarray(rule["std"], dtype=np.float32)
        if x.shape[1:] != mean.shape:
            raise ValueError(f"inputs of shape {x.shape[1:]} per row, but the run standardised "
                             f"{mean.shape} features")
        return (x.astype(np.float32) - mean) / std
    raise ValueError(f"unknown preprocessing kind {kind!r}; valid: {', '.join(KINDS)}")
