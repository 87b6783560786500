"""How often ``route(x, y)`` sends a client that was never in a run to the cluster of its true
concept, per family (docs/guides/export.md, "Routing a new client").

Each run trains on a scenario's clients but a few (they never join: their nodes are left out),
then every withheld client is routed by the strategy's own newcomer rule (``load_run(...)
.route``) on ``--samples`` labelled samples of its last time step. The cluster of a concept is
the cluster most of that concept's trained clients are in at the end; a route is right when it
picks the cluster of the withheld client's concept (FedCCFA: the personal classifier of a
client of that concept), and only counts where the run gave each concept a cluster of its own
(``separated``; a run that did not makes every route wrong). Rows: family, strategy, scenario,
seed, separated, routes, right, accuracy.

    python benchmarks/route_heldout.py                          # 6 families x 3 seeds (~1 min)
    python benchmarks/route_heldout.py --seeds 0 1 2 --jsonl docs/guides/route_heldout.jsonl
"""

from __future__ import annotations

import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
from harness import parser, write_rows

from fedcluster_app.engine import InProcessGrid, run_inprocess
from fedcluster_app.serving import load_run

#: family -> (strategy, scenario, settings): each family on a scenario its rule can separate
#: (Fielding's default representation is the label distribution: a label shift)
CASES = {
    "ifca": ("ifca", "mixture-swap", {}),
    # FedDrift splits a model when a client's data drift: the concepts change at step 2
    "feddrift": ("feddrift", "mixture-swap", {"drift-step": 2}),
    "fielding": ("fielding", "mixture-prior", {}),
    "flexcfl": ("flexcfl", "mixture-swap", {}),
    # FedRC's EM needs more rounds to separate the concepts
    "fedrc": ("fedrc", "mixture-swap", {"rounds-per-step": 10}),
    "fedccfa": ("fedccfa", "mixture-swap", {}),
}
#: a small run: 20 clients, the first half on the second concept from step 1 (drift-step 1:
#: the concepts are there from the start), 4 steps of 3 rounds
BASE = {"num-clients": 20, "num-steps": 4, "drift-step": 1, "rounds-per-step": 3,
        "local-steps": 10, "samples-per-step": 100, "test-samples": 50, "progress": False,
        "plot": False, "checkpoint-client-state": True}
#: the withheld clients: two drifting (concept 1 at the end), two not (concept 0)
HELD_OUT = (3, 8, 13, 17)


def grid_without(held_out: tuple[int, ...]):
    """An in-process grid whose nodes are every client of the scenario but ``held_out``."""
    class Grid(InProcessGrid):
        def __init__(self, run_config, num_nodes, **kw):
            ids = [c for c in range(num_nodes) if c not in held_out]
            super().__init__(run_config, len(ids), node_config=lambda i: {
                "partition-id": ids[i], "num-partitions": num_nodes}, **kw)
    return Grid


def measure(family: str, seed: int, samples: int, out: Path) -> dict:
    strategy, scenario, extra = CASES[family]
    cfg = {**BASE, **extra, "strategy": strategy, "scenario": scenario, "seed": seed,
           "out-dir": str(out / f"{family}-s{seed}"), "overwrite": True,
           "min-nodes": BASE["num-clients"] - len(HELD_OUT)}
    summary = run_inprocess(cfg, grid_cls=grid_without(HELD_OUT))
    run = load_run(cfg["out-dir"])
    sc = run.run.exp.scenario
    last = sc.num_steps
    concept = {c: sc.concept(c, last) for c in range(sc.num_clients)}
    # the cluster of a concept: where most of its trained clients are at the end
    by_concept: dict[int, Counter] = {}
    for cid, mid in run.assignments.items():
        if cid not in HELD_OUT and mid is not None:
            by_concept.setdefault(concept[cid], Counter())[mid] += 1
    # the concepts are separated when each has a cluster of its own (else routing to "its"
    # cluster says nothing, and every route counts as wrong)
    home = {k: c.most_common(1)[0][0] for k, c in by_concept.items()}
    separated = len(set(home.values())) == len(home) > 1
    if getattr(run.run.strategy, "gid", None) is not None:
        separated = None     # one global model: FedCCFA's clusters are its clients' classifiers
    right = 0
    routes = []
    for cid in HELD_OUT:
        data = sc.step_data(cid, last)
        route = run.route(data.x_train[:samples], data.y_train[:samples], raw=False)
        if "classifier_of_client" in route.evidence:      # FedCCFA: a client's classifier
            ok = concept[int(route.evidence["classifier_of_client"])] == concept[cid]
        else:
            ok = separated and route.model_id == home.get(concept[cid])
        right += ok
        routes.append({"client": cid, "concept": concept[cid], "model": route.model_id,
                       "right": bool(ok)})
    return {"family": family, "strategy": strategy, "scenario": scenario, "seed": seed,
            "samples": samples, "separated": separated, "routes": len(HELD_OUT), "right": right,
            "accuracy": right / len(HELD_OUT), "ari_final": summary.get("ari_final"),
            "clusters": {str(k): dict(v) for k, v in sorted(by_concept.items())},
            "detail": routes}


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, jsonl="one per family and seed", seeds=[0, 1, 2])
    ap.add_argument("--families", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--samples", type=int, default=20, help="labelled samples per new client")
    ap.add_argument("--runs-dir", type=Path, help="run directories (default: a temporary folder)")
    args = ap.parse_args(argv)
    out = args.runs_dir or Path(tempfile.mkdtemp(prefix="route-heldout-"))
    rows = [measure(f, s, args.samples, out) for f in args.families for s in args.seeds]
    print(f"{'family':10} {'strategy':10} {'scenario':14} seed  separated  right/routes  "
          f"ari_final")
    for r in rows:
        ari = "n/a" if r["ari_final"] is None else f"{r['ari_final']:.3f}"
        print(f"{r['family']:10} {r['strategy']:10} {r['scenario']:14} {r['seed']:4}  "
              f"{'n/a' if r['separated'] is None else str(r['separated']):9}  "
              f"{r['right']}/{r['routes']:<10}  {ari}")
    for fam in args.families:
        mine = [r for r in rows if r["family"] == fam]
        print(f"{fam}: {sum(r['right'] for r in mine)}/{sum(r['routes'] for r in mine)} routes "
              f"to the cluster of the client's concept")
    write_rows(args.jsonl, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
