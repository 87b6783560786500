"""Stacked convolutions on the CPU: which way of writing them could make stacking win.

The built-in CNN on 1x28x28 images (10 classes) is compute-bound on a CPU, and stacking its
clients (``batched._torch_stacked``: ``vmap`` over ``functional_call``) loses there, so
``batched.stacking_pays`` trains it one client at a time (``benchmarks/bench_batching.py``).
This script trains one round of the same jobs as that script (100 samples a client, 5 SGD
steps of 32, lr 0.05) at each client count, in one process, each of these ways:

* ``per-client``: one client after the other (``batched.run_jobs``): the reference, ratio 1;
* ``batched``: what the package's batched engine runs (``batched.run_jobs_batched``, by its
  rule: grouped convolutions in programs of ``grouped_cnn.PROGRAM_CLIENTS`` for this CNN);
* ``stacked vmap``: the package's stacked program, forced (``batched.stacking_forced``);
* ``stacked vmap, script's loop``: the same program written here (the control for the next);
* ``stacked vmap, channels-last``: that loop with the inputs and convolution weights in
  ``torch.channels_last`` memory format (each client's slice of a stacked tensor);
* ``grouped conv`` (and ``, channels-last``): the clients' inputs side by side on the channel
  axis, (batch, clients x channels, H, W), each convolution one ``F.conv2d(groups=clients)``
  of the clients' weights concatenated, each linear layer one batched matrix product; the
  script asserts that its weights after the round equal the per-client ones within 1e-5;
* ``compiled per-client`` and ``compiled stacked vmap``: one SGD step (forward, gradient,
  update) as a function of the parameters, compiled with ``torch.compile`` (Inductor, which
  needs a C++ compiler; a failure is recorded as the row's ``error``), per client and under
  ``vmap``. ``compile_s`` is the first round's time less a later round's (a cold compile, in
  an empty cache; the process's first one also loads the compiler), and ``payback_rounds``
  the rounds after which it has paid for itself against the per-client reference (none when
  it never does).
* ``grouped conv, channels-last, programs of N`` (``--program-clients N [N ...]``): the same
  grouped convolutions, the clients split into programs of at most N (in order, as the
  package splits a group), one after the other.

Each way is timed as the median of ``--repeats`` rounds after a warm-up round, the ways taking
turns round by round so that a change of the machine's load falls on all alike (``round_s``;
``first_round_s`` is the warm-up's); ``ratio`` is ``round_s`` / the per-client round's (below
1: the way wins); ``max_abs_diff`` is the largest difference of a weight after the round from
the per-client one. One torch thread, as the engine runs clients (``training.limit_threads``).

    python benchmarks/bench_conv_stacking.py [--model "cnn 1x28x28"] [--clients 10 50]
        [--repeats 3] [--ways WAY ...] [--program-clients N ...] [--jsonl FILE]
"""

from __future__ import annotations

import contextlib
import statistics
import time

import numpy as np

from bench_batching import MODELS, jobs_for
from harness import load_average, machine, parser, write_rows

#: the built-in CNN's inputs the script can stack (``bench_batching``'s names)
CNN_MODELS = [name for name in MODELS if name.startswith("cnn ")]
WAYS = ("per-client", "batched", "stacked vmap", "stacked vmap, script's loop",
        "stacked vmap, channels-last", "grouped conv", "grouped conv, channels-last",
        "compiled per-client", "compiled stacked vmap")
PROGRAMS_OF = "grouped conv, channels-last, programs of "
#: the largest difference from the per-client weights the grouped convolutions may make
GROUPED_TOLERANCE = 1e-5


