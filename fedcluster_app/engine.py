"""The in-process engine: a Flower ``Grid`` that calls the ClientApp directly (no Ray, no network).

It runs the real ServerApp and ClientApp code with one ``Context`` per virtual node, so client
state in ``context.state`` behaves as in simulation and deployment. Used by tests and for fast
experiments; the same seed gives the same metrics as a ``flwr run`` simulation.
"""

from __future__ import annotations

import contextlib
import itertools
import random
from collections.abc import Callable, Iterable

from flwr.app import Context, Error, Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

from fedcluster_app.client_app import app as default_client_app
from fedcluster_app.client_app import handle_many
from fedcluster_app.core import codec
from fedcluster_app.core.config import ConfigValue, merge_overrides
from fedcluster_app.core.flower_fast import expired

ClientAppFn = Callable[[Message, Context], Message]


class InProcessGrid(Grid):
    """Delivers each message synchronously to ``client_app`` with that node's Context.

    Exceptions become error replies, as in Flower's runtimes. With ``batch-clients`` (and the
    package's own ClientApp) the messages of one push are answered together, their training
    jobs run as one batched program (``client_app.handle_many``).

    Time to live, as on Flower's runtimes: a message whose time to live (its round's
    deadline) has run out when its turn comes is never delivered, as a node never gets an
    expired instruction, and a reply that comes after it is dropped, as the SuperLink drops a
    reply to an expired instruction. The clients run one after another here, as on a Ray
    cluster with one worker: a round waits at most until its deadline plus the one call under
    way then, which finishes (the client's state advances, it is never rolled back) but is not
    counted.
    """

    def __init__(
        self,
        run_config: dict[str, ConfigValue],
        num_nodes: int,
        client_app: ClientAppFn = default_client_app,
        run_id: int = 1,
        node_config: Callable[[int], dict[str, ConfigValue]] | None = None,
    ) -> None:
        self._app = client_app
        # the package's own ClientApp: no wrapper (faults.py) sits between its messages and it
        self.own_app = client_app is default_client_app
        self._batch = self.own_app and bool(run_config.get("batch-clients", True))
        self._run_id = run_id
        rng = random.Random(run_id)
        # random node ids, like Flower's: nothing may rely on their order or value
        self.contexts: dict[int, Context] = {}
        shared = dict(run_config)   # one dict for all nodes: load_experiment knows it at once
        for i in range(num_nodes):
            node_id = rng.getrandbits(62) + 2
            cfg = node_config(i) if node_config else {"partition-id": i, "num-partitions": num_nodes}
            self.contexts[node_id] = Context(
                run_id=run_id, node_id=node_id, node_config=cfg, state=RecordDict(),
                run_config=shared,
            )
        self._ids = itertools.count(1)
        self._replies: dict[str, Message] = {}
        self.messages_sent = 0
        TaskIdentity.run_id = run_id   # Message() outside a Flower runtime needs these set
        TaskIdentity.node_id = 1
        TaskIdentity.task_id = 1

    # Grid API ---------------------------------------------------------------------------
    def set_run(self, run) -> None:
        self._run = run

    @property
    def run(self):
        return getattr(self, "_run", None)

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None) -> Message:
        return Message(content=content, dst_node_id=dst_node_id, message_type=message_type,
                       group_id=group_id, ttl=ttl)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        pairs = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = f"m{next(self._ids)}"
            pairs.append((msg, self.contexts[msg.metadata.dst_node_id]))
        self.messages_sent += len(pairs)
        pairs = [(msg, ctx) for msg, ctx in pairs if not expired(msg)]
        if self._batch:
            replies = handle_many(pairs)
            replies = [None if expired(msg) else r for (msg, _), r in zip(pairs, replies)]
        else:   # one by one: an instruction that expires while the others run is not delivered
            replies = [None if expired(msg) else self._answer_in_time(msg, ctx)
                       for msg, ctx in pairs]
        for (msg, _), reply in zip(pairs, replies):
            if reply is None:   # never delivered, or answered after it expired: no reply
                continue
            if isinstance(reply, Exception):   # a failing client must not stop the run
                reply = Message(Error(code=2, reason=f"{type(reply).__name__}: {reply}"),
                                reply_to=msg)
            self._replies[msg.metadata.message_id] = reply
        return [msg.metadata.message_id for msg, _ in pairs]

    def _answer_in_time(self, msg: Message, ctx: Context) -> Message | Exception | None:
        reply = self._call(msg, ctx)
        return None if expired(msg) else reply

    def _call(self, msg: Message, ctx: Context) -> Message | Exception:
        try:
            return self._app(msg, ctx)
        except Exception as ex:  # noqa: BLE001
            return ex

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._replies.pop(m) for m in message_ids if m in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None):
        return self.pull_messages(self.push_messages(messages))


def run_inprocess(
    overrides: dict[str, ConfigValue] | None = None,
    *,
    num_nodes: int | None = None,
    client_app: ClientAppFn = default_client_app,
    grid_cls: type[InProcessGrid] = InProcessGrid,
) -> dict:
    """Run one experiment in this process; returns its summary (as in summary.json)."""
    from fedcluster_app.api import run_config_defaults
    from fedcluster_app.core.experiment import load_experiment
    from fedcluster_app.core.models import resolve_device
    from fedcluster_app.server_app import run_server

    run_config = merge_overrides(run_config_defaults(overrides), dict(overrides or {}))
    exp = load_experiment(run_config)
    resolve_device(exp.cfg.device)   # the clients run here: a missing GPU fails before round 1
    if num_nodes is None:
        num_nodes = exp.scenario.num_clients
    grid = grid_cls(run_config, num_nodes, client_app=client_app)
    # server and clients share this process: arrays travel by reference, unless a wrapped
    # ClientApp (faults.py) may rewrite a message's bytes
    with codec.by_reference() if grid.own_app else contextlib.nullcontext():
        return run_server(grid, run_config)
