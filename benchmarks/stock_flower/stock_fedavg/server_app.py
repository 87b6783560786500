"""The ServerApp: Flower's own FedAvg, every node in every round, train and evaluate.

With ``times-file`` set it writes each round's wall time (Flower calls ``evaluate_fn`` once
before the first round and once after each) and the clients' accuracy, for
benchmarks/bench_ray_vs_stock.py."""

from __future__ import annotations

import json
import time

from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from stock_fedavg import task

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    rc = context.run_config
    n = int(rc["num-clients"])
    ends: list[float] = []

    def round_ended(server_round: int, arrays: ArrayRecord) -> None:
        ends.append(time.perf_counter())

    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=1.0, min_train_nodes=n,
                      min_evaluate_nodes=n, min_available_nodes=n)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(task.mlp().state_dict()),
                            num_rounds=int(rc["num-server-rounds"]),
                            train_config=ConfigRecord({}), evaluate_fn=round_ended)
    if rc["times-file"]:
        accuracy = {r: float(m["eval_acc"])
                    for r, m in result.evaluate_metrics_clientapp.items()}
        with open(str(rc["times-file"]), "w") as fh:
            json.dump({"round_time_s": [b - a for a, b in zip(ends, ends[1:])],
                       "accuracy": accuracy}, fh)
