"""The GPU check, in one short run: every family's strategies with ``device = "cuda"`` against
the same runs on the CPU, batched training of 100 to 10,000 clients on the GPU against the
machine's CPUs and against one client at a time, and Ray's fractional GPUs.

    python benchmarks/bench_gpu.py [--device cuda] [--quick] [--budget-s 330]
        [--sections env families scaling endtoend ray] [--jsonl FILE]

Sections (each in a child process with its share of the time budget; a section writes its
rows as it goes, so one that fails or runs out of time keeps what it measured):

* ``env``: the card, its driver and memory, torch and CUDA, the processor.
* ``families``: the golden runs (tests/golden/golden.py: every registered strategy on the
  tests' fast scenario, each family on its own paper's data) in-process, on the CPU and on
  the device at the same time (two processes), each family's paper runs first. Per run:
  status, accuracy per round, the final models' largest difference from the CPU run's, how
  many module calls inside the clients took inputs on the GPU and on the CPU, the NumPy-kernel
  jobs, peak GPU memory and what stayed allocated after the run; one CNN run twice on the
  device (run-to-run determinism).
* ``scaling``: one round of client training (``run_jobs_batched`` / ``run_jobs``: the code the
  engine calls) at 100, 1,000 and 10,000 clients with the built-in CNN (1x28x28) and a small
  ResNet (``gpu_models.py``, 3x32x32): 64 samples per client, 2 Adam steps of 32. Seconds per
  round, client-rounds per second, peak GPU memory; the same on the CPUs (all cores) and one
  client at a time on the GPU. Where a configuration would take too long, it runs on the first
  clients and the row says how many (``measured``) and projects the round linearly.
* ``endtoend``: FedAvg rounds through the in-process engine (server work and evaluation
  included) on a synthetic 28x28 image set with the CNN, 100 and 1,000 clients.
* ``ray``: ``fedcluster run --engine ray`` with the ``gpu`` federation profile (a quarter GPU
  per client) and with ``cpu``: wall time, seconds per round, and the processes that held GPU
  memory while it ran (``nvidia-smi``).

``--device cpu`` runs it all with the CPU in the GPU's place (the comparisons are then CPU
against CPU): the script's test runs it that way with ``--quick``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

from harness import add_row, load_average, load_module, machine, parser, write_rows

ROOT = Path(__file__).resolve().parent.parent

SECTIONS = ("env", "families", "scaling", "endtoend", "ray")
#: each section's share of the time budget (two Ray start-ups take a minute or more)
SHARES = {"env": 0.02, "families": 0.32, "scaling": 0.28, "endtoend": 0.1, "ray": 0.28}


# ------------------------------------------------------------------------------ helpers
def emit(path: str, row: dict) -> None:
    """Append one row to the section's file at once (a section cut short keeps its rows)."""
    add_row(path, row)


def read_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def quiet() -> None:
    import logging

    from flwr.common.logger import FLOWER_LOGGER

    FLOWER_LOGGER.setLevel(logging.ERROR)


def gpu_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else "none"


def peak_reset(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def peak_mib(device: str) -> float:
    import torch

    if not device.startswith("cuda"):
        return 0.0
    torch.cuda.synchronize()
    return round(torch.cuda.max_memory_allocated() / 2**20, 1)


def allocated_mib(device: str) -> float:
    import torch

    return round(torch.cuda.memory_allocated() / 2**20, 1) if device.startswith("cuda") else 0.0


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


# ------------------------------------------------------------------------------ env
def section_env(args, out: str) -> None:
    import platform

    import torch

    row = {"section": "env", "device": args.device, "torch": torch.__version__,
           "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
           "python": platform.python_version(), "gpu": gpu_name(args.device),
           "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
           "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32, **machine(load_average())}
    if args.device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(args.device))
        row.update(gpu_memory_mib=props.total_memory // 2**20, sms=props.multi_processor_count)
        smi = shutil.which("nvidia-smi")
        if smi:
            q = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total",
                                "--format=csv,noheader"], capture_output=True, text=True)
            row["nvidia_smi"] = q.stdout.strip()
    emit(out, row)


