"""Nothing is lost: a finished run's directory is never written over without --overwrite, a
refused resume changes no file, a resume is the same run (its config comes from the checkpoint,
a different one is refused), a finished run resumed is left alone, and `fedcluster run` exits
with the run's real status."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fedcluster_app import launcher
from fedcluster_app.api import make_strategy
from fedcluster_app.cli import main
from fedcluster_app.core.server.checkpoint import SAFE_ON_RESUME, read_checkpoint
from fedcluster_app.core.config import default_run_config
from fedcluster_app.core.results import RunRecorder, load_run
from fedcluster_app.engine import InProcessGrid, run_inprocess
from tests.support import FAST

# 4 steps of 1 round, a checkpoint every round: the smallest run with a drift (at step 3)
TINY = {**FAST, "strategy": "ifca", "rounds-per-step": 1, "num-steps": 4, "checkpoint-every": 1}
TINY_ARGS = [arg for k, v in TINY.items() for arg in ("--set", f"{k}={str(v).lower()}")]


class Killed(BaseException):
    """Not an Exception: the run cannot record it, as with kill -9 (no summary.json)."""


class KilledGrid(InProcessGrid):
    """The server process dies when round 3 starts (rounds 1-2 logged and checkpointed)."""

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        if any(m.metadata.group_id == "3" for m in messages):
            raise Killed
        return super().send_and_receive(messages, timeout=timeout)


def files(run_dir: Path) -> dict[str, tuple[bytes, int]]:
    """Every file of a run directory with its bytes and mtime."""
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(run_dir.iterdir())}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("finished") / "run"
    assert run_inprocess({**TINY, "out-dir": str(out)})["status"] == "completed"
    return out


@pytest.fixture
def finished(finished_run, tmp_path) -> Path:
    """A private copy (bytes and mtimes kept) of the finished run."""
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    return out


# ---------------------------------------------------------------- 1. no silent replacement
def test_a_new_run_into_a_finished_run_is_refused_and_touches_nothing(finished):
    before = files(finished)
    with pytest.raises(FileExistsError, match="--overwrite") as err:
        run_inprocess({**TINY, "out-dir": str(finished)})
    assert str(finished) in str(err.value) and f"--resume {finished}" in str(err.value)
    with pytest.raises(FileExistsError):   # Flower's Strategy.start in your own ServerApp
        make_strategy("ifca", run_config={**TINY, "out-dir": str(finished)}).start(
            InProcessGrid({**default_run_config(), **TINY}, 10))
    assert files(finished) == before


def test_a_killed_run_is_finished_too_and_overwrite_replaces_a_run(finished, tmp_path):
    killed = tmp_path / "killed"
    with pytest.raises(Killed):
        run_inprocess({**TINY, "out-dir": str(killed)}, grid_cls=KilledGrid)
    assert not (killed / "summary.json").exists() and (killed / "metrics.jsonl").stat().st_size
    with pytest.raises(FileExistsError, match="metrics.jsonl holds a run that stopped"):
        run_inprocess({**TINY, "out-dir": str(killed)})
    (killed / "metrics.jsonl").unlink()   # a checkpoint alone is a run's state too
    with pytest.raises(FileExistsError, match="checkpoint.npz holds a run that stopped"):
        run_inprocess({**TINY, "out-dir": str(killed)})

    again = run_inprocess({**TINY, "out-dir": str(finished), "overwrite": True, "seed": 1})
    summary, rounds = load_run(finished)
    assert again["status"] == summary["status"] == "completed" and summary["seed"] == 1
    assert [r["round"] for r in rounds] == [1, 2, 3, 4]
    assert read_checkpoint(finished)[0]["config"]["seed"] == 1   # the new run's checkpoint


def test_the_cli_refuses_before_starting_ray_or_a_deployment(finished, monkeypatch, capsys):
    def must_not_start(*args, **kwargs):
        raise AssertionError("started although the run was refused")

    for name in ("stage_app", "run_with_flwr", "run_on_deployment"):
        monkeypatch.setattr(launcher, name, must_not_start)
    before = files(finished)
    for engine in ("inprocess", "ray", "deployment"):
        assert main(["run", *TINY_ARGS, "--out", str(finished), "--engine", engine]) == 2
        err = capsys.readouterr().err
        assert f"{finished} holds a finished run's results" in err and "--overwrite" in err
    assert files(finished) == before


# ---------------------------------------------------------------- 2. and 4. refused resumes
@pytest.mark.parametrize("change, message", [
    ({"strategy": "fedavg"}, "strategy = 'ifca'; this run has strategy = 'fedavg'"),
    ({"scenario": "mixture-prior"}, "scenario = 'mixture-swap'; this run has scenario"),
    ({"lr": 0.05}, "lr: 0.01 -> 0.05"),
    ({"seed": 7, "rounds-per-step": 2}, "rounds-per-step: 1 -> 2; seed: 0 -> 7"),
    ({"num-steps": 3}, "num-steps: 4 -> 3 (the checkpoint's run has 4 time steps"),
])
def test_a_refused_resume_changes_no_file(finished, change, message):
    before = files(finished)
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        run_inprocess({**TINY, **change, "out-dir": str(finished), "resume-from": str(finished)})
    assert files(finished) == before


def test_a_corrupt_checkpoint_is_refused_and_changes_no_file(finished):
    ckpt = finished / "checkpoint.npz"
    ckpt.write_bytes(ckpt.read_bytes()[:1000])
    before = files(finished)
    with pytest.raises(ValueError, match="corrupt"):
        run_inprocess({**TINY, "out-dir": str(finished), "resume-from": str(finished)})
    assert main(["run", "--resume", str(finished)]) == 2
    assert files(finished) == before


def test_resuming_into_another_finished_run_is_refused(finished, finished_run):
    before = files(finished)
    with pytest.raises(FileExistsError, match="holds a finished run's results"):
        run_inprocess({**TINY, "out-dir": str(finished), "resume-from": str(finished_run)})
    assert files(finished) == before


def test_only_operational_keys_may_change_on_resume():
    assert {"out-dir", "resume-from", "overwrite", "progress", "plot", "checkpoint-every",
            "round-timeout", "node-wait-s", "device"} <= SAFE_ON_RESUME
    assert not {"lr", "seed", "rounds-per-step", "num-steps", "strategy"} & SAFE_ON_RESUME
    assert SAFE_ON_RESUME <= set(default_run_config())


def test_more_steps_continue_the_run_when_the_first_steps_stay_the_same(finished):
    more = {**TINY, "num-steps": 5, "out-dir": str(finished), "resume-from": str(finished),
            "progress": True, "round-timeout": 60.0}          # operational keys may change
    summary = run_inprocess(more)
    _, rounds = load_run(finished)
    assert summary["status"] == "completed" and summary["resumed_after_round"] == 4
    assert [(r["round"], r["time_step"]) for r in rounds] == [(i, i) for i in range(1, 6)]
    short = {**TINY, "num-steps": 2, "out-dir": str(finished.parent / "short")}
    run_inprocess(short)
    # with 2 steps mixture-swap drifts at step 2, with 4 at step 3: not the same first steps
    with pytest.raises(ValueError, match="num-steps: 2 -> 4"):
        run_inprocess({**short, "num-steps": 4, "resume-from": short["out-dir"]})


# ---------------------------------------------------------------- 3. --resume DIR alone
def test_bare_resume_after_a_killed_run_takes_everything_from_the_checkpoint(tmp_path, capsys):
    out = tmp_path / "killed"
    config = {**TINY, "strategy": "oracle", "lr": 0.02, "seed": 3, "out-dir": str(out)}
    with pytest.raises(Killed):
        run_inprocess(config, grid_cls=KilledGrid)
    assert not (out / "summary.json").exists()
    assert main(["run", "--resume", str(out)]) == 0          # the README's command
    summary, rounds = load_run(out)
    assert (summary["strategy"], summary["seed"], summary["config"]["lr"]) == ("oracle", 3, 0.02)
    assert summary["status"] == "completed" and summary["resumed_after_round"] == 2
    assert [r["round"] for r in rounds] == [1, 2, 3, 4]
    assert "mean accuracy" in capsys.readouterr().out
    full = run_inprocess({**config, "out-dir": str(tmp_path / "full")})
    assert summary["final_accuracy"] == full["final_accuracy"]


# ---------------------------------------------------------------- 5. a finished run resumed
def test_resuming_a_finished_run_says_so_and_changes_nothing(finished, capsys):
    before = files(finished)
    summary = run_inprocess({**TINY, "out-dir": str(finished), "resume-from": str(finished)})
    assert summary == json.loads(before["summary.json"][0])
    assert main(["run", "--resume", str(finished)]) == 0
    assert "already finished (round 4 of 4, status completed)" in capsys.readouterr().out
    assert files(finished) == before


def test_a_finished_degraded_run_resumed_is_left_alone_and_exits_3(finished, capsys):
    summary = json.loads((finished / "summary.json").read_text())
    summary.update(status="degraded", reason="client 4 never answered")
    (finished / "summary.json").write_text(json.dumps(summary))
    before = files(finished)
    assert main(["run", "--resume", str(finished)]) == 3
    out, err = capsys.readouterr()
    assert "already finished (round 4 of 4, status degraded)" in out
    assert "run degraded: client 4 never answered" in err
    assert files(finished) == before


# ---------------------------------------------------------------- 6. honest exit status
@pytest.mark.parametrize("status, code", [("completed", 0), ("degraded", 3), ("failed", 1)])
@pytest.mark.parametrize("engine", ["inprocess", "ray"])
def test_the_exit_status_is_the_runs(status, code, engine, tmp_path, monkeypatch, capsys):
    reason = None if status == "completed" else "3 of 10 clients never answered"
    summary = {"strategy": "ifca", "scenario": "mixture-swap", "seed": 0, "mean_accuracy": 0.5,
               "final_accuracy": None, "ari_final": None, "wall_time_s": 1.0, "status": status,
               "reason": reason}
    monkeypatch.setattr("fedcluster_app.engine.run_inprocess", lambda *a, **k: summary)
    monkeypatch.setattr(launcher, "run_with_flwr", lambda *a, **k: summary)
    assert main(["run", *TINY_ARGS, "--out", str(tmp_path / "r"), "--engine", engine]) == code
    err = capsys.readouterr().err
    assert (f"run {status}: {reason}" in err) == (status != "completed")


def test_the_launcher_reads_the_summary_this_run_wrote(tmp_path):
    path = tmp_path / "summary.json"
    assert launcher.run_summary(tmp_path, None, completed=False) is None   # wrote none
    path.write_text(json.dumps({"status": "degraded", "reason": "r"}))
    assert launcher.run_summary(tmp_path, None, completed=False)["status"] == "degraded"
    old = path.read_bytes()
    assert launcher.run_summary(tmp_path, old, completed=False) is None    # an earlier run's
    assert launcher.run_summary(tmp_path, old, completed=True)["reason"] == "r"


def test_the_recorder_accepts_degraded_with_a_reason(tmp_path):
    r = RunRecorder(tmp_path, strategy="ifca", scenario="s", seed=0, config={})
    r.log_round({"round": 1, "time_step": 1, "accuracy": 0.5, "num_clusters": 1})
    s = r.finish(status="degraded", reason="2 clients failed every round", plot=False)
    assert (s["status"], s["reason"]) == ("degraded", "2 clients failed every round")
    assert r.finish(status="failed", error="boom", plot=False)["reason"] == "boom"
