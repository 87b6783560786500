"""The checkpoint file: one ``.npz`` holding a strategy's whole state.

The JSON metadata (round, assignments, per-client records, RNG, the protocol's and the
strategy's own state, and the run config the run was started with) is stored as bytes under
``__meta__``; model ``m``'s arrays as ``model<m>_<i>``. Writes are atomic, so a crash never
leaves a half-written checkpoint.

A resumed run must be the same run: :func:`check_same_run` refuses a run config that differs
from the checkpoint's in any key but :data:`SAFE_ON_RESUME`. :class:`Checkpoints` takes a
strategy's state into a checkpoint and back, with its clients' context.state where configured.
"""

from __future__ import annotations

import errno
import json
import shutil
from logging import WARNING
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from flwr.app import ConfigRecord, Message
from flwr.common.logger import log
from flwr.serverapp import Grid

from fedcluster_app.core import codec
from fedcluster_app.core import wire as P
from fedcluster_app.core.atomic import atomic_open
from fedcluster_app.core.config import default_run_config
from fedcluster_app.core.data.schedules import schedule_digest
from fedcluster_app.core.results.files import (
    CHECKPOINT_FILE,  # with the run's other file names
)
from fedcluster_app.core.server import exchange
from fedcluster_app.core.server.messages import Task, validate_reply
from fedcluster_app.core.server.nodes import ClientRecord

if TYPE_CHECKING:   # the strategy module composes this one: its type only
    from fedcluster_app.core.server.strategy import ClusteredStrategy

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