# ------------------------------------------------------------------------------ families
def family_runs(quick: bool) -> list[tuple[str, dict]]:
    """The golden runs, each family's paper runs first (one per family, then the rest), so a
    section cut short has covered every family."""
    golden = load_module("tests/golden/golden.py")

    paper = [(f"{family}/{s}", {**golden.QUIET, **cfg, "strategy": s})
             for family, (names, cfg) in golden.FAMILY_RUNS.items() for s in names]
    firsts = {name.split("/")[0]: (name, cfg) for name, cfg in reversed(paper)}
    order = list(firsts.values()) + [r for r in paper if r not in firsts.values()]
    if quick:
        return list(firsts.values())
    return order + [(f"fast/{s}", {**golden.FAST, "strategy": s}) for s in golden.strategies()]


class ClientWatch:
    """Counts, while clients handle messages in-process, the module calls whose inputs were
    on a GPU and on the CPU, and the jobs the NumPy MLP kernel trained."""

    def __init__(self) -> None:
        import torch

        from fedcluster_app import engine
        from fedcluster_app.core.client import batched

        self.counts = {"gpu": 0, "cpu": 0, "kernel_jobs": 0}
        self.inside = False
        real_many, real_kernel = engine.handle_many, batched.kernels.numpy_train_many

        def handle_many(pairs):
            self.inside = True
            try:
                return real_many(pairs)
            finally:
                self.inside = False

        def kernel(jobs, cfg):
            self.counts["kernel_jobs"] += len(jobs)
            return real_kernel(jobs, cfg)

        def hook(module, inputs):
            # the size probe of a stacked program runs on the CPU by design: no client's call
            if (self.inside and not batched.in_size_probe() and inputs
                    and isinstance(inputs[0], torch.Tensor)):
                self.counts["gpu" if inputs[0].is_cuda else "cpu"] += 1

        engine.handle_many = handle_many
        batched.kernels.numpy_train_many = kernel
        torch.nn.modules.module.register_module_forward_pre_hook(hook)

    def take(self) -> dict:
        counts, self.counts = self.counts, {"gpu": 0, "cpu": 0, "kernel_jobs": 0}
        return counts


def child_families(args, out: str) -> None:
    """One side of the families section: every run on ``args.on``."""
    import numpy as np

    from fedcluster_app.core.server.strategy import read_checkpoint
    from fedcluster_app.engine import run_inprocess

    quiet()
    watch = ClientWatch()
    deadline = time.monotonic() + args.budget_s
    runs = [(n, c) for n, c in family_runs(args.quick)
            if not args.runs or n.startswith(tuple(args.runs))]
    again = [(n, c) for n, c in runs if args.repeat_all or c.get("scenario") == "digits-ccfa"]
    if args.on == "cpu" and args.device != "cpu":
        again = []                       # run-to-run determinism is checked on the device
    for name, cfg in runs + [(n + "#again", c) for n, c in again[: None if args.repeat_all else 1]]:
        if time.monotonic() > deadline:
            emit(out, {"name": name, "on": args.on, "status": "skipped: out of time"})
            continue
        run_dir = Path(args.work) / args.on.replace(":", "") / name.replace("/", "__")
        peak_reset(args.on)
        before = allocated_mib(args.on)
        t0 = time.perf_counter()
        try:
            summary = run_inprocess({"protocol": "none", **cfg, "device": args.on,
                                     "out-dir": str(run_dir), "overwrite": True})
        except Exception as ex:  # noqa: BLE001 - the row says what broke
            emit(out, {"name": name, "on": args.on, "status": "error",
                       "error": f"{type(ex).__name__}: {ex}"[-600:], **watch.take()})
            continue
        wall = time.perf_counter() - t0
        rounds = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        models = read_checkpoint(run_dir)[1]
        np.savez(run_dir / "final_models.npz",
                 **{f"{mid}_{i}": a for mid, arrays in models.items() for i, a in enumerate(arrays)})
        emit(out, {"name": name, "on": args.on, "status": summary["status"],
                   "accuracy": [r.get("accuracy") for r in rounds],
                   "assignments": [r.get("assignments") for r in rounds],
                   "final_accuracy": summary.get("final_accuracy"), "wall_s": round(wall, 3),
                   "round_s": statistics.median(r["round_time_s"] for r in rounds),
                   "peak_mib": peak_mib(args.on),
                   "left_mib": round(allocated_mib(args.on) - before, 1),
                   "run_dir": str(run_dir), **watch.take()})


