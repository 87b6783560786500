"""A finished (or checkpointed) run's models, out of its checkpoint and into files any PyTorch
program loads: ``fedcluster export RUN_DIR --out DIR`` and the run-config key ``export``.

:func:`open_run` rebuilds the run's strategy as the checkpoint left it (the same code that
resumes a run), so the cluster models, each client's cluster and the strategy's own state
(Fielding's centres, FlexCFL's group directions, FedRC's label prior, ...) are the run's own.
:func:`export_run` writes, into DIR:

* ``models/model<id>.safetensors``: each cluster model's ``state_dict`` (parameter names as
  the model's own), loadable with ``safetensors.torch.load_file`` alone;
* ``models/model<id>.torchscript.pt``: the model traced with TorchScript where tracing works
  (the built-in MLP and CNN; a user's model where it traces), loadable with
  ``torch.jit.load`` and no Python class at all; where it fails the manifest says why;
* ``personal/client<cid>.<record>.safetensors``: what a strategy keeps on its clients and the
  checkpoint holds (``checkpoint-client-state = true``): a personal model (Local, FedSoft,
  ...), a personal classifier head (FedCCFA, FedRep, FedBABU, Flash);
* ``manifest.json``: the strategy, the run config, the scenario or dataset, the model spec
  and input shape, the classes, the preprocessing of raw inputs, each model's members and
  each client's model, package versions (docs/guides/export.md describes every field).

Loading needs no fedcluster: ``docs/guides/export.md`` shows the ten lines.
"""

from __future__ import annotations

import json
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from fedcluster_app.api import build_strategy, run_config_defaults
from fedcluster_app.core import codec
from fedcluster_app.core.results.provenance import package_versions
from fedcluster_app.core import wire as P
from fedcluster_app.core.server.checkpoint import checkpoint_file, read_checkpoint, read_client_states
from fedcluster_app.core.config import ConfigError, merge_overrides
from fedcluster_app.core.experiment import Experiment, load_experiment
from fedcluster_app.core.models import build_model, set_weights
from fedcluster_app.core.server.strategy import ClusteredStrategy

#: the manifest's format; a loader refuses another
MANIFEST_VERSION = 1
MANIFEST_FILE = "manifest.json"
#: what a checkpoint's metadata must hold to be read (older versions lacked ``config``)
LAYOUT_KEYS = ("strategy", "scenario", "config", "round", "model_ids", "clients")
#: the context.state records that predict (their writers: ``StreamClient.store_personal``, the
#: FedCCFA family's client; ``tests/test_export.py`` checks the names agree)
PERSONAL_MODEL = "personal-model"
PERSONAL_CLASSIFIER = "personal-classifier"
CLASSIFIER = ("classifier.weight", "classifier.bias")
#: packages whose versions the manifest records


