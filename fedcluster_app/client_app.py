"""Flower ClientApp: turns messages into calls on this node's StreamClient and back.

The logical client id is the ``client-id`` node-config key in deployment and ``partition-id``
in simulation; every reply carries it, with the ground-truth concept of the step (read only by
metrics and the Oracle). The message kinds are the built-in ones (``core/client/handlers.py``) and
those of every algorithm family (``HANDLERS`` of ``families/<family>/client.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from logging import INFO
from pathlib import Path

from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.logger import log

from fedcluster_app import families
from fedcluster_app.core import codec
from fedcluster_app.core import flower_fast
from fedcluster_app.core.client import handlers
from fedcluster_app.core import wire as P
from fedcluster_app.core.data.catalogue import reads_dataset
from fedcluster_app.core.data.sources import is_node_spec
from fedcluster_app.core.experiment import load_experiment
from fedcluster_app.core.client.handlers import Handler
from fedcluster_app.core.client.stream_client import StreamClient


class _ClientApp(ClientApp):
    """Flower's ClientApp, pickled as a reference to this module's ``app``.

    Flower's Ray backend pickles the ClientApp with every message it hands a worker, and
    cloudpickle copies by value every function it cannot name (each message kind's handler is
    a closure): 5.7 KB and about 18 ms of the simulation process's CPU per message on a loaded
    2-core machine, against 0.03 ms for stock Flower's two module-level functions
    (docs/operations/performance.md, "The Ray path against stock Flower"). A worker imports
    this module and gets the same app, with the same handlers, by name."""

    def __reduce__(self):
        return _the_app, ()


def _the_app() -> ClientApp:
    return app


app = _ClientApp()


def logical_client_id(context: Context) -> int:
    node_config = context.node_config
    for key in ("client-id", "partition-id"):
        if key in node_config:
            return int(node_config[key])
    raise ValueError("node config has neither 'client-id' nor 'partition-id'")


def make_client(context: Context) -> StreamClient:
    """This node's client. A SuperNode's ``data-dir`` node-config key (its local data) takes
    precedence over the run config's.

    ``data-dir`` may also be a dataset file spec (``npz:PATH``, ``csv:PATH``, ``parquet:PATH``,
    ``imagefolder:PATH``, ``hf-disk:PATH``) for the ``dataset-*`` scenarios: that file is then
    this node's whole local data, its shard. The node replaces the run config's ``dataset`` with
    it and samples it as ``partition = iid`` without ``disjoint`` (its own class frequencies;
    test samples from its own test split or held-out fraction). With ``partition-column`` the
    file holds this node's rows (one value of the column), or a whole table of which the node
    takes the ``client-id``-th value (sorted). Set ``num-classes`` (and ``input-shape``) in the
    run config so that every node and the server agree on the model even when a node lacks
    classes. The node logs once what reading its file changed (remapped labels, fewer rows than
    a step asks for).
    """
    run_config = context.run_config
    data_dir = context.node_config.get("data-dir")
    own_file = bool(data_dir) and is_node_spec(data_dir)
    if own_file:
        scenario = str(run_config.get("scenario", ""))
        if not reads_dataset(scenario):
            raise ValueError(f"node-config data-dir {data_dir!r} is a dataset file, which only the "
                             f"dataset-* scenarios read; scenario {scenario!r} reads a directory "
                             f"(or nothing)")
        natural = bool(str(run_config.get("partition-column", "")).strip())
        run_config = {**run_config, "dataset": str(data_dir).strip(),
                      "partition": "" if natural else "iid", "disjoint": False}
    elif data_dir:
        if not Path(str(data_dir)).is_dir():
            raise FileNotFoundError(f"node-config data-dir {data_dir!r} is not a directory")
        run_config = {**run_config, "data-dir": str(data_dir)}
    client = StreamClient(logical_client_id(context), load_experiment(run_config), context.state)
    if own_file and client.first_time("data-report"):   # a process per message: state says
        for line in client.exp.scenario.data_report([client.client_id]):
            log(INFO, "%s", line)
    return client


def _config(msg: Message) -> dict:
    record = flower_fast.records_of(msg.content, ConfigRecord).get(P.CONFIG)
    return dict(flower_fast.data_of(record)) if record is not None else {}


def _reply(msg: Message, client: StreamClient, config: dict, result: tuple) -> Message:
    metrics, models, model_metrics, *extras = result
    if msg.metadata.message_type.startswith("train"):
        metrics, model_metrics = client.honest_counts(metrics, model_metrics)
    step = int(config[P.STEP])
    # the round and step it answers, echoed: the server drops a reply to another instruction
    base = {P.CLIENT_ID: client.client_id, P.CONCEPT: client.concept(step), P.STEP: step,
            **({P.ROUND: int(config[P.ROUND])} if P.ROUND in config else {})}
    return flower_fast.reply(codec.reply_content({**base, **metrics}, models, model_metrics, *extras), msg)


def _request(msg: Message, context: Context) -> tuple[StreamClient, dict, handlers.Models]:
    """This node's client, the message's config and its models; a message without a step is
    refused before any work."""
    client, config = make_client(context), _config(msg)
    int(config[P.STEP])
    return client, config, codec.unpack_models(msg.content)


class InstructionExpired(RuntimeError):
    """The instruction's time to live (its round's deadline) ran out while it was handled."""


def _wrap(handler: Handler) -> Callable[[Message, Context], Message]:
    def handle(msg: Message, context: Context) -> Message:
        client, config, models = _request(msg, context)
        reply = _reply(msg, client, config, handlers.call(handler, client, config, models))
        if flower_fast.expired(msg):
            # the server has stopped waiting: raising keeps Flower from writing this call's
            # Context back, which on a simulation could overwrite the state a newer message
            # of this node has written meanwhile (a state rolled back by a late reply)
            raise InstructionExpired(f"round {config.get(P.ROUND)}'s instruction expired while "
                                     f"it was handled; its reply and state are dropped")
        return reply

    handle.__name__ = getattr(handler, "__name__", "handler")
    return handle


# message kind -> handler, for the engines that batch messages of one kind across clients
KINDS: dict[str, Handler] = {}


def register(kind: str, handler: Handler) -> None:
    """Answer messages of type ``kind`` ("train", "evaluate", "query.<name>", "train.<name>",
    ...) with ``handler``."""
    action, _, name = kind.partition(".")
    decorators = {"train": app.train, "evaluate": app.evaluate, "query": app.query}
    if action not in decorators:
        raise ValueError(f"message kind {kind!r} is not train[.name], evaluate[.name] or query.name")
    decorate = decorators[action](name) if name else decorators[action]()
    decorate(_wrap(handler))
    KINDS[kind] = handler


def handle_many(messages: list[tuple[Message, Context]]) -> list[Message | Exception]:
    """Replies to the given (message, node context) pairs, as ``app`` would give them one by
    one, except that the training jobs of all of them run as one batched program
    (``core/client/batched.py``). Messages of a kind without a handler here go to ``app``. A message
    whose handling raises gets its exception back in its place."""
    out: list[Message | Exception | None] = [None] * len(messages)
    calls, where = [], []
    for i, (msg, context) in enumerate(messages):
        handler = KINDS.get(msg.metadata.message_type)
        try:
            if handler is None:
                out[i] = app(msg, context)
                continue
            calls.append((handler, *_request(msg, context)))
            where.append(i)
        except Exception as ex:  # noqa: BLE001 - one node's failure is its own error reply
            out[i] = ex
    for i, call, result in zip(where, calls, handlers.call_many(calls)):
        try:
            out[i] = result if isinstance(result, Exception) else _reply(
                messages[i][0], call[1], call[2], result)
        except Exception as ex:  # noqa: BLE001
            out[i] = ex
    return out  # type: ignore[return-value]


for _kind, _handler in {**handlers.HANDLERS, **families.client_handlers()}.items():
    register(_kind, _handler)


# A node's context.state lives in its process (and Flower gives every new `flwr run` an empty
# one), so the server keeps a copy in its checkpoint and a resumed run puts it back: the
# personal models, classifiers, anchors and representations continue from the checkpointed
# round (run-config key checkpoint-client-state).
@app.query(P.QUERY_STATE.partition(".")[2])
def send_state(msg: Message, context: Context) -> Message:
    content = RecordDict({P.STATE_PREFIX + key: record for key, record in context.state.items()})
    content[P.METRICS] = MetricRecord({P.CLIENT_ID: logical_client_id(context)})
    return Message(content, reply_to=msg)


@app.query(P.QUERY_RESTORE.partition(".")[2])
def restore_state(msg: Message, context: Context) -> Message:
    for key in list(context.state.keys()):
        del context.state[key]
    for key, record in msg.content.items():
        if key.startswith(P.STATE_PREFIX):
            context.state[key[len(P.STATE_PREFIX):]] = record
    return Message(RecordDict({P.METRICS: MetricRecord({P.CLIENT_ID: logical_client_id(context)})}),
                   reply_to=msg)
