"""Six strategies x three seeds on River's ImageSegments table with FedCCFA's sudden label swaps
(scenario ``imagesegments-swap``), in-process, one common setting; writes docs/imagesegments/README.md.

    python benchmarks/imagesegments_table.py [--out runs/imagesegments-table] \
        [--results docs/imagesegments/imagesegments_results.jsonl] [--doc docs/imagesegments/README.md] [--table-only]

Every run's summary (without the run config and long arrays), plus the metric it reports, its
cluster counts, its compute time and the machine load around it, is appended to --results as one
JSON line as soon as the run ends; runs already there (same strategy, seed and setting, status
completed) are skipped, so a re-run after a crash only does what is missing (delete the file to
start over). The markdown (setting, table, per-seed values, compute time, load, reading) is then
written from the JSON lines alone; --table-only rewrites it without running anything.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
from harness import parser

from fedcluster_app.core.results import load_run, to_json
from fedcluster_app.engine import run_inprocess

SCENARIO = "imagesegments-swap"
STRATEGIES = ["fedavg", "ifca", "feddrift", "fielding", "fedccfa", "oracle"]
SEEDS = [0, 1, 2]
DRIFT_STEP = 3   # the scenario's: every client swaps at step 3 (round 21 with 10 rounds per step)
#: the one setting every run shares (the strategies' own hyper-parameters stay at their defaults)
COMMON = {
    "scenario": SCENARIO, "rounds-per-step": 10, "local-steps": 20, "batch-size": 50,
    "samples-per-step": 200, "test-samples": 100, "optimizer": "adam", "lr": 0.01,
    "num-clusters": 4, "plot": False, "progress": False,
}
#: what each strategy's accuracy is (they run under their own protocols)
METRIC = {
    "fedavg": "A", "ifca": "A", "fielding": "A", "oracle": "A", "feddrift": "B", "fedccfa": "C",
}
METRIC_TEXT = {
    "A": "rounds protocol: mean client accuracy on its own test split of the current step, after "
         "the round's training; every round (60 values)",
    "B": "FedDrift's time-step protocol: the model each client uses at step t, tested on its "
         "training batch of step t+1 (before it adapts to t+1); once per step, steps 1-5 "
         "(5 values; step 6 is test-only, so 50 training rounds)",
    "C": "rounds protocol, personalised: each client's own model (shared extractor + its "
         "classifier) on its own test split of the current step, after training; every round",
}
MAX_LIST = 20   # longer lists in a summary are left out of the JSON line


def class_cluster_tuples(partitions: dict[str, list[list[int]]]) -> int:
    """FedCCFA: how many distinct tuples of class-level clusters its clients hold (a client's
    tuple: the group it is in for each class; ``partitions``: class -> groups of clients)."""
    tuples: dict[int, list[int]] = {}
    for cls in sorted(partitions, key=int):
        for g, group in enumerate(partitions[cls]):
            for cid in group:
                tuples.setdefault(int(cid), []).append(g)
    return len({tuple(t) for t in tuples.values()})


def run_one(strategy: str, seed: int, root: Path) -> dict:
    out = root / f"{strategy}-s{seed}"
    load_before = os.getloadavg()
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        run_inprocess({**COMMON, "strategy": strategy, "seed": seed, "overwrite": True, "out-dir": str(out.resolve())})
        summary, records = load_run(out)
        error = None
    except Exception as ex:  # a crash is recorded, the grid goes on
        summary, records, error = {"status": "failed"}, [], f"{type(ex).__name__}: {ex}"
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    row = {k: v for k, v in summary.items()
           if k not in ("config", "out_dir") and not (isinstance(v, list) and len(v) > MAX_LIST)}
    row.update(strategy=strategy, seed=seed, scenario=SCENARIO, setting=dict(COMMON),
               metric=METRIC[strategy], run_dir=out.as_posix(),
               elapsed_s=round(elapsed, 2), process_cpu_s=round(cpu, 2),
               load_before=[round(x, 2) for x in load_before],
               load_after=[round(x, 2) for x in os.getloadavg()], cpu_count=os.cpu_count())
    if error:
        row["error"] = error
    if records:
        last = records[-1]
        # the summary's counts: clusters some client is assigned to, and models allocated
        row["clusters_in_use"] = summary.get("num_clusters_final")
        evaluated = [r for r in records if r.get("accuracy") is not None]
        if "identities" in last:   # time-step protocol: one evaluation per step (on step t+1)
            row["step_accuracy"] = [r["accuracy"] for r in evaluated]
        else:
            before = [r["accuracy"] for r in evaluated if r["time_step"] < DRIFT_STEP]
            at = [r["accuracy"] for r in evaluated if r["time_step"] == DRIFT_STEP]
            row["mean_accuracy_before_drift"] = float(np.mean(before)) if before else None
            row["accuracy_first_drift_round"] = at[0] if at else None
        if "class_ari" in last:
            row["class_ari_final"] = last["class_ari"]
            row["clusters_per_class_final"] = last["clusters_per_class"]
            row["class_cluster_tuples_final"] = class_cluster_tuples(last["class_partitions"])
    return to_json(row)


def read_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def done(rows: list[dict]) -> dict[tuple[str, int], dict]:
    """The last completed row of every (strategy, seed) run with the current setting."""
    out = {}
    for r in rows:
        # rows from before the summary counted models and clusters in use apart are run again
        if (r.get("status") == "completed" and r.get("setting") == COMMON
                and "models_allocated_final" in r):
            out[(r["strategy"], r["seed"])] = r
    return out


# ----------------------------------------------------------------------------- the markdown


def pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}"


def ms(values, scale: float = 100.0, digits: int = 1) -> str:
    """mean +- std (population, ddof = 0) over seeds; '-' when a value is missing."""
    if not values or any(v is None for v in values):
        return "-"
    a = scale * np.asarray(values, dtype=float)
    return f"{a.mean():.{digits}f} ± {a.std():.{digits}f}"


def per_seed(values, fmt) -> str:
    return " / ".join("-" if v is None else fmt(v) for v in values)


def stats(runs: dict) -> dict[str, dict]:
    out = {}
    for s in STRATEGIES:
        rs = [runs[(s, seed)] for seed in SEEDS if (s, seed) in runs]
        if rs:
            out[s] = {k: [r.get(k) for r in rs] for k in (
                "mean_accuracy", "mean_accuracy_before_drift", "accuracy_first_drift_round",
                "mean_accuracy_after_drift", "final_accuracy", "ari_final",
                "models_allocated_final", "clusters_in_use", "wall_time_s", "elapsed_s", "seed")}
            out[s]["rows"] = rs
    return out


def mean(v) -> float:
    return float(np.mean(v))


def reading(st: dict) -> list[str]:
    """The short reading, every number taken from the rows."""
    if set(st) != set(STRATEGIES) or any(len(st[s]["rows"]) != len(SEEDS) for s in st):
        return ["(incomplete grid: the reading is written once all 18 runs are in)"]
    f = {s: mean(st[s]["final_accuracy"]) for s in st}
    a = {s: mean(st[s]["mean_accuracy_after_drift"]) for s in st}
    b = {s: mean(st[s]["mean_accuracy_before_drift"]) for s in st if s != "feddrift"}
    best = max(["fedavg", "ifca", "fielding"], key=lambda s: a[s])
    ifca = st["ifca"]
    sep = [i for i, v in enumerate(ifca["ari_final"]) if v is not None and v >= 0.99]
    col = [i for i, v in enumerate(ifca["clusters_in_use"]) if v == 1]

    def seeds(idx):
        return ", ".join(str(SEEDS[i]) for i in idx) or "none"

    def vals(s, key, idx):
        return " / ".join(pct(st[s][key][i]) for i in idx)

    def aris(values):
        return per_seed(values, lambda v: f"{v:.2f}")

    fd = st["feddrift"]
    cc = st["fedccfa"]["rows"]
    swapped = [mean(r["class_ari_final"][1:7]) for r in cc if r.get("class_ari_final")]
    sd = {s: float(np.std(st[s]["mean_accuracy_after_drift"])) for s in ("fedavg", "ifca",
                                                                       "fielding", "fedccfa")}
    spread = ("with the smallest seed spread after the drift of the non-oracle rounds-protocol "
              "methods" if min(sd, key=sd.get) == "fedccfa" else
              f"with a seed spread after the drift of {100 * sd['fedccfa']:.1f} points")
    hit = {s: mean(st[s]["accuracy_first_drift_round"]) for s in ("fedccfa", "oracle", "fedavg")}
    first = ("loses less at the first swapped round" if hit["fedccfa"] > hit["oracle"]
             else "loses as much or more at the first swapped round")
    gap = 100 * (f["fielding"] - f["fedavg"])
    fielding = (f"Fielding is only {gap:.1f} points above FedAvg at the end" if 0 <= gap < 5 else
                f"Fielding differs from FedAvg by {gap:+.1f} points at the end")
    name = {"fedavg": "FedAvg", "ifca": "IFCA", "fielding": "Fielding"}
    return [
        "* **No single winner across the table, because there are three metrics.** Under "
        "metric A (the oracle's protocol and metric) the best method that does not see the "
        f"truth, on average over the seeds, is {name[best]}: {pct(a[best])}% after the drift "
        f"and {pct(f[best])}% at the end, against the oracle's {pct(a['oracle'])}% and "
        f"{pct(f['oracle'])}%. FedCCFA (metric C) ends at {pct(f['fedccfa'])}% "
        f"({100 * (f['oracle'] - f['fedccfa']):.1f} points under the oracle's final value, on "
        f"a different metric), {spread}. FedDrift (metric B) has the highest numbers "
        f"({pct(f['feddrift'])}% at the end) but on the next step's data, which after the "
        "single drift comes from the same concept as the current step (caveat below).",
        f"* **IFCA is all or nothing.** In seed(s) {seeds(sep)} it separates the three swap "
        "groups exactly (final ARI 1.00) and matches the oracle "
        f"({vals('ifca', 'final_accuracy', sep)}% vs {vals('oracle', 'final_accuracy', sep)}% at "
        f"the end); in seed(s) {seeds(col)} all clients end in one of its 4 models (ARI 0.00) "
        f"and it is a FedAvg ({vals('ifca', 'final_accuracy', col)}% vs FedAvg's "
        f"{vals('fedavg', 'final_accuracy', col)}%). "
        f"Its mean ± std ({ms(ifca['final_accuracy'])}% final) averages these two outcomes.",
        "* **FedAvg and Fielding do not follow the swap.** FedAvg's one model for three "
        f"conflicting labelings drops from {pct(b['fedavg'])}% before the drift to "
        f"{pct(a['fedavg'])}% after it. {fielding} ({pct(f['fielding'])}% vs {pct(f['fedavg'])}%): "
        "its clusters follow the clients' label histograms (its default label representation), "
        "not their concepts (final ARI "
        f"{aris(st['fielding']['ari_final'])}).",
        f"* **FedDrift** detects the swap (final ARI {aris(fd['ari_final'])}) "
        f"but keeps more models than concepts ({per_seed(fd['models_allocated_final'], str)} alive, "
        f"{per_seed(fd['clusters_in_use'], str)} in use at the last step, 3 true concepts). "
        f"Its mean ({pct(mean(fd['mean_accuracy']))}%) includes the evaluation that meets the "
        "drift (step 2's model on step 3's swapped batch: "
        f"{per_seed([r['step_accuracy'][1] for r in fd['rows']], pct)}%).",
        f"* **FedCCFA** learns more slowly before the drift ({pct(b['fedccfa'])}% vs "
        f"{pct(b['oracle'])}% for the single model of FedAvg and the oracle, rounds 1-20; it "
        f"trains with its own SGD recipe, not the common Adam), {first} "
        f"({pct(mean(st['fedccfa']['accuracy_first_drift_round']))}% vs the oracle's "
        f"{pct(mean(st['oracle']['accuracy_first_drift_round']))}% and FedAvg's "
        f"{pct(mean(st['fedavg']['accuracy_first_drift_round']))}%), and recovers to "
        f"{pct(f['fedccfa'])}% without client-level clusters: its client-level ARI is low "
        f"({aris(st['fedccfa']['ari_final'])}) because it clusters "
        "classifier rows class by class, and the swapped classes 1-6 are clustered well "
        f"(mean per-class ARI at the end {aris(swapped)}).",
        "* **Caveat: the three metrics are different quantities.** B is measured on the *next* "
        "step's training batch before adapting, once per step (5 values per run, 50 training "
        "rounds); A and C after training on the current step, every round (60 values per run). "
        "C is personalised (each client's own classifier), A uses the cluster's shared model. "
        "Compare rows of the same metric; across metrics only large gaps mean something. "
        "FedCCFA also trains with its own local optimiser and epochs (`fedccfa.*` defaults), "
        "not the common Adam setting, and all strategies keep their default hyper-parameters "
        "(none was tuned for this table); 3 seeds give a rough spread only.",
    ]


def write_doc(path: Path, rows: list[dict], results_path: Path, command: str) -> None:
    runs = done(rows)
    st = stats(runs)
    n = len(runs)
    lines = [
        "# River's ImageSegments table with a sudden label-swap drift",
        "",
        "Generated by `benchmarks/imagesegments_table.py` from the JSON lines in "
        f"`{results_path.as_posix()}` (one line per run: its summary without the run config and "
        "long arrays, plus the metric, cluster counts, compute time and load). Regenerate with",
        "",
        "```bash",
        command,
        "```",
        "",
        f"(runs already in `{results_path.name}` with the same setting are skipped: delete it to "
        "run all 18 again).",
        "",
        "## Scenario",
        "",
        f"`{SCENARIO}`: River's bundled ImageSegments table (2,310 rows, 18 features standardised "
        "with the train split's statistics, 7 classes; 25% held out, stratified, as the test "
        "pool) shared by 10 clients with a Dirichlet(1) label skew; 6 time steps. At step 3 every "
        "client's labels swap by FedCCFA's groups and stay swapped: clients with `k % 10` in "
        "{0, 1, 2} swap 1<->2, {3, 4, 5} swap 3<->4, {6, ..., 9} swap 5<->6 (concepts 1, 2, 3; "
        "before: concept 0 for everybody). Model: the scenario's MLP (18 -> 36 -> 7, one hidden "
        "layer).",
        "",
        "## Setting (common to all 18 runs)",
        "",
        "Seeds 0, 1, 2 (model initialisation and sampling; the data seed follows the seed). "
        "In-process engine, full participation, every client evaluated every round; the "
        "clients of a round train as one batched program (`batch-clients`, on by default), "
        "whose float summation order differs from training one client at a time "
        "(`batch-clients = false`): against this table's earlier unbatched rows, a run's "
        "final accuracy differs by at most 0.8 points (Fielding, seed 1), its mean accuracy "
        "by at most 0.09.",
        "",
        "| key | value |",
        "|---|---|",
        *[f"| `{k}` | {v} |" for k, v in COMMON.items()],
        "",
        "Every strategy's own hyper-parameters stay at their defaults (`fedcluster list params`): "
        "`num-clusters` applies to IFCA only; FedDrift `feddrift.delta` 0.1; Fielding "
        "`fielding.tau` 1/3 with the label representation; FedCCFA trains with its own local "
        "recipe (`fedccfa.*`: SGD, momentum 0.9, 5 extractor epochs at lr 0.01 and 1 classifier "
        "epoch at lr 0.1, batch 64, alignment from round 20, DBSCAN eps 0.1), so the common "
        "optimiser, lr and `local-steps` do not apply to it. With 10 rounds per step a "
        "rounds-protocol run has 60 rounds and the drift starts at round 21; FedDrift's "
        "time-step protocol trains steps 1-5 (50 rounds) and tests on step 6.",
        "",
        "## Metrics",
        "",
        *[f"* **{m}**: {t}." for m, t in METRIC_TEXT.items()],
        "",
        "Columns: *mean acc.* = the summary's `mean_accuracy` (all evaluated rounds, warm-up "
        "included); *before drift* = mean over the evaluated rounds of steps 1-2 (rounds 1-20; "
        "A and C only); *first drift round* = the accuracy of round 21, the first on swapped "
        "data (per-seed table only); *after drift* = `mean_accuracy_after_drift` (evaluated "
        "rounds from the first with drifted clients on: for A and C rounds 21-60, which "
        "include the drop at the drift; for B the evaluations of steps 3-5, which exclude "
        "the one evaluation that meets the drift, step 2's model on step 3's swapped data); "
        "*final acc.* = "
        "`final_accuracy` (last evaluation); *ARI* = "
        "`ari_final` (client clusters against the true concepts; FedCCFA has no client-level "
        "clusters, its client cluster is the tuple of its class-level clusters); *clusters* = "
        "`models_allocated_final` (IFCA: its models, FedDrift: models alive, FedCCFA: its one "
        "global model) / `num_clusters_final`, the clusters holding at least one "
        "client after the last round (FedCCFA: in brackets, the distinct tuples of class-level "
        "clusters its clients hold, `class_cluster_tuples_final`); "
        "*wall* = the run's `wall_time_s`. Mean ± std over the 3 seeds (population std, "
        "ddof = 0); accuracies in %.",
        "",
        "## Results",
        "",
        f"{n} of {len(STRATEGIES) * len(SEEDS)} runs completed.",
        "",
        "| strategy | metric | mean acc. | before drift | after drift | final acc. | ARI final | "
        "clusters (per seed) | wall s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s, v in st.items():
        tuples = [r.get("class_cluster_tuples_final") for r in v["rows"]]
        clusters = per_seed(list(zip(v["models_allocated_final"], v["clusters_in_use"], tuples)),
                            lambda p: f"{p[0]}/{p[1]}" + ("" if p[2] is None else f" ({p[2]})"))
        lines.append(
            f"| {s} | {METRIC[s]} | {ms(v['mean_accuracy'])} | "
            f"{ms(v['mean_accuracy_before_drift'])} | "
            f"{ms(v['mean_accuracy_after_drift'])} | {ms(v['final_accuracy'])} | "
            f"{ms(v['ari_final'], 1.0, 2)} | {clusters} | {ms(v['wall_time_s'], 1.0, 1)} |")
    lines += [
        "",
        "Per seed (seeds 0 / 1 / 2):",
        "",
        "| strategy | metric | mean acc. | before drift | first drift round | after drift | "
        "final acc. | ARI final | wall s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s, v in st.items():
        lines.append(
            f"| {s} | {METRIC[s]} | {per_seed(v['mean_accuracy'], pct)} | "
            f"{per_seed(v['mean_accuracy_before_drift'], pct)} | "
            f"{per_seed(v['accuracy_first_drift_round'], pct)} | "
            f"{per_seed(v['mean_accuracy_after_drift'], pct)} | "
            f"{per_seed(v['final_accuracy'], pct)} | "
            f"{per_seed(v['ari_final'], lambda x: f'{x:.2f}')} | "
            f"{per_seed(v['wall_time_s'], lambda x: f'{x:.1f}')} |")
    extra = []
    if "feddrift" in st:
        fd = st["feddrift"]["rows"]
        extra.append(
            "* FedDrift `acc_omit` (its paper's metric: only (client, step) pairs whose next "
            "step has the same concept): "
            f"{per_seed([r.get('acc_omit') for r in fd], pct)}; accuracy of each evaluation "
            "(the model of step 1, ..., 5 on the batch of step 2, ..., 6): "
            + "; ".join(f"seed {r['seed']}: {', '.join(pct(x) for x in r['step_accuracy'])}"
                        for r in fd if r.get("step_accuracy"))
            + f"; models created "
            f"{per_seed([r.get('models_created') for r in fd], str)}, drift detections "
            f"{per_seed([r.get('detections_total') for r in fd], str)}, merges "
            f"{per_seed([r.get('merges_total') for r in fd], str)}.")
    if "fedccfa" in st:
        cc = st["fedccfa"]["rows"]
        extra.append(
            "* FedCCFA generalised accuracy (each client's model on the whole test pool "
            "relabelled with its concept) at the end: "
            f"{per_seed([r.get('final_generalized_accuracy') for r in cc], pct)}; per-class ARI "
            "at the end (classes 0-6): "
            + "; ".join(f"seed {r['seed']}: {', '.join(f'{x:.2f}' for x in r['class_ari_final'])}"
                        for r in cc if r.get("class_ari_final"))
            + "; clusters per class: "
            + "; ".join(f"seed {r['seed']}: {r['clusters_per_class_final']}"
                        for r in cc if r.get("clusters_per_class_final")) + ".")
    if extra:
        lines += ["", "Strategy-specific summary fields (seeds 0 / 1 / 2):", "", *extra]
    allr = list(runs.values())
    if allr:
        loads = [x for r in allr for x in (r["load_before"][0], r["load_after"][0])]
        total_wall = sum(r["wall_time_s"] for r in allr)
        total_el = sum(r["elapsed_s"] for r in allr)
        total_cpu = sum(r["process_cpu_s"] for r in allr)
        first = min(allr, key=lambda r: r.get("started_at") or "")
        last = max(allr, key=lambda r: r.get("finished_at") or "")
        lines += [
            "",
            "## Compute time and machine",
            "",
            f"A machine with {allr[0]['cpu_count']} cores, shared with other work (the load "
            "averages below say how much); the runs one after the other in one process, "
            "CPU only. "
            f"Total compute time of the {n} runs: {total_el:.0f} s ({total_el / 60:.1f} min) "
            f"from the start of `run_inprocess` to the end of reading its results, of which "
            f"{total_wall:.0f} s the runs' own `wall_time_s`; the process used {total_cpu:.0f} s "
            f"of CPU time over them ({total_cpu / total_el:.2f} CPU-seconds per second: about "
            f"{total_cpu / total_el:.1f} of the 2 cores busy on average). "
            f"Runs from {first.get('started_at')} to {last.get('finished_at')}. "
            f"One-minute load average at the start and end of each run: "
            f"{min(loads):.2f} to {max(loads):.2f} (median {float(np.median(loads)):.2f}); "
            f"first run started at load {first['load_before'][0]:.2f}, last run ended at "
            f"{last['load_after'][0]:.2f}. Wall times therefore carry the noise of a shared "
            "machine: compare them only as orders of magnitude.",
        ]
    lines += ["", "## Reading", "", *reading(st), ""]
    path.write_text("\n".join(lines))


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--out", type=Path, default=Path("runs/imagesegments-table"))
    ap.add_argument("--results", type=Path, default=Path("docs/imagesegments/imagesegments_results.jsonl"))
    ap.add_argument("--doc", type=Path, default=Path("docs/imagesegments/README.md"))
    ap.add_argument("--table-only", action="store_true",
                    help="only rewrite the markdown from the JSON lines")
    args = ap.parse_args(argv)
    if not args.table_only:
        have = done(read_rows(args.results))
        args.results.parent.mkdir(parents=True, exist_ok=True)
        for strategy in STRATEGIES:
            for seed in SEEDS:
                if (strategy, seed) in have:
                    print(f"{strategy:9s} seed {seed}: already in {args.results}, skipped")
                    continue
                row = run_one(strategy, seed, args.out)
                with open(args.results, "a") as fh:
                    fh.write(json.dumps(row, allow_nan=False) + "\n")
                    fh.flush()
                    os.fsync(fh.fileno())
                print(f"{strategy:9s} seed {seed}: {row.get('status')}  mean "
                      f"{pct(row.get('mean_accuracy'))}  final {pct(row.get('final_accuracy'))}  "
                      f"ARI {row.get('ari_final')}  clusters {row.get('models_allocated_final')}/"
                      f"{row.get('clusters_in_use')}  {row['elapsed_s']:.1f} s  load "
                      f"{row['load_after'][0]:.2f}", flush=True)
    write_doc(args.doc, read_rows(args.results), args.results,
              "python benchmarks/imagesegments_table.py")
    print(f"wrote {args.doc} ({platform.python_version()}, {os.cpu_count()} cores)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
