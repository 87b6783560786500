"""Golden metrics: seeded short runs of every registered strategy, recorded before a refactor
and compared after it, so behaviour that must not change can be checked bit for bit.

    python tests/golden/golden.py record  [--out tests/golden/metrics.jsonl]
    python tests/golden/golden.py compare [--golden tests/golden/metrics.jsonl]

Each line of the golden file is one run: its name, its run config and every metrics.jsonl
record and the summary, without wall-clock fields. ``compare`` re-runs each recorded config and
reports, per run, every value of metrics.jsonl and summary.json that differs (a summary key the
golden run lacks is reported as an addition, not a difference).

The runs train one client after the other (``batch-clients = false``, as when they were
recorded); ``--set batch-clients=true`` compares the batched engine, which agrees up to
floating-point rounding (PyTorch families with Adam differ in the last digits).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT = HERE / "metrics.jsonl"

# The tests' fast setting as recorded (tests/support.py's FAST): 10 clients, 6 steps, a label
# swap at step 3.
FAST = {"scenario": "mixture-swap", "rounds-per-step": 2, "local-steps": 5,
        "samples-per-step": 100, "test-samples": 50, "progress": False, "plot": False}
QUIET = {"progress": False, "plot": False}

# Each family also on its own paper's data, small (the code paths its scenarios exercise).
FAMILY_RUNS = {
    "feddrift": (["feddrift", "feddrift-eager", "feddrift-c", "feddrift-w", "oblivious", "window",
                  "ifca-w", "cfl", "driftsurf", "aue", "kue", "adaptive-fedavg", "oracle-t"],
                 {"scenario": "sea4", "rounds-per-step": 2, "local-steps": 10, "num-steps": 6,
                  "samples-per-step": 200, "feddrift.delta": 0.04}),
    "fielding": (["fielding", "static-cfl", "auxo", "fielding-tau0"],
                 {"scenario": "labels-small-large", "rounds-per-step": 2, "local-steps": 5}),
    "fielding-gradient": (["fielding"],
                          {"scenario": "digits-concept-swap", "rounds-per-step": 2,
                           "local-steps": 5, "fielding.rep": "gradient"}),
    "flexcfl": (["flexcfl", "fedgroup", "fesem", "flexcfl-ifca", "flexcfl-ifca-mig", "fesem-mig"],
                {"scenario": "synthetic-1-1-swap", "num-steps": 12, "rounds-per-step": 1,
                 "num-clusters": 3, "local-steps": 5, "flexcfl.pretrain-scale": 2,
                 "fedgroup.pretrain-scale": 2}),
    "fedrc": (["fedrc", "fedem", "fedsoft", "cfl-rounds", "fesem"],
              {"scenario": "shifts-3", "rounds-per-step": 8, "num-clusters": 3,
               "local-steps": 5, "fesem.clients-per-round": 30}),
    "fedccfa": (["fedccfa", "fedrep", "fedbabu", "flash", "adaptive-fedavg-rounds"],
                {"scenario": "digits-ccfa", "num-steps": 4, "rounds-per-step": 2,
                 "fedccfa.align-start": 2, "fedbabu.ft-epochs": 1}),
}

# The FedCCFA family's clients and Adaptive-FedAvg trained with recipes of their own until they
# read the shared one: the runs recorded then state them, so that they still compare (with 1
# local epoch in the FedCCFA family's own runs, as their keys fedccfa.ext-epochs etc. said).
CCFA_RECIPE = {"optimizer": "sgd", "lr": 0.01, "momentum": 0.9, "weight-decay": 1e-5,
               "batch-size": 64, "local-steps": 0, "local-epochs": 5}
AFA_ROUNDS_RECIPE = {"optimizer": "sgd", "momentum": 0.9, "weight-decay": 1e-5}  # eta0 0.01
AFA_RECIPE = {"optimizer": "sgd", "lr": 0.1}       # afa-lr 0.1, momentum 0, the run's decay
RECIPES = {("fast", s): CCFA_RECIPE for s in ("fedccfa", "fedrep", "fedbabu", "flash")}
RECIPES |= {("fedccfa", s): {**CCFA_RECIPE, "local-epochs": 1}
            for s in ("fedccfa", "fedrep", "fedbabu", "flash")}
RECIPES |= {(family, "adaptive-fedavg-rounds"): AFA_ROUNDS_RECIPE for family in ("fast", "fedccfa")}
RECIPES |= {(family, "adaptive-fedavg"): AFA_RECIPE for family in ("fast", "feddrift")}

# wall-clock readings and paths: they differ between any two runs
VOLATILE = {"round_time_s", "wall_time_s", "fielding_cluster_s", "fielding_handling_s",
            "out_dir", "started_at",
            "finished_at", "config"}


def strategies() -> list[str]:
    try:
        from fedcluster_app.api import STRATEGIES
    except ImportError:
        from fedcluster_app.strategies import STRATEGIES
    return sorted(STRATEGIES)


def runs() -> list[tuple[str, dict]]:
    out = [(f"fast/{s}", {**FAST, "strategy": s, **RECIPES.get(("fast", s), {})})
           for s in strategies()]
    for family, (names, cfg) in FAMILY_RUNS.items():
        out += [(f"{family}/{s}", {**QUIET, **cfg, "strategy": s,
                                   **RECIPES.get((family, s), {})}) for s in names]
    return out


# fields added to metrics.jsonl after the recording (compared only when the golden has them)
ADDED = {"gradient_steps", "bounded_updates", "reason", "models_allocated", "assignments", "models_allocated_final",
         "train_loss", "assignments_final", "resolved_config", "data_fingerprint", "versions",
         "git", "round_protocol", "accuracy_rule",
         # balanced-test = true only (off in every golden run)
         "balanced_accuracy_current", "client_balanced_accuracy_current",
         "balanced_accuracy_next", "client_balanced_accuracy_next"}


def strip(obj):
    if isinstance(obj, dict):
        return {k: strip(v) for k, v in obj.items() if k not in VOLATILE}
    if isinstance(obj, list):
        return [strip(v) for v in obj]
    return obj


def run_one(name: str, cfg: dict, extra: dict | None = None) -> dict:
    from fedcluster_app.engine import run_inprocess

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        # recorded before scenarios declared their papers' protocols: the plain defaults
        run_inprocess({"protocol": "none", "batch-clients": False, **cfg, **(extra or {}),
                       "out-dir": str(out)})
        rounds = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        summary = json.loads((out / "summary.json").read_text())
    return {"name": name, "config": cfg, "rounds": strip(rounds), "summary": strip(summary)}


def differences(a, b, path="") -> list[str]:
    """Every place where ``b`` differs from ``a``, as ``path: golden != new``."""
    if type(a) is not type(b):
        return [f"{path}: {a!r} != {b!r}"]
    if isinstance(a, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            if k in ADDED and k not in a:
                continue
            if k not in a or k not in b:
                out.append(f"{path}.{k}: only in {'golden' if k in a else 'new'}")
            else:
                out += differences(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list):
        if len(a) != len(b):
            return [f"{path}: length {len(a)} != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["record", "compare"])
    ap.add_argument("--golden", "--out", default=str(DEFAULT))
    ap.add_argument("--only", nargs="*", help="run names (or prefixes) to do")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="run-config keys to set on every run (compare only)")
    args = ap.parse_args(argv)
    from fedcluster_app.core.config import parse_assignment

    extra = dict(parse_assignment(a) for a in args.set)
    wanted = runs()
    if args.only:
        wanted = [(n, c) for n, c in wanted if any(n.startswith(o) for o in args.only)]
    if args.mode == "record":
        # merges: the runs recorded now replace their lines, every other line is kept (so that
        # ``--only`` never drops the rest), in the order of runs(); written once at the end
        path = Path(args.golden)
        lines = {json.loads(line)["name"]: line for line in
                 (path.read_text().splitlines() if path.is_file() else [])}
        for name, cfg in wanted:
            t0 = time.monotonic()
            lines[name] = json.dumps(run_one(name, cfg), sort_keys=True)
            print(f"{name}: {time.monotonic() - t0:.1f} s", flush=True)
        order = {name: i for i, (name, _) in enumerate(runs())}
        ordered = sorted(lines, key=lambda n: (order.get(n, len(order)), n))
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(lines[n] + "\n" for n in ordered))
        tmp.replace(path)
        return 0
    golden = {}
    for line in Path(args.golden).read_text().splitlines():
        rec = json.loads(line)
        golden[rec["name"]] = rec
    bad = 0
    for name, _ in wanted:
        if name not in golden:
            print(f"{name}: NOT IN GOLDEN FILE")
            bad += 1
            continue
        rec = run_one(name, golden[name]["config"], extra)
        metrics = differences(strip(golden[name]["rounds"]), rec["rounds"], "metrics")
        summary = differences(strip(golden[name]["summary"]), rec["summary"], "summary")
        added = [d for d in summary if d.endswith("only in new")]
        changed = [d for d in summary if d not in added]
        verdict = "metrics identical" if not metrics else f"METRICS DIFFER ({len(metrics)})"
        if changed:
            verdict += f"; SUMMARY DIFFERS ({len(changed)})"
        elif added:
            verdict += "; summary adds " + ", ".join(d.split(":")[0] for d in added)
        print(f"{name}: {verdict}", flush=True)
        for d in (metrics + changed)[:8]:
            print(f"    {d}")
        bad += bool(metrics or changed)
    missing = sorted(set(golden) - {n for n, _ in wanted}) if not args.only else []
    for name in missing:
        print(f"{name}: in the golden file, no longer a registered run")
    print(f"{len(wanted) - bad} of {len(wanted)} runs with identical metrics and summary values; "
          f"{len(missing)} golden runs gone")
    return 1 if bad or missing else 0


if __name__ == "__main__":
    sys.exit(main())