# ------------------------------------------------------------------------------ the jobs
class Stacked:
    """The jobs' data and minibatches stacked over clients, for the script's own ways: every
    job must have the same number of steps of the same size (the benchmark's jobs do; the
    package pads and masks instead)."""

    def __init__(self, jobs) -> None:
        import torch

        from fedcluster_app.core.models import cached_model

        steps = {len(j.batches) for j in jobs}
        sizes = {len(b) for j in jobs for b in j.batches}
        if len(steps) != 1 or len(sizes) != 1:
            raise ValueError("the script's stacked ways need jobs of equal steps and batch sizes")
        cfg = jobs[0].cfg
        if cfg.optimizer != "sgd" or cfg.momentum or cfg.weight_decay or cfg.prox_mu:
            raise ValueError("the compiled steps are plain SGD: no momentum, weight decay or "
                             "proximal term")
        self.jobs, self.cfg, self.J = jobs, cfg, len(jobs)
        self.model = cached_model(jobs[0].spec, "cpu").train()
        self.names = [n for n, _ in self.model.named_parameters()]
        self.X = torch.from_numpy(np.concatenate([np.asarray(j.x, np.float32) for j in jobs]))
        self.Y = torch.from_numpy(np.concatenate([j.y for j in jobs]).astype(np.int64))
        offsets = np.cumsum([0] + [len(j.y) for j in jobs[:-1]])
        # step s's rows of X: (clients, batch)
        self.rows = [torch.from_numpy(np.stack([j.batches[s] for j in jobs]).astype(np.int64)
                                      + offsets[:, None]) for s in range(steps.pop())]

    def params(self, channels_last: bool = False) -> dict:
        """The jobs' starting weights, stacked: one leaf tensor (clients, ...) per parameter;
        ``channels_last``: each client's slice of a convolution weight in that format."""
        import torch

        out = {}
        for i, name in enumerate(self.names):
            p = torch.stack([torch.from_numpy(np.asarray(j.weights[i], np.float32))
                             for j in self.jobs])
            if channels_last and p.ndim == 5:      # (J, out, in, kh, kw), in innermost
                p = p.permute(0, 1, 3, 4, 2).contiguous().permute(0, 1, 4, 2, 3)
            out[name] = p.requires_grad_()
        return out

    def weights(self, params: dict) -> list[list[np.ndarray]]:
        return [[params[n][j].detach().contiguous().numpy().copy() for n in self.names]
                for j in range(self.J)]


def max_diff(a: list[list[np.ndarray]], b: list[list[np.ndarray]]) -> float:
    return max(float(np.max(np.abs(x - y))) for wa, wb in zip(a, b) for x, y in zip(wa, wb))


# ------------------------------------------------------------------------------ the ways
def vmap_round(st: Stacked, channels_last: bool) -> list[list[np.ndarray]]:
    """The package's stacked program, without its padding, masks and weights: vmap over
    ``functional_call``, the sum of the clients' losses, one SGD step for all."""
    import torch
    from torch.nn import functional as F

    from fedcluster_app.core.training import make_optimizer

    params = st.params(channels_last)
    opt = make_optimizer(list(params.values()), st.cfg)

    def job_loss(p, xb, yb):
        return F.cross_entropy(torch.func.functional_call(st.model, p, (xb,)), yb)

    losses = torch.vmap(job_loss)
    for rows in st.rows:
        xb = st.X[rows]                                        # (J, B, C, H, W)
        if channels_last:                                      # each client's slice
            xb = xb.permute(0, 1, 3, 4, 2).contiguous().permute(0, 1, 4, 2, 3)
        opt.zero_grad(set_to_none=True)
        losses(params, xb, st.Y[rows]).sum().backward()
        opt.step()
    return st.weights(params)