@dataclass
class TrainedRun:
    """A run as its checkpoint left it: the strategy (models, clients, its own state), the
    experiment, and the clients' saved ``context.state`` (empty without
    ``checkpoint-client-state``)."""

    checkpoint: Path
    strategy: ClusteredStrategy
    client_states: dict[int, bytes] = field(default_factory=dict)

    @property
    def exp(self) -> Experiment:
        return self.strategy.exp

    def cluster_ids(self) -> list[int]:
        """The models that are clusters (not a probe, not FlexCFL's w0) and the server holds
        (``local``'s clusters are its clients' personal models, on the clients)."""
        return [m for m in self.strategy.cluster_models() if m in self.strategy.models]

    def assignments(self) -> dict[int, int | None]:
        """Each client's cluster (model id) at the end, as metrics.jsonl's ``assignments``."""
        return {int(c): m for c, m in
                self.strategy.protocol.clustering()["assignments"].items()}

    def members(self) -> dict[int, list[int]]:
        """Each cluster model's clients at the end."""
        out: dict[int, list[int]] = {m: [] for m in self.cluster_ids()}
        for cid, mid in sorted(self.assignments().items()):
            if mid is not None:
                out.setdefault(mid, []).append(cid)
        return out

    def model(self, weights: list[np.ndarray]) -> nn.Module:
        """A module of the run's model spec holding ``weights``, in eval mode, on the CPU."""
        model = build_model(self.exp.spec, 0)
        set_weights(model, weights)
        return model.eval()

    def client_state(self, cid: int):
        """Client ``cid``'s saved context.state (a Flower RecordDict, its record names without
        the ``state.`` prefix), or None when the checkpoint does not hold it."""
        blob = self.client_states.get(int(cid))
        if blob is None:
            return None
        from flwr.app import RecordDict

        saved = codec.decode_state(blob)
        return RecordDict({k[len(P.STATE_PREFIX):]: v for k, v in saved.items()})

    def personal_parts(self, cid: int) -> dict[str, dict[str, np.ndarray]]:
        """What a strategy keeps on client ``cid`` and the checkpoint holds, by record name:
        a whole personal model (named as the model's ``state_dict``), a personal classifier
        head (``classifier.weight``, ``classifier.bias``), any other arrays (FedCCFA's
        anchors) by position (``"0"``, ``"1"``, ...). Optimizer states are left out."""
        state = self.client_state(cid)
        if state is None:
            return {}
        whole = list(build_model(self.exp.spec, 0).state_dict())
        out = {}
        for name, record in state.array_records.items():
            if name.startswith(P.OPTIMIZER_PREFIX):
                continue
            arrays = codec.unpack_arrays(record)
            names = (whole if name == PERSONAL_MODEL and len(arrays) == len(whole) else
                     list(CLASSIFIER) if name.endswith(PERSONAL_CLASSIFIER) and len(arrays) == 2
                     else [str(i) for i in range(len(arrays))])
            out[name] = dict(zip(names, arrays))
        return out


def open_run(run_dir: str | Path) -> TrainedRun:
    """The run whose checkpoint is ``run_dir`` (a run directory or its ``checkpoint.npz``).

    Raises FileNotFoundError (no checkpoint, the file named) or ValueError (a corrupt file,
    one of an older layout, or one this version cannot rebuild: the file and the reason
    named)."""
    path = checkpoint_file(run_dir)
    meta, models = read_checkpoint(path)
    missing = [k for k in LAYOUT_KEYS if k not in meta]
    if missing:
        raise ValueError(f"checkpoint {path} is of an older layout: its metadata lacks "
                         f"{', '.join(missing)}; run the experiment again with this version "
                         f"(or resume it with the version that wrote it)")
    saved = {k: v for k, v in meta["config"].items() if k not in ("resume-from",)}
    try:
        config = merge_overrides(run_config_defaults(saved), saved)
        exp = _experiment(config)
        strategy = build_strategy(exp)
        strategy.load_state_dict(meta, models)
    except KeyError as ex:
        raise ValueError(f"checkpoint {path} is incomplete: missing {ex}") from None
    except (ConfigError, ValueError) as ex:
        raise ValueError(f"checkpoint {path} cannot be rebuilt by this version: {ex}") from None
    if strategy.round:     # the step the run ended in (FedDrift's identities are per step)
        strategy.step = strategy.protocol.time_step(strategy.round)
    return TrainedRun(path, strategy, read_client_states(path))


def _experiment(config: dict) -> Experiment:
    """The run's experiment with its data where this machine has them (the preprocessing of a
    user's table needs them), else from the scenario's metadata alone."""
    try:
        return load_experiment(config)
    except (FileNotFoundError, ValueError, RuntimeError):
        return load_experiment(config, server=True)


# ------------------------------------------------------------------------------- writing
def export_run(run_dir: str | Path, out: str | Path, overwrite: bool = False) -> Path:
    """Write the run's models and manifest into ``out`` (module docstring); returns the
    manifest's path. ``out`` holding an export already is refused unless ``overwrite``."""
    run = open_run(run_dir)
    out = Path(out).expanduser().resolve()
    if (out / MANIFEST_FILE).exists():
        if not overwrite:
            raise FileExistsError(f"{out} holds an export already ({MANIFEST_FILE}); choose "
                                  f"another --out, or pass --overwrite to replace it")
        for sub in ("models", "personal"):
            shutil.rmtree(out / sub, ignore_errors=True)
    return write_export(run, out)


