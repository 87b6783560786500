"""Flower ClientApp: turns messages into calls on this node's StreamClient and back.

The logical client id is the ``client-id`` node-config key in deployment and ``partition-id``
in simulation; every reply carries it.
"""

from __future__ import annotations

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from . import protocol as P
from .clients.stream_client import StreamClient
from .experiment import load_experiment

app = ClientApp()


def logical_client_id(context: Context) -> int:
    node_config = context.node_config
    for key in ("client-id", "partition-id"):
        if key in node_config:
            return int(node_config[key])
    raise ValueError("node config has neither 'client-id' nor 'partition-id'")


def make_client(context: Context) -> StreamClient:
    return StreamClient(logical_client_id(context), load_experiment(context.run_config), context.state)


def _base_metrics(client: StreamClient, step: int) -> dict:
    return {P.CLIENT_ID: client.client_id, P.CONCEPT: client.concept(step), P.STEP: step}


def _config(msg: Message) -> dict:
    return dict(msg.content.config_records[P.CONFIG]) if P.CONFIG in msg.content.config_records else {}


@app.train()
def train(msg: Message, context: Context) -> Message:
    client = make_client(context)
    config = _config(msg)
    step = int(config[P.STEP])
    models = P.unpack_models(msg.content)
    metrics = _base_metrics(client, step)

    if config.get(P.PERSONAL):
        weights, n, m = client.fit(client.personal_weights(), {**config, "model-id": P.PERSONAL_MODEL_ID})
        client.store_personal(weights)
        metrics.update({P.NUM_EXAMPLES: n, **m})
        return Message(P.reply_content(metrics), reply_to=msg)

    train_ids = [int(i) for i in config.get(P.TRAIN_IDS, list(models))]
    if config.get(P.SELECT) == "min-loss":
        ids = sorted(models)
        losses, accs = client.losses([models[i] for i in ids], step)
        chosen = ids[min(range(len(ids)), key=lambda j: (losses[j], j))]
        train_ids = [chosen]
        metrics.update({P.CHOSEN: chosen, P.LOSSES: losses, P.ACCURACIES: accs, P.MODEL_IDS: ids})

    trained, per_model = {}, {}
    for mid in train_ids:
        weights, n, m = client.fit(models[mid], {**config, "model-id": mid})
        trained[mid] = weights
        per_model[mid] = {P.NUM_EXAMPLES: n, **m}
    metrics[P.NUM_EXAMPLES] = max((v[P.NUM_EXAMPLES] for v in per_model.values()), default=0)
    return Message(P.reply_content(metrics, trained, per_model), reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    client = make_client(context)
    config = _config(msg)
    step = int(config[P.STEP])
    metrics = _base_metrics(client, step)
    if config.get(P.PERSONAL):
        loss, n, m = client.evaluate(client.personal_weights(), config)
    else:
        models = P.unpack_models(msg.content)
        if len(models) == 1:
            loss, n, m = client.evaluate(next(iter(models.values())), config)
        else:
            loss, n, m = client.evaluate_mixture(
                [models[i] for i in sorted(models)], list(config[P.MIXTURE]), config
            )
    metrics.update({P.LOSS: loss, P.NUM_EXAMPLES: n, **m})
    return Message(P.reply_content(metrics), reply_to=msg)


@app.query("info")
def info(msg: Message, context: Context) -> Message:
    client = make_client(context)
    step = int(_config(msg)[P.STEP])
    x, y = client.train_data(step)
    metrics = {**_base_metrics(client, step), P.NUM_EXAMPLES: len(y)}
    return Message(P.reply_content(metrics), reply_to=msg)


@app.query("losses")
def losses(msg: Message, context: Context) -> Message:
    client = make_client(context)
    step = int(_config(msg)[P.STEP])
    models = P.unpack_models(msg.content)
    ids = sorted(models)
    loss, acc = client.losses([models[i] for i in ids], step)
    metrics = {**_base_metrics(client, step), P.MODEL_IDS: ids, P.LOSSES: loss, P.ACCURACIES: acc}
    return Message(P.reply_content(metrics), reply_to=msg)


@app.query("histogram")
def histogram(msg: Message, context: Context) -> Message:
    client = make_client(context)
    step = int(_config(msg)[P.STEP])
    hist = client.label_histogram(step)
    metrics = {**_base_metrics(client, step), P.HISTOGRAM: hist.tolist(), P.NUM_EXAMPLES: int(hist.sum())}
    return Message(P.reply_content(metrics), reply_to=msg)
