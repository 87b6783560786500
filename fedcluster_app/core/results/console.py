"""The one-line progress message of a round."""

from __future__ import annotations

import math
from typing import Any

from fedcluster_app.core.results.files import is_number

def _fmt_bytes(n: float) -> str:
    if n < 1000:
        return f"{int(n)} B"
    for unit in ("kB", "MB", "GB", "TB"):
        n /= 1000.0
        if n < 1000 or unit == "TB":
            return f"{n:.1f} {unit}"
    raise AssertionError("unreachable")


def _scalar(v: Any) -> Any:
    """numpy/torch scalar -> Python scalar; anything else unchanged."""
    if isinstance(v, (str, bool, int, float)) or v is None:
        return v
    item = getattr(v, "item", None)
    if callable(item):
        try:
            return item()
        except (ValueError, TypeError, RuntimeError):  # not a single-element array
            return v
    return v


def format_round_line(record: dict, total_rounds: int) -> str:
    """One-line progress message for a round, e.g.

    ``[round  12/55 | step  3] acc 0.912 | clusters 2 | ari 1.000 | up 12.3 kB down 24.6 kB | 0.21 s``

    Parts whose value is missing or null are left out; ``drift <n>`` and ``fail <n>`` appear
    only when positive; ``clusters`` counts the clusters in use, followed by ``(<n> models)``
    when the server holds another number of models; with ``score-next-step``, ``current``
    (where it is not ``acc``) and ``next``; ``train loss`` after them when the round's
    training replies reported one. ``total_rounds`` <= 0 or None leaves out the
    ``/total``.
    """
    record = {k: _scalar(v) for k, v in record.items()}
    rnd = record.get("round")
    head = "round"
    if rnd is not None:
        width = max(3, len(str(total_rounds))) if total_rounds else 0
        head += f" {rnd:>{width}}"
        if total_rounds:
            head += f"/{total_rounds}"
    step = record.get("time_step")
    if step is not None:
        head += f" | step {step:>2}"

    parts = []
    acc = record.get("accuracy")
    if is_number(acc) and math.isfinite(acc):
        parts.append(f"acc {acc:.3f}")
    current = record.get("accuracy_current")   # score-next-step: where it is not ``accuracy``
    if is_number(current) and math.isfinite(current) and current != acc:
        parts.append(f"current {current:.3f}")
    nxt = record.get("accuracy_next")
    if is_number(nxt) and math.isfinite(nxt):
        parts.append(f"next {nxt:.3f}")
    glob = record.get("global_accuracy")
    if is_number(glob) and math.isfinite(glob):
        parts.append(f"global {glob:.3f}")
    loss = record.get("train_loss")
    if is_number(loss) and math.isfinite(loss):
        parts.append(f"train loss {loss:.3f}")
    k, allocated = record.get("num_clusters"), record.get("models_allocated")
    if k is not None:
        parts.append(f"clusters {k}" + (f" ({allocated} models)"
                                        if allocated is not None and allocated != k else ""))
    ari = record.get("ari")
    if is_number(ari) and math.isfinite(ari):
        parts.append(f"ari {ari:.3f}")
    drifted = record.get("drifted_clients")
    if is_number(drifted) and drifted > 0:
        parts.append(f"drift {drifted}")
    failures = record.get("failures")
    if is_number(failures) and failures > 0:
        parts.append(f"fail {failures}")
    up, down = record.get("bytes_up"), record.get("bytes_down")
    traffic = []
    if is_number(up):
        traffic.append(f"up {_fmt_bytes(up)}")
    if is_number(down):
        traffic.append(f"down {_fmt_bytes(down)}")
    if traffic:
        parts.append(" ".join(traffic))
    t = record.get("round_time_s")
    if is_number(t):
        parts.append(f"{t:.2f} s")

    line = f"[{head}]"
    if parts:
        line += " " + " | ".join(parts)
    if total_rounds and total_rounds >= LONG_RUN_ROUNDS and is_number(rnd):
        line += " " + progress_bar(rnd, total_rounds)
    return line


LONG_RUN_ROUNDS = 50   # runs this long get a progress bar on their round lines


def progress_bar(done: int, total: int, width: int = 20) -> str:
    """``|#######-------------|  35%``: plain ASCII, so it survives any log viewer."""
    frac = min(max(done / total, 0.0), 1.0)
    filled = int(round(frac * width))
    return f"|{'#' * filled}{'-' * (width - filled)}| {frac * 100:3.0f}%"
