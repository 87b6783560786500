"""Client side of Fielding (docs/fielding/README.md, "The algorithm as implemented" and
"Representations"; the drift test: D1).

Message kind registered here: ``query.fielding_rep``. The client computes the representation of
its current training window, runs its own drift test against ``r_last`` (the last representation
it reported, kept in ``context.state``) and replies

* ``fielding.drifted`` = 1 and ``fielding.rep`` = r_now when rho(r_now, r_last) > eps_drift, or when
  it registers (no ``r_last`` yet, or the server asks with ``fielding.register``): registration
  always reports; it then sets ``r_last <- r_now``;
* ``fielding.drifted`` = 0 and no vector otherwise.

The server sends every ``fielding.*`` key of the query (rep, metric, eps-drift, grad-layers,
register); the client keeps no defaults of its own, so FieldingParams stays their one declaration.

Representations (``fielding.rep``): ``label`` (p[y] = n(y)/n over the window), ``embedding`` (mean
penultimate-layer features of the shared probe model) and ``gradient`` (gradient of the probe
model's mean cross-entropy on the window: its last layer, or every layer with
``fielding.grad-layers = "all"``). The probe model is broadcast once: the server attaches it to
the query until the client has it, and the client keeps it in ``context.state``; a client that
lost it answers ``fielding.probe-missing`` and gets it again.

Malicious clients (test hook, docs/fielding/README.md D15): the run-config key
``fielding.malicious-fraction`` picks round(f * N) clients (a permutation seeded by the run seed);
they report a randomly permuted vector whenever they register, keep their true vector as ``r_last``
and train honestly.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import ConfigRecord
from torch.nn import functional as F

from fedcluster_app.core import codec
from fedcluster_app.core import wire as P
from fedcluster_app.core.client.handlers import Models
from fedcluster_app.core.client.stream_client import StreamClient
from fedcluster_app.core.training import as_tensor
from fedcluster_app.families.fielding.distances import distance
from fedcluster_app.families.fielding.params import REPRESENTATIONS, FieldingParams
from fedcluster_app.families.fielding.wire import (
    CLIENT_KEYS,
    DRIFTED,
    KIND,
    METRIC,
    PARAMS,
    PROBE_MISSING,
    REGISTER,
    REGISTERED,
    REP,
)

STATE_REP = "fielding.r-last"          # ArrayRecord: [r_last]
STATE_PROBE = "fielding.probe"         # ArrayRecord: the probe model's weights
STATE_INFO = "fielding.client"         # ConfigRecord: representation kind of r_last


def malicious_clients(num_clients: int, fraction: float, seed: int) -> set[int]:
    """The clients that lie at registration: the first round(f * N) of a seeded permutation."""
    if fraction <= 0:
        return set()
    order = np.random.default_rng([seed, 0xBAD]).permutation(num_clients)
    return {int(c) for c in order[: int(round(fraction * num_clients))]}


def _window(client: StreamClient, config: dict) -> tuple[np.ndarray, np.ndarray]:
    return client.train_data(int(config[P.STEP]))


def label_vector(client: StreamClient, config: dict) -> np.ndarray:
    hist = client.label_histogram(int(config[P.STEP])).astype(np.float64)
    return hist / max(hist.sum(), 1.0)


def embedding_vector(client: StreamClient, config: dict, probe: list[np.ndarray]) -> np.ndarray:
    x, _ = _window(client, config)
    model = client.scratch(probe)
    model.eval()
    with torch.no_grad():
        feats = model.features(as_tensor(x, device=client.device))
    return feats.mean(0).double().cpu().numpy()


def gradient_vector(client: StreamClient, config: dict, probe: list[np.ndarray],
                    layers: str) -> np.ndarray:
    x, y = _window(client, config)
    model = client.scratch(probe)
    model.eval()
    params = (list(model.classifier.parameters()) if layers == "last"
              else list(model.parameters()))
    model.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(as_tensor(x, device=client.device)),
                           as_tensor(y, np.int64, client.device))
    grads = torch.autograd.grad(loss, params)
    return torch.cat([g.reshape(-1) for g in grads]).double().cpu().numpy()


def client_params(config: dict) -> dict:
    """The clients' share of the hyper-parameters, as the server sent it (``wire.CLIENT_KEYS``)."""
    return FieldingParams.read_message(config, PARAMS, CLIENT_KEYS)


def representation(client: StreamClient, config: dict, probe: list[np.ndarray] | None) -> np.ndarray:
    p = client_params(config)
    kind = p["rep"]
    if kind == "label":
        return label_vector(client, config)
    if probe is None:
        raise ValueError(f"the {kind} representation needs the probe model")
    if kind == "embedding":
        return embedding_vector(client, config, probe)
    if kind == "gradient":
        return gradient_vector(client, config, probe, p["grad-layers"])
    raise ValueError(f"unknown representation {kind!r}; valid: {', '.join(REPRESENTATIONS)}")


def report(client: StreamClient, config: dict, models: Models):
    """Handler of ``query.fielding_rep`` (see the module docstring)."""
    state = client.state
    p = client_params(config)
    kind = p["rep"]
    probe = None
    if models:  # the probe model, broadcast once
        probe = models[min(models)]
        state[STATE_PROBE] = codec.pack_arrays(probe)
    elif STATE_PROBE in state.array_records:
        probe = codec.unpack_arrays(state.array_records[STATE_PROBE])
    if kind != "label" and probe is None:
        return {PROBE_MISSING: 1, DRIFTED: 0}, {}, {}
    r_now = representation(client, config, probe)
    last = None
    if STATE_REP in state.array_records and STATE_INFO in state.config_records \
            and state.config_records[STATE_INFO].get("kind") == kind:
        last = codec.unpack_arrays(state.array_records[STATE_REP])[0]
    registering = bool(config[REGISTER]) or last is None
    metric = str(config[METRIC])
    drifted = registering or last.shape != r_now.shape or \
        distance(r_now, last, metric) > p["eps-drift"]
    if not drifted:
        return {DRIFTED: 0}, {}, {}
    state[STATE_REP] = codec.pack_arrays([r_now.astype(np.float64)])
    state[STATE_INFO] = ConfigRecord({"kind": kind})
    sent = r_now
    fraction = FieldingParams.from_run_config(client.exp.cfg.raw).malicious_fraction
    if registering and client.client_id in malicious_clients(
            client.exp.scenario.num_clients, fraction, client.exp.cfg.seed):
        perm = np.random.default_rng([client.exp.cfg.seed, client.client_id, 0xBAD]).permutation(len(r_now))
        sent = r_now[perm]
    return {DRIFTED: 1, REGISTERED: int(registering), REP: [float(v) for v in sent]}, {}, {}


HANDLERS = {KIND: report}