def section_families(args, out: str) -> None:
    work = Path(args.work) / "families"
    sides = {}
    procs = []
    for on in dict.fromkeys(["cpu", args.device]):
        sides[on] = work / f"{on.replace(':', '')}.jsonl"
        procs.append(subprocess.Popen(
            [sys.executable, __file__, "--child", "families", "--on", on, "--device", args.device,
             "--budget-s", str(args.budget_s * 0.9), "--work", str(work), "--jsonl", str(sides[on]),
             *child_flags(args)], env=child_env()))
    for proc in procs:
        try:
            proc.wait(timeout=args.budget_s)
        except subprocess.TimeoutExpired:
            proc.kill()
    cpu = {r["name"]: r for r in read_rows(sides["cpu"])}
    dev = {r["name"]: r for r in read_rows(sides[args.device])}
    for name, d in dev.items():   # a repeat is compared with the device's first run
        base = name.split("#")[0]
        c = dev.get(base, {}) if name != base else cpu.get(name, {})
        emit(out, {"section": "families", **compare_runs(name, c, d)})


def compare_runs(name: str, c: dict, d: dict) -> dict:
    """One run on the device against the same run on the CPU."""
    import numpy as np

    row = {"name": name, "status": d.get("status"), "status_cpu": c.get("status"),
           "wall_s": d.get("wall_s"), "wall_s_cpu": c.get("wall_s"),
           "round_s": d.get("round_s"), "round_s_cpu": c.get("round_s"),
           "forwards_gpu": d.get("gpu"), "forwards_cpu": d.get("cpu"),
           "kernel_jobs": d.get("kernel_jobs"), "peak_mib": d.get("peak_mib"),
           "left_mib": d.get("left_mib"), "error": d.get("error")}
    if d.get("status") not in ("completed", "degraded") or c.get("status") != d.get("status"):
        return {**row, "verdict": "differs" if c.get("status") else "no cpu run"}
    acc_c = [a for a in c["accuracy"] if a is not None]
    acc_d = [a for a in d["accuracy"] if a is not None]
    gap = max((abs(a - b) for a, b in zip(acc_c, acc_d)), default=0.0) \
        if len(acc_c) == len(acc_d) else float("inf")
    same = sum(a == b for a, b in zip(c["assignments"], d["assignments"]))
    wc = np.load(Path(c["run_dir"]) / "final_models.npz")
    wd = np.load(Path(d["run_dir"]) / "final_models.npz")
    wgap = (max((float(np.abs(wc[k] - wd[k]).max()) for k in wc.files), default=0.0)
            if sorted(wc.files) == sorted(wd.files) else None)
    verdict = ("equal" if gap == 0 and wgap == 0 else
               "close" if gap <= 0.01 and same == len(c["assignments"]) else "differs")
    if name.endswith("#again"):   # the same run twice on the device
        verdict = "repeat equal" if gap == 0 and wgap == 0 else "repeat differs"
    return {**row, "accuracy_gap": round(gap, 6), "same_assignments": f"{same}/{len(c['assignments'])}",
            "weights_gap": wgap, "final_accuracy": d.get("final_accuracy"),
            "final_accuracy_cpu": c.get("final_accuracy"), "verdict": verdict}


# ------------------------------------------------------------------------------ scaling
SAMPLES, STEPS, BATCH = 64, 2, 32


def scaling_models() -> dict:
    from fedcluster_app.core.models import ModelSpec

    return {"cnn": ModelSpec("cnn", (1, 28, 28), 10),
            "resnet": ModelSpec("gpu_models:resnet_gn", (3, 32, 32), 10)}


