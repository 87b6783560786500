"""The FedDrift paper's data: SINE-2, CIRCLE-2, SEA-2 and SEA-4 (docs/feddrift.md, "Data and
drift schedules").

Ten clients, ten training steps plus the test-only step 11, on the standard synthetic streams
of the core's catalogue (``core/data/generators.py``: SINE, CIRCLE, SEA) with the authors'
concept matrices: Y (2 concepts, staggered) and F (4 concepts, with recurrence), bundled with
the app (``core/data/feddrift_changepoints.json``).
"""

from __future__ import annotations

from fedcluster_app.core.data.catalogue import ScenarioDef

#: the family's scenarios (entries of the core's standard catalogue)
SCENARIOS = [
    ScenarioDef("sine2", "SINE-2 (FedDrift): y = [x2 <= sin(x1)], concept B flips the labels; "
                "staggered 2-concept schedule Y", "sine", "", "Y", num_steps=11, drift_step=4),
    ScenarioDef("circle2", "CIRCLE-2 (FedDrift): inside/outside a circle that moves and grows; "
                "staggered 2-concept schedule Y", "circle", "", "Y", num_steps=11, drift_step=4),
    ScenarioDef("sea2", "SEA-2 (FedDrift): y = [x1 + x2 <= 9 (A) / 8 (B)], 10% label noise; "
                "schedule Y", "sea", "2", "Y", num_steps=11, drift_step=4),
    ScenarioDef("sea4", "SEA-4 (FedDrift): thresholds 9, 8, 7, 9.5, 10% label noise; 4-concept "
                "schedule F with recurrence", "sea", "4", "F", num_steps=11, drift_step=4),
]


# The FedDrift paper's setup on its synthetic streams (docs/feddrift.md; benchmarks/
# feddrift_reproduce.py): R = 100 rounds per time step of K = 50 local Adam steps on batches of
# 50, lr 0.01 with L2 0.001, and as many clusters as the stream has concepts.
_PAPER = {"rounds-per-step": 100, "local-steps": 50, "batch-size": 50, "optimizer": "adam",
          "lr": 0.01, "weight-decay": 0.001}
PROTOCOLS = {name: {**_PAPER, "num-clusters": k}
             for name, k in (("sine2", 2), ("circle2", 2), ("sea2", 2), ("sea4", 4))}
