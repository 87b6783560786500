"""Run a bench matrix: each cell once, finished runs skipped, several at a time in a process pool.

Every cell has its own run directory
``<runs-dir>/<data>/<shift>/<pattern>/<prior>/<strategy>/lr<rate>/seed<k>``.
A cell whose directory holds a finished run (status completed or degraded) is scored from it and
never run again; a failed run stays failed (its error is the table's reason) unless
``retry_failed``; a run stopped before its summary is run again from the start. A strategy that
refuses the scenario when it is built (its own configuration check) is listed as "cannot run"
with its message and never started.

Rows of an earlier bench (its ``runs.jsonl``) can stand for runs whose directories are gone
(``reuse``): a finished row counts for a cell without a finished run directory when its
scenario, strategy, learning rate, seed and protocol all match, so a committed benchmark grows
by its new cells only. A run directory, when there is one, always wins.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import multiprocessing
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedcluster_app.bench.matrix import (FINISHED, QUIET_RUN, Cell, bench_scenario, cannot_run,
                                         method, num_concepts)
from fedcluster_app.bench.scores import score_run


#: the status of a cell a ``--render-only`` page lists without running it
NOT_RUN = "not run yet"


class RunsDirMismatch(ValueError):
    """A runs directory holds a finished run of a cell with another run config."""


def _check_same_run(cell: Cell, config: dict, summary: dict, out: Path) -> None:
    """A finished run directory stands for its cell only when it ran the cell's run config:
    a runs directory of an earlier protocol is refused, never silently scored as this one's."""
    from fedcluster_app.core.results.files import to_json

    ran = summary.get("config") or {}
    config = to_json(config)    # as the summary holds it (a non-finite number is null there)
    differ = sorted(k for k, v in config.items() if k not in ("out-dir", "overwrite", *QUIET_RUN)
                    and (k not in ran or not _same_value(ran[k], v)))
    if differ:
        shown = ", ".join(f"{k} = {ran.get(k, '(unset)')!r} there, {config[k]!r} here"
                          for k in differ[:4])
        raise RunsDirMismatch(
            f"{out} holds a finished run of {cell.name} with another run config ({shown}"
            f"{', ...' if len(differ) > 4 else ''}): give this protocol a runs directory of "
            f"its own (--runs-dir), or move that one away")


def _same_value(a, b) -> bool:
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return a == b


def run_dir(runs_dir: Path, cell: Cell) -> Path:
    return Path(runs_dir) / cell.name


def _run_one(run_config: dict) -> tuple[str, str | None, float]:
    """In a worker: one run; (status, error, seconds). Never raises: a failed run is a row."""
    from fedcluster_app.engine import run_inprocess

    t0 = time.perf_counter()
    try:
        summary = run_inprocess(run_config)
        return str(summary.get("status")), summary.get("reason"), time.perf_counter() - t0
    except Exception as ex:  # noqa: BLE001 - a failed run is its cell's result; the matrix goes on
        last = traceback.format_exception_only(type(ex), ex)[-1].strip()
        return "failed", last, time.perf_counter() - t0


def _row(cell: Cell, status: str, reason: str | None = None, **scores: Any) -> dict[str, Any]:
    sc = cell.scenario
    return {"scenario": sc.key, "data": sc.data, "shift": sc.shift, "pattern": sc.pattern,
            "prior": sc.prior, "catalogue": sc.scenario, "strategy": cell.strategy,
            "lr": cell.config()["lr"], "seed": cell.seed,
            "protocol": dict(cell.protocol), **_settings(cell), "status": status,
            "reason": reason, **scores}


def _settings(cell: Cell) -> dict[str, Any]:
    """The method's own settings, in its row (only where it has some: rows of methods at
    their defaults keep the form they always had)."""
    settings = dict(method(cell.strategy).settings)
    return {"settings": settings} if settings else {}