def make_jobs(spec, n: int, device: str, seed: int = 0) -> list:
    """n clients' jobs: each its own data (drawn from 100 distinct client sets, reused) and
    its own minibatches; every client starts from the same model, as in FedAvg's round."""
    import numpy as np

    from fedcluster_app.core.client.batched import FitJob
    from fedcluster_app.core.config import TrainConfig
    from fedcluster_app.core.models import initial_weights

    cfg = TrainConfig(optimizer="adam", lr=0.01, local_steps=STEPS, batch_size=BATCH)
    weights = initial_weights(spec, seed)
    rng = np.random.default_rng(seed)
    sets = [(rng.normal(size=(SAMPLES, *spec.input_shape)).astype(np.float32),
             rng.integers(0, spec.num_classes, SAMPLES)) for _ in range(min(n, 100))]
    jobs = []
    for k in range(n):
        x, y = sets[k % len(sets)]
        batches = [rng.choice(SAMPLES, BATCH, replace=False) for _ in range(STEPS)]
        jobs.append(FitJob(spec, weights, x, y, batches, cfg, device=device))
    return jobs


def child_scaling(args, out: str) -> None:
    import torch

    from fedcluster_app.core.client.batched import run_jobs, run_jobs_batched
    from fedcluster_app.core.models import prepare_device

    torch.set_num_threads(os.cpu_count() or 1)     # the machine's CPUs, all of them
    prepare_device(args.device)                    # as the clients have it
    deadline = time.monotonic() + args.budget_s
    sizes = [4, 8] if args.quick else [100, 1000, 10000]
    dev = args.device
    # (model, mode, where, sizes, most clients measured): the GPU batched at every size, the
    # rest where the budget allows (one by one costs the same per client at any size)
    plan = []
    for model in ("cnn", "resnet"):
        plan += [(model, "batched", dev, sizes, None),
                 (model, "one-by-one", dev, sizes, sizes[0] if args.quick else 300)]
        if dev != "cpu":
            plan += [(model, "batched", "cpu", sizes[:2] if model == "cnn" else sizes[:1],
                      None if model == "cnn" else sizes[0]),
                     (model, "one-by-one", "cpu", sizes[:1], None)]
    if dev.startswith("cuda") and not args.quick:
        plan += [(m, "batched, any cuDNN", dev, [1000], None) for m in ("cnn", "resnet")]
        plan += [(m, "one-by-one, any cuDNN", dev, [100], None) for m in ("cnn", "resnet")]
        plan.append(("resnet", "batched, no TF32", dev, [1000], None))
    if args.modes:       # only these configurations (a second try of a few)
        plan = [(m, mode, where, [n for n in ns if not args.sizes or n in args.sizes], cap)
                for m, mode, where, ns, cap in plan
                if f"{m} {mode} {where}" in args.modes]
    specs = scaling_models()
    for model, mode, where, ns, cap in plan:
        run = run_jobs if mode.startswith("one-by-one") else run_jobs_batched
        warm = make_jobs(specs[model], 8, where, seed=1)   # cuDNN's and vmap's first calls
        run(warm)
        for n in ns:
            if time.monotonic() > deadline:
                emit(out, {"section": "scaling", "model": model, "mode": mode, "on": where,
                           "clients": n, "status": "skipped: out of time"})
                continue
            measured = min(n, cap) if cap else n
            jobs = make_jobs(specs[model], measured, where)
            # the clients' settings (prepare_device: deterministic cuDNN), unless the mode
            # measures what they cost
            torch.backends.cudnn.allow_tf32 = "no TF32" not in mode
            torch.backends.cudnn.deterministic = "any cuDNN" not in mode
            load = load_average()
            peak_reset(where)
            sync(where)
            t0 = time.perf_counter()
            try:
                run(jobs)
                sync(where)
            except Exception as ex:  # noqa: BLE001 - the row says what broke
                emit(out, {"section": "scaling", "model": model, "mode": mode, "on": where,
                           "clients": n, "status": "error", "error": f"{type(ex).__name__}: {ex}"[-400:]})
                continue
            finally:
                torch.backends.cudnn.allow_tf32 = True
                torch.backends.cudnn.deterministic = True
            took = time.perf_counter() - t0
            round_s = took * n / measured
            emit(out, {"section": "scaling", "model": model, "mode": mode, "on": where,
                       "gpu": gpu_name(where), "clients": n, "measured": measured,
                       "round_s": round(round_s, 4), "client_rounds_per_s": round(n / round_s, 1),
                       "peak_mib": peak_mib(where), "samples": SAMPLES, "steps": STEPS,
                       "batch": BATCH, "threads": torch.get_num_threads(), "status": "ok",
                       **machine(load)})
            del jobs


