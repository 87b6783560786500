"""The ClientApp as Flower's Ray backend ships it: pickled with every message a worker gets."""

from __future__ import annotations

import ray.cloudpickle as cloudpickle

from fedcluster_app import client_app


def test_the_client_app_pickles_as_a_reference_to_the_module_s_app():
    """Ray pickles the function that returns the app once per message; by value, every
    handler closure travelled with it (5.7 KB, milliseconds of the simulation's CPU each)."""
    app = client_app.app
    blob = cloudpickle.dumps(lambda: app)   # what Flower's backend hands Ray
    assert len(blob) < 1_000, len(blob)
    assert cloudpickle.loads(blob)() is app
    # the same handlers, by name, on the other side: every message kind the app answers
    assert set(client_app.KINDS) <= {k.removesuffix(".default") for k in app._registered_funcs}
