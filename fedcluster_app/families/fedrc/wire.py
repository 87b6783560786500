"""The FedRC family's wire: message kinds and config / metric keys, among them the prefixes of
the typed hyper-parameters of FedRC / FedEM and FedSoft (``params.py``: the server sends them
with every message, the client reads them through the same classes)."""

from __future__ import annotations

from fedcluster_app.core import wire as P

TRAIN_KIND = "train.fedrc"
EVAL_KIND = "evaluate.fedrc"
FEDSOFT_TRAIN_KIND = "train.fedsoft"

# config keys the server sends
OMEGA = "fedrc-omega"              # the client's cluster weights, aligned with the sorted model ids
PRIOR = "fedrc-prior"              # P~ flattened row-major (K x C); absent = uniform (FedEM)
ESTIMATE = "fedrc-estimate"        # evaluate: estimate omega on the adaptation split first
PARAMS = "fedrc."                  # prefix of FedRC's hyper-parameters
FEDSOFT_PARAMS = "fedsoft."        # prefix of FedSoft's

# metric keys the client replies with
MASS = "label-cluster-mass"        # S, K x C flattened row-major
OMEGA_REPLY = "omega"
ITERATIONS = "em-iterations"
IMPORTANCE = "importance"          # FedSoft: u, aligned with the sorted centre ids

P.declare_reply_metrics(**{MASS: "list", OMEGA_REPLY: "list", ITERATIONS: "int",
                            IMPORTANCE: "list"})


