"""The FedCCFA family's wire: message kinds, config / metric keys, and which typed
hyper-parameters (``params.py``) every message carries (the server sends them, the client reads
them through the same classes; it has no defaults of its own)."""

from __future__ import annotations

from fedcluster_app.core import wire as P
from fedcluster_app.families.fedccfa.params import (
    FamilyParams,
    FedBABUParams,
    FedCCFAParams,
    FedRepParams,
    FlashParams,
)

TRAIN_KIND = "train.fedccfa"
EVAL_KIND = "query.fedccfa_eval"
EXTRA = "ccfa"                      # extra.<name> of the classifier/anchor record in a reply

# config keys (server -> client)
ALGO = "ccfa-algo"                  # fedccfa | fedrep | fedbabu | flash
PARAMS = "ccfa."                    # prefix of the algorithm's hyper-parameters
PENDING_ROUND = "ccfa-pending-round"
PENDING_CLASSES = "ccfa-pending-classes"
PENDING_ROWS = "ccfa-pending-rows"
PENDING_ANCHOR_CLASSES = "ccfa-pending-anchor-classes"
PENDING_ANCHORS = "ccfa-pending-anchors"
NEWCOMER = "ccfa-newcomer"          # a held-out client: learns a classifier before it predicts

# metric keys (client -> server)
GEN_ACCURACY = "gen-accuracy"
ENTROPY = "label-entropy"
LAMBDA = "align-weight"
ALIGNED = "aligned"
PERSONAL_AGE = "personal-age"       # rounds the personal classifier has been trained in a row
EPOCHS_RUN = "epochs-run"

P.declare_reply_metrics(**{GEN_ACCURACY: "unit", ENTROPY: "scalar", LAMBDA: "scalar",
                            ALIGNED: "int", PERSONAL_AGE: "int", EPOCHS_RUN: "int"})


#: the hyper-parameter class of each ``ALGO``
ALGORITHMS: dict[str, type[FamilyParams]] = {"fedccfa": FedCCFAParams, "fedrep": FedRepParams,
                                          "fedbabu": FedBABUParams, "flash": FlashParams}


def read_params(config: dict) -> tuple[str, FamilyParams]:
    """The algorithm and its hyper-parameters, as the server sent them."""
    algo = str(config[ALGO])
    if algo not in ALGORITHMS:
        raise ValueError(f"unknown {ALGO} {algo!r}; valid: {', '.join(ALGORITHMS)}")
    return algo, ALGORITHMS[algo].from_message(config, PARAMS)
