"""The wire format between the clustered strategies and the ClientApp: one place for every key.

A message may carry several models, each an ``ArrayRecord`` under ``model.<id>``; the
``ConfigRecord`` ``config`` says what to do with them. Replies carry the trained models under
the same keys, a ``MetricRecord`` ``metrics`` with the client's logical id (Flower node ids
change between runs, so nothing long-lived is keyed on them) and per-model metrics under
``metrics.<id>``.
"""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict

# message types (query.* are custom actions handled by @app.query(...))
TRAIN = "train"
EVALUATE = "evaluate"
QUERY_INFO = "query.info"           # logical id, ground-truth concept, data sizes
QUERY_LOSSES = "query.losses"       # loss and accuracy of every model sent, on the training window
QUERY_HISTOGRAM = "query.histogram"  # label histogram of the training window

MODEL_PREFIX = "model."
EXTRA_PREFIX = "extra."        # other arrays of a reply (e.g. FedCCFA's classifier rows), by name
CONFIG = "config"
METRICS = "metrics"

# config keys the server sends
ROUND = "server-round"
STEP = "time-step"
TRAIN_IDS = "train-ids"        # models to train (default: every model in the message)
SELECT = "select"              # "min-loss": train only the lowest-loss model (IFCA)
PERSONAL = "personal"          # train/evaluate the client's own model kept in context.state
MIXTURE = "mixture-weights"    # evaluate: predict with this weighted mixture of the models sent
DATA_STEPS = "data-steps"      # train/losses on these time steps' training data instead of the
                               # window; "data-steps.<model id>" sets it for one model
TEST_STEP = "test-step"        # evaluate on this step's data (e.g. FedDrift: the next step)
TEST_SPLIT = "test-split"      # evaluate on that step's "test" split (default) or "train" batch

# metric keys clients reply with
CLIENT_ID = "client-id"
CONCEPT = "concept"            # ground truth; read only by metrics and the Oracle strategy
NUM_EXAMPLES = "num-examples"
TRAIN_LOSS = "train-loss"
CHOSEN = "chosen-model"
LOSSES = "losses"
ACCURACIES = "accuracies"
ACCURACY = "accuracy"
LOSS = "loss"
MODEL_IDS = "model-ids"
HISTOGRAM = "histogram"

PERSONAL_MODEL_ID = -1         # id under which a client's personal model is reported


def pack_models(models: dict[int, list[np.ndarray]]) -> dict[str, ArrayRecord]:
    return {f"{MODEL_PREFIX}{mid}": ArrayRecord(arrays) for mid, arrays in models.items()}


def unpack_models(content: RecordDict) -> dict[int, list[np.ndarray]]:
    return {
        int(key[len(MODEL_PREFIX):]): record.to_numpy_ndarrays()
        for key, record in content.array_records.items()
        if key.startswith(MODEL_PREFIX)
    }


def unpack_extras(content: RecordDict) -> dict[str, list[np.ndarray]]:
    return {
        key[len(EXTRA_PREFIX):]: record.to_numpy_ndarrays()
        for key, record in content.array_records.items()
        if key.startswith(EXTRA_PREFIX)
    }


def model_metrics_key(mid: int) -> str:
    return f"{METRICS}.{mid}"


def build_content(
    models: dict[int, ArrayRecord] | None = None,
    config: dict | None = None,
) -> RecordDict:
    """An instruction message's content; ``models`` are already packed (once per round, since
    the same cluster model goes to many clients)."""
    content = RecordDict({f"{MODEL_PREFIX}{mid}": rec for mid, rec in (models or {}).items()})
    content[CONFIG] = ConfigRecord(config or {})
    return content


def reply_content(
    metrics: dict,
    models: dict[int, list[np.ndarray]] | None = None,
    model_metrics: dict[int, dict] | None = None,
    extras: dict[str, list[np.ndarray]] | None = None,
) -> RecordDict:
    content = RecordDict(pack_models(models or {}))
    for name, arrays in (extras or {}).items():
        content[f"{EXTRA_PREFIX}{name}"] = ArrayRecord(arrays)
    content[METRICS] = MetricRecord(metrics)
    for mid, values in (model_metrics or {}).items():
        content[model_metrics_key(mid)] = MetricRecord(values)
    return content


def nbytes(content: RecordDict) -> int:
    """Payload size of a message's arrays (what the communication accounting counts)."""
    return sum(
        len(array.data) for record in content.array_records.values() for array in record.values()
    )
