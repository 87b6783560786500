"""The FedDrift family's wire keys: message kinds and config / metric keys, shared by its
strategies (server side) and its client handlers (``client.py``)."""

from fedcluster_app.core import wire as P

TRAIN_KIND = "train.feddrift"
PROBE_KIND = "query.fd_probe"
DISTANCE_KIND = "query.fd_distance"

# config / metric keys
ENGINE = "fd.engine"                 # "numpy" (default for MLPs) | "torch"
STEP_WEIGHTS = "fd.step-weights"     # fd.step-weights.<id>: sampling weight per attached step
CLUSTERS = "fd.clusters"             # distance phase: cluster (model) ids j
STEPS = "fd.steps"                   # fd.steps.<j>: this client's steps attached to j
QUOTA = "fd.quota"                   # fd.quota.<j>: points to draw from them
ERRORS = "fd.errors"                 # reply: errors[i * len(clusters) + jj]
COUNTS = "fd.counts"                 # reply: points drawn per cluster
ERROR_RATES = "fd.error-rates"       # probe reply: 0-1 error per model
MSE = "fd.mse"                       # probe reply: mean (1 - p(y|x))^2 per model (AUE)
ENSEMBLE_KIND = "query.fd_ensemble"  # accuracy of a weighted ensemble of the models sent
ENS_WEIGHTS = "fd.weights"           # one weight per model (sorted ids)
ENS_VOTE = "fd.vote"                 # "hard": weighted vote of predictions | "soft": of softmax
MASK = "fd.mask"                     # fd.mask.<id>: 0/1 per input feature (KUE random subspaces)
BOOTSTRAP = "fd.bootstrap"           # train on a Poisson(1) bootstrap of the data (online bagging)
CONFUSION = "fd.confusion"           # probe reply: C x C confusion counts per model, flattened
MIN_ERROR = "min-error"              # select: per-round IFCA trains the lowest 0-1 error model
#: the ``select`` values under which a client chooses its model, and which of
#: ``client.model_ce_error``'s (cross-entropy, 0-1 error) the choice minimises
SELECT_BY = {"min-loss": 0, MIN_ERROR: 1}

P.declare_reply_metrics(**{CLUSTERS: "int-list", ERRORS: "list", COUNTS: "int-list",
                            ERROR_RATES: "unit-list", MSE: "list", CONFUSION: "list"},
                         per_model=(ERROR_RATES, MSE))
