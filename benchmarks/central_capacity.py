"""How fast can an MLP learn a scenario's concept when trained centrally?

Pools the training data of every client at one step (all on one concept), trains an MLP with
Adam (lr 0.01, weight decay 1e-3, batch 50) for a number of steps, and prints test accuracy on
the next step's data, per hidden width and seed. Shows why FedDrift's 2-4-2 MLP needs a long
training budget on CIRCLE-2.

    python benchmarks/central_capacity.py --scenario circle2 --hidden 4 16 --steps 1000 8000 \
        [--jsonl FILE]   # one JSON line per (hidden, steps, seed): the raw rows
"""

from __future__ import annotations


import numpy as np
from harness import parser, write_rows

from fedcluster_app.api import build_scenario
from fedcluster_app.core.config import TrainConfig
from fedcluster_app.core.models import ModelSpec, build_model
from fedcluster_app.core.training import evaluate, limit_threads, local_train


def main() -> None:
    ap = parser(__doc__, jsonl="one per trained model", seeds=[0, 1, 2])
    ap.add_argument("--scenario", default="circle2")
    ap.add_argument("--hidden", nargs="+", type=int, default=[4, 16])
    ap.add_argument("--steps", nargs="+", type=int, default=[1000, 8000])
    args = ap.parse_args()
    rows = []
    limit_threads()
    sc = build_scenario(args.scenario, seed=0)
    pool = lambda t: [sc.step_data(c, t) for c in range(sc.num_clients)]  # noqa: E731
    x = np.concatenate([d.x_train for d in pool(1)])
    y = np.concatenate([d.y_train for d in pool(1)])
    xt = np.concatenate([d.x_train for d in pool(2)])
    yt = np.concatenate([d.y_train for d in pool(2)])
    print(f"{args.scenario}, step 1 -> step 2, majority class rate {max(yt.mean(), 1 - yt.mean()):.3f}")
    for hidden in args.hidden:
        for steps in args.steps:
            accs = []
            for seed in args.seeds:
                model = build_model(ModelSpec("mlp", tuple(sc.input_shape), sc.num_classes, hidden), seed)
                cfg = TrainConfig(optimizer="adam", lr=0.01, weight_decay=0.001, local_steps=steps,
                                  batch_size=50)
                local_train(model, x, y, cfg, np.random.default_rng(seed))
                accs.append(evaluate(model, xt, yt)[1])
                rows.append({"scenario": args.scenario, "hidden": hidden, "adam_steps": steps,
                             "seed": seed, "accuracy_next_step": accs[-1],
                             "majority_class_rate": float(max(yt.mean(), 1 - yt.mean()))})
            print(f"hidden {hidden:3d}, {steps:5d} Adam steps: accuracy "
                  f"{np.mean(accs):.3f} (seeds: {', '.join(f'{a:.3f}' for a in accs)})")
    write_rows(args.jsonl, rows)


if __name__ == "__main__":
    main()
