"""The checkpoint file: one ``.npz`` holding a strategy's whole state.

The JSON metadata (round, assignments, per-client records, RNG, the protocol's and the
strategy's own state, and the run config the run was started with) is stored as bytes under
``__meta__``; model ``m``'s arrays as ``model<m>_<i>``. Writes are atomic, so a crash never
leaves a half-written checkpoint.

A resumed run must be the same run: :func:`check_same_run` refuses a run config that differs
from the checkpoint's in any key but :data:`SAFE_ON_RESUME`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from fedcluster_app.core.atomic import atomic_open
from fedcluster_app.core.config import default_run_config
from fedcluster_app.core.data.schedules import schedule_digest
from fedcluster_app.core.results.files import (
    CHECKPOINT_FILE,  # with the run's other file names
)

Weights = list[np.ndarray]

#: run-config keys a resumed run may change: they say where and how the run is carried out
#: (files, display, waiting, hardware), not what it computes, so the continued run is still
#: the checkpointed one. ``num-steps`` may also grow when the scenario's first steps stay the
#: same (checked with :func:`schedule_digest`). Any other difference is refused.
SAFE_ON_RESUME = frozenset({
    "out-dir", "resume-from", "overwrite",        # where the files go, whether to replace them
    "progress", "plot", "checkpoint-every",       # what is shown and how often state is saved
    "checkpoint-every-s",
    "checkpoint-client-state",                    # whether clients' state is saved with it
    "export",                                     # whether the models are exported at the end
    "round-timeout", "node-wait-s", "min-nodes",  # how long to wait for clients
    "device", "data-dir",                         # the hardware, where the same data live here
    "batch-clients",                              # clients trained batched or one by one
    "deterministic",                              # cuDNN's algorithms on a GPU
    "tracking", "tracking-uri",                   # where else the run is logged
})


def write_checkpoint(path: Path, meta: dict[str, Any], models: dict[int, Weights],
                     client_states: dict[int, bytes] | None = None) -> None:
    """Atomic: written to a temporary file, then renamed over the old checkpoint.
    ``client_states``: each client's serialised context.state, as ``client<cid>``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {f"model{mid}_{i}": a for mid, ws in models.items() for i, a in enumerate(ws)}
    arrays.update({f"client{cid}": np.frombuffer(blob, dtype=np.uint8)
                   for cid, blob in (client_states or {}).items()})
    with atomic_open(path) as fh:
        np.savez(fh, __meta__=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **arrays)


def read_client_states(path: Path) -> dict[int, bytes]:
    """The clients' serialised context.state kept in a checkpoint (empty for none)."""
    path = checkpoint_file(path)
    try:
        with np.load(path) as data:
            return {int(k[len("client"):]): bytes(data[k]) for k in data.files
                    if k.startswith("client")}
    except Exception as ex:
        raise ValueError(f"checkpoint {path} is corrupt: {type(ex).__name__}: {ex}") from None


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
    rnd = meta.get("round") if isinstance(meta, dict) else None
    if not isinstance(rnd, int) or isinstance(rnd, bool) or rnd < 0:
        raise ValueError(f"checkpoint {path} is corrupt: its 'round' must be a non-negative "
                         f"integer, got {rnd!r}")
    return meta, models


def resume_command(out_dir: str | Path) -> str | None:
    """The command that continues the run of ``out_dir`` from its checkpoint, None when it
    has none (a resume would be refused: no checkpoint)."""
    import shlex

    out_dir = Path(out_dir)
    if not (out_dir / CHECKPOINT_FILE).is_file():
        return None
    return f"fedcluster run --resume {shlex.quote(str(out_dir))}"


def checkpoint_file(path: str | Path) -> Path:
    """The checkpoint file ``path`` names: itself, or the one in the run directory ``path``."""
    path = Path(path).expanduser().resolve()
    return path / CHECKPOINT_FILE if path.is_dir() else path


def config_changes(saved: dict[str, Any], config: dict[str, Any],
                   defaults: dict[str, Any] | None = None) -> dict[str, tuple[Any, Any]]:
    """``key -> (old, new)`` for every run-config key outside :data:`SAFE_ON_RESUME` whose
    value differs between the checkpoint's config ``saved`` and ``config``. A key the
    checkpoint does not know (added by a later version) counts as its default."""
    defaults = defaults or {}
    changes = {}
    for key in sorted(set(saved) | set(config)):
        old, new = saved.get(key, defaults.get(key, _UNSET)), config.get(key, _UNSET)
        if key not in SAFE_ON_RESUME and old != new:
            changes[key] = (old, new)
    return changes


def check_same_run(meta: dict[str, Any], config: dict[str, Any], scenario: Any) -> None:
    """Refuse (``ValueError`` listing every difference, old -> new) to resume the checkpoint
    ``meta`` with a run config or scenario that is not the checkpointed run's: a different
    ``lr`` or ``seed`` would silently mix two runs, a different ``rounds-per-step`` would make
    time steps run backwards. ``num-steps`` may grow when the scenario's first steps (their
    concept schedule) stay the same. A checkpoint without a config (an older version) is not
    checked."""
    saved = meta.get("config")
    if saved is None:
        return
    changes = {k: f"{_show(a)} -> {_show(b)}"
               for k, (a, b) in config_changes(saved, config, default_run_config()).items()}
    steps = int(meta.get("num_steps", scenario.num_steps))
    same_start = (scenario.num_steps >= steps and "schedule" in meta
                  and schedule_digest(scenario.concept_matrix()[:steps],
                                      scenario.concept_labels) == meta["schedule"])
    if same_start:
        changes.pop("num-steps", None)   # an extension: the steps run so far are the same
    elif "num-steps" in changes:
        changes["num-steps"] += (f" (the checkpoint's run has {steps} time steps; a resumed run "
                                 f"may only add steps after them, with the same schedule)")
    elif "schedule" in meta:
        changes["the scenario's concept schedule"] = (f"not the one of the checkpoint's first "
                                                      f"{steps} time steps")
    if changes:
        raise ValueError("the checkpoint is from a run with another configuration: "
                         + "; ".join(f"{k}: {v}" for k, v in changes.items())
                         + ". Resume with the checkpoint's settings (`fedcluster run --resume "
                         "DIR` alone reads them), or start a new run")


_UNSET = object()


def _show(value: Any) -> str:
    return "(unset)" if value is _UNSET else repr(value)
