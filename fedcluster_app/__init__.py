"""fedcluster: clustered federated learning under data drift, as a Flower app.

Kept import-light on purpose: ``flwr run`` imports this package to check the app's components.
"""

__version__ = "0.1.0"
