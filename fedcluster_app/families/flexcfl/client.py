"""Client side of FlexCFL (docs/flexcfl/README.md, The algorithm: group and client cold start; D2):
``query.pretrain``.

The server sends w0; the client runs ``pretrain-iters`` (50) mini-batch SGD steps from it on its
current training data, with the run's batch size, optimizer and learning rate, reshuffling its
data each time it is exhausted (the last partial batch of a pass is kept, as Keras does), and
returns the pre-trained model under w0's id together with the label-count vector of the data it
trained on (the reference counts of the migration test, docs/flexcfl/README.md D8). The server computes
``Delta = w_after - w0``. A client without training data returns no model.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fedcluster_app.core import wire as P
from fedcluster_app.core.client.batched import FitJob
from fedcluster_app.core.client.stream_client import StreamClient
from fedcluster_app.families.flexcfl.wire import PRETRAIN_ITERS, QUERY_PRETRAIN

PRETRAIN_MODEL_SALT = 7_777   # model-id offset of the pre-training minibatch stream


def pretrain_batches(n: int, batch_size: int, iters: int, rng: np.random.Generator
                     ) -> list[np.ndarray]:
    """``iters`` minibatches: consecutive chunks of shuffled passes over the data."""
    out: list[np.ndarray] = []
    while len(out) < iters:
        order = rng.permutation(n)
        for i in range(0, n, batch_size):
            out.append(order[i : i + batch_size])
            if len(out) == iters:
                break
    return out


def pretrain(client: StreamClient, config: dict, models: dict[int, list[np.ndarray]]):
    if len(models) != 1:
        raise ValueError(f"query.pretrain needs exactly one model (w0), got {len(models)}")
    (mid, w0), = models.items()
    step = int(config[P.STEP])
    x, y = client.train_data(step)
    hist = np.bincount(y, minlength=client.exp.scenario.num_classes).astype(np.int64)
    metrics = {P.NUM_EXAMPLES: len(y), P.HISTOGRAM: hist.tolist()}
    if len(y) == 0:
        return metrics, {}, {}
    cfg = dataclasses.replace(client.train_config(config), prox_mu=0.0)   # plain SGD steps
    iters = int(config[PRETRAIN_ITERS])
    rng = client.rng(int(config[P.ROUND]), PRETRAIN_MODEL_SALT + mid)
    batches = pretrain_batches(len(y), cfg.batch_size, iters, rng)
    (weights, loss), = yield [FitJob(client.exp.spec, w0, x, y, batches, cfg, client.device)]
    metrics[P.TRAIN_LOSS] = loss
    return metrics, {mid: weights}, {}


HANDLERS = {QUERY_PRETRAIN: pretrain}
