"""Reproduce the FedDrift paper's synthetic results (Table 2 / appendix Table 4) with fedcluster.

The paper's protocol (docs/feddrift/README.md): 10 clients, 10 training steps plus a test
step, 500 samples per client and step, R rounds per step (paper: 100), K = 50 local Adam steps
(amsgrad, weight decay 1e-3) of batch 50, lr 1e-2, delta per dataset (SINE 0.20, CIRCLE 0.10,
SEA 0.04), data fixed across trials (data seed 0), trial seed = model init and minibatches.
Each run goes through the in-process engine (the real ServerApp and ClientApp); runs are
spread over ``--workers`` processes. Finished runs are reused (their summary.json is read), so
an interrupted reproduction continues where it stopped.

    python benchmarks/feddrift_reproduce.py --rounds 100 --seeds 0 1 2 --workers 2 \\
        --report docs/feddrift/feddrift_table.md

writes a markdown table: ours (mean +- std over seeds, omitting drift steps; and including
them) beside the paper's numbers, plus seconds per run.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from pathlib import Path

import numpy as np
from harness import assignments, parser, run_many, write_rows

ROOT = Path(__file__).resolve().parent.parent

DATASETS = ["sine2", "circle2", "sea2", "sea4"]
# SEA as the authors' data files are (thresholds 8, 9, 7, 9): scored against the same paper column
AUTHORS_SEA = ["sea2-authors", "sea4-authors"]


def paper_column(dataset: str) -> int:
    """The paper's column of ``dataset`` (a variant shares its base dataset's)."""
    return DATASETS.index(dataset.split("-")[0])


def base(dataset: str) -> str:
    return dataset.split("-")[0]

DELTA = {"sine2": 0.20, "circle2": 0.10, "sea2": 0.04, "sea4": 0.04}          # the authors' code's defaults
DRIFTSURF_DELTA = {"sine2": 0.10, "circle2": 0.05, "sea2": 0.02, "sea4": 0.02}
CLUSTERS = {"sine2": 2, "circle2": 2, "sea2": 2, "sea4": 4}

# paper, omitting drift steps: Table 2 and appendix Table 4 (mean, std) per dataset
PAPER = {
    "Oblivious": ("oblivious", [(52.11, 1.79), (88.38, 0.17), (86.46, 0.22), (85.40, 0.09)]),
    "DriftSurf": ("driftsurf", [(84.18, 1.40), (92.34, 0.38), (87.20, 0.27), (85.55, 0.13)]),
    "KUE": ("kue", [(86.86, 0.17), (93.71, 0.14), (87.25, 0.94), (85.09, 0.86)]),
    "AUE": ("aue", [(86.00, 0.95), (92.84, 0.19), (87.48, 0.07), (85.47, 0.12)]),
    "Window": ("window", [(86.28, 0.64), (93.72, 0.14), (87.94, 0.10), (85.72, 0.13)]),
    "Window-2": ("window-2", [(85.97, 0.94), (93.28, 0.15), (87.62, 0.33), (86.58, 0.15)]),
    "Weighted-Linear": ("weighted-linear", [(72.93, 2.05), (89.87, 0.54), (87.02, 0.46), (86.42, 0.10)]),
    "Weighted-Exp": ("weighted-exp", [(82.52, 1.78), (92.38, 0.32), (87.11, 0.34), (86.60, 0.07)]),
    "Adaptive-FedAvg": ("adaptive-fedavg", [(74.10, 10.03), (86.26, 0.00), (86.77, 0.53), (85.25, 0.27)]),
    "IFCA(T)": ("ifca-t", [(98.45, 0.03), (91.72, 5.19), (86.46, 0.23), (85.41, 0.20)]),
    "IFCA-W": ("ifca-w", [(98.49, 0.13), (94.31, 1.62), (88.04, 0.17), (86.17, 1.00)]),
    "CFL": ("cfl", [(57.57, 8.87), (86.59, 3.42), (86.46, 0.24), (86.24, 0.15)]),
    "CFL-W": ("cfl-w", [(96.92, 1.84), (96.04, 1.56), (87.81, 0.32), (86.06, 0.11)]),
    "FedDrift-Eager": ("feddrift-eager", [(97.53, 0.13), (97.82, 0.17), (87.51, 0.88), (87.61, 1.26)]),
    "FedDrift": ("feddrift", [(97.43, 0.06), (97.82, 0.19), (87.29, 0.75), (88.13, 0.76)]),
    "FedDrift-C": ("feddrift-c", [(97.91, 0.70), (97.61, 0.19), (87.52, 0.91), (88.26, 0.80)]),
    "FedDrift-Eager-W": ("feddrift-eager-w", [(97.95, 0.67), (97.56, 0.24), (87.32, 1.02), (86.99, 0.40)]),
    "FedDrift-W": ("feddrift-w", [(97.86, 0.59), (97.52, 0.22), (87.30, 1.01), (88.56, 0.39)]),
    "Oracle": ("oracle-t", [(98.45, 0.03), (97.84, 0.22), (87.76, 0.98), (88.79, 0.41)]),
    "Oracle-W": ("oracle-w", [(98.53, 0.15), (97.81, 0.13), (87.31, 0.75), (88.41, 0.57)]),
}
TABLE_ORDER = {m: i for i, m in enumerate(PAPER)}
TABLE2 = ["Oblivious", "DriftSurf", "KUE", "AUE", "Window", "Adaptive-FedAvg", "IFCA-W", "CFL-W",
          "FedDrift-Eager", "FedDrift", "Oracle"]


def run_config(strategy: str, dataset: str, seed: int, args) -> dict:
    cfg = {
        "strategy": strategy, "scenario": dataset, "seed": seed, "data-seed": args.data_seed,
        "rounds-per-step": args.rounds, "local-steps": args.local_steps, "batch-size": 50,
        "lr": 0.01, "weight-decay": 0.001, "optimizer": "adam",
        "num-clusters": CLUSTERS[base(dataset)], "feddrift.delta": DELTA[base(dataset)],
        "feddrift-baselines.driftsurf-delta": DRIFTSURF_DELTA[base(dataset)],
        "optimizer-state": args.optimizer_state,
        # the paper's Adaptive-FedAvg: SGD at its own initial lr (0.1 on SINE-2, else 0.01)
        **({"optimizer": "sgd", "lr": 0.1 if dataset == "sine2" else 0.01}
           if strategy == "adaptive-fedavg" else {}),
        **args.overrides,
        "progress": False, "plot": False, "checkpoint-every": 0, "protocol": "none",
        "overwrite": True, "out-dir": str(Path(args.runs_dir) / _setting(args) / f"{strategy}-{dataset}-s{seed}"),
    }
    return cfg


def _setting(args) -> str:
    """The runs directory of one protocol (an Adam state kept per time step and every set of
    ``--set`` overrides have their own)."""
    kept = "-adam-per-step" if args.optimizer_state == "step" else ""
    extra = "".join(f"-{k}={v}" for k, v in sorted(args.overrides.items()))
    return f"R{args.rounds}-K{args.local_steps}{kept}{extra}"


def _finished(cfg: dict) -> dict | None:
    """The summary of the completed run in ``cfg``'s out-dir, if there is one (runs are reused)."""
    summary_file = Path(cfg["out-dir"]) / "summary.json"
    if summary_file.is_file():
        s = json.loads(summary_file.read_text())
        if s.get("status") == "completed" and s.get("acc_omit") is not None:
            return s
    return None


