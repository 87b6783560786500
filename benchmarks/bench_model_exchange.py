"""What one trained model costs on its way back to the server, by how many arrays it is.

A training reply passes through the same steps for every model it carries: the client packs
it (``codec.reply_content``, under ``codec.by_reference`` as in the in-process engine), the
server checks it (``messages.validate_reply``: metrics, shapes, dtypes, finiteness), measures
its update (``strategy.SentModel.update_norm``) and averages it (``strategy.weighted_average``).
Most of those steps work array by array. This script times them for 10 clients returning one
2-4-2 MLP (the FedDrift family's model on CIRCLE-2) held as its four layer arrays, as it is
today, and as one flat array of the same 22 weights, beside a reply without a model. Prints
the CPU time per client's model, and their ratio, measured in one process, alternating.

    python benchmarks/bench_model_exchange.py [--repeats 30] [--jsonl FILE]
"""

from __future__ import annotations

import time

import numpy as np
from harness import load_average, machine, parser, write_rows

CLIENTS = 10
LAYERS = [(4, 2), (4,), (2, 4), (2,)]       # the 2-4-2 MLP: w1, b1, w2, b2
FLAT = [(sum(int(np.prod(s)) for s in LAYERS),)]


def exchange(shapes, sent, returned, instruction) -> None:
    """One exchange of one model with every client: pack each reply, check it, measure its
    update, average them."""
    from fedcluster_app.core import codec, flower_fast
    from fedcluster_app.core import wire as P
    from fedcluster_app.core.server.messages import Task, validate_reply
    from fedcluster_app.core.server.updates import SentModel, weighted_average

    task, dtypes = Task(models=[0] if sent else []), tuple(np.dtype(np.float32) for _ in shapes)
    with codec.by_reference():
        replies = [flower_fast.reply(codec.reply_content({P.CLIENT_ID: cid, P.NUM_EXAMPLES: 100},
                                                         {0: arrays} if sent else {},
                                                         {0: {P.NUM_EXAMPLES: 100}} if sent
                                                         else {}),
                                     instruction)
                   for cid, arrays in enumerate(returned)]
        checked = [validate_reply(msg, cid, task, tuple(shapes), dtypes, 1000)
                   for cid, msg in enumerate(replies)]
    if sent:
        model = SentModel(sent, tuple(shapes), dtypes)
        for reply in checked:
            model.update_norm(reply.models[0])
        weighted_average([(reply.models[0], 100.0) for reply in checked])


def main() -> None:
    ap = parser(__doc__, jsonl="one per case", repeats=30,
                repeats_help="alternations of the three cases")
    args = ap.parse_args()
    from flwr.supercore.task_identity import TaskIdentity

    from fedcluster_app.core import codec, flower_fast
    from fedcluster_app.core.client import compiled_mlp  # noqa: F401  (the update norm's compiled path)

    # Message() outside a Flower runtime needs these, as the in-process engine sets them
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    instruction = flower_fast.instruction(codec.build_content({}, {}), 1, "train", "1")
    rng = np.random.default_rng(0)

    def model(shapes):
        return [rng.normal(size=s).astype(np.float32) for s in shapes]

    cases = {"layer arrays": (LAYERS, model(LAYERS), [model(LAYERS) for _ in range(CLIENTS)]),
             "one flat array": (FLAT, model(FLAT), [model(FLAT) for _ in range(CLIENTS)]),
             "no model": ([], [], [[] for _ in range(CLIENTS)])}
    load = load_average()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for case in cases.values():
        exchange(case[0], case[1], case[2], instruction)        # first calls: not timed
    for _ in range(args.repeats):
        for name, (shapes, sent, returned) in cases.items():
            start = time.process_time()
            for _ in range(20):
                exchange(shapes, sent, returned, instruction)
            times[name].append((time.process_time() - start) / 20 / CLIENTS)
    rows = []
    for name, seconds in times.items():
        seconds.sort()
        best, median = seconds[0] * 1e6, seconds[len(seconds) // 2] * 1e6
        print(f"{name:15s} {best:6.1f} us per client's reply (median {median:6.1f} us)")
        rows.append({"case": name, "clients": CLIENTS, "repeats": args.repeats,
                     "us_per_reply_min": round(best, 1), "us_per_reply_median": round(median, 1),
                     **machine(load)})
    layers, flat = (min(times[name]) for name in ("layer arrays", "one flat array"))
    print(f"the model as layer arrays vs one flat array: {layers / flat:.2f}x; load average "
          f"{load[0]:.2f} at the start")
    write_rows(args.jsonl, rows)


if __name__ == "__main__":
    main()