def matching_rows(rows: list[dict[str, Any]], cells: list, row_key: Callable[[dict], tuple],
                  cell_key: Callable[[Any], tuple]) -> dict[Any, dict[str, Any]]:
    """The finished or failed rows among ``rows`` whose key (``row_key``) is a cell's
    (``cell_key``): what an earlier bench's rows say about these cells (a failed row, like a
    failed run directory, stands until ``--retry-failed``: :func:`_sort_out`). A row the key
    cannot be read from (an older row without its protocol, say) matches nothing: what it was
    run with is unknown."""
    by_key = {}
    for r in rows:
        if r.get("status") not in (*FINISHED, "failed") or not isinstance(r.get("seed"), int):
            continue
        try:
            by_key[row_key(r)] = r
        except (KeyError, TypeError):
            continue
    return {cell: by_key[key] for cell in cells if (key := cell_key(cell)) in by_key}


def canonical(config: Any) -> str:
    """One text per run config (or protocol, or method settings), as a row holds it: keys
    sorted, a non-finite number null. Two configs match when their texts are equal."""
    from fedcluster_app.core.results.files import to_json

    return json.dumps(to_json(config or {}), sort_keys=True)


def reusable_rows(rows: list[dict[str, Any]], cells: list[Cell]) -> dict[Cell, dict[str, Any]]:
    """The matrix's finished (or failed) rows among ``rows`` that match a cell: same scenario,
    strategy, learning rate, seed, protocol and method settings."""
    def row_key(r: dict) -> tuple:
        if not isinstance(r["protocol"], dict):
            raise TypeError("a row without its protocol")
        return (r.get("scenario"), r.get("strategy"), r.get("lr"), r["seed"],
                canonical(r["protocol"]), canonical(r.get("settings")))

    def cell_key(cell: Cell) -> tuple:
        return (cell.scenario.key, cell.strategy, cell.config()["lr"], cell.seed,
                canonical(dict(cell.protocol)), canonical(_settings(cell).get("settings")))

    return matching_rows(rows, cells, row_key, cell_key)


def _score(cell: Cell, out: Path) -> dict[str, Any]:
    from fedcluster_app.core.results import load_run

    summary, records = load_run(out)
    if summary.get("status") not in FINISHED:
        return _row(cell, "failed", summary.get("error") or summary.get("reason"))
    rounds_per_step = int(summary.get("config", {}).get("rounds-per-step")
                          or dict(cell.protocol)["rounds-per-step"])
    concepts = bench_scenario(cell).concept_matrix()
    try:
        scores = score_run(summary, records, concepts, rounds_per_step)
    except ValueError as ex:
        return _row(cell, "failed", f"cannot score: {ex}")
    return _row(cell, summary["status"], summary.get("reason"), concepts=concepts.tolist(),
                recipe=effective_recipe(summary, records), **scores)


#: the shared training settings a row states (the run's resolved values)
RECIPE_KEYS = ("optimizer", "lr", "momentum", "weight-decay", "local-steps", "local-epochs",
               "batch-size")


def effective_recipe(summary: dict[str, Any], records: list[dict[str, Any]]) -> dict[str, Any]:
    """How a run trained: its shared training settings as resolved, and the optimizer steps
    its clients actually took (``gradient_steps`` of metrics.jsonl: every exchange and phase,
    pre-training and a family's extra passes included), in all and per client and round."""
    config = summary.get("resolved_config") or summary.get("config") or {}
    steps = sum(int(r.get("gradient_steps") or 0) for r in records)
    clients = int(summary.get("num_clients") or 0)
    return {**{k: config.get(k) for k in RECIPE_KEYS}, "gradient_steps": steps,
            "steps_per_client_round": (round(steps / (clients * len(records)), 3)
                                       if clients and records else None)}


def _run_on_ray(todo: dict[Cell, dict], address: str,
                finished: Callable[[Cell, tuple], None]) -> None:
    """Every run as a one-CPU Ray task on the cluster at ``address``: the cluster's CPUs set how
    many run at once. Each task writes its run directory itself, so the runs directory must be
    on a file system every node of the cluster sees."""
    import ray

    ray.init(address=address, log_to_driver=False)
    try:
        task = ray.remote(num_cpus=1)(_run_one)
        pending = {task.remote(config): cell for cell, config in todo.items()}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                finished(pending.pop(ref), ray.get(ref))
    finally:
        ray.shutdown()


