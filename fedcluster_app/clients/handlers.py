"""Imports the client-side modules of the algorithm families; each registers its message kinds
with ``client_app.register_query`` / ``register_train`` when imported.

One import line per family, each under its own marker, so families are added independently.
"""

# -- issue 3: FedDrift family and its baselines
# -- issue 4: Fielding
# -- issue 5: FlexCFL
# -- issue 6: FedRC
# -- issue 7: FedCCFA
