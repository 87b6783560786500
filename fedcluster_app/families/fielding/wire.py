"""The Fielding family's wire: its message kind and keys (its typed hyper-parameters are in
``params.py``)."""

from __future__ import annotations

from fedcluster_app.core import wire as P

KIND = "query.fielding_rep"

# config keys the server sends
REP = "fielding.rep"                  # label | embedding | gradient (also the reply key of r_now)
METRIC = "fielding.metric"            # distance of the drift test
EPS = "fielding.eps-drift"            # drift threshold
REGISTER = "fielding.register"        # report r_now whatever the drift test says
GRAD_LAYERS = "fielding.grad-layers"  # last | all
# reply keys
DRIFTED = "fielding.drifted"
REGISTERED = "fielding.registered"
PROBE_MISSING = "fielding.probe-missing"

P.declare_reply_metrics(**{REP: "list", DRIFTED: "int", REGISTERED: "int", PROBE_MISSING: "int"})


