"""Your own Flower ServerApp with a fedcluster strategy in it.

fedcluster's strategies are Flower strategies: build one by name with keyword
hyper-parameters, validated on the spot, and call ``start`` as you would Flower's FedAvg. The
clients run fedcluster's ClientApp (``fedcluster_app.client_app:app``), which answers the
messages the strategies send; the data and drift scenario, the model and local training come
from the run config, as in ``fedcluster run``.

Here FedDrift (local drift detection, one new model per drifted client, hierarchical merging)
runs on the SEA-4 stream with the drift threshold the FedDrift authors use for SEA, and Flower's
``evaluate_fn`` scores every cluster model on a central test set after each round.

Run it in this process (no Ray, a few seconds)::

    python examples/own_server_app/server_app.py

or through Flower, by naming ``examples.own_server_app.server_app:app`` as the ``serverapp``
component of a Flower app whose ``clientapp`` is ``fedcluster_app.client_app:app``.
"""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp

from fedcluster_app.api import build_scenario, make_strategy

app = ServerApp()


def central_test_set(run_config: dict, n: int = 500) -> tuple[np.ndarray, np.ndarray]:
    """A test set of the scenario's concept 0, drawn on the server (your own data goes here)."""
    scenario = build_scenario(str(run_config.get("scenario", "sea4")))
    x, y = scenario.realisation.sample(0, n, np.random.default_rng(7), client=0, train=False)
    return np.asarray(x, np.float64), np.asarray(y)


def mlp_accuracy(arrays: ArrayRecord, x: np.ndarray, y: np.ndarray) -> float:
    """Accuracy of the run's one-hidden-layer MLP (weights in PyTorch's state_dict order)."""
    w1, b1, w2, b2 = (a.numpy() for a in arrays.values())
    hidden = np.maximum(x @ w1.T + b1, 0.0)
    return float(((hidden @ w2.T + b2).argmax(axis=1) == y).mean())


@app.main()
def main(grid: Grid, context: Context) -> None:
    strategy = make_strategy("feddrift", run_config=context.run_config, delta=0.04)
    x, y = central_test_set(context.run_config)

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        return MetricRecord({"central_accuracy": mlp_accuracy(arrays, x, y)})

    result = strategy.start(grid, timeout=120.0, evaluate_fn=evaluate_fn)
    summary = result.summary
    sizes = {m: sum(1 for c in result.assignments.values() if c == m) for m in result.models}
    print(f"{strategy.name} on {summary['scenario']}: {summary['rounds']} rounds, "
          f"accuracy on the next step {summary['acc_include']:.3f}, "
          f"{len(result.models)} models with {sizes} clients; results in {summary['out_dir']}")


if __name__ == "__main__":
    import tempfile

    from fedcluster_app.api import default_run_config
    from fedcluster_app.engine import InProcessGrid

    with tempfile.TemporaryDirectory() as out:
        run_config = {**default_run_config(), "scenario": "sea4", "rounds-per-step": 5,
                      "local-steps": 20, "progress": False, "plot": False, "out-dir": out}
        grid = InProcessGrid(run_config, num_nodes=10)
        app(grid, Context(run_id=1, node_id=0, node_config={}, state=None,
                          run_config=run_config))