def _one(cfg: dict) -> dict:
    os.environ.setdefault("FEDCLUSTER_TORCH_THREADS", "1")
    if (s := _finished(cfg)) is not None:
        return _with_steps(s, cfg)
    import logging

    from flwr.common.logger import FLOWER_LOGGER
    FLOWER_LOGGER.setLevel(logging.ERROR)
    from fedcluster_app.engine import run_inprocess

    return _with_steps(run_inprocess(cfg), cfg)


def _with_steps(summary: dict, cfg: dict) -> dict:
    """The summary plus each evaluated step's accuracy omitting drift pairs (the table's
    number is their pooled mean): where in the stream a method gains or loses."""
    from fedcluster_app.core.results import load_run

    records = load_run(cfg["out-dir"])[1]
    steps = [round(r["acc_omit"], 5) for r in records if r.get("acc_omit") is not None]
    return {**summary, "acc_omit_per_step": steps}


def main() -> None:
    ap = parser(__doc__, jsonl="one per run (the raw results)", append=True, seeds=[0, 1, 2],
                workers=1, overrides=True)
    ap.add_argument("--rounds", type=int, default=100, help="rounds per time step R (paper: 100)")
    ap.add_argument("--local-steps", type=int, default=50, help="local Adam steps K (paper: 50)")
    ap.add_argument("--data-seed", type=int, default=0)
    ap.add_argument("--datasets", nargs="+", default=DATASETS, choices=DATASETS + AUTHORS_SEA)
    ap.add_argument("--optimizer-state", default="round", choices=("round", "step"),
                    help="round: a fresh Adam every round | step: kept through a time step, "
                         "as the authors' clients")
    ap.add_argument("--methods", nargs="+", default=TABLE2, help="paper row names (see PAPER)")
    ap.add_argument("--runs-dir", default=str(ROOT / "runs" / "feddrift-repro"))
    ap.add_argument("--report", default="", help="markdown file for the table (default: print only)")
    ap.add_argument("--table-only", action="store_true",
                    help="run nothing: render the table from the finished runs in --runs-dir")
    ap.add_argument("--merge", action="store_true",
                    help="with --jsonl: keep the rows already there for runs not made now (same "
                         "datasets, seeds and setting) and render the table from all of them, "
                         "e.g. to refresh one method's rows after a change to it")
    args = ap.parse_args()
    args.argv = ap.argv     # the command the table names
    if args.merge and not args.jsonl:
        ap.error("--merge needs --jsonl (the rows to merge into)")
    if args.append and (args.merge or not args.jsonl):
        ap.error("--append needs --jsonl and goes without --merge")
    from fedcluster_app.core.config import ConfigError

    try:    # --set's keys, set on every run: such runs have their own runs directory
        args.overrides = assignments(args.set)
    except ConfigError as e:
        ap.error(str(e))

    from fedcluster_app.api import STRATEGIES

    methods = [m for m in args.methods if PAPER[m][0] in STRATEGIES]
    missing = [m for m in args.methods if m not in methods]
    jobs = [(m, d, s) for m in methods for d in args.datasets for s in args.seeds]
    results: dict[tuple, dict] = {}
    t0 = time.time()
    if args.table_only:
        for m, d, s in jobs:
            cfg = run_config(PAPER[m][0], d, s, args)
            if (summary := _finished(cfg)) is not None:
                results[(m, d, s)] = _with_steps(summary, cfg)
        jobs = []
    configs = [run_config(PAPER[m][0], d, s, args) for m, d, s in jobs]
    for key, s in zip(jobs, run_many(_one, configs, args.workers)):
        results[key] = s
        print(f"[{len(results)}/{len(jobs)}] {key[0]:16s} {key[1]:8s} seed {key[2]}: "
              f"omit {100 * s['acc_omit']:.2f} incl {100 * s['acc_include']:.2f} "
              f"models {s.get('models_final')} {s['wall_time_s']:.1f}s", flush=True)
    if args.merge:
        kept = merged_rows(args, set(results))
        results.update(kept)
        present = {m for m, _, _ in results}
        methods = sorted(present, key=lambda m: TABLE_ORDER.get(m, 99))
    table = render(results, methods, missing, args, time.time() - t0)
    print(table)
    if args.report:
        Path(args.report).write_text(table)
    write_rows(args.jsonl, raw_rows(results, args), append=args.append)