def grouped_round(st: Stacked, channels_last: bool) -> list[list[np.ndarray]]:
    import torch
    from torch.nn import functional as F

    from fedcluster_app.core.client.grouped_cnn import grouped_forward
    from fedcluster_app.core.training import make_optimizer

    params = st.params()
    opt = make_optimizer(list(params.values()), st.cfg)
    for rows in st.rows:
        xb = st.X[rows]                                        # (J, B, C, H, W)
        J, B = xb.shape[:2]
        xb = xb.transpose(0, 1).reshape(B, -1, *xb.shape[3:])  # (B, J x C, H, W)
        if channels_last:
            xb = xb.contiguous(memory_format=torch.channels_last)
        logits = grouped_forward(st.model, params, xb, J, channels_last)
        per_sample = F.cross_entropy(logits.flatten(0, 1), st.Y[rows].flatten(),
                                     reduction="none")
        opt.zero_grad(set_to_none=True)
        per_sample.view(J, B).mean(1).sum().backward()        # each client's mean, summed
        opt.step()
    return st.weights(params)


def grouped_programs_round(programs: list[Stacked]) -> list[list[np.ndarray]]:
    """Grouped convolutions in channels-last, one program after the other."""
    return [w for st in programs for w in grouped_round(st, channels_last=True)]


def compiled_step(model, lr: float, stacked: bool):
    """One SGD step as a function of the parameters (forward, gradient and update), per
    client or under vmap, compiled."""
    import torch
    from torch.nn import functional as F

    def loss(p, xb, yb):
        return F.cross_entropy(torch.func.functional_call(model, p, (xb,)), yb)

    grad = torch.func.grad_and_value(loss)
    if stacked:
        grad = torch.vmap(grad)

    def step(p, xb, yb):
        grads, _ = grad(p, xb, yb)
        return {n: p[n] - lr * grads[n] for n in p}

    return torch.compile(step, dynamic=False)


def compiled_per_client_round(st: Stacked, step) -> list[list[np.ndarray]]:
    import torch

    out = []
    for j, job in enumerate(st.jobs):
        p = {n: torch.from_numpy(np.asarray(w, np.float32)) for n, w in zip(st.names, job.weights)}
        for rows in st.rows:
            p = step(p, st.X[rows[j]], st.Y[rows[j]])
        out.append([p[n].numpy().copy() for n in st.names])
    return out


def compiled_stacked_round(st: Stacked, step) -> list[list[np.ndarray]]:
    p = {n: t.detach() for n, t in st.params().items()}
    for rows in st.rows:
        p = step(p, st.X[rows], st.Y[rows])
    return st.weights(p)


def round_fn(way: str, jobs, st: Stacked):
    """A function that trains one round of ``way`` and returns the weights after it."""
    from fedcluster_app.core.client import batched

    if way == "per-client":
        return lambda: [r.weights for r in batched.run_jobs(jobs)]
    if way == "batched":
        return lambda: [r.weights for r in batched.run_jobs_batched(jobs)]
    if way == "stacked vmap":
        def forced():
            with batched.stacking_forced():
                return [r.weights for r in batched.run_jobs_batched(jobs)]
        return forced
    if way.startswith("stacked vmap, "):
        return lambda: vmap_round(st, way.endswith("channels-last"))
    if way.startswith(PROGRAMS_OF):
        cap = int(way.removeprefix(PROGRAMS_OF))
        programs = [Stacked(jobs[i:i + cap]) for i in range(0, len(jobs), cap)]
        return lambda: grouped_programs_round(programs)
    if way.startswith("grouped conv"):
        return lambda: grouped_round(st, way.endswith("channels-last"))
    stacked = way == "compiled stacked vmap"
    step = compiled_step(st.model, st.cfg.lr, stacked)
    run = compiled_stacked_round if stacked else compiled_per_client_round
    return lambda: run(st, step)


@contextlib.contextmanager
def cold_compiles(compiling: bool):
    """Compiles that start from nothing: no compiled code of an earlier client count, an
    empty cache directory (kept until the rounds are done: the compiled code runs from it)."""
    if not compiling:
        yield
        return
    import torch
    from torch._inductor.utils import fresh_cache

    torch.compiler.reset()
    with fresh_cache():
        yield


