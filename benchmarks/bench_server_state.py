"""Server-side state for many registered clients: memory per client.

Registers N clients with a clustered strategy through the real discovery path (a fake grid that
answers `query.info` for N nodes without running any client code), assigns them to clusters and
measures the Python heap the strategy holds (tracemalloc), and the size of its checkpoint.

    python benchmarks/bench_server_state.py [--clients 10000] [--strategy ifca]
"""

from __future__ import annotations

import gc
import tempfile
import tracemalloc
from pathlib import Path

from flwr.app import Message
from harness import parser

from fedcluster_app.api import build_strategy
from fedcluster_app.core import codec
from fedcluster_app.core import wire as P
from fedcluster_app.core.config import default_run_config, merge_overrides
from fedcluster_app.core.experiment import load_experiment
from fedcluster_app.engine import InProcessGrid


class InfoOnlyGrid(InProcessGrid):
    """N nodes that answer query.info with their logical id; no client code runs."""

    def __init__(self, run_config, num_nodes):
        super().__init__(run_config, 0)
        self.node_ids = list(range(1000, 1000 + num_nodes))

    def get_node_ids(self):
        return self.node_ids

    def send_and_receive(self, messages, *, timeout=None):
        return [
            Message(codec.reply_content({P.CLIENT_ID: m.metadata.dst_node_id - 1000, P.NUM_EXAMPLES: 500,
                                     P.CONCEPT: 0, P.STEP: 1}), reply_to=m)
            for m in messages
        ]


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--clients", type=int, default=10_000)
    ap.add_argument("--strategy", default="ifca")
    args = ap.parse_args()
    rc = merge_overrides(default_run_config(), {"strategy": args.strategy, "scenario": "circle2",
                                                "num-clients": args.clients, "protocol": "none"})
    exp = load_experiment(rc)
    grid = InfoOnlyGrid(rc, args.clients)
    gc.collect()
    tracemalloc.start()
    strategy = build_strategy(exp)
    base, _ = tracemalloc.get_traced_memory()
    strategy.discover(grid)
    strategy.on_start()
    gc.collect()
    used, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    per_client = (used - base) / args.clients
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "checkpoint.npz"
        strategy.save_checkpoint(path)
        ckpt = path.stat().st_size
    models = sum(a.nbytes for w in strategy.models.values() for a in w)
    print(f"{args.strategy}: {len(strategy.clients)} registered clients, {len(strategy.models)} models "
          f"({models / 1e3:.1f} kB of weights)")
    print(f"server heap for client state: {(used - base) / 1e6:.2f} MB "
          f"-> {per_client:.0f} bytes per client (peak during registration {peak / 1e6:.1f} MB)")
    print(f"checkpoint: {ckpt / 1e6:.2f} MB -> {ckpt / args.clients:.0f} bytes per client")


if __name__ == "__main__":
    main()