# ------------------------------------------------------------------------------ end to end
def child_endtoend(args, out: str) -> None:
    import numpy as np

    from fedcluster_app.engine import run_inprocess

    quiet()
    deadline = time.monotonic() + args.budget_s
    data = Path(args.work) / "images28.npz"
    rng = np.random.default_rng(0)
    n_rows = 2000 if args.quick else 60000
    np.savez(data, x=rng.integers(0, 256, (n_rows, 28, 28), dtype=np.uint8),
             y=rng.integers(0, 10, n_rows))
    sizes = [4] if args.quick else [100, 1000]
    for where in dict.fromkeys([args.device, "cpu"]):
        for n in sizes if where == args.device else sizes[:1]:
            if time.monotonic() > deadline:
                emit(out, {"section": "endtoend", "on": where, "clients": n,
                           "status": "skipped: out of time"})
                continue
            run_dir = Path(args.work) / f"e2e-{where.replace(':', '')}-{n}"
            load = load_average()
            peak_reset(where)
            t0 = time.perf_counter()
            summary = run_inprocess({
                "strategy": "fedavg", "scenario": "dataset-static", "dataset": f"npz:{data}",
                "num-clients": n, "num-steps": 1, "rounds-per-step": 3, "local-steps": STEPS,
                "batch-size": BATCH, "samples-per-step": SAMPLES, "test-samples": 32,
                "protocol": "none", "device": where, "plot": False, "progress": False,
                "checkpoint-client-state": False, "out-dir": str(run_dir), "overwrite": True})
            wall = time.perf_counter() - t0
            rounds = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
            emit(out, {"section": "endtoend", "on": where, "gpu": gpu_name(where), "clients": n,
                       "status": summary["status"], "run_s": round(wall, 2),
                       "round_s": [r["round_time_s"] for r in rounds],
                       "peak_mib": peak_mib(where), **machine(load)})


# ------------------------------------------------------------------------------ ray
class GpuProcesses:
    """Samples ``nvidia-smi``'s compute processes while a run goes on: which PIDs held GPU
    memory, and the most each held."""

    def __init__(self) -> None:
        self.smi = shutil.which("nvidia-smi")
        self.seen: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self):
        if self.smi:
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self.smi:
            self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            q = subprocess.run([self.smi, "--query-compute-apps=pid,used_memory",
                                "--format=csv,noheader,nounits"], capture_output=True, text=True)
            for line in q.stdout.splitlines():
                pid, _, mem = line.partition(",")
                if mem.strip().isdigit():
                    self.seen[pid.strip()] = max(self.seen.get(pid.strip(), 0.0), float(mem))