def write_export(run: TrainedRun, out: Path) -> Path:
    from safetensors.torch import save_file

    (out / "models").mkdir(parents=True, exist_ok=True)
    exp, spec = run.exp, run.exp.spec
    example = torch.zeros((1, *spec.input_shape))
    models = {}
    for mid in run.cluster_ids():
        module = run.model(run.strategy.models[mid])
        weights = f"models/model{mid}.safetensors"
        save_file({k: v.contiguous() for k, v in module.state_dict().items()}, out / weights)
        entry: dict[str, Any] = {"state_dict": weights}
        entry.update(_torchscript(module, example, out, f"models/model{mid}.torchscript.pt"))
        models[str(mid)] = entry
    personal: dict[str, dict[str, str]] = {}
    for cid in sorted(run.client_states):
        for name, tensors in run.personal_parts(cid).items():
            rel = f"personal/client{cid}.{name}.safetensors"
            (out / "personal").mkdir(exist_ok=True)
            save_file({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in tensors.items()},
                      out / rel)
            personal.setdefault(str(cid), {})[name] = rel
    manifest = manifest_of(run, models, personal)
    path = out / MANIFEST_FILE
    path.write_text(json.dumps(manifest, indent=2) + "\n")
    return path


def _torchscript(module: nn.Module, example: torch.Tensor, out: Path, rel: str) -> dict:
    """The module traced and saved, checked to give the module's outputs; or why not."""
    try:
        with torch.no_grad(), warnings.catch_warnings():
            # torch 2.9+ calls TorchScript deprecated; it still loads with torch.jit.load alone.
            # A tracer warning is checked below: the traced module must give the same outputs
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            traced = torch.jit.trace(module, example)
            probe = torch.randn((3, *example.shape[1:]), generator=torch.Generator().manual_seed(0))
            if not torch.allclose(traced(probe), module(probe), atol=1e-6):
                return {"torchscript": None, "torchscript_skipped": "the traced module's "
                        "outputs differ from the model's (data-dependent control flow)"}
        traced.save(str(out / rel))
        return {"torchscript": rel}
    except Exception as ex:  # noqa: BLE001 - any tracing failure only skips this format
        return {"torchscript": None, "torchscript_skipped": f"{type(ex).__name__}: {ex}"}


def manifest_of(run: TrainedRun, models: dict, personal: dict) -> dict[str, Any]:
    exp, spec, scenario = run.exp, run.exp.spec, run.exp.scenario
    strategy = run.strategy
    soft = {str(c): {str(m): w for m, w in rec.soft.items()}
            for c, rec in sorted(strategy.clients.items()) if rec.soft}
    return {
        "format": "fedcluster-export",
        "version": MANIFEST_VERSION,
        "strategy": strategy.name,
        "round": strategy.round,
        "rounds": strategy.num_rounds,
        "finished": strategy.round >= strategy.num_rounds,
        "scenario": scenario.name,
        "dataset": exp.cfg.dataset or None,
        "seed": exp.cfg.seed,
        "config": dict(exp.cfg.raw),
        "model": {"kind": spec.kind, "input_shape": list(spec.input_shape),
                  "num_classes": spec.num_classes, "hidden": spec.hidden, "init": spec.init,
                  "output": "logits, one per class (argmax = the predicted class)"},
        "classes": list(range(spec.num_classes)),
        "class_names": list(scenario.class_names) or None,
        "preprocessing": scenario.preprocessing,
        "models": {m: {**entry, "members": run.members().get(int(m), [])}
                   for m, entry in models.items()},
        "assignments": {str(c): m for c, m in run.assignments().items()},
        "soft_assignments": soft,
        "personal": personal,
        "versions": package_versions("safetensors"),
    }
