"""Stopping, one writer, nothing lost to an interruption, out directories, refusals
(docs/operations/reliability.md, "Interruptions, writers and out directories").

The in-process engine's signal tests run the real `fedcluster run` in a process of its own;
the Ray engine's are in tests/test_e2e_ray.py (slow)."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fedcluster_app.cli import main
from fedcluster_app.core.server.checkpoint import read_checkpoint
from fedcluster_app.core.results.files import LOCK_FILE
from tests.support import ROOT

QUICK = ROOT / "presets" / "quick.toml"
LONG = ["--run-config", str(QUICK), "--set", "rounds-per-step=300", "--set", "progress=false",
        "--set", "plot=false"]


def start_cli(argv: list[str]) -> subprocess.Popen:
    """`fedcluster <argv>` in a process of its own, with SIGINT's default handling (a shell
    that runs the tests in the background starts them with SIGINT ignored)."""
    return subprocess.Popen([sys.executable, "-m", "fedcluster_app.cli", *argv], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def logged_rounds(out: Path) -> list[int]:
    try:
        lines = (out / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return []
    rounds = []
    for line in lines:
        try:
            rounds.append(json.loads(line)["round"])
        except ValueError:   # the line being written
            break
    return rounds


def wait_for_rounds(proc: subprocess.Popen, out: Path, n: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while len(logged_rounds(out)) < n:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the run logged no rounds in time"
        time.sleep(0.05)


def lock_is_free(out: Path) -> bool:
    with open(out / LOCK_FILE) as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
    return True


# ------------------------------------------------------------------------------- signals
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_the_inprocess_run_with_a_checkpoint_and_marks_it_interrupted(tmp_path, sig):
    """SIGINT / SIGTERM: exit 128 + signal, the process gone, the checkpoint after the last
    logged round (the round in progress finished), summary.json "interrupted" with the command
    that continues it, the lock released; that command continues it, every round once."""
    out = tmp_path / "run"
    proc = start_cli(["run", *LONG, "--out", str(out)])
    wait_for_rounds(proc, out, 3)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err[-3000:]
    assert "Traceback" not in err
    rounds = logged_rounds(out)
    assert read_checkpoint(out)[0]["round"] == rounds[-1]        # a whole round, checkpointed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    assert summary["rounds"] == len(rounds) and summary["checkpoint_round"] == rounds[-1]
    assert summary["resume_command"] == f"fedcluster run --resume {out}"
    assert f"stopped by {signal.Signals(sig).name} after round {rounds[-1]}" in summary["reason"]
    assert err.strip().splitlines()[-1].endswith(f"continue it with: fedcluster run --resume {out}")
    assert lock_is_free(out)
    # a new run into it is refused, advising what works (--resume: it has a checkpoint)
    assert main(["run", *LONG, "--out", str(out)]) == 2
    # the resume command continues it
    proc = start_cli(["run", "--resume", str(out)])
    wait_for_rounds(proc, out, len(rounds) + 2)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 143
    again = logged_rounds(out)
    assert again == list(range(1, len(again) + 1)) and len(again) > len(rounds)


def test_the_cli_exit_codes_are_documented():
    from fedcluster_app.cli import RUN_EPILOG

    readme = (ROOT / "README.md").read_text()
    assert "130  interrupted by SIGINT (Ctrl-C), 143 by SIGTERM" in RUN_EPILOG
    assert "| 130, 143 | interrupted by SIGINT (Ctrl-C) or SIGTERM" in readme


# ------------------------------------------------------------------------------- one writer
def test_a_second_writer_is_refused_at_once_naming_the_holder_and_the_first_run_is_intact(
        tmp_path, capsys):
    out = tmp_path / "run"
    first = start_cli(["run", "--run-config", str(QUICK), "--set", "rounds-per-step=100",
                       "--set", "progress=false", "--seed", "0", "--out", str(out)])
    wait_for_rounds(first, out, 1)
    holder = json.loads((out / LOCK_FILE).read_text())
    t0 = time.monotonic()
    for argv in (["--seed", "1", "--out", str(out)],              # a second new run
                 ["--seed", "1", "--out", str(out), "--overwrite"],
                 ["--resume", str(out)]):                          # resume takes the lock too
        assert main(["run", "--run-config", str(QUICK), "--set", "progress=false", *argv]
                    if argv[0] != "--resume" else ["run", *argv]) == 2
        err = capsys.readouterr().err
        assert f"{out} is being written by another run (process {first.pid} on " in err
        assert holder["command"] in err and "--resume" not in err.split("lock file")[1]
    assert time.monotonic() - t0 < 30   # at once, not after the first run
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["seed"] == 0
    assert logged_rounds(out) == list(range(1, 601))                # one line per round, once


def test_a_lock_left_by_a_dead_holder_is_not_stale(tmp_path, fast_config):
    """The lock is the kernel's (flock): a holder killed with SIGKILL releases it, and the note
    it left does not stop the next run."""
    from fedcluster_app.engine import run_inprocess

    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK_FILE).write_text(json.dumps({"pid": 999999, "host": "gone", "command": "x"}))
    summary = run_inprocess(fast_config(**{"out-dir": str(out), "num-steps": 1}))
    assert summary["status"] == "completed"
    assert json.loads((out / LOCK_FILE).read_text())["pid"] == os.getpid()


# ----------------------------------------------------------------- checkpoints, a full disk
def test_the_default_checkpoints_by_time_and_checkpoint_every_s_sets_it(fast_config, monkeypatch):
    import fedcluster_app.core.server.checkpoint as S
    from fedcluster_app.core.config import default_run_config
    from fedcluster_app.engine import run_inprocess

    assert default_run_config()["checkpoint-every-s"] == 30.0
    saved = []
    real = S.write_checkpoint
    monkeypatch.setattr(S, "write_checkpoint", lambda path, meta, *a: (
        saved.append(meta["round"]), real(path, meta, *a)))
    run_inprocess(fast_config(**{"num-steps": 2}))          # 4 rounds in well under 30 s
    assert saved == [4]                                     # the final one only
    saved.clear()
    run_inprocess(fast_config(**{"num-steps": 2, "checkpoint-every-s": 1e-9, "overwrite": True}))
    assert saved == [1, 2, 3, 4, 4]                         # every round, then the final one


def test_a_full_disk_keeps_the_last_checkpoint_and_says_how_much_space_is_needed(
        fast_config, monkeypatch):
    import fedcluster_app.core.server.checkpoint as C
    from fedcluster_app.engine import run_inprocess

    cfg = fast_config(**{"num-steps": 2, "checkpoint-every": 1})
    real_savez = C.np.savez
    calls = []

    def savez(fh, **arrays):   # the second checkpoint's file fills the disk half way
        calls.append(1)
        if len(calls) == 2:
            fh.write(b"x" * 100)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_savez(fh, **arrays)

    monkeypatch.setattr(C.np, "savez", savez)
    with pytest.raises(OSError, match=r"no space left for the checkpoint of round 2 in .*: it "
                                      r"needs about \d+\.\d MB, \d+\.\d MB are free; the last "
                                      r"checkpoint written .* is intact"):
        run_inprocess(cfg)
    out = Path(cfg["out-dir"])
    assert read_checkpoint(out)[0]["round"] == 1                    # intact, loadable
    assert sorted(p.name for p in out.iterdir() if p.name.endswith(".tmp")) == []
    assert json.loads((out / "summary.json").read_text())["status"] == "failed"


# ----------------------------------------------------------------------- out directories
@pytest.mark.parametrize("where", ["root", "home", "repository"])
def test_out_refuses_the_root_the_home_folder_and_the_repository(where, capsys):
    out = {"root": "/", "home": str(Path.home()), "repository": str(ROOT)}[where]
    assert main(["run", "--run-config", str(QUICK), "--out", out]) == 2
    what = {"root": "the filesystem root", "home": "your home folder",
            "repository": "the repository root"}[where]
    assert f"--out {out} is {what}" in capsys.readouterr().err


def test_out_never_touches_a_users_files(tmp_path, capsys):
    """A directory holding files that are not a run's is refused, also with --overwrite:
    `--out D` deleted D/plot.png when D held no run."""
    user = tmp_path / "mine"
    user.mkdir()
    (user / "plot.png").write_bytes(b"my own plot")
    (user / "notes.txt").write_text("mine")
    for extra in ([], ["--overwrite"]):
        assert main(["run", "--run-config", str(QUICK), "--out", str(user), *extra]) == 2
        err = capsys.readouterr().err
        assert f"--out {user} holds files that are not a run's (notes.txt)" in err
    assert (user / "plot.png").read_bytes() == b"my own plot"
    assert sorted(p.name for p in user.iterdir()) == ["notes.txt", "plot.png"]


def test_a_refusal_advises_resume_only_when_there_is_a_checkpoint(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"round": 1, "time_step": 0, "accuracy": 0.5, '
                                       '"num_clusters": 1}\n')
    assert main(["run", "--run-config", str(QUICK), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--overwrite" in err and "--resume" not in err
    assert main(["run", "--resume", str(out)]) == 2          # what it would have advised
    assert "no checkpoint" in capsys.readouterr().err


# ------------------------------------------------------------------ resume checks the files
def _interrupted_run(fast_config, tmp_path, monkeypatch) -> Path:
    """A run of 12 rounds whose checkpoint is after round 6 and whose summary is gone: one
    killed after round 12's line, its last checkpoint of round 6."""
    import shutil

    import fedcluster_app.core.server.checkpoint as S
    from fedcluster_app.engine import run_inprocess

    cfg = fast_config(**{"checkpoint-every": 6})
    saved = tmp_path / "cp6.npz"
    real = S.write_checkpoint

    def keep_round_6(path, meta, *args):
        real(path, meta, *args)
        if meta["round"] == 6:
            shutil.copy(path, saved)

    with monkeypatch.context() as m:
        m.setattr(S, "write_checkpoint", keep_round_6)
        run_inprocess(cfg)
    out = Path(cfg["out-dir"])
    shutil.copy(saved, out / "checkpoint.npz")
    (out / "summary.json").unlink()
    return out


