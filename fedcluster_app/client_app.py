"""Flower ClientApp: turns messages into calls on this node's StreamClient and back.

The logical client id is the ``client-id`` node-config key in deployment and ``partition-id``
in simulation; every reply carries it, with the ground-truth concept of the step (read only by
metrics and the Oracle). Algorithm families add their own message kinds with
``register_query`` / ``register_train`` / ``register_evaluate`` from a module in ``clients/`` instead of editing this
file.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from . import protocol as P
from .clients.stream_client import StreamClient
from .experiment import load_experiment

app = ClientApp()

Models = dict[int, list[np.ndarray]]
# handler(client, config, models) -> (metrics, models to send back, per-model metrics), or the
# same plus other named arrays to send back ({name: arrays}, the reply's ``extra.<name>``)
Handler = Callable[[StreamClient, dict[str, Any], Models], tuple]


def logical_client_id(context: Context) -> int:
    node_config = context.node_config
    for key in ("client-id", "partition-id"):
        if key in node_config:
            return int(node_config[key])
    raise ValueError("node config has neither 'client-id' nor 'partition-id'")


def make_client(context: Context) -> StreamClient:
    """This node's client. A SuperNode's ``data-dir`` node-config key (its local data) takes
    precedence over the run config's."""
    run_config = context.run_config
    data_dir = context.node_config.get("data-dir")
    if data_dir:
        if not Path(str(data_dir)).is_dir():
            raise FileNotFoundError(f"node-config data-dir {data_dir!r} is not a directory")
        run_config = {**run_config, "data-dir": str(data_dir)}
    return StreamClient(logical_client_id(context), load_experiment(run_config), context.state)


def _config(msg: Message) -> dict:
    return dict(msg.content.config_records[P.CONFIG]) if P.CONFIG in msg.content.config_records else {}


def _wrap(handler: Handler) -> Callable[[Message, Context], Message]:
    def handle(msg: Message, context: Context) -> Message:
        client = make_client(context)
        config = _config(msg)
        step = int(config[P.STEP])
        metrics, models, model_metrics, *extras = handler(client, config,
                                                          P.unpack_models(msg.content))
        base = {P.CLIENT_ID: client.client_id, P.CONCEPT: client.concept(step), P.STEP: step}
        content = P.reply_content({**base, **metrics}, models, model_metrics, *extras)
        return Message(content, reply_to=msg)

    handle.__name__ = getattr(handler, "__name__", "handler")
    return handle


def register_query(name: str, handler: Handler) -> None:
    """Handle ``query.<name>`` messages with ``handler``."""
    app.query(name)(_wrap(handler))


def register_train(name: str, handler: Handler) -> None:
    """Handle ``train.<name>`` messages (a training variant of an algorithm family)."""
    app.train(name)(_wrap(handler))


def register_evaluate(name: str, handler: Handler) -> None:
    """Handle ``evaluate.<name>`` messages (an evaluation variant of an algorithm family)."""
    app.evaluate(name)(_wrap(handler))


# ---------------------------------------------------------------------------- built-in kinds
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


app.train()(_wrap(train))
app.evaluate()(_wrap(evaluate))
register_query("info", info)
register_query("losses", losses)
register_query("histogram", histogram)

# Algorithm families' client-side handlers register themselves on import.
from .clients import handlers  # noqa: E402,F401  (after register_* exist: they import them)
