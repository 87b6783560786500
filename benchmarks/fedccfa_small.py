"""FedCCFA's small experiment on the digits (docs/fedccfa/README.md), through the real
ServerApp/ClientApp in-process.

K = 10 clients, full participation, Dirichlet(0.5) label skew, 135 training samples per client
and step, MLP extractor (64 -> 64, d = 64) + linear classifier, 60 rounds = 12 steps x 5 rounds,
drift at step 7 (round 31 = 0-indexed round 30, half-way like the paper's 100 of 200): sudden (all groups
swap), incremental (G1, G2, G3 one step = 5 rounds apart), recurring (swap at round 31, back at
round 46 = 0-indexed 45). Paper hyper-parameters (SGD momentum 0.9, wd 1e-5, batch 64, E = 5,
lr 0.01 / 0.1), T_s = 6 (= 20/200 x 60), FedCCFA eps 0.05 (docs/fedccfa/README.md explains why not 0.1).

Data: ``digits-ccfa`` (the paper's partition on a stream: every training batch holds >= 5
samples of every class, the rest follows the client's Dirichlet prior). Metric: generalised accuracy (the whole 450-image digits test pool relabelled with each
client's current concept, mean over the clients) after the last round. FedAvg/FedProx report it
from their final global model (read from the run's checkpoint); the other methods report it
every round. Also printed: the accuracy drop after the drift and the rounds to recover.

    python benchmarks/fedccfa_small.py --settings none sudden --methods fedavg fedrep fedccfa --seeds 0 1 2
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
from harness import add_row, load_average, machine, parser, start_rows

from fedcluster_app.core.config import default_run_config, merge_overrides
from fedcluster_app.core.experiment import load_experiment
from fedcluster_app.core.models import build_model, set_weights
from fedcluster_app.core.server.strategy import read_checkpoint
from fedcluster_app.core.training import evaluate
from fedcluster_app.engine import run_inprocess
from fedcluster_app.families.fedccfa.classifiers import drift_recovery
from fedcluster_app.families.fedccfa.client import general_test_set

STEPS, RPS, DRIFT_STEP = 12, 5, 7
# digits-ccfa: the paper's partition (>= 5 training samples of every class per client and step)
SCENARIOS = {p: "digits-ccfa" for p in ("none", "sudden", "incremental", "recurring")}
COMMON = {
    "model": "mlp", "hidden": 64, "num-steps": STEPS, "rounds-per-step": RPS,
    "drift-step": DRIFT_STEP, "samples-per-step": 135, "test-samples": 100,
    "dirichlet-alpha": 0.5, "progress": False, "plot": False, "protocol": "none",
    # the paper's local training for single-model baselines
    "optimizer": "sgd", "lr": 0.01, "momentum": 0.9, "weight-decay": 1e-5, "local-steps": 0,
    "local-epochs": 5, "batch-size": 64,
    "fedccfa.eps": 0.05, "fedccfa.align-start": 6,
}
VARIANTS = {   # method name -> (strategy, extra overrides)
    "fedavg": ("fedavg", {}), "fedprox": ("fedprox", {}), "fedrep": ("fedrep", {}),
    "fedbabu": ("fedbabu", {}), "flash": ("flash", {}), "fedccfa": ("fedccfa", {}),
    "fedccfa-noalign": ("fedccfa", {"fedccfa.weight-mode": "fixed", "fedccfa.fixed-weight": 0.0}),
    "fedccfa-eps0.1": ("fedccfa", {"fedccfa.eps": 0.1}),
    "fedccfa-eps0.2": ("fedccfa", {"fedccfa.eps": 0.2}),
    "adaptive-fedavg": ("adaptive-fedavg", {}),
    "adaptive-fedavg-rounds": ("adaptive-fedavg-rounds", {}),   # the FedCCFA paper's: lr adapted every round
}


def final_gen_accuracy_from_checkpoint(run_config: dict, out_dir: Path) -> float:
    """Global model of a single-model run (FedAvg, FedProx) on each client's relabelled pool."""
    exp = load_experiment(run_config)
    _, models = read_checkpoint(out_dir)
    weights = models[min(models)]
    model = build_model(exp.spec, 0)
    set_weights(model, weights)
    step = exp.scenario.num_steps
    accs = [evaluate(model, *general_test_set(exp.scenario, exp.scenario.concept(k, step)))[1]
            for k in range(exp.scenario.num_clients)]
    return float(np.mean(accs))