def test_resume_cuts_lines_past_the_checkpoint_keeping_a_backup(fast_config, tmp_path,
                                                                monkeypatch):
    from fedcluster_app.engine import run_inprocess

    out = _interrupted_run(fast_config, tmp_path, monkeypatch)
    lines = (out / "metrics.jsonl").read_text().splitlines(keepends=True)
    # a second writer's lines too: rounds 1-12 then 8-12 again
    (out / "metrics.jsonl").write_text("".join(lines + lines[7:]))
    before = (out / "metrics.jsonl").read_text()
    summary = run_inprocess({"resume-from": str(out), "out-dir": str(out), **{
        k: v for k, v in fast_config().items() if k != "out-dir"}})
    assert logged_rounds(out) == list(range(1, 13))
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 12
    backups = list(out.glob("metrics.jsonl.*.bak"))
    assert len(backups) == 1 and backups[0].read_text() == before
    assert summary["rounds"] == 12 and summary["resumed_after_round"] == 6
    # the same summary as the uninterrupted run's
    whole = run_inprocess(fast_config(**{"out-dir": str(tmp_path / "whole")}))
    assert summary["mean_accuracy"] == whole["mean_accuracy"]


def test_resume_refuses_files_that_lack_the_checkpoints_rounds_and_changes_nothing(
        fast_config, tmp_path, capsys, monkeypatch):
    out = _interrupted_run(fast_config, tmp_path, monkeypatch)
    lines = (out / "metrics.jsonl").read_text().splitlines(keepends=True)
    for broken, message in ((lines[:4], "holds rounds 1..4, but the checkpoint is after round 6"),
                            (lines[:2] + lines[3:], "line 3: round 4 where the checkpoint's run "
                                                    "has round 3")):
        (out / "metrics.jsonl").write_text("".join(broken))
        before = {p.name: p.read_bytes() for p in out.iterdir()}
        assert main(["run", "--resume", str(out)]) == 2
        assert message in capsys.readouterr().err
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before