def measure(model: str, jobs, st: Stacked, ways: list[str], repeats: int,
            load_start) -> list[dict]:
    """One row per way: a warm-up round each, then ``repeats`` rounds of every way in turn
    (so that a change of the machine's load falls on all ways alike), their median."""
    fns, first, weights, rows = {}, {}, {}, {}
    for way in ways:
        rows[way] = {"way": way, "model": model, "clients": st.J, "repeats": repeats}
        try:
            fns[way] = round_fn(way, jobs, st)
            t0 = time.perf_counter()
            weights[way] = fns[way]()              # a compiled way compiles here
            first[way] = time.perf_counter() - t0
        except Exception as ex:        # torch.compile without a working C++ compiler, ...
            if not way.startswith("compiled"):
                raise
            fns.pop(way, None)
            rows[way]["error"] = f"{type(ex).__name__}: {ex}"[:2000]
            print(f"{st.J:3d} clients, {way:30s} failed: {rows[way]['error'][:300]}", flush=True)
    times = {way: [] for way in fns}
    for _ in range(repeats):
        for way, fn in fns.items():
            t0 = time.perf_counter()
            weights[way] = fn()
            times[way].append(time.perf_counter() - t0)
    ref_s = statistics.median(times["per-client"])
    for way in fns:
        steady = statistics.median(times[way])
        diff = max_diff(weights[way], weights["per-client"])
        if way.startswith("grouped conv") or way == "batched":
            assert diff <= GROUPED_TOLERANCE, f"{way}: weights differ by {diff:.2e}"
        row = rows[way]
        row.update(round_s=round(steady, 4), first_round_s=round(first[way], 4),
                   ratio=round(steady / ref_s, 3), max_abs_diff=float(f"{diff:.3g}"))
        note = ""
        if way.startswith("compiled"):
            compile_s, gain = first[way] - steady, ref_s - steady
            row["compile_s"] = round(compile_s, 2)
            row["payback_rounds"] = None if gain <= 0 else int(np.ceil(compile_s / gain))
            note = f", compile {compile_s:.1f} s, " + (
                "never pays back" if gain <= 0
                else f"pays back after {row['payback_rounds']} rounds")
        print(f"{st.J:3d} clients, {way:30s} {steady:7.3f} s/round (x{steady / ref_s:.2f}"
              f" per-client; max weight diff {diff:.1e}{note})", flush=True)
    return [{**rows[way], **machine(load_start)} for way in ways]


def main() -> None:
    ap = parser(__doc__, jsonl="one per way and client count")
    ap.add_argument("--clients", type=int, nargs="+", default=[10, 50])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ways", nargs="+", default=list(WAYS), choices=WAYS,
                    help="the ways to time (per-client, the reference, is always timed)")
    ap.add_argument("--program-clients", type=int, nargs="+", default=[], metavar="N",
                    help="also time grouped convolutions in channels-last in programs of at "
                         "most N clients each")
    ap.add_argument("--model", default="cnn 1x28x28", choices=CNN_MODELS)
    args = ap.parse_args()
    if any(n < 1 for n in args.program_clients):
        ap.error("--program-clients: a program holds at least 1 client")
    from fedcluster_app.core.config import TrainConfig
    from fedcluster_app.core.models import ModelSpec
    from fedcluster_app.core.training import limit_threads

    limit_threads()
    load_start = load_average()
    spec = ModelSpec(**MODELS[args.model])
    cfg = TrainConfig(optimizer="sgd", lr=0.05, local_steps=5, batch_size=32)
    ways = (["per-client"] + [w for w in args.ways if w != "per-client"]
            + [f"{PROGRAMS_OF}{n}" for n in args.program_clients])
    rows = []
    for clients in args.clients:
        jobs = jobs_for(spec, cfg, clients)
        with cold_compiles(any(w.startswith("compiled") for w in ways)):
            rows += measure(args.model, jobs, Stacked(jobs), ways, args.repeats, load_start)
    write_rows(args.jsonl, rows)


if __name__ == "__main__":
    main()
