"""Serve a finished run with ``load_run``: predict for a client of the run, route a new one.

    python examples/serve.py RUN_DIR

A new device holds labelled samples of some concept. Here they are client 3's held-out test
split of the run's last time step (data no model trained on), written to
``RUN_DIR/new-client.npz`` for ``fedcluster predict RUN_DIR --data npz:RUN_DIR/new-client.npz``
(README, "Export and serve").
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from fedcluster_app.api import load_run


def main(run_dir: str) -> int:
    run = load_run(run_dir)
    print(run)
    print("clusters at the end (client -> model):", run.assignments)
    scenario = run.run.exp.scenario
    data = scenario.step_data(3, scenario.num_steps)
    # a client of the run predicts with its own cluster's model
    pred = run.predict(data.x_test, client_id=3)
    print(f"client 3 (cluster {run.assignments[3]}): accuracy {np.mean(pred == data.y_test):.3f}")
    # a new client: routed by the strategy's own rule from 20 labelled samples
    route = run.route(data.x_test[:20], data.y_test[:20])
    print(f"a new client with client 3's concept -> cluster {route.model_id} ({route.rule}): "
          f"{route.evidence}")
    np.savez(Path(run_dir) / "new-client.npz", x=data.x_test, y=data.y_test)
    print(f"its samples: {Path(run_dir) / 'new-client.npz'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