def run_one(setting: str, method: str, seed: int, root: Path, scenario: str = "") -> dict:
    strategy, extra = VARIANTS[method]
    out = root / f"{setting}-{method}-s{seed}"
    cfg = {**COMMON, **extra, "strategy": strategy, "scenario": scenario or SCENARIOS[setting],
           "seed": seed,
           "drift-pattern": setting,
           "overwrite": True, "out-dir": str(out)}
    t0 = time.time()
    summary = run_inprocess(cfg)
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    series = [r.get("generalized_accuracy") for r in lines]
    if all(v is None for v in series):
        gen = final_gen_accuracy_from_checkpoint(merge_overrides(default_run_config(), cfg), out)
        series = [r.get("accuracy") for r in lines]   # per-round: personalised only
        curve = "accuracy"
    else:
        gen = series[-1]
        curve = "generalized_accuracy"
    drift_index = (DRIFT_STEP - 1) * RPS
    rec = drift_recovery(series, drift_index) if setting != "none" else {}
    row = {"setting": setting, "method": method, "seed": seed, "scenario": cfg["scenario"],
           "gen_final": gen,
           "acc_final": summary["final_accuracy"], "curve": curve,
           "drop": rec.get("drop"), "rounds_to_recover": rec.get("rounds_to_recover"),
           "series": series, "wall_s": round(time.time() - t0, 1)}
    if "class_ari" in lines[-1]:
        row["class_ari_final"] = lines[-1]["class_ari"]
        row["clusters_per_class_final"] = lines[-1]["clusters_per_class"]
        pre = lines[drift_index - 1] if setting != "none" else None
        if pre is not None and "clusters_per_class" in pre:
            row["clusters_per_class_before_drift"] = pre["clusters_per_class"]
    return row


def main(argv=None) -> int:
    ap = parser(__doc__, jsonl="one per run, written as it ends", append=True, seeds=[0, 1, 2])
    ap.add_argument("--settings", nargs="+", default=["none", "sudden"], choices=list(SCENARIOS))
    ap.add_argument("--methods", nargs="+", default=["fedavg", "fedrep", "fedccfa"],
                    choices=list(VARIANTS))
    ap.add_argument("--runs-dir", default="runs/fedccfa-bench")
    ap.add_argument("--scenario", default="", help="another image scenario with swap concepts "
                    "(e.g. digits-swap: no per-class minimum); default digits-ccfa")
    args = ap.parse_args(argv)
    root = Path(args.runs_dir)
    start_rows(args.jsonl, args.append)
    rows = []
    for setting in args.settings:
        for seed in args.seeds:
            for method in args.methods:
                load = load_average()
                row = run_one(setting, method, seed, root, args.scenario)
                row = {**row, **machine(load)}      # its wall time's context
                rows.append(row)
                drop = "-" if row["drop"] is None else f"{100 * row['drop']:.1f}"
                print(f"{setting:12s} {method:16s} seed {seed}: gen {100 * row['gen_final']:.1f}  "
                      f"own-split {100 * row['acc_final']:.1f}  drop {drop}  "
                      f"recover {row['rounds_to_recover']}  ({row['wall_s']} s)", flush=True)
                add_row(args.jsonl, row)
    print("\nmean (std) over seeds, generalised accuracy %:")
    for setting in args.settings:
        for method in args.methods:
            g = [100 * r["gen_final"] for r in rows if r["setting"] == setting and r["method"] == method]
            print(f"  {setting:12s} {method:16s} {np.mean(g):5.1f} ({np.std(g):.1f})  n={len(g)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
