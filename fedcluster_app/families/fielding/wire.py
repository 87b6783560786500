"""The Fielding family's wire: its message kind and keys (its typed hyper-parameters are in
``params.py``)."""

from __future__ import annotations

from fedcluster_app.core import wire as P

KIND = "query.fielding_rep"

# config keys the server sends: the clients' share of the hyper-parameters (params.py), sent as
# ``FieldingParams.to_message(PARAMS, CLIENT_KEYS)`` and read back through the same declaration
PARAMS = "fielding."
CLIENT_KEYS = ("rep", "eps-drift", "grad-layers")  # representation, drift threshold, layers
METRIC = "fielding.metric"            # distance of the drift test (derived from the parameters)
REGISTER = "fielding.register"        # report r_now whatever the drift test says
REP = "fielding.rep"                  # the reply key of r_now
# reply keys
DRIFTED = "fielding.drifted"
REGISTERED = "fielding.registered"
PROBE_MISSING = "fielding.probe-missing"

P.declare_reply_metrics(**{REP: "list", DRIFTED: "int", REGISTERED: "int", PROBE_MISSING: "int"})