# ------------------------------------------------------------------------------- refusals
def test_refusals_name_the_key_or_file_and_exit_2(tmp_path, fast_config, capsys):
    from fedcluster_app.engine import run_inprocess

    assert main(["run", "--run-config", str(QUICK), "--seed", str(2**70),
                 "--out", str(tmp_path / "s")]) == 2
    assert f"seed must be an integer in [0, 4,294,967,295], got {2**70}" in \
        capsys.readouterr().err
    long = tmp_path / ("a" * 300)
    assert main(["run", "--run-config", str(QUICK), "--out", str(long)]) == 2
    assert f"--out {long}: File name too long" in capsys.readouterr().err
    # a checkpoint whose round is not an integer
    cfg = fast_config(**{"num-steps": 1})
    run_inprocess(cfg)
    out = Path(cfg["out-dir"])
    import numpy as np

    for bad in ("abc", 1.5, -1):
        with np.load(out / "checkpoint.npz") as data:
            arrays = dict(data)
        meta = json.loads(bytes(arrays["__meta__"]).decode())
        meta["round"] = bad
        arrays["__meta__"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        np.savez(tmp_path / "bad.npz", **arrays)
        assert main(["run", "--resume", str(tmp_path / "bad.npz"), "--out",
                     str(tmp_path / "r")]) == 2
        assert (f"checkpoint {tmp_path / 'bad.npz'} is corrupt: its 'round' must be a "
                f"non-negative integer, got {bad!r}") in capsys.readouterr().err


def test_a_tls_trust_failure_says_so(tmp_path):
    """A SuperLink whose certificate the connection's CA did not sign: refused before `flwr
    run` (which says "check your network connection"), naming TLS and the CA file."""
    from fedcluster_app.deploy import make_certificates
    from fedcluster_app.launcher import check_tls_trust, free_port

    served = make_certificates(tmp_path / "served", ("127.0.0.1",))
    other = make_certificates(tmp_path / "other", ("127.0.0.1",))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(served["server.pem"], served["server.key"])
    import socket

    port = free_port()
    server = socket.create_server(("127.0.0.1", port))

    def serve():
        for _ in range(2):
            conn, _ = server.accept()
            try:
                with context.wrap_socket(conn, server_side=True):
                    pass
            except (ssl.SSLError, OSError):
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    address = f"127.0.0.1:{port}"
    with pytest.raises(ValueError, match=rf"TLS: the SuperLink at {address} presented a "
                                         rf"certificate that root-certificates .*other.* do not "
                                         rf"trust"):
        check_tls_trust({"address": address, "root-certificates": str(other["ca.crt"])})
    check_tls_trust({"address": address, "root-certificates": str(served["ca.crt"])})   # trusted
    server.close()
    with pytest.raises(ValueError, match="root-certificates .*missing.crt: no such file"):
        check_tls_trust({"address": address, "root-certificates": str(tmp_path / "missing.crt")})


def test_a_failed_flwr_run_leaves_no_temporary_folder(tmp_path, monkeypatch, fast_config):
    import tempfile

    from fedcluster_app.launcher import RunFailed, free_port, run_on_deployment

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    with pytest.raises((RunFailed, ValueError)):   # nothing listens there
        run_on_deployment(fast_config(), {"address": f"127.0.0.1:{free_port()}",
                                          "insecure": True})
    assert list((tmp_path / "tmp").iterdir()) == []