#: the summary fields a raw row keeps
ROW_FIELDS = ("acc_omit", "acc_include", "models_final", "num_clusters_final", "ari_final",
              "models_sent_down", "models_sent_up", "wall_time_s", "status", "acc_omit_per_step")


def merged_rows(args, made: set) -> dict[tuple, dict]:
    """The rows of ``args.jsonl`` with this invocation's setting, less those made now (the
    fields the tables read: a row serves as the run's summary)."""
    path = Path(args.jsonl)
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    out = {}
    for r in rows:
        key = (r["method"], r["dataset"], r["seed"])
        same = (r["dataset"] in args.datasets and r["seed"] in args.seeds
                and (r["data_seed"], r["rounds"], r["local_steps"], r["optimizer_state"],
                     r.get("set", {}))
                == (args.data_seed, args.rounds, args.local_steps, args.optimizer_state,
                    args.overrides))
        if same and key not in made:
            out[key] = r
    return out


def raw_rows(results: dict, args) -> list[dict]:
    """One row per run, in a stable order: what the tables are computed from."""
    return [{"method": m, "strategy": PAPER[m][0], "dataset": d, "seed": s,
             "data_seed": args.data_seed, "rounds": args.rounds,
             "local_steps": args.local_steps, "optimizer_state": args.optimizer_state,
             **({"set": args.overrides} if args.overrides else {}),
             **{f: results[(m, d, s)][f] for f in ROW_FIELDS if f in results[(m, d, s)]}}
            for (m, d, s) in sorted(results, key=lambda k: (TABLE_ORDER.get(k[0], 99), k[1], k[2]))]


