"""The checkpoint file: one ``.npz`` holding a strategy's whole state.

The JSON metadata (round, assignments, per-client records, RNG, the protocol's and the
strategy's own state) is stored as bytes under ``__meta__``; model ``m``'s arrays as
``model<m>_<i>``. Writes are atomic, so a crash never leaves a half-written checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from fedcluster_app.core.atomic import atomic_open

Weights = list[np.ndarray]
CHECKPOINT_FILE = "checkpoint.npz"


def write_checkpoint(path: Path, meta: dict[str, Any], models: dict[int, Weights]) -> None:
    """Atomic: written to a temporary file, then renamed over the old checkpoint."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {f"model{mid}_{i}": a for mid, ws in models.items() for i, a in enumerate(ws)}
    with atomic_open(path) as fh:
        np.savez(fh, __meta__=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **arrays)


def read_checkpoint(path: Path) -> tuple[dict[str, Any], dict[int, Weights]]:
    """(metadata, models by id) of a checkpoint file, or of the one in a run directory."""
    path = Path(path)
    if path.is_dir():
        path = path / CHECKPOINT_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        with np.load(path) as data:
            meta = json.loads(bytes(data["__meta__"]).decode())
            models = {}
            for mid in meta["model_ids"]:
                n = sum(k.startswith(f"model{mid}_") for k in data.files)
                models[int(mid)] = [data[f"model{mid}_{i}"] for i in range(n)]
    except Exception as ex:  # zip, json or key errors: all mean the file is unusable
        raise ValueError(f"checkpoint {path} is corrupt or not a fedcluster checkpoint: "
                         f"{type(ex).__name__}: {ex}") from None
    return meta, models
