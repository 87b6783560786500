"""What periodic checkpointing costs: seconds per round of a long-ish in-process run with
checkpoints off, at the default (``checkpoint-every-s = 30``) and after every round (the
upper bound: ``checkpoint-every = 1``), and the time of one checkpoint.

    python benchmarks/bench_checkpoint.py [--rounds-per-step 300] [--strategies ifca fedccfa]
                                          [--jsonl FILE]

Each strategy runs once first (warm-up: Numba's compilation, the data cache), then once per
setting, in this process, on the quick preset's scenario (10 clients, 6 steps). FedCCFA's
checkpoint also holds every client's personal state (``checkpoint-client-state``), pulled from
the clients when it is written.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from harness import load_average, machine, parser, write_rows

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = {   # name: run-config keys
    "off": {"checkpoint-every-s": 0.0},
    "default (every 30 s)": {},
    "every round": {"checkpoint-every": 1},
}


def main() -> None:
    import tomllib

    from fedcluster_app.engine import run_inprocess

    ap = parser(__doc__.splitlines()[0], jsonl="one setting of one strategy: seconds per round",
                strategies=["ifca", "fedccfa"])
    ap.add_argument("--rounds-per-step", type=int, default=300)
    args = ap.parse_args()
    base = {**tomllib.loads((ROOT / "presets" / "quick.toml").read_text()),
            "progress": False, "plot": False}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for strategy in args.strategies:
            run_inprocess({**base, "strategy": strategy, "num-steps": 1,
                           "out-dir": f"{tmp}/{strategy}-warm"})
            for name, keys in SETTINGS.items():
                load = load_average()
                t0 = time.perf_counter()
                summary = run_inprocess({**base, **keys, "strategy": strategy,
                                         "rounds-per-step": args.rounds_per_step,
                                         "out-dir": f"{tmp}/{strategy}-{len(rows)}"})
                wall = time.perf_counter() - t0
                rows.append({"strategy": strategy, "setting": name, "rounds": summary["rounds"],
                             "wall_s": round(wall, 2),
                             "s_per_round": round(wall / summary["rounds"], 5),
                             "checkpoint_bytes": (Path(summary["out_dir"]) /
                                                  "checkpoint.npz").stat().st_size,
                             "mean_accuracy": summary["mean_accuracy"], **machine(load)})
                print(json.dumps(rows[-1]))
    for strategy in args.strategies:
        got = {r["setting"]: r for r in rows if r["strategy"] == strategy}
        off, each = got["off"], got["every round"]
        per = (each["wall_s"] - off["wall_s"]) / each["rounds"] * 1e3
        print(f"{strategy}: s/round off {off['s_per_round']:.4f}, default "
              f"{got['default (every 30 s)']['s_per_round']:.4f}, every round "
              f"{each['s_per_round']:.4f}; one checkpoint ~{per:.1f} ms "
              f"({each['checkpoint_bytes'] / 1e3:.0f} kB); same accuracy: "
              f"{len({r['mean_accuracy'] for r in got.values()}) == 1}")
    write_rows(args.jsonl, rows)


if __name__ == "__main__":
    main()
