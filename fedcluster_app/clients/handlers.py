"""Imports the client-side modules of the algorithm families; each registers its message kinds
with ``client_app.register_query`` / ``register_train`` when imported.

One import line per family, each under its own marker, so families are added independently.
"""

# -- issue 3: FedDrift family and its baselines
from . import feddrift  # noqa: F401
# -- issue 4: Fielding
from . import fielding as _fielding  # noqa: E402,F401  (query.fielding_rep)
# -- issue 5: FlexCFL
from . import flexcfl as _flexcfl  # noqa: E402,F401  (query.pretrain)
# -- issue 6: FedRC
from . import fedrc as _fedrc  # noqa: E402,F401  (train.fedrc, evaluate.fedrc)
from . import fedsoft as _fedsoft  # noqa: E402,F401  (train.fedsoft)
# -- issue 7: FedCCFA
from . import fedccfa as _fedccfa  # noqa: E402,F401  (train.fedccfa, query.fedccfa_eval)