def _ms(values: list[float]) -> str:
    return f"{np.mean(values):.2f} ± {np.std(values):.2f}"


# the reproduction's acceptance bands: |ours - paper| in points, per method and dataset
TOLERANCE = {("FedDrift", "sine2"): 3.0, ("FedDrift", None): 2.0, ("Oracle", None): 1.5}


def checks(results: dict, args) -> list[str]:
    """PASS/FAIL lines: FedDrift and Oracle near the paper, FedDrift above Window and Oblivious,
    and every baseline more than 3 points away from the paper (to be explained)."""
    def mean(m: str, d: str) -> float | None:
        vals = [100 * results[(m, d, s)]["acc_omit"] for s in args.seeds if (m, d, s) in results]
        return float(np.mean(vals)) if vals else None

    out = []
    for d in args.datasets:
        for m in ("FedDrift", "Oracle"):
            ours, paper = mean(m, d), PAPER[m][1][paper_column(d)][0]
            tol = TOLERANCE.get((m, base(d)), TOLERANCE[(m, None)])
            if ours is not None:
                ok = abs(ours - paper) <= tol
                out.append(f"{'PASS' if ok else 'FAIL'} {m} on {d}: {ours:.2f} vs paper {paper:.2f} "
                           f"({ours - paper:+.2f}, band ±{tol})")
        fd = mean("FedDrift", d)
        for m in ("Window", "Oblivious"):
            other = mean(m, d)
            if fd is not None and other is not None:
                out.append(f"{'PASS' if fd > other else 'FAIL'} FedDrift above {m} on {d}: "
                           f"{fd:.2f} vs {other:.2f} ({fd - other:+.2f})")
    for m in PAPER:
        if m in ("FedDrift", "Oracle"):
            continue
        for d in args.datasets:
            ours, paper = mean(m, d), PAPER[m][1][paper_column(d)][0]
            if ours is not None and abs(ours - paper) > 3:
                out.append(f"NOTE {m} on {d} differs from the paper by {ours - paper:+.2f} points "
                           f"({ours:.2f} vs {paper:.2f})")
    return out


def _without_option(argv: list[str], option: str) -> list[str]:
    """``argv`` without ``option`` and its values (``--opt V ...`` up to the next option, or
    ``--opt=V``)."""
    out, skip = [], False
    for a in argv:
        if a == option:
            skip = True
            continue
        if skip and not a.startswith("--"):
            continue
        skip = False
        if not a.startswith(option + "="):
            out.append(a)
    return out


