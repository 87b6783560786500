"""Client-side message handlers: the built-in message kinds, and the type every family's
handlers have.

A handler turns one message into calls on this node's :class:`StreamClient` and returns
``(metrics, models, per-model metrics)`` or the same plus named arrays (``{name: arrays}``,
the reply's ``extra.<name>``). A handler that trains is a generator: it ``yield``s its
:class:`~fedcluster_app.core.client.batched.FitJob` list, receives one ``FitResult`` per job, and
``return``s its reply tuple; :func:`call` runs its jobs for this client alone and
:func:`call_many` runs the jobs of many clients as one batched program. A family adds its own kinds in its ``client.py`` as a
``HANDLERS = {"train.<name>": fn, "query.<name>": fn, ...}`` table; the ClientApp registers
the built-in table and every family's.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fedcluster_app.core import wire as P
from fedcluster_app.core.client.batched import run_jobs, run_jobs_batched
from fedcluster_app.core.client.stream_client import StreamClient
from fedcluster_app.core.training import counting_steps

Models = dict[int, list[np.ndarray]]
Handler = Callable[[StreamClient, dict[str, Any], Models], tuple]


Call = tuple[Handler, StreamClient, dict[str, Any], Models]


def call(handler: Handler, client: StreamClient, config: dict, models: Models) -> tuple:
    """The handler's reply tuple, its training jobs run for this client alone."""
    out = handler(client, config, models)
    if not inspect.isgenerator(out):
        return out
    steps = 0
    try:
        jobs = next(out)
        while True:
            steps += _steps(jobs)
            jobs = out.send(run_jobs(jobs))
    except StopIteration as stop:
        _finished(client)
        return _with_steps(stop.value, steps)


def _steps(jobs: Sequence) -> int:
    """The optimizer steps of a handler's training jobs: one per minibatch each job sees."""
    return sum(len(job.batches) for job in jobs)


def counts_steps(handler: Handler) -> Handler:
    """``handler``, whose reply also says how many optimizer steps it took: for a handler
    that steps its own optimizers instead of yielding jobs (whose steps ``call`` and
    ``call_many`` count), every optimizer step inside it is counted."""
    @functools.wraps(handler)
    def counted(client: StreamClient, config: dict, models: Models) -> tuple:
        with counting_steps() as steps:
            result = handler(client, config, models)
        return _with_steps(result, steps.count)

    return counted


def _with_steps(result: tuple, steps: int) -> tuple:
    """A reply tuple whose metrics say how many optimizer steps its training took (every
    phase of it: pre-training, extra passes), so a benchmark can state each method's work."""
    if not steps:
        return result
    metrics, *rest = result
    return ({**metrics, P.GRADIENT_STEPS: steps}, *rest)


def _finished(client: StreamClient | None) -> None:
    """A handler has returned: its client keeps what its training left (optimizer states)."""
    if client is not None:      # tests drive handlers without a client
        client.keep_optimizer_states()


def call_many(calls: Sequence[Call]) -> list[tuple | Exception]:
    """The reply tuple (or the exception) of every call; the training jobs the calls yield at
    the same point are run together, batched across clients. A call that raises fails alone."""
    out: list[tuple | Exception | None] = [None] * len(calls)
    waiting: dict[int, tuple[Any, list]] = {}     # call -> (its generator, the jobs it yielded)
    steps = [0] * len(calls)                      # call -> optimizer steps of its jobs so far

    def resume(i: int, gen, sent) -> None:
        try:
            waiting[i] = (gen, gen.send(sent))     # send(None) starts a generator
            steps[i] += _steps(waiting[i][1])
        except StopIteration as stop:
            _finished(calls[i][1])
            out[i] = _with_steps(stop.value, steps[i])
        except Exception as ex:  # noqa: BLE001 - one client's failure is its own error reply
            out[i] = ex

    for i, (handler, client, config, models) in enumerate(calls):
        try:
            result = handler(client, config, models)
        except Exception as ex:  # noqa: BLE001
            out[i] = ex
            continue
        if inspect.isgenerator(result):
            resume(i, result, None)
        else:
            out[i] = result
    while waiting:
        round_ = [(i, *waiting.pop(i)) for i in list(waiting)]
        try:
            results = run_jobs_batched([job for _, _, jobs in round_ for job in jobs])
        except Exception:  # noqa: BLE001 - a batch that fails runs call by call, to find whose
            results = None
        start = 0
        for i, gen, jobs in round_:
            if results is None:
                try:
                    mine = run_jobs(jobs)
                except Exception as ex:  # noqa: BLE001
                    gen.close()
                    out[i] = ex
                    continue
            else:
                mine = results[start:start + len(jobs)]
                start += len(jobs)
            resume(i, gen, mine)
    return out  # type: ignore[return-value]


def train(client: StreamClient, config: dict, models: Models):
    """Train every model sent (or ``train-ids``), or the personal model, or IFCA's best one."""
    if config.get(P.PERSONAL):
        job = client.fit_job(client.personal_weights(), {**config, P.MODEL_ID: P.PERSONAL_MODEL_ID})
        (weights, loss), = yield [job]
        client.count_trained()
        client.store_personal(weights)
        return {P.NUM_EXAMPLES: len(job.y), P.TRAIN_LOSS: loss}, {}, {}
    metrics: dict[str, Any] = {}
    train_ids = [int(i) for i in config.get(P.TRAIN_IDS, list(models))]
    if config.get(P.SELECT) == "min-loss":
        ids = sorted(models)
        losses, accs = client.losses([models[i] for i in ids], config)
        chosen = ids[min(range(len(ids)), key=lambda j: (losses[j], j))]
        train_ids = [chosen]
        metrics.update({P.CHOSEN: chosen, P.LOSSES: losses, P.ACCURACIES: accs, P.MODEL_IDS: ids})
    jobs = [client.fit_job(models[mid], {**config, P.MODEL_ID: mid}) for mid in train_ids]
    results = yield jobs
    trained, per_model = {}, {}
    for mid, job, (weights, loss) in zip(train_ids, jobs, results):
        client.count_trained()
        trained[mid] = weights
        per_model[mid] = {P.NUM_EXAMPLES: len(job.y), P.TRAIN_LOSS: loss}
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
