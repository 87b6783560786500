"""Serve a finished run: its cluster models as ``torch.nn.Module``s, predictions for a client of
the run, and the cluster of a client that was never in it.

``load_run(RUN_DIR)`` (also ``fedcluster_app.api.load_run``) reads the run's checkpoint
(``export.open_run``: the strategy as the run left it) and returns a :class:`LoadedRun`:

* ``models``: cluster model id -> ``nn.Module`` (eval mode, CPU); ``assignments``: client id
  -> its cluster model at the end (None: in no cluster);
* ``predict(x, client_id=k)``: the classes client ``k`` predicts, with the model it is scored
  with in the run (its cluster's; its mixture under soft clustering; its personal model or
  classifier where the strategy keeps one and the checkpoint holds it);
* ``route(x, y)``: the cluster for a new client, chosen from a few labelled samples by the
  strategy's own rule for a newcomer (:func:`family_routes`), with the evidence it was
  chosen on.

Inputs are raw, as the run's data source holds them (pixel values, a table's features): the
run's preprocessing (``core/data/preprocessing.py``) is applied first; ``raw=False`` takes
inputs as the model sees them (a scenario's ``step_data``).

A routing rule reuses the family's own code: the strategy object rebuilt from the checkpoint
(Fielding's centres, FlexCFL's group directions, FedRC's label prior and EM settings) and the
family's client handlers, run here on a :class:`NewClient` that holds the labelled samples.
This module hosts both sides, as the in-process engine does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import RecordDict
from torch import nn

from fedcluster_app.core import wire as P
from fedcluster_app.core.data.preprocessing import apply as apply_preprocessing
from fedcluster_app.core.client.handlers import call, losses
from fedcluster_app.core.models import build_model
from fedcluster_app.core.client.stream_client import StreamClient
from fedcluster_app.core.training import as_tensor, predict_proba
from fedcluster_app.export import TrainedRun, open_run

__all__ = ["LoadedRun", "NewClient", "Route", "family_routes", "load_run"]


class NewClient(StreamClient):
    """A client that is not in the run: every split it is asked for (training window, test,
    adaptation data) is the labelled samples it was given, so that a family's client handler
    computes on them what it computes for a newcomer of the run."""

    def __init__(self, run: TrainedRun, x: np.ndarray, y: np.ndarray) -> None:
        # not StreamClient.__init__: its id is outside the scenario's clients on purpose (its
        # random streams differ from every client's), its data are x, y
        self.client_id = run.exp.scenario.num_clients
        self.exp = run.exp
        self.state = RecordDict()
        self.device = "cpu"
        self._open_states = {}
        self._xy = (x, y)

    def train_data(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        return self._xy

    def test_data(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        return self._xy

    def steps_data(self, steps: list[int]) -> tuple[np.ndarray, np.ndarray]:
        return self._xy

    def examples(self, n: int) -> int:
        return int(n)


@dataclass
class Route:
    """Where a new client goes: its cluster model, the rule, and the evidence per cluster
    (``{"losses": {id: ...}}``, ``{"distances": ...}``, ``{"responsibilities": ...}``, ...)."""

    model_id: int
    model: nn.Module
    rule: str
    evidence: dict[str, Any] = field(default_factory=dict)


def _config(run: TrainedRun, **extra: Any) -> dict[str, Any]:
    """What a message of the run's last round carries, for a handler run here."""
    return {P.ROUND: run.strategy.round, P.STEP: run.strategy.step or 1, **extra}


def _by_id(ids: list[int], values) -> dict[str, float]:
    return {str(m): float(v) for m, v in zip(ids, values)}


def route_lowest_loss(run: TrainedRun, client: NewClient) -> tuple[int, str, dict]:
    """IFCA's and FedDrift's rule (and the default): the cluster model of lowest loss on the
    client's samples (the run's ``query.losses`` handler); ties: the lowest id."""
    ids = run.cluster_ids()
    metrics, _, _ = call(losses, client, _config(run), {m: run.strategy.models[m] for m in ids})
    values = metrics[P.LOSSES]
    best = min(range(len(ids)), key=lambda j: (values[j], ids[j]))
    return ids[best], "lowest loss", {"losses": _by_id(ids, values),
                                      "accuracies": _by_id(ids, metrics[P.ACCURACIES])}


