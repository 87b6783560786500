"""Raw rows of the benchmark scripts: one JSON line per measurement, with the machine's load.

Every table in docs/ has its raw rows committed beside it (``--jsonl FILE`` of the script that
made it). The timing scripts stamp each row with ``machine()``: the load average at the start
and the end of the measurement and the number of cores, since the machines are shared and a
wall time means little without them.
"""

from __future__ import annotations

import json
import os
import platform


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages, rounded to 2 digits."""
    return [round(x, 2) for x in os.getloadavg()]


def machine(load_start: list[float]) -> dict:
    """The fields every timing row carries: the load at its start (taken by the caller before
    measuring) and now, the cores and the processor (the project's machines change between
    sessions, and a timing compares only with timings of the same processor)."""
    return {"load_start": load_start, "load_end": load_average(), "cores": os.cpu_count(),
            **processor()}


def processor() -> dict:
    """The processor's model name and whether it has AVX-512 (NumPy then uses its own
    vectorised exp and log, which can differ from libm's in the last bit), from Linux's
    /proc/cpuinfo; else the architecture Python reports."""
    try:
        with open("/proc/cpuinfo") as fh:
            info = dict(line.split(":", 1) for line in fh.read().split("\n\n")[0].splitlines()
                        if ":" in line)
    except OSError:
        return {"cpu": platform.machine()}
    info = {k.strip(): v.strip() for k, v in info.items()}
    return {"cpu": info.get("model name", platform.machine()),
            "avx512": "avx512f" in info.get("flags", "").split()}


def write_rows(path: str, rows: list[dict], sort_keys: bool = False, append: bool = False) -> None:
    """Write ``rows`` to ``path``, one JSON line each, and say so (nothing when ``path`` is
    empty); ``append`` adds them after the rows already there (several commands, one file)."""
    if not path:
        return
    with open(path, "a" if append else "w") as fh:
        fh.writelines(json.dumps(r, sort_keys=sort_keys) + "\n" for r in rows)
    print(f"wrote {path} ({len(rows)} rows)")