class Checkpoints:
    """A strategy's state in a checkpoint and back: its registry, clients, generator, its
    protocol's and its own state (``strategy_state``), and with ``checkpoint-client-state``
    every client's context.state, pulled at each checkpoint and given back once to each
    client when it rejoins a resumed run."""

    def __init__(self, strategy: ClusteredStrategy) -> None:
        self.s = strategy
        #: the checkpoint file ``load`` read (None: not resumed from a file)
        self.resumed_from: Path | None = None
        self.pending_states: dict[int, bytes] = {}   # resumed: clients' state not yet restored

    def state_dict(self) -> tuple[dict[str, Any], dict[int, Weights]]:
        s = self.s
        scenario = s.exp.scenario
        meta = {
            "strategy": s.name,
            "scenario": scenario.name,
            "num_clients": scenario.num_clients,
            # what check_same_run compares when the run is resumed; `fedcluster run --resume
            # DIR` reads the config from here (a killed run has no summary.json)
            "config": dict(s.cfg.raw),
            "num_steps": scenario.num_steps,
            "schedule": schedule_digest(scenario.concept_matrix(), scenario.concept_labels),
            "round": s.round,
            "next_model_id": s.next_model_id,
            "model_birth": {str(k): v for k, v in s.model_birth.items()},
            "model_ids": sorted(s.models),
            # vars, not dataclasses.asdict (which deep-copies): 100,000 clients in 0.1 s, not 3 s
            "clients": [{**vars(r), "soft": _keys_to_str(r.soft)} for r in s.clients.values()],
            "truth": {str(c): {str(t): k for t, k in d.items()} for c, d in s.truth.items()},
            "rng": s.rng.bit_generator.state,
            "protocol_state": s.protocol.state(),
            "strategy_state": s.strategy_state(),
            "untrained_rounds": s.runner.untrained_rounds,
            "unevaluated_rounds": s.runner.unevaluated_rounds,
        }
        return meta, dict(s.models)

    def load_state_dict(self, meta: dict[str, Any], models: dict[int, Weights]) -> None:
        s = self.s
        for key, mine in (("strategy", s.name), ("scenario", s.exp.scenario.name),
                          ("num_clients", s.exp.scenario.num_clients)):
            if meta.get(key) != mine:
                raise ValueError(f"the checkpoint is from a run with {key} = {meta.get(key)!r}; "
                                 f"this run has {key} = {mine!r}")
        check_same_run(meta, s.cfg.raw, s.exp.scenario)
        s.round = int(meta["round"])
        s.next_model_id = int(meta["next_model_id"])
        s.model_birth = {int(k): int(v) for k, v in meta["model_birth"].items()}
        shapes_expected = s.shapes
        for mid, weights in models.items():
            shapes = tuple(tuple(a.shape) for a in weights)
            if shapes != shapes_expected:
                raise ValueError(f"model {mid} of the checkpoint has shapes {shapes}, this run's "
                                 f"model {shapes_expected}")
            if not all(np.isfinite(a).all() for a in weights if a.dtype.kind == "f"):
                raise ValueError(f"model {mid} of the checkpoint has non-finite weights")
        s.models = {int(mid): models[int(mid)] for mid in meta["model_ids"]}
        s.clients = {}
        for r in meta["clients"]:
            soft = {int(k): float(v) for k, v in r["soft"].items()} if r["soft"] else None
            s.clients[int(r["cid"])] = ClientRecord(**{**r, "soft": soft, "node_id": None})
        s.truth = {int(c): {int(t): int(k) for t, k in d.items()} for c, d in meta["truth"].items()}
        s.rng.bit_generator.state = meta["rng"]
        s.protocol.load_state(meta["protocol_state"])
        s.load_strategy_state(meta["strategy_state"])
        s.runner.untrained_rounds = [int(r) for r in meta.get("untrained_rounds", [])]
        s.runner.unevaluated_rounds = [int(r) for r in meta.get("unevaluated_rounds", [])]

    def save(self, path: Path, grid: Grid | None = None) -> None:
        """The strategy's state, and with ``grid`` (and checkpoint-client-state) every
        client's context.state, so that a resumed run continues the clients exactly too."""
        s = self.s
        states = (self.pull_client_states(grid)
                  if grid is not None and s.cfg.checkpoint_client_state else {})
        meta, models = self.state_dict()
        try:
            write_checkpoint(path, meta, models, states)
        except OSError as ex:
            if ex.errno != errno.ENOSPC:
                raise
            # the write is atomic: the checkpoint before this one is still whole
            need = (sum(a.nbytes for ws in models.values() for a in ws)
                    + sum(map(len, states.values())) + len(json.dumps(meta)))
            free = shutil.disk_usage(Path(path).parent).free
            raise OSError(errno.ENOSPC, (
                f"no space left for the checkpoint of round {s.round} in {Path(path).parent}: "
                f"it needs about {need / 1e6:.1f} MB, {free / 1e6:.1f} MB are free; the last "
                f"checkpoint written ({path}) is intact: free space, then resume it")) from None

    def load(self, path: Path) -> None:
        meta, models = read_checkpoint(path)
        try:
            self.load_state_dict(meta, models)
        except KeyError as ex:
            raise ValueError(f"checkpoint {path} is incomplete: missing {ex}") from None
        self.resumed_from = checkpoint_file(path)
        self.pending_states = read_client_states(path)
        for cid, blob in self.pending_states.items():   # refused now, not when it rejoins
            try:
                codec.decode_state(blob)
            except Exception as ex:
                raise ValueError(f"checkpoint {path}: the saved state of client {cid} is corrupt "
                                 f"({type(ex).__name__}: {ex})") from None

    def pull_client_states(self, grid: Grid) -> dict[int, bytes]:
        """Every reachable client's context.state, serialised; a client that does not answer
        is logged and resumes without its state."""
        s = self.s
        sent = {rec.node_id: cid for cid, rec in sorted(s.clients.items())
                if rec.node_id is not None}
        messages = [Message(content=codec.build_content(config={P.ROUND: s.round}), dst_node_id=n,
                            message_type=P.QUERY_STATE, group_id=f"state-{s.round}")
                    for n in sent]
        states = {}
        shapes = s.shapes
        for msg in exchange.send_and_receive(grid, messages, s.round_timeout) if messages else []:
            cid = sent.get(msg.metadata.src_node_id)
            if cid is None:
                continue
            try:   # the generic check (error reply, metrics, client id); it carries no model
                validate_reply(msg, cid, Task(), shapes)
                states[cid] = codec.encode_state(msg.content)
            except Exception as ex:   # a hostile or failed reply: that client only
                log(WARNING, "round %d: client %s: its state is not in the checkpoint (%s)",
                    s.round, cid, ex)
        return states

    def restore(self, grid: Grid, cids: list[int]) -> None:
        """Give resumed clients back their checkpointed context.state (once each)."""
        s = self.s
        todo = {s.clients[c].node_id: c for c in cids if c in self.pending_states}
        messages = []
        for node, cid in todo.items():
            content = codec.decode_state(self.pending_states[cid])
            content[P.CONFIG] = ConfigRecord({P.ROUND: s.round})
            messages.append(Message(content=content, dst_node_id=node,
                                    message_type=P.QUERY_RESTORE, group_id="restore"))
        restored = set()
        for msg in exchange.send_and_receive(grid, messages, s.round_timeout) if messages else []:
            cid = todo.get(msg.metadata.src_node_id)
            if cid is not None and not msg.has_error():
                restored.add(cid)
                self.pending_states.pop(cid)
        for cid in sorted(set(todo.values()) - restored):
            log(WARNING, "client %d: its checkpointed state could not be restored; it continues "
                "from the state it has", cid)


def _keys_to_str(d: dict[int, float] | None) -> dict[str, float] | None:
    return None if d is None else {str(k): v for k, v in d.items()}