def child_ray(args, out: str) -> None:
    profiles = ["cpu"] if args.device == "cpu" else ["gpu", "cpu"]
    deadline = time.monotonic() + args.budget_s
    for profile in profiles:
        if time.monotonic() > deadline:
            emit(out, {"section": "ray", "profile": profile, "status": "skipped: out of time"})
            continue
        run_dir = Path(args.work) / f"ray-{profile}"
        cmd = [sys.executable, "-m", "fedcluster_app.cli", "run", "--engine", "ray",
               "--federation", profile, "--strategy", "fedavg", "--scenario", "digits-swap",
               "--set", "rounds-per-step=2", "--set", f"num-steps={2 if args.quick else 3}",
               "--set", "progress=false", "--out", str(run_dir), "--overwrite"]
        load = load_average()
        t0 = time.perf_counter()
        with GpuProcesses() as gpu:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, cwd=args.work, env=child_env())
            try:
                log, _ = proc.communicate(timeout=max(deadline - time.monotonic(), 60))
                rc = proc.returncode
            except subprocess.TimeoutExpired:   # Ctrl-C: fedcluster stops what it started
                proc.send_signal(signal.SIGINT)
                log, _ = proc.communicate()
                rc = "timeout"
            tail = log[-1500:]
        wall = time.perf_counter() - t0
        rounds = ([json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
                  if (run_dir / "metrics.jsonl").exists() else [])
        emit(out, {"section": "ray", "profile": profile, "rc": rc, "wall_s": round(wall, 1),
                   "round_s": [r["round_time_s"] for r in rounds],
                   "accuracy": [r.get("accuracy") for r in rounds],
                   "gpu_pids": len(gpu.seen), "gpu_mib_per_pid": sorted(gpu.seen.values()),
                   "status": "ok" if rc == 0 else "failed",
                   **({} if rc == 0 else {"log_tail": tail}), **machine(load)})


# ------------------------------------------------------------------------------ driver
CHILDREN = {"families": child_families, "scaling": child_scaling, "endtoend": child_endtoend,
            "ray": child_ray}


def child_env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH", "")]),
        "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1",
        "FEDCLUSTER_TORCH_THREADS": "1"}


def child_flags(args) -> list[str]:
    return ([*(["--quick"] if args.quick else []), *(["--repeat-all"] if args.repeat_all else []),
             *(["--runs", *args.runs] if args.runs else []),
             *(["--modes", *args.modes] if args.modes else []),
             *(["--sizes", *map(str, args.sizes)] if args.sizes else [])])


def run_section(name: str, args, work: Path) -> list[dict]:
    rows = work / f"{name}.jsonl"
    budget = args.budget_s * SHARES[name] / sum(SHARES[s] for s in args.sections)
    t0 = time.perf_counter()
    print(f"== {name} (budget {budget:.0f} s)", flush=True)
    if name == "env":
        section_env(args, str(rows))
    elif name == "families":
        section_families(argparse.Namespace(**{**vars(args), "budget_s": budget,
                                               "work": str(work)}), str(rows))
    else:
        cmd = [sys.executable, __file__, "--child", name, "--device", args.device,
               "--budget-s", str(budget * 0.9), "--work", str(work), "--jsonl", str(rows),
               *child_flags(args)]
        try:
            res = subprocess.run(cmd, env=child_env(), timeout=budget * 1.5 + 30,
                                 capture_output=True, text=True)
            if res.returncode:
                emit(str(rows), {"section": name, "status": f"child exited {res.returncode}",
                                 "error": res.stderr[-1500:]})
        except subprocess.TimeoutExpired:
            emit(str(rows), {"section": name, "status": "child killed: out of time"})
    print(f"   {time.perf_counter() - t0:.1f} s", flush=True)
    return read_rows(rows)


