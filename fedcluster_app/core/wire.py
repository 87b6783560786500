"""The wire vocabulary between the clustered strategies and the ClientApp: one place for every key.

A message may carry several models, each an ``ArrayRecord`` under ``model.<id>``; the
``ConfigRecord`` ``config`` says what to do with them. Replies carry the trained models under
the same keys, a ``MetricRecord`` ``metrics`` with the client's logical id (Flower node ids
change between runs, so nothing long-lived is keyed on them) and per-model metrics under
``metrics.<id>``.

Only names and what they hold (message kinds, record and config / metric keys, the kinds of
reply metrics), no Flower and no NumPy, so that every module on both sides, and each family's
own ``wire.py``, can import it as ``P``. Arrays and a message's content are encoded by
``core/codec.py``; Flower's objects are built through ``core/flower_fast.py``.
"""

from __future__ import annotations

# message types (query.* are custom actions handled by @app.query(...))
TRAIN = "train"
EVALUATE = "evaluate"
QUERY_INFO = "query.info"           # logical id, ground-truth concept, data sizes
QUERY_LOSSES = "query.losses"       # loss and accuracy of every model sent, on the training window
QUERY_HISTOGRAM = "query.histogram"  # label histogram of the training window
QUERY_STATE = "query.state"         # the client's context.state, for the server's checkpoint
QUERY_RESTORE = "query.restore"     # put a checkpointed context.state back (a resumed run)
STATE_PREFIX = "state."             # context.state records travel under state.<name>
#: a client's optimizer state of one model in its context.state: + stream id (a model id)
OPTIMIZER_PREFIX = "optimizer-state."

MODEL_PREFIX = "model."
EXTRA_PREFIX = "extra."        # other arrays of a reply (e.g. FedCCFA's classifier rows), by name
CONFIG = "config"
METRICS = "metrics"

# config keys the server sends
ROUND = "server-round"
STEP = "time-step"
TRAIN_IDS = "train-ids"        # models to train (default: every model in the message)
SELECT = "select"              # "min-loss": train only the lowest-loss model (IFCA); the
                               # FedDrift family also "min-error": the lowest 0-1 error
PERSONAL = "personal"          # train/evaluate the client's own model kept in context.state
MIXTURE = "mixture-weights"    # evaluate: predict with this weighted mixture of the models sent
DATA_STEPS = "data-steps"      # train/losses on these time steps' training data instead of the
                               # window; "data-steps.<model id>" sets it for one model
TEST_STEP = "test-step"        # evaluate on this step's data (e.g. FedDrift: the next step)
TEST_SPLIT = "test-split"      # evaluate on that step's "test" split (default) or "train" batch
BALANCED_TEST = "balanced-test"  # evaluate on the test split: also score the class-balanced
                                 # test sample of that step (reply: balanced-accuracy)
MODEL_ID = "model-id"          # the model a job trains (a NumPyClient-style fit of one model)

# The run's shared training settings (``config.TrainConfig``) reach every client through the run
# config; a message may change only these for its round (key -> TrainConfig field), and a client
# refuses a message that sets any other (it would make one strategy's recipe differ silently).
TRAIN_LR = "lr"                # e.g. Adaptive-FedAvg's adapted learning rate
TRAIN_PROX_MU = "prox-mu"      # e.g. FedProx's mu where the run leaves it at 0
TRAIN_OVERRIDES = {TRAIN_LR: "lr", TRAIN_PROX_MU: "prox_mu"}

# metric keys clients reply with
CLIENT_ID = "client-id"
CONCEPT = "concept"            # ground truth; read only by metrics and the Oracle strategy
NUM_EXAMPLES = "num-examples"
TRAIN_LOSS = "train-loss"
CHOSEN = "chosen-model"
LOSSES = "losses"
ACCURACIES = "accuracies"
ACCURACY = "accuracy"
BALANCED_ACCURACY = "balanced-accuracy"   # on the class-balanced test sample (balanced-test)
LOSS = "loss"
MODEL_IDS = "model-ids"
HISTOGRAM = "histogram"
GRADIENT_STEPS = "gradient-steps"   # the optimizer steps a reply's training took, every job's

PERSONAL_MODEL_ID = -1         # id under which a client's personal model is reported

# What a reply's metric holds, checked before a strategy reads it (core/server/messages.py): a
# "scalar", an "int" or a "unit" (a number in [0, 1]), or a list of them ("list", "int-list",
# "unit-list"). Families declare their own keys with declare_reply_metrics; undeclared keys
# only have to be finite numbers.
REPLY_METRICS: dict[str, str] = {
    CLIENT_ID: "int", CONCEPT: "int", STEP: "int", ROUND: "int", NUM_EXAMPLES: "int",
    CHOSEN: "int", GRADIENT_STEPS: "int",
    TRAIN_LOSS: "scalar", ACCURACY: "unit", BALANCED_ACCURACY: "unit", LOSS: "scalar",
    LOSSES: "list", ACCURACIES: "unit-list", MODEL_IDS: "int-list", HISTOGRAM: "int-list",
}
_METRIC_KINDS = ("scalar", "int", "unit", "list", "int-list", "unit-list")
# lists with one value per model: per id of the reply's model-ids, or per model sent without it
PER_MODEL_METRICS: set[str] = {LOSSES, ACCURACIES}


def declare_reply_metrics(per_model: tuple[str, ...] = (), **kinds: str) -> None:
    """Declare what reply metrics hold, by key (``"fd.counts": "int-list"``; keys with dots
    or dashes are passed as ``declare_reply_metrics(**{"fd.counts": "int-list"})``);
    ``per_model``: the list keys that hold one value per model."""
    PER_MODEL_METRICS.update(per_model)
    for key, kind in kinds.items():
        if kind not in _METRIC_KINDS:
            raise ValueError(f"reply metric {key!r}: kind must be one of {_METRIC_KINDS}, got {kind!r}")
        if REPLY_METRICS.get(key, kind) != kind:
            raise ValueError(f"reply metric {key!r} is already declared {REPLY_METRICS[key]!r}")
        REPLY_METRICS[key] = kind


def model_metrics_key(mid: int) -> str:
    """The key of a reply's metrics of model ``mid``."""
    return f"{METRICS}.{mid}"
