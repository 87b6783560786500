"""Poisoning: accuracy of one strategy per family with 10%, 20% and 30% attacking clients of each
kind, under three defence settings; writes docs/operations/reliability.md's poisoning table.

    python benchmarks/poisoning_table.py [--results docs/operations/reliability_poisoning.jsonl] \
        [--doc docs/operations/reliability.md] [--table-only]

Attacks (``fedcluster_app.faults.ATTACKS``): ``huge`` (every weight 1e30), ``scaled`` (update
x -1000), ``inflated`` (num-examples x 10^6), ``permuted`` (list metrics shuffled: losses,
histograms, representations). Attackers are clients 0..k-1 of 10; every reply they send is
attacked. Defences: ``off`` (update-norm-bound = 0, plain weighted mean), ``bound`` (the
defaults: update-norm-bound = 10, num-examples capped by what a client holds), ``median``
(bound plus robust-aggregation = "median"). Every run appends one JSON line to --results as it
ends; rows already there are skipped, so a re-run does only what is missing. The markdown table
between the POISONING markers of --doc is then rewritten from the JSON lines alone.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from harness import parser

ROOT = Path(__file__).resolve().parent.parent
STRATEGIES = ["fedavg", "ifca", "feddrift", "fielding", "flexcfl", "fedrc", "fedccfa"]
ATTACKS = ["huge", "scaled", "inflated", "permuted"]
FRACTIONS = [0.1, 0.2, 0.3]
DEFENCES = {
    "off": {"update-norm-bound": 0.0, "robust-aggregation": "none"},
    "bound": {"update-norm-bound": 10.0, "robust-aggregation": "none"},
    "median": {"update-norm-bound": 10.0, "robust-aggregation": "median"},
}
SEED = 0
#: one common small setting (the test suite's): 10 clients, 6 steps, half swap labels at step 3
COMMON = {
    "scenario": "mixture-swap", "rounds-per-step": 2, "local-steps": 5, "samples-per-step": 100,
    "test-samples": 50, "protocol": "none", "plot": False, "progress": False, "seed": SEED,
}
BEGIN, END = "<!-- POISONING:BEGIN -->", "<!-- POISONING:END -->"


def run_one(strategy: str, attack: str, fraction: float, defence: str) -> dict:
    from fedcluster_app.engine import run_inprocess
    from fedcluster_app.faults import faulty_app

    attackers = set(range(round(fraction * 10)))
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = {**COMMON, **DEFENCES[defence], "strategy": strategy, "out-dir": f"{tmp}/run"}
        try:
            summary = run_inprocess(cfg, client_app=faulty_app(attackers, attack or "huge"))
            error = None
        except Exception as ex:   # recorded, the grid goes on
            summary, error = {"status": "crashed"}, f"{type(ex).__name__}: {ex}"
    return {"strategy": strategy, "attack": attack or "none", "fraction": fraction,
            "defence": defence, "setting": COMMON, "status": summary.get("status"),
            "reason": summary.get("reason"), "error": error,
            "mean_accuracy": summary.get("mean_accuracy"),
            "final_accuracy": summary.get("final_accuracy"),
            "failures": summary.get("failures"), "elapsed_s": round(time.perf_counter() - t0, 2),
            "load_before": [round(x, 2) for x in load_before],
            "load_after": [round(x, 2) for x in os.getloadavg()]}


def read_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def key(row: dict) -> tuple:
    return row["strategy"], row["attack"], row["fraction"], row["defence"]


def grid() -> list[tuple]:
    out = []
    for strategy in STRATEGIES:
        for defence in DEFENCES:
            out.append((strategy, "none", 0.0, defence))
            out += [(strategy, a, f, defence) for a in ATTACKS for f in FRACTIONS]
    return out


def table(rows: list[dict]) -> str:
    by = {key(r): r for r in rows if r.get("setting") == COMMON}

    def cell(strategy, attack, fraction, defence):
        r = by.get((strategy, attack, fraction, defence))
        if r is None:
            return "not run"
        acc = r.get("mean_accuracy")
        text = "no score" if acc is None else f"{acc:.2f}"
        return text if r["status"] == "completed" else f"{text} ({r['status']})"

    head = ("| strategy | attack | " + " | ".join(f"{int(f * 100)}% {d}" for f in FRACTIONS
                                              for d in DEFENCES) + " |")
    lines = [head, "|" + "---|" * (2 + len(FRACTIONS) * len(DEFENCES))]
    for s in STRATEGIES:
        clean = " / ".join(cell(s, "none", 0.0, d) for d in DEFENCES)
        lines.append(f"| {s} | none: {clean} |" + " |" * (len(FRACTIONS) * len(DEFENCES) - 1))
        for a in ATTACKS:
            lines.append(f"| {s} | {a} | " + " | ".join(cell(s, a, f, d) for f in FRACTIONS
                                                      for d in DEFENCES) + " |")
    done = [r for r in rows if r.get("setting") == COMMON]
    total = sum(r["elapsed_s"] for r in done)
    loads = [r["load_before"][0] for r in done]
    lines.append("")
    lines.append(f"{len(done)} runs, {total / 60:.1f} min of wall time in all on a 2-core machine; "
                 f"1-minute load average before a run: {min(loads):.1f} to {max(loads):.1f} "
                 f"(other jobs were running)." if done else "no runs yet")
    return "\n".join(lines)


def write_doc(doc: Path, rows: list[dict]) -> None:
    text = doc.read_text() if doc.exists() else f"{BEGIN}\n{END}\n"
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    doc.write_text(text[:start] + "\n" + table(rows) + "\n" + text[end:])


def main(argv=None) -> int:
    ap = parser(__doc__)
    docs = ROOT / "docs" / "operations"
    ap.add_argument("--results", type=Path, default=docs / "reliability_poisoning.jsonl")
    ap.add_argument("--doc", type=Path, default=docs / "reliability.md")
    ap.add_argument("--table-only", action="store_true")
    args = ap.parse_args(argv)
    if not args.table_only:
        have = {key(r) for r in read_rows(args.results) if r.get("setting") == COMMON}
        todo = [g for g in grid() if g not in have]
        for i, (strategy, attack, fraction, defence) in enumerate(todo, 1):
            row = run_one(strategy, "" if attack == "none" else attack, fraction, defence)
            row["attack"] = attack
            with args.results.open("a") as fh:
                fh.write(json.dumps(row) + "\n")
            print(f"[{i}/{len(todo)}] {strategy} {attack} {fraction} {defence}: "
                  f"{row['status']} {row['mean_accuracy']}", file=sys.stderr, flush=True)
    write_doc(args.doc, read_rows(args.results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