def _with_methods(argv: list[str], methods: list[str]) -> list[str]:
    """``argv`` with its ``--methods`` list replaced by ``methods``."""
    return _without_option(argv, "--methods") + ["--methods", *methods]


def render(results: dict, methods: list[str], missing: list[str], args, elapsed: float) -> str:
    argv = _without_option([a for a in args.argv if a not in ("--table-only", "--merge")],
                           "--runs-dir")      # where the runs go changes no number
    if args.merge:   # the page names the command that makes every row from scratch
        argv = _with_methods(argv, methods)
    cmd = "python benchmarks/feddrift_reproduce.py " + shlex.join(argv)
    lines = [
        f"Reproduction: R = {args.rounds} rounds per step, K = {args.local_steps} local steps, "
        f"seeds {args.seeds} (data seed {args.data_seed}), in-process engine, "
        + ("Adam state kept through each time step (as the authors' clients)."
           if args.optimizer_state == "step" else "a fresh Adam state every round.")
        + "".join(f" {k} = {v}." for k, v in args.overrides.items()),
        "", f"Command: `{cmd}`", "",
        "Accuracy (%) omitting drift steps, ours (mean ± std over seeds) / paper (Table 2, Table 4):", "",
        "| Method | " + " | ".join(d for d in args.datasets) + " |",
        "|---|" + "---|" * len(args.datasets),
    ]
    for m in methods:
        cells = []
        for d in args.datasets:
            vals = [100 * results[(m, d, s)]["acc_omit"] for s in args.seeds if (m, d, s) in results]
            paper = PAPER[m][1][paper_column(d)]
            seeds = "" if len(vals) == len(args.seeds) else f" ({len(vals)} seeds)"
            cells.append(f"{_ms(vals)}{seeds} / {paper[0]:.2f} ± {paper[1]:.2f}" if vals
                         else f"not run / {paper[0]:.2f} ± {paper[1]:.2f}")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    lines += ["", "Accuracy (%) including drift steps (ours; the paper's Table 5 is partly lost):", "",
              "| Method | " + " | ".join(args.datasets) + " | models at the end | models sent (down+up) | s/run |",
              "|---|" + "---|" * (len(args.datasets) + 3)]
    for m in methods:
        cells, models, sent, secs = [], [], [], []
        for d in args.datasets:
            rs = [results[(m, d, s)] for s in args.seeds if (m, d, s) in results]
            cells.append(_ms([100 * r["acc_include"] for r in rs]) if rs else "—")
            models += [r.get("models_final", 0) for r in rs]
            sent += [r.get("models_sent_down", 0) + r.get("models_sent_up", 0) for r in rs]
            secs += [r["wall_time_s"] for r in rs]
        if not secs:
            continue
        lines.append(f"| {m} | " + " | ".join(cells) +
                     f" | {np.mean(models):.1f} | {np.mean(sent):.0f} | {np.mean(secs):.1f} |")
    lines += ["", "The acceptance checks (omit-drift accuracy, mean over the seeds run):", ""]
    lines += [f"- {line}" for line in checks(results, args)]
    if missing:
        lines += ["", "Not implemented, so not run: " + ", ".join(missing) + "."]
    run_s = sum(r["wall_time_s"] for r in results.values())
    if args.merge:
        made = sum(1 for r in results.values() if "method" not in r)   # kept rows carry it
        lines += ["", f"{made} runs made by the last invocation ({elapsed / 60:.1f} min with "
                      f"{args.workers} worker(s)); the other {len(results) - made} rows kept from "
                      f"the raw rows file; run times add up to {run_s / 60:.1f} min."]
    elif args.table_only:
        lines += ["", f"Rendered from the finished runs; their run times add up to {run_s / 60:.1f} min "
                      f"(s/run above: in-process, measured while the runs shared the 2 cores)."]
    else:
        lines += ["", f"Total wall time {elapsed / 60:.1f} min with {args.workers} worker(s) "
                      f"(run times add up to {run_s / 60:.1f} min)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
