"""Which Flower node holds which client id, apart from the strategy base that uses it.

A node is asked its logical client id once (``query.info``); the reply is checked (a client id
inside the scenario's clients, sane metrics) and the node admitted, or refused with the reason
kept for the run's health line. A client id already held by a node that still answers is
refused to a second node; a client that comes back on another node keeps its cluster. With
``bind-client-ids`` a client id belongs to the first node that claimed it, for the whole run
(its owner is checkpointed): under SuperNode authentication a node id is its device's key, so
another device can never take a client id over, with its cluster and its personal state. A
resumed run puts each admitted client's checkpointed state back as it is discovered.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from logging import ERROR, INFO, WARNING
from typing import TYPE_CHECKING

from flwr.app import Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid

from fedcluster_app.core import codec
from fedcluster_app.core import flower_fast
from fedcluster_app.core import wire as P
from fedcluster_app.core.server import exchange
from fedcluster_app.core.server.messages import RejectedReply, check_metrics

if TYPE_CHECKING:   # the strategy module composes this one: its type only
    from fedcluster_app.core.server.strategy import ClusteredStrategy


@dataclass
class ClientRecord:
    """What the server knows of one client: its node, its cluster (hard or soft), its data
    size, the last round it answered and its failures."""

    cid: int
    node_id: int | None = None
    cluster: int | None = None               # hard assignment: a model id
    soft: dict[int, float] | None = None     # soft assignment: model id -> weight
    num_examples: int = 0
    last_round: int = 0                      # last round this client answered
    failures: int = 0
    owner: int | None = None                 # bind-client-ids: the node that claimed it first


class NodeDirectory:
    """The node <-> client-id map of one run and the nodes it did not admit."""

    def __init__(self, strategy: ClusteredStrategy) -> None:
        self.s = strategy
        self.node_to_cid: dict[int, int] = {}
        self.unidentifiable: set[int] = set()     # nodes without a usable client-id
        self.errors: dict[int, str] = {}          # nodes not admitted: why (last error)
        self.refused_duplicates: set[int] = set()  # nodes claiming a client id held by a live node

    def discover(self, grid: Grid) -> list[int]:
        """Ask nodes not seen yet for their logical id; returns the newly known client ids."""
        s = self.s
        unknown = [n for n in grid.get_node_ids()
                   if n not in self.node_to_cid and n not in self.unidentifiable]
        if not unknown:
            return []
        step = s.protocol.time_step(max(s.round, 1))
        messages = [flower_fast.instruction(codec.build_content(config={P.ROUND: s.round,
                                                                         P.STEP: step}),
                                            n, P.QUERY_INFO, "discover")
                    for n in unknown]
        new, mapped = [], []
        for msg in exchange.send_and_receive(grid, messages, s.round_timeout):
            node = msg.metadata.src_node_id
            if msg.has_error():   # e.g. its data failed to load: asked again next round
                if node not in self.errors:
                    log(ERROR, "node %d could not answer the discovery query: %s (asked again "
                        "every round)", node, msg.error.reason)
                self.errors[node] = msg.error.reason
                continue
            try:
                cid, num_examples = self.identify(msg)
            except RejectedReply as ex:
                log(ERROR, "node %d refused: %s", node, ex)
                self.unidentifiable.add(node)
                self.errors[node] = f"refused: {ex}"
                continue
            self.errors.pop(node, None)
            rec = s.clients.get(cid)
            if s.cfg.bind_client_ids and rec is not None and rec.owner not in (None, node):
                log(ERROR, "node %d refused: client id %d belongs to node %d for this run "
                    "(bind-client-ids)", node, cid, rec.owner)
                self.unidentifiable.add(node)   # never asked again
                self.errors[node] = f"refused: client id {cid} belongs to node {rec.owner}"
                continue
            if rec is not None and rec.node_id not in (None, node) and self.holder_alive(rec):
                if node not in self.refused_duplicates:
                    log(ERROR, "node %d refused: client id %d is already held by node %d, which is "
                        "still answering", node, cid, rec.node_id)
                    self.refused_duplicates.add(node)
                continue
            if rec is not None and rec.node_id not in (None, node):
                log(INFO, "client %d is back on node %d (was node %d); it keeps cluster %s",
                    cid, node, rec.node_id, rec.cluster)
                self.node_to_cid.pop(rec.node_id, None)
            self.node_to_cid[node] = cid
            mapped.append(cid)
            if rec is None:
                rec = s.clients[cid] = ClientRecord(cid)
                new.append(cid)
            rec.node_id = node
            if s.cfg.bind_client_ids and rec.owner is None:
                rec.owner = node
            rec.num_examples = num_examples
        if s.checkpoints.pending_states:
            s.checkpoints.restore(grid, mapped)
        return sorted(new)

    def identify(self, msg: Message) -> tuple[int, int]:
        """(client id, num-examples) of a discovery reply; RejectedReply when it has no usable
        client id (none, not an integer, or outside the scenario's clients)."""
        s = self.s
        try:
            records = flower_fast.records_of(msg.content, MetricRecord)
            if P.METRICS not in records:
                raise RejectedReply("its reply has no metrics record")
            metrics = check_metrics(dict(records[P.METRICS]), s.max_examples)
        except RejectedReply as ex:
            raise RejectedReply(f"it could not identify itself ({ex})") from None
        except Exception as ex:   # anything a hostile reply makes decoding raise
            raise RejectedReply(f"it could not identify itself (malformed reply: "
                                f"{type(ex).__name__}: {ex})") from None
        if P.CLIENT_ID not in metrics:
            raise RejectedReply("it sent no client id; set the node-config key client-id")
        cid, population = metrics[P.CLIENT_ID], s.exp.scenario.num_clients
        if not 0 <= cid < population:
            raise RejectedReply(f"client id {cid} is outside this scenario's clients "
                                f"0..{population - 1}")
        return cid, int(metrics.get(P.NUM_EXAMPLES, 0))

    def holder_alive(self, rec: ClientRecord) -> bool:
        """A node holding a client id counts as alive while it has not missed a round."""
        s = self.s
        return rec.last_round >= s.round - 1 and rec.cid not in s.round_stats.failed_clients

    def wait_for(self, grid: Grid) -> None:
        """Wait up to node-wait-s for min-nodes (default: every client of the scenario)."""
        s = self.s
        wanted = s.cfg.min_nodes or s.exp.scenario.num_clients
        deadline = time.monotonic() + s.cfg.node_wait_s
        while len(list(grid.get_node_ids())) < wanted and time.monotonic() < deadline:
            time.sleep(0.2)
        found = len(list(grid.get_node_ids()))
        if found < wanted:
            log(WARNING, "only %d of %d nodes connected after %.0f s; starting with them "
                "(in simulation set num-supernodes=%d; `fedcluster run` does this for you)",
                found, wanted, s.cfg.node_wait_s, wanted)
