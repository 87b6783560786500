"""What several test modules share, in one place: the repository's root, the small run configs
they build on, the wall-clock fields a comparison of two runs leaves out, and the helpers that
start fedcluster and watch processes. A module keeps a config of its own only where it is its
own (a family's data, a smaller or slower run).

Standard library only: the fast checks of the repository (docs links, structure) import it
without paying for torch and Flower.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# A small drift scenario: 10 clients, 6 steps, half the clients get a label permutation at step 3.
# (tests/conftest.py's fast_config fixture gives it with an out-dir; tests/golden/golden.py keeps
# its own copy, the setting its recorded runs were made with.)
FAST = {
    "scenario": "mixture-swap",
    "rounds-per-step": 2,
    "local-steps": 5,
    "samples-per-step": 100,
    "test-samples": 50,
    "progress": False,
    "plot": False,
}

# The FedCCFA paper's setting, tiny: its digits with a label swap, 2 steps of 2 rounds, and its
# local SGD for one epoch (the family trains with the run's shared recipe). The FedCCFA family
# and Adaptive-FedAvg, which the paper compares with, are tested on it.
FEDCCFA_TINY = {
    "scenario": "digits-swap", "model": "mlp", "hidden": 16, "num-steps": 2,
    "rounds-per-step": 2, "drift-step": 2, "samples-per-step": 60, "test-samples": 30,
    "dirichlet-alpha": 1.0, "progress": False, "plot": False,
    "fedccfa.align-start": 1, "fedbabu.ft-epochs": 1,
    "optimizer": "sgd", "lr": 0.01, "momentum": 0.9, "weight-decay": 1e-5, "batch-size": 64,
    "local-steps": 0, "local-epochs": 1,
}


def fedccfa_tiny(tmp_path, **kw):
    """:data:`FEDCCFA_TINY` writing to ``tmp_path/run``, with ``kw`` (run-config keys) on top."""
    cfg = dict(FEDCCFA_TINY, **{"out-dir": str(tmp_path / "run")})
    cfg.update(kw)
    return cfg


#: a metrics.jsonl record's wall-clock readings: the only fields two runs that must agree (a
#: resumed run and the uninterrupted one, two runs of one setting) may log differently
WALL_CLOCK = frozenset({"round_time_s", "fielding_cluster_s", "fielding_handling_s"})


# ---------------------------------------------------------------------------- processes
def fedcluster(*args: str) -> subprocess.CompletedProcess:
    """``fedcluster ARGS`` in a process of its own, run from the repository's root."""
    return subprocess.run([sys.executable, "-m", "fedcluster_app.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, check=False)


def superlinks() -> set[str]:
    """The PIDs of the SuperLinks running on this machine."""
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=True)
    return {line.split()[0] for line in ps.stdout.splitlines() if "flower-superlink" in line}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie has exited; an init that never reaps (some containers) keeps it listed
    stat = Path(f"/proc/{pid}/stat")
    return not stat.is_file() or stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
