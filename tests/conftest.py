"""Shared fixtures: small, fast experiment settings for the in-process engine."""

from __future__ import annotations

import pytest

import fedcluster_app.families  # noqa: F401  (every family's scenarios, for tests of the data)

# A small drift scenario: 10 clients, 6 steps, half the clients get a label permutation at step 3.
FAST = {
    "scenario": "mixture-swap",
    "rounds-per-step": 2,
    "local-steps": 5,
    "samples-per-step": 100,
    "test-samples": 50,
    "progress": False,
    "plot": False,
}


@pytest.fixture
def fast_config(tmp_path):
    def make(**overrides):
        cfg = dict(FAST)
        cfg["out-dir"] = str(tmp_path / "run")
        cfg.update({k.replace("_", "-"): v for k, v in overrides.items()})
        return cfg

    return make
