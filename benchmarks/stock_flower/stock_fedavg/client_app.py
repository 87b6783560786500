"""The ClientApp: train and evaluate the received MLP on this node's data of the round's step."""

from __future__ import annotations

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from stock_fedavg import task

app = ClientApp()


def _setup(msg: Message, context: Context):
    rc = context.run_config
    client = int(context.node_config["partition-id"])
    step = task.time_step(int(msg.content["config"]["server-round"]), int(rc["rounds-per-step"]))
    data = task.scenario(int(rc["num-clients"]), int(rc["num-steps"]), int(rc["seed"])
                         ).step_data(client, step)
    model = task.mlp()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    return rc, client, step, data, model


@app.train()
def train(msg: Message, context: Context) -> Message:
    rc, client, step, data, model = _setup(msg, context)
    seed = hash((int(rc["seed"]), client, int(msg.content["config"]["server-round"])))
    loss = task.train(model, data.x_train, data.y_train, lr=float(rc["lr"]),
                      steps=int(rc["local-steps"]), batch_size=int(rc["batch-size"]),
                      seed=seed & 0xFFFFFFFF)
    metrics = MetricRecord({"train_loss": loss, "num-examples": len(data.y_train)})
    return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics}),
                   reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    _, _, _, data, model = _setup(msg, context)
    loss, acc = task.test(model, data.x_test, data.y_test)
    metrics = MetricRecord({"eval_loss": loss, "eval_acc": acc, "num-examples": len(data.y_test)})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)