def report(rows: list[dict]) -> None:
    for r in rows:
        if r.get("section") == "env":
            print(f"\n{r.get('gpu')} ({r.get('nvidia_smi', 'no nvidia-smi')}); torch {r['torch']}, "
                  f"CUDA {r['cuda']}, cuDNN {r['cudnn']}; {r['cpu']}, {r['cores']} cores")
    fam = [r for r in rows if r.get("section") == "families" and "name" in r]
    if fam:
        print(f"\nfamilies ({len(fam)} runs): device vs CPU")
        print(f"{'run':<34} {'verdict':<14} {'acc gap':>8} {'w gap':>9} {'assign':>7} "
              f"{'fwd gpu/cpu':>12} {'kernel':>6} {'peak MiB':>8} {'s dev/cpu':>12}")
        for r in fam:
            wg = r.get("weights_gap")
            print(f"{r['name']:<34} {r.get('verdict', ''):<14} {r.get('accuracy_gap', '')!s:>8} "
                  f"{'' if wg is None else f'{wg:.1e}':>9} {r.get('same_assignments', '')!s:>7} "
                  f"{r.get('forwards_gpu')!s:>5}/{r.get('forwards_cpu')!s:<6} "
                  f"{r.get('kernel_jobs')!s:>6} {r.get('peak_mib')!s:>8} "
                  f"{r.get('wall_s')!s:>5}/{r.get('wall_s_cpu')!s:<6}"
                  + (f"  {r['error'][:120]}" if r.get("error") else ""))
        verdicts = [r.get("verdict") for r in fam]
        print("verdicts: " + ", ".join(f"{v} {verdicts.count(v)}" for v in dict.fromkeys(verdicts)))
    sc = [r for r in rows if r.get("section") == "scaling" and r.get("status") == "ok"]
    if sc:
        print(f"\nscaling: one round of {STEPS} Adam steps of {BATCH} per client")
        print(f"{'model':<7} {'mode':<18} {'on':<7} {'clients':>8} {'measured':>8} {'s/round':>9} "
              f"{'client-rounds/s':>15} {'peak MiB':>9}")
        for r in sc:
            print(f"{r['model']:<7} {r['mode']:<18} {r['on']:<7} {r['clients']:>8} {r['measured']:>8} "
                  f"{r['round_s']:>9.3f} {r['client_rounds_per_s']:>15.1f} {r['peak_mib']:>9.0f}")
    for r in rows:
        if r.get("section") == "endtoend" and "run_s" in r:
            print(f"end to end: {r['on']} {r['clients']} clients: {r['status']}, rounds "
                  f"{r['round_s']} s, peak {r['peak_mib']} MiB")
        if r.get("section") == "ray" and "wall_s" in r:
            print(f"ray {r['profile']}: {r['status']}, {r['wall_s']} s, rounds {r['round_s']} s, "
                  f"{r['gpu_pids']} GPU processes {r['gpu_mib_per_pid']} MiB")
    for r in rows:
        if str(r.get("status", "")).startswith(("child", "skipped", "error")):
            print(f"{r.get('section')}: {r.get('status')} {r.get('error', '')[:300]}")


def main() -> None:
    ap = parser(__doc__, jsonl="every section's rows (a child: its section's)")
    ap.add_argument("--device", default="cuda", help="cuda | cuda:N | cpu (the CPU in its place)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (the script's test)")
    ap.add_argument("--budget-s", type=float, default=330.0, help="time for all sections")
    ap.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=SECTIONS)
    ap.add_argument("--runs", nargs="+", default=[],
                    help="families: only the runs whose names start so (e.g. fedccfa/ fast/ifca)")
    ap.add_argument("--modes", nargs="+", default=[],
                    help='scaling: only these, as "MODEL MODE ON" (e.g. "cnn batched cuda")')
    ap.add_argument("--sizes", nargs="+", type=int, default=[],
                    help="scaling: only these numbers of clients")
    ap.add_argument("--repeat-all", action="store_true",
                    help="families: every run twice on the device (run-to-run determinism)")
    ap.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    ap.add_argument("--on", default="", help=argparse.SUPPRESS)
    ap.add_argument("--work", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        try:
            CHILDREN[args.child](args, args.jsonl)
        except Exception:  # noqa: BLE001 - the parent reports it
            emit(args.jsonl, {"section": args.child, "status": "error",
                             "error": traceback.format_exc()[-1500:]})
        return
    from fedcluster_app.core.models import resolve_device

    resolve_device(args.device)       # a GPU that is not there fails here, by name
    load_start = load_average()
    work = Path(tempfile.mkdtemp(prefix="bench_gpu_"))
    rows: list[dict] = []
    try:
        for name in args.sections:
            rows += run_section(name, args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(rows)
    write_rows(args.jsonl, rows, load_start=load_start)   # the families' runs are timed too


if __name__ == "__main__":
    main()