def route_fedrc(run: TrainedRun, client: NewClient) -> tuple[int, str, dict]:
    """FedRC's (and FedEM's) newcomer: EM from uniform cluster weights with the models fixed
    (the family's evaluate handler, with the run's label prior and EM settings); the cluster
    of the largest responsibility."""
    from fedcluster_app.families.fedrc import wire as W
    from fedcluster_app.families.fedrc.client import evaluate

    s = run.strategy
    ids = sorted(s.models)
    task = s.global_eval_task(client.client_id)
    metrics, _, _ = call(evaluate, client, _config(run, **task.config),
                         {m: s.models[m] for m in ids})
    omega = metrics[W.OMEGA_REPLY]
    best = max(range(len(ids)), key=lambda j: (omega[j], -ids[j]))
    return ids[best], "largest responsibility (EM)", {
        "responsibilities": _by_id(ids, omega), "em_iterations": int(metrics[W.ITERATIONS])}


def route_fielding(run: TrainedRun, client: NewClient) -> tuple[int, str, dict]:
    """Fielding's newcomer: its representation (the family's client code: label distribution,
    embedding or gradient on the probe model) goes to the nearest cluster centre under the
    run's metric."""
    from fedcluster_app.families.fielding import clustering
    from fedcluster_app.families.fielding import wire as W
    from fedcluster_app.families.fielding.client import representation

    s = run.strategy
    if not s.centers:
        return route_lowest_loss(run, client)
    probe = s.models.get(s.probe_id) if s.probe_id is not None else None
    vec = representation(client, _config(run, **s.params.to_message(W.PARAMS, W.CLIENT_KEYS)),
                         probe)
    ids = sorted(s.centers)
    dist = [clustering.distance(vec, s.centers[m], s.params.metric) for m in ids]
    best = min(range(len(ids)), key=lambda j: (dist[j], ids[j]))
    return ids[best], f"nearest centre ({s.params.rep} representation, {s.params.metric})", {
        "distances": _by_id(ids, dist)}


def route_flexcfl(run: TrainedRun, client: NewClient) -> tuple[int, str, dict]:
    """FlexCFL's (and FedGroup's) client cold start: pre-train from w0 on the client's samples
    (the family's pre-training handler), join the group whose initial direction is most
    similar, argmin (1 - cos(dw0_g, dw)) / 2 (``FlexCFL.nearest_group``)."""
    from fedcluster_app.families.flexcfl.client import pretrain
    from fedcluster_app.families.flexcfl.grouping import cosine, flatten
    from fedcluster_app.families.flexcfl.wire import PRETRAIN_ITERS

    s = run.strategy
    if s.w0_id is None or not s.directions:
        return route_lowest_loss(run, client)
    w0 = s.models[s.w0_id]
    _, trained, _ = call(pretrain, client, _config(run, **{PRETRAIN_ITERS: s.pretrain_iters}),
                         {s.w0_id: w0})
    delta = flatten(trained[s.w0_id]) - flatten(w0)
    dis = {g: (1.0 - cosine(s.directions[g], delta)) / 2.0 for g in sorted(s.directions)}
    return s.nearest_group(delta), "most similar update direction (cold start)", {
        "dissimilarities": {str(g): float(d) for g, d in dis.items()}}


def route_fedccfa(run: TrainedRun, client: NewClient) -> tuple[int, str, dict]:
    """FedCCFA clusters clients by the similarity of their classifiers: the newcomer trains
    its balanced classifier as a FedCCFA client does (from the server's classifier phi(0),
    ``bal-steps`` steps at ``bal-lr`` on ``bal-per-class`` samples of every class, the
    extractor frozen) and takes the personal classifier of the known client whose rows of
    those classes are most similar (mean cosine). ``Route.model_id`` is the global model; the
    evidence names the client whose classifier it uses."""
    from fedcluster_app.families.fedccfa.client import _train_head

    s, p = run.strategy, run.strategy.params
    heads = {cid: parts for cid in sorted(run.client_states)
             if (parts := _classifier(run, cid)) is not None}
    if not heads:
        raise ValueError(f"{s.name} keeps its classifiers on the clients, and checkpoint "
                         f"{run.checkpoint} holds no client state (checkpoint-client-state = "
                         f"false): there is no classifier to route to")
    x, y = client.train_data(0)
    net = run.model(s.models[s.gid])
    with torch.no_grad():
        z = net.features(as_tensor(x))
    counts = np.bincount(y, minlength=run.exp.spec.num_classes)
    present = np.flatnonzero(counts > 0)
    m = int(min(p.bal_per_class, counts[present].min()))
    rng = np.random.default_rng([run.exp.cfg.seed, client.client_id, 0xCCFA])
    idx = np.concatenate([rng.choice(np.flatnonzero(y == c), size=m, replace=False)
                          for c in present])
    _train_head(net.classifier, z, torch.from_numpy(y), [idx] * p.bal_steps, p.bal_lr, p)
    rows = net.classifier.weight.detach().numpy()[present]
    sims = {}
    for cid, (w, _b) in heads.items():
        other = w[present]
        cos = (rows * other).sum(1) / np.maximum(
            np.linalg.norm(rows, axis=1) * np.linalg.norm(other, axis=1), 1e-12)
        sims[cid] = float(cos.mean())
    best = max(sims, key=lambda c: (sims[c], -c))
    return s.gid, "most similar personal classifier (balanced classifier rows, cosine)", {
        "similarities": {str(c): v for c, v in sims.items()}, "classifier_of_client": best}