def process_pool(workers: int) -> cf.ProcessPoolExecutor:
    """A pool of ``workers`` spawned processes: the matrix's, and the benchmark scripts'."""
    ctx = multiprocessing.get_context("spawn")   # no forked torch/Ray state in the workers
    # no max_tasks_per_child: with it Python 3.11's pool hangs once the first workers retire
    return cf.ProcessPoolExecutor(workers, mp_context=ctx)


def stop_workers(pool: cf.ProcessPoolExecutor) -> None:
    """No run outlives the bench: the queued runs are cancelled and the running ones stopped
    (a SIGTERM to the bench alone would leave its workers running the queue's next runs,
    writing into the runs directory under a bench started again). A stopped run's directory
    has no finished summary: the next bench goes on from its last checkpoint (:func:`_start`)."""
    # the executor names no public way to its processes before Python 3.14's terminate_workers
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in processes:
        proc.terminate()
    for proc in processes:
        proc.join(timeout=10)


def run_matrix(cells: list[Cell], runs_dir: Path, workers: int = 1, retry_failed: bool = False,
               log: Callable[[str], None] = print,
               ray_address: str | None = None,
               reuse: list[dict[str, Any]] | None = None,
               score: Callable[[Cell, Path], dict[str, Any]] = _score,
               row: Callable[..., dict[str, Any]] = _row,
               match: Callable[[list[dict], list], dict] = reusable_rows,
               render_only: bool = False) -> tuple[list[dict[str, Any]], int]:
    """Run what is not finished, then score every cell: one row per cell, in ``cells``' order,
    and the number of runs this call made. Runs go to a process pool of ``workers`` on this
    machine, or with ``ray_address`` to the Ray cluster there. ``reuse``: rows of an earlier
    bench that stand for cells without a finished run directory (:func:`reusable_rows`).
    ``score`` (a cell and its run directory) and ``row`` (a cell, a status and a reason) make
    the rows, and ``match`` finds a cell's earlier row: the matrix's, or another tier's for its
    own cells (``papers.py``). ``render_only``: run nothing; a cell that would run gets a
    row of status :data:`NOT_RUN` (a long bench's page, shown while it goes on)."""
    rows, todo, earlier, _ = _sort_out(cells, runs_dir, retry_failed, reuse, row, match)
    skipped = len(cells) - len(todo) - len(rows)
    reused = sum(cell in earlier for cell in rows)
    refused = len(rows) - reused
    if render_only:
        rows.update({cell: row(cell, NOT_RUN, "the page was written with --render-only")
                     for cell in todo})
    where = f"on the Ray cluster at {ray_address}" if ray_address else f"with {workers} worker(s)"
    log(f"bench: {len(cells)} runs: {skipped} finished before, "
        + (f"{reused} from earlier rows, " if reuse is not None else "")
        + f"{refused} cannot run, "
        + (f"{len(todo)} {NOT_RUN} (--render-only)" if render_only
           else f"{len(todo)} to run {where}"))
    if render_only:
        todo = {}
    done = 0

    def finished(cell: Cell, result: tuple[str, str | None, float]) -> None:
        nonlocal done
        done += 1
        status, error, seconds = result
        note = f"{status}" + (f": {error}" if status == "failed" else "")
        log(f"[{done}/{len(todo)}] {cell.name} {note} ({seconds:.1f} s)")

    if ray_address and todo:
        _run_on_ray(todo, ray_address, finished)
    elif workers <= 1:
        for cell, config in todo.items():
            finished(cell, _run_one(config))
    else:
        with process_pool(workers) as pool:
            futures = {pool.submit(_run_one, config): cell for cell, config in todo.items()}
            try:
                for fut in cf.as_completed(futures):
                    finished(futures[fut], fut.result())
            except BaseException:   # Ctrl-C, SIGTERM (Interrupted), a failure of the pool
                stop_workers(pool)
                raise
    return [rows[cell] if cell in rows else _scored(cell, runs_dir, score, row)
            for cell in cells], len(todo)


def rows_without_running(cells: list[Cell], runs_dir: Path, retry_failed: bool = False,
                         reuse: list[dict[str, Any]] | None = None) -> dict[Cell, dict[str, Any]]:
    """The rows :func:`run_matrix` would give the cells it would not run (finished or failed
    run directories, earlier rows, cells that cannot run), running nothing: what a dry run
    knows, such as the tuning's scores before the scored runs' rates are chosen."""
    rows, todo, _, _ = _sort_out(cells, runs_dir, retry_failed, reuse, _row)
    return {cell: rows[cell] if cell in rows else _scored(cell, runs_dir, _score, _row)
            for cell in cells if cell not in todo}


