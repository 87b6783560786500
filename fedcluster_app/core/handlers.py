"""Client-side message handlers: the built-in message kinds, and the type every family's
handlers have.

A handler turns one message into calls on this node's :class:`StreamClient` and returns
``(metrics, models, per-model metrics)`` or the same plus named arrays (``{name: arrays}``,
the reply's ``extra.<name>``). A family adds its own kinds in its ``client.py`` as a
``HANDLERS = {"train.<name>": fn, "query.<name>": fn, ...}`` table; the ClientApp registers
the built-in table and every family's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from fedcluster_app.core import wire as P
from fedcluster_app.core.stream_client import StreamClient

Models = dict[int, list[np.ndarray]]
Handler = Callable[[StreamClient, dict[str, Any], Models], tuple]


def train(client: StreamClient, config: dict, models: Models):
    """Train every model sent (or ``train-ids``), or the personal model, or IFCA's best one."""
    if config.get(P.PERSONAL):
        weights, n, m = client.fit(client.personal_weights(), {**config, "model-id": P.PERSONAL_MODEL_ID})
        client.store_personal(weights)
        return {P.NUM_EXAMPLES: n, **m}, {}, {}
    metrics: dict[str, Any] = {}
    train_ids = [int(i) for i in config.get(P.TRAIN_IDS, list(models))]
    if config.get(P.SELECT) == "min-loss":
        ids = sorted(models)
        losses, accs = client.losses([models[i] for i in ids], config)
        chosen = ids[min(range(len(ids)), key=lambda j: (losses[j], j))]
        train_ids = [chosen]
        metrics.update({P.CHOSEN: chosen, P.LOSSES: losses, P.ACCURACIES: accs, P.MODEL_IDS: ids})
    trained, per_model = {}, {}
    for mid in train_ids:
        weights, n, m = client.fit(models[mid], {**config, "model-id": mid})
        trained[mid] = weights
        per_model[mid] = {P.NUM_EXAMPLES: n, **m}
    metrics[P.NUM_EXAMPLES] = max((v[P.NUM_EXAMPLES] for v in per_model.values()), default=0)
    return metrics, trained, per_model


def evaluate(client: StreamClient, config: dict, models: Models):
    """Test accuracy of the personal model, the one model sent, the mixture of several, or
    (``select = "min-loss"``, a newcomer) the model of lowest loss on the labelled training
    split."""
    if config.get(P.PERSONAL):
        loss, n, m = client.evaluate(client.personal_weights(), config)
    elif config.get(P.SELECT) == "min-loss":
        ids = sorted(models)
        losses, _ = client.losses([models[i] for i in ids], config)
        chosen = ids[min(range(len(ids)), key=lambda j: (losses[j], j))]
        loss, n, m = client.evaluate(models[chosen], config)
        m = {**m, P.CHOSEN: chosen}
    elif len(models) == 1:
        loss, n, m = client.evaluate(next(iter(models.values())), config)
    else:
        ids = sorted(models)
        loss, n, m = client.evaluate_mixture([models[i] for i in ids], list(config[P.MIXTURE]), config)
    return {P.LOSS: loss, P.NUM_EXAMPLES: n, **m}, {}, {}


def info(client: StreamClient, config: dict, models: Models):
    _, y = client.train_data(int(config[P.STEP]))
    return {P.NUM_EXAMPLES: len(y)}, {}, {}


def losses(client: StreamClient, config: dict, models: Models):
    ids = sorted(models)
    loss, acc = client.losses([models[i] for i in ids], config)
    return {P.MODEL_IDS: ids, P.LOSSES: loss, P.ACCURACIES: acc}, {}, {}


def histogram(client: StreamClient, config: dict, models: Models):
    hist = client.label_histogram(int(config[P.STEP]))
    return {P.HISTOGRAM: hist.tolist(), P.NUM_EXAMPLES: int(hist.sum())}, {}, {}


HANDLERS: dict[str, Handler] = {
    P.TRAIN: train,
    P.EVALUATE: evaluate,
    P.QUERY_INFO: info,
    P.QUERY_LOSSES: losses,
    P.QUERY_HISTOGRAM: histogram,
}