def _classifier(run: TrainedRun, cid: int) -> tuple[np.ndarray, np.ndarray] | None:
    for tensors in run.personal_parts(cid).values():
        if set(tensors) == {"classifier.weight", "classifier.bias"}:
            return tensors["classifier.weight"], tensors["classifier.bias"]
    return None


def family_routes() -> list[tuple[type, Callable]]:
    """A family's newcomer rule by strategy class (subclasses included); every other strategy
    (IFCA, FedDrift, CFL, ...) routes by the lowest loss. Imported when a run is routed."""
    from fedcluster_app.families.fedccfa.fedccfa import FedCCFA
    from fedcluster_app.families.fedrc.fedrc import FedRC
    from fedcluster_app.families.fielding.fielding import Fielding
    from fedcluster_app.families.flexcfl.flexcfl import FlexCFL

    return [(FedRC, route_fedrc), (Fielding, route_fielding), (FlexCFL, route_flexcfl),
            (FedCCFA, route_fedccfa)]



class LoadedRun:
    """A finished (or checkpointed) run, ready to predict (module docstring)."""

    def __init__(self, run: TrainedRun) -> None:
        self.run = run
        self.strategy_name = run.strategy.name
        self.input_shape = tuple(run.exp.spec.input_shape)
        self.classes = list(range(run.exp.spec.num_classes))
        #: class i's label as the run's data wrote it (remap-labels), else None
        self.class_names = list(run.exp.scenario.class_names) or None
        self.preprocessing = run.exp.scenario.preprocessing
        self.models: dict[int, nn.Module] = {m: run.model(run.strategy.models[m])
                                             for m in run.cluster_ids()}
        self.assignments: dict[int, int | None] = run.assignments()

    def __repr__(self) -> str:
        return (f"LoadedRun({self.strategy_name}, {len(self.models)} cluster models, "
                f"{len(self.assignments)} clients, {self.run.checkpoint})")

    # -- inputs
    def prepare(self, x, raw: bool = True) -> np.ndarray:
        """``x`` as the model sees it: the run's preprocessing applied (unless not ``raw``),
        its shape checked against the model's input shape."""
        x = np.asarray(x)
        if x.shape[1:] != self.input_shape:
            raise ValueError(f"inputs of shape {x.shape} do not fit this run's model: expected "
                             f"(n, {', '.join(map(str, self.input_shape))})")
        if not raw:
            return np.ascontiguousarray(x, dtype=np.float32)
        if self.preprocessing is None:
            raise ValueError(f"the preprocessing of this run's data is unknown here (its "
                             f"dataset {self.run.exp.cfg.dataset!r} is not readable on this "
                             f"machine); pass inputs as the model sees them with raw=False")
        return apply_preprocessing(self.preprocessing, x)

    def labels(self, y, n: int | None = None) -> np.ndarray:
        """``y`` as class indices: labels as the run's data wrote them where remap-labels
        numbered them (the manifest's ``class_names``), else the indices themselves."""
        y = np.asarray(y)
        n = len(y) if n is None else n
        if y.shape != (n,):
            raise ValueError(f"labels of shape {y.shape} for {n} inputs; expected ({n},)")
        if self.class_names:     # remap-labels numbered the data's labels: y holds such labels
            index = {v: i for i, v in enumerate(self.class_names)}
            values = y.tolist()
            unknown = sorted({repr(v) for v in values if v not in index})
            if unknown:
                raise ValueError(f"labels {', '.join(unknown[:5])} are not among this run's "
                                 f"classes {self.class_names} (as its data wrote them)")
            return np.array([index[v] for v in values], dtype=np.int64)
        if y.dtype.kind not in "iuf" or (y.dtype.kind == "f" and y.size
                                           and not np.all(np.mod(y, 1) == 0)):
            raise ValueError(f"labels must be this run's class indices 0.."
                             f"{len(self.classes) - 1}, got values such as {y.flat[0].item()!r}")
        y = y.astype(np.int64)
        bad = sorted(set(y.tolist()) - set(self.classes))
        if bad:
            raise ValueError(f"labels {bad[:5]} are outside this run's classes "
                             f"0..{len(self.classes) - 1}")
        return y

    # -- known clients
    def predict_proba(self, x, client_id: int, raw: bool = True) -> np.ndarray:
        """Class probabilities of client ``client_id``'s model for ``x`` (n x classes)."""
        nets, weights = self._client_models(int(client_id))
        with torch.no_grad():
            return predict_proba(nets, weights, self.prepare(x, raw)).numpy()

    def predict(self, x, client_id: int, raw: bool = True) -> np.ndarray:
        """The class client ``client_id`` predicts for each row of ``x``."""
        return self.predict_proba(x, client_id, raw).argmax(1)

    def _client_models(self, cid: int) -> tuple[list[nn.Module], list[float]]:
        s = self.run.strategy
        if cid not in self.assignments:
            raise ValueError(f"client {cid} is not in this run: its clients are 0.."
                             f"{len(self.assignments) - 1}; route(x, y) picks a cluster for a "
                             f"new client")
        personal = self._personal(cid)
        if personal is not None:
            return [personal], [1.0]
        task = s.eval_task(cid) if cid in s.clients else None
        if task is not None and P.MIXTURE in task.config and len(task.models) > 1:
            return ([self.run.model(s.models[m]) for m in task.models],
                    [float(w) for w in task.config[P.MIXTURE]])
        mid = self.assignments[cid]
        if mid is None or mid not in s.models:
            raise ValueError(f"client {cid} is in no cluster at the end of the run (held out, "
                             f"or never grouped); route(x, y) picks one from labelled samples")
        return [self.models[mid] if mid in self.models else self.run.model(s.models[mid])], [1.0]

    def _personal(self, cid: int) -> nn.Module | None:
        """The client's own model where the strategy keeps one on the client: a whole personal
        model (``Local``, FedSoft, ...), or a personal classifier on the global model (FedCCFA,
        FedRep, FedBABU, Flash: the strategies with a global model ``gid``); None for a
        strategy without. Such a strategy with a checkpoint without client state: an error."""
        s = self.run.strategy
        task = s.eval_task(cid) if cid in s.clients else None
        whole = task is not None and bool(task.personal or task.config.get(P.PERSONAL))
        head = getattr(s, "gid", None) is not None
        if not (whole or head):
            return None
        parts = self.run.personal_parts(cid)
        names = list(build_model(self.run.exp.spec, 0).state_dict())
        for tensors in parts.values():
            if whole and list(tensors) == names:
                return self.run.model(list(tensors.values()))
            if head and set(tensors) == {"classifier.weight", "classifier.bias"}:
                merged = {**dict(zip(names, s.models[s.gid])), **tensors}
                return self.run.model([merged[k] for k in names])
        raise ValueError(f"{s.name} predicts with each client's own "
                         f"{'model' if whole else 'classifier'}, kept on the client, and "
                         f"checkpoint {self.run.checkpoint} does not hold client {cid}'s (run "
                         f"with checkpoint-client-state = true)")

    # -- new clients
    def route(self, x, y, raw: bool = True) -> Route:
        """The cluster for a client that was not in the run, from labelled samples ``(x, y)``,
        by the strategy's newcomer rule (:func:`family_routes`; else the lowest loss)."""
        xm = self.prepare(x, raw)
        if len(xm) == 0:
            raise ValueError("route needs at least one labelled sample")
        ym = self.labels(y, len(xm))
        client = NewClient(self.run, xm, ym)
        rule = next((fn for cls, fn in family_routes() if isinstance(self.run.strategy, cls)),
                    route_lowest_loss)
        mid, name, evidence = rule(self.run, client)
        if "classifier_of_client" in evidence:    # FedCCFA: that client's personal model
            model = self._personal(int(evidence["classifier_of_client"]))
        else:
            model = (self.models[mid] if mid in self.models
                     else self.run.model(self.run.strategy.models[mid]))
        return Route(int(mid), model, name, evidence)


def load_run(run_dir: str | Path) -> LoadedRun:
    """The run whose checkpoint is in ``run_dir`` (or the checkpoint file itself); a missing,
    corrupt or older checkpoint is an error naming the file."""
    return LoadedRun(open_run(run_dir))