def run_states(cells: list[Cell], runs_dir: Path, retry_failed: bool = False,
               reuse: list[dict[str, Any]] | None = None,
               match: Callable[[list[dict], list], dict] = reusable_rows) -> dict[Cell, str]:
    """What :func:`run_matrix` would do with each cell, in words, running nothing (the dry
    runs): "to run", "finished", "failed (kept: --retry-failed runs it again)", "from
    earlier rows" or "cannot run: <why>"."""
    bare = lambda cell, status, reason=None, **_: {"status": status, "reason": reason}
    rows, todo, earlier, kept_failed = _sort_out(cells, runs_dir, retry_failed, reuse, bare,
                                                 match)

    def state(cell: Cell) -> str:
        if cell in todo:
            return ("to run (goes on from its checkpoint)" if "resume-from" in todo[cell]
                    else "to run")
        if cell in rows:   # an earlier row comes before a refusal (_sort_out)
            if cell in earlier:
                return ("failed, from earlier rows (--retry-failed runs it again)"
                        if rows[cell].get("status") == "failed" else "from earlier rows")
            return f"cannot run: {rows[cell]['reason']}"
        return ("failed (kept: --retry-failed runs it again)" if cell in kept_failed
                else "finished")

    return {cell: state(cell) for cell in cells}


def _scored(cell: Cell, runs_dir: Path, score: Callable[[Cell, Path], dict[str, Any]],
            row: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    out = run_dir(runs_dir, cell)
    return (score(cell, out) if (out / "summary.json").is_file()
            else row(cell, "failed", "the run left no summary.json"))


def _start(out: Path, status: str | None) -> dict[str, Any]:
    """How an unfinished run starts: a stopped one (a bench stopped mid-run, its worker killed)
    goes on from its last checkpoint, so a long run loses at most ``checkpoint-every-s`` of its
    work; a failed one (with ``--retry-failed``), or one without a checkpoint, from round 1. A
    checkpoint of another run config is refused by the run, which then fails, never mixes."""
    from fedcluster_app.core.results.files import CHECKPOINT_FILE

    if status != "failed" and (out / CHECKPOINT_FILE).is_file():
        return {"resume-from": str(out.resolve())}
    return {"overwrite": True}


def _sort_out(cells: list[Cell], runs_dir: Path, retry_failed: bool,
              reuse: list[dict[str, Any]] | None, row: Callable[..., dict[str, Any]],
              match: Callable[[list[dict], list], dict] = reusable_rows
              ) -> tuple[dict[Cell, dict[str, Any]], dict[Cell, dict], dict[Cell, dict],
                         set[Cell]]:
    """(rows known without scoring a run directory: earlier rows and cells that cannot run;
    the run configs of the cells to run; the earlier rows that match a cell; the cells whose
    failed run directory is kept). A cell in neither of the first two has a finished (or
    failed, kept) run directory to score."""
    from fedcluster_app.core.results import read_summary

    rows: dict[Cell, dict[str, Any]] = {}
    todo: dict[Cell, dict] = {}
    kept_failed: set[Cell] = set()
    if reuse and retry_failed:   # a failed earlier row runs again, as a failed run directory
        reuse = [r for r in reuse if r.get("status") != "failed"]
    earlier = match(reuse, cells) if reuse else {}
    for cell in cells:
        out = run_dir(runs_dir, cell)
        summary = read_summary(out) or {}
        status = summary.get("status")
        if status in FINISHED:
            _check_same_run(cell, cell.run_config(num_concepts(cell)), summary, out)
            continue
        if status == "failed" and not retry_failed:
            kept_failed.add(cell)
            continue
        if cell in earlier:
            rows[cell] = earlier[cell]
            continue
        config = cell.run_config(num_concepts(cell))
        why = cannot_run(cell, config)
        if why:
            rows[cell] = row(cell, "cannot run", why)
            continue
        todo[cell] = {**config, "out-dir": str(out.resolve()), **_start(out, status)}
    return rows, todo, earlier, kept_failed
