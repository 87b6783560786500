"""Messages out and replies in, apart from the strategy base that uses them.

One exchange sends every task's message (its models packed once per exchange, the bytes sent
counted), waits up to ``round-timeout``, and keeps a reply only when it answers what was sent:
the checks of ``messages.validate_reply`` (shapes, dtypes, finite values, sizes, metrics), an
update of sane scale (``updates.SentModel``), the strategy's own ``check_reply``. A rejected or
missing reply counts as the client's failure in the round. The kept replies' updates longer
than ``update-norm-bound`` x the median update of the same model are scaled down to it.
"""

from __future__ import annotations

from logging import WARNING
from typing import TYPE_CHECKING

from flwr.common.logger import log
from flwr.serverapp import Grid

from fedcluster_app.core import codec
from fedcluster_app.core import flower_fast
from fedcluster_app.core import wire as P
from fedcluster_app.core.server import exchange
from fedcluster_app.core.server.messages import RejectedReply, Reply, Task, validate_reply
from fedcluster_app.core.server.updates import (
    MAX_UPDATE_SCALE,
    SentModel,
    scale_update,
    weighted_median,
)

if TYPE_CHECKING:   # the strategy module composes this one: its type only
    from fedcluster_app.core.server.strategy import ClusteredStrategy


class Courier:
    """The exchanges of one strategy's run (module docstring)."""

    def __init__(self, strategy: ClusteredStrategy) -> None:
        self.s = strategy

    def exchange(self, grid: Grid, kind: str, tasks: dict[int, Task]) -> list[Reply]:
        """Send one message per task, wait, validate; failures are logged and counted."""
        s = self.s
        wire_kind = s.protocol.message_kind(kind)
        s.protocol.prepare(kind, tasks)
        step = s.step if s.step is not None else s.protocol.time_step(max(s.round, 1))
        extra = s.extra_config.get(kind, {})
        messages, sent, packed = [], {}, {}
        wait = s.runner.time_left()
        if wait <= 0:   # the round's deadline has passed: its instructions would expire unread
            for cid in sorted(tasks):
                if s.clients[cid].node_id is not None:
                    self.fail(cid, f"no {wire_kind} instruction sent: the round's deadline "
                              f"(round-timeout = {s.round_timeout:g} s) has passed", "no-reply")
            return []
        for cid, task in sorted(tasks.items()):
            node = s.clients[cid].node_id
            if node is None:
                continue
            config = {P.ROUND: s.round, P.STEP: step, **extra, **task.config}
            if task.train_ids is not None:
                config[P.TRAIN_IDS] = list(task.train_ids)
            if task.personal:
                config[P.PERSONAL] = True
            for m in task.models:
                if m not in packed:
                    record = codec.pack_message_arrays(s.models[m])
                    packed[m] = record, codec.record_nbytes(record)
            content = codec.build_content({m: packed[m][0] for m in task.models}, config)
            # the instruction's arrays are its models': counted once per model and exchange
            s.round_stats.bytes_down += sum(packed[m][1] for m in task.models)
            # it expires with the round: a node that has not started it by then never will
            messages.append(flower_fast.instruction(content, node, wire_kind, str(s.round),
                                                    ttl=wait))
            sent[node] = (cid, task, (config[P.ROUND], config[P.STEP]))
        replies = (exchange.send_and_receive(grid, messages, wait) if messages else [])
        out, answered = [], set()
        norms: dict[tuple[int, int], float] = {}   # (client, model) -> update norm
        sent_models: dict[int, SentModel] = {}     # model -> its scale and arrays, once
        for msg in replies:
            node = msg.metadata.src_node_id
            cid, task, asked = sent.get(node, (None, None, None))
            if cid is None:
                continue
            answered.add(node)
            try:
                reply = validate_reply(msg, cid, task, s.shapes, s.dtypes, s.max_examples,
                                       asked=asked)
                self.record_truth(reply)
                norms.update(self.check_scale(reply, sent_models))
                s.check_reply(wire_kind, reply)
            except RejectedReply as ex:
                kind = "error" if msg.has_error() else ex.kind
                self.fail(cid, f"{wire_kind} reply rejected: {ex}", kind)
                continue
            except Exception as ex:   # a strategy's own check tripped on a hostile reply
                self.fail(cid, f"{wire_kind} reply rejected: {type(ex).__name__}: {ex}")
                continue
            s.round_stats.bytes_up += reply.nbytes
            s.round_stats.gradient_steps += reply.metrics.get(P.GRADIENT_STEPS, 0)
            s.clients[cid].last_round = s.round
            out.append(reply)
        for node, (cid, _, _) in sent.items():
            if node not in answered:
                self.fail(cid, f"no {wire_kind} reply before the round's deadline "
                          f"(round-timeout = {s.round_timeout:g} s)", "no-reply")
        out = sorted(out, key=lambda r: r.cid)  # order fixed: aggregation sums are reproducible
        self.bound_updates(out, norms)
        if not s.protocol.in_scoring_only:   # score-next-step's own exchanges: not accounted
            s.protocol.on_exchange(kind, tasks, out)
        return out

    def check_scale(self, reply: Reply, sent: dict[int, SentModel]
                    ) -> dict[tuple[int, int], float]:
        """The update norm of every model the reply returns, by (client, model); RejectedReply
        for one out of all proportion to the model it started from: a root-mean-square change
        per weight above MAX_UPDATE_SCALE x the model's own (at least 1) is no training step
        (1e30 weights), whoever else answered. This also holds for a model only one or two
        clients train, where update-norm-bound has no median to measure against. ``sent``
        caches what the check needs of each model for the exchange."""
        s = self.s
        norms = {}
        for mid, weights in reply.models.items():
            if mid in s.models:
                model = sent.get(mid)
                if model is None:
                    model = sent[mid] = SentModel(s.models[mid], s.shapes, s.dtypes)
                norm = norms[reply.cid, mid] = model.update_norm(weights)
                change, scale = norm / model.size, model.scale
                if change > MAX_UPDATE_SCALE * scale:
                    raise RejectedReply(f"model {mid}: a change of {change:.3g} per weight, "
                                        f"{change / scale:.3g}x the model's scale (at most "
                                        f"{MAX_UPDATE_SCALE:g}x)", "scale")
        return norms

    def bound_updates(self, replies: list[Reply], norms: dict[tuple[int, int], float]) -> None:
        """Scale down every returned model whose update (returned - sent) is longer than
        ``update-norm-bound`` x the median update of the same model in this exchange: one
        client cannot drag a model far (a scaled or huge update), while its honest co-members,
        doing the same local work from the same model, stay inside the bound. Per model, since
        a fresh model moves much further than a converged one; it needs 3 updates of that model
        for a median that one attacker cannot set. Under a soft assignment the median is
        weighted by each client's weight on the model: a client that hardly belongs to a model
        returns it hardly changed, and an unweighted median of those would bound the model's
        own members (FedRC with K = 6 lost 0.11 of its accuracy so). ``norms``: as
        check_scale measured them."""
        s = self.s
        bound = s.cfg.update_norm_bound
        if bound <= 0:
            return
        by_model: dict[int, dict[int, float]] = {}   # model id -> reply index -> update norm
        for i, r in enumerate(replies):
            for mid in r.models:
                if mid in s.models:
                    by_model.setdefault(mid, {})[i] = norms[r.cid, mid]
        for mid, by_reply in by_model.items():
            if len(by_reply) < 3:
                continue
            median = weighted_median(list(by_reply.values()),
                                     [self.membership(replies[i].cid, mid) for i in by_reply])
            if median <= 0:
                continue
            for i, norm in by_reply.items():
                if norm > bound * median:
                    reply = replies[i]
                    reply.models[mid] = scale_update(reply.models[mid], s.models[mid],
                                                     bound * median / norm)
                    s.round_stats.bounded_updates += 1
                    log(WARNING, "round %d: client %d: update of model %d has norm %.3g, %.0fx "
                        "the median; scaled down to %.3g (update-norm-bound)", s.round,
                        reply.cid, mid, norm, norm / median, bound * median)

    def membership(self, cid: int, mid: int) -> float:
        """The client's weight on a model it returned: its soft weight under a soft assignment
        (the weight it trained with), else 1."""
        s = self.s
        rec = s.clients.get(cid)
        soft = rec.soft if rec is not None else None
        return float(soft.get(mid, 0.0)) if soft else 1.0

    def record_truth(self, reply: Reply) -> None:
        """Keep the reported concept for metrics (and the Oracle); hide it from the others."""
        s = self.s
        metrics = reply.metrics
        if P.CONCEPT in metrics and P.STEP in metrics:
            s.truth.setdefault(reply.cid, {})[int(metrics[P.STEP])] = int(metrics[P.CONCEPT])
        if not s.uses_ground_truth:
            metrics.pop(P.CONCEPT, None)

    def fail(self, cid: int, reason: str, kind: str = "invalid") -> None:
        s = self.s
        s.clients[cid].failures += 1
        s.round_stats.failures += 1
        s.round_stats.failed_clients.append(cid)
        s.round_stats.rejected[kind] = s.round_stats.rejected.get(kind, 0) + 1
        log(WARNING, "round %d: client %d: %s", s.round, cid, reason)
