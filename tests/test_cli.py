"""The fedcluster command line."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from fedcluster_app.api import STRATEGIES
from fedcluster_app.cli import main
from fedcluster_app.core.config import ConfigError, parse_assignment
from fedcluster_app.core.data import scenario_names
from tests.support import ROOT

QUICK = ROOT / "presets" / "quick.toml"


def test_list_names_every_strategy_and_scenario(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in [*STRATEGIES, *scenario_names(), "cpu", "gpu", "rounds-per-step"]:
        assert name in out


def test_version_names_fedcluster_flwr_and_torch_without_importing_them():
    """``fedcluster --version`` reads the installed versions from the packages' metadata: it
    answers as fast as ``fedcluster list`` (no torch, no flwr imported)."""
    import subprocess
    import sys
    from importlib.metadata import version

    probe = ("import sys\nfrom fedcluster_app.cli import main\ntry:\n    main(['--version'])\n"
             "except SystemExit as ex:\n    print('exit', ex.code)\n"
             "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'flwr', 'numpy'}))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert out == [f"fedcluster {version('fedcluster')}, flwr {version('flwr')}, torch "
                   f"{version('torch')}", "exit 0", "[]"]
    assert version("flwr") == "1.41.0"


def test_run_inprocess_writes_results(tmp_path, capsys):
    out = tmp_path / "r"
    rc = main(["run", "--strategy", "oracle", "--run-config", str(QUICK), "--out", str(out),
               "--set", "progress=false", "--set", "plot=true"])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["strategy"] == "oracle" and summary["ari_final"] == 1.0
    assert (out / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "mean accuracy" in capsys.readouterr().out


def test_resume_with_the_directory_alone_continues_that_run(tmp_path, capsys):
    """``fedcluster run --resume DIR`` (the README's command) reads the strategy, the scenario
    and the rest of the run config from DIR (a finished run: nothing to do); flags given beside
    it still win, and a run that is not DIR's is refused. (Resuming a killed run:
    tests/core/results/test_nothing_lost.py.)"""
    out = tmp_path / "r"
    assert main(["run", "--strategy", "oracle", "--run-config", str(QUICK), "--out", str(out),
                 "--set", "progress=false", "--set", "plot=false"]) == 0
    first = (out / "summary.json").read_bytes()
    assert main(["run", "--resume", str(out)]) == 0
    assert (out / "summary.json").read_bytes() == first
    assert "oracle" in first.decode() and "already finished" in capsys.readouterr().out
    assert main(["run", "--resume", str(out), "--strategy", "ifca"]) == 2   # not this run's
    assert "strategy = 'oracle'; this run has strategy = 'ifca'" in capsys.readouterr().err


def test_unknown_strategy_exits_2_and_lists_the_valid_ones(tmp_path, capsys):
    assert main(["run", "--strategy", "fedmagic", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "unknown strategy 'fedmagic'" in err and "ifca" in err and "oracle" in err


def test_unknown_scenario_exits_2_and_lists_the_valid_ones(tmp_path, capsys):
    assert main(["run", "--scenario", "imagenet", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "imagenet" in err and "circle2" in err and "digits-swap" in err


@pytest.mark.parametrize("flag, typo, meant", [
    ("--scenario", "mixtrue-swap", "mixture-swap"), ("--scenario", "Digits-Swp", "digits-swap"),
    ("--strategy", "IFCA", "ifca"), ("--strategy", "FedDirft", "feddrift"),
])
def test_a_mistyped_scenario_or_strategy_gets_the_closest_name_case_ignored(
        tmp_path, capsys, flag, typo, meant):
    assert main(["run", flag, typo, "--out", str(tmp_path)]) == 2
    assert f"{typo!r} (did you mean {meant!r}?)" in capsys.readouterr().err


def test_unknown_key_and_bad_value(tmp_path, capsys):
    assert main(["run", "--set", "learnin-rate=0.1", "--out", str(tmp_path)]) == 2
    assert "unknown run-config key 'learnin-rate'" in capsys.readouterr().err
    assert main(["run", "--set", "lr=-1", "--out", str(tmp_path)]) == 2
    assert "lr must be > 0" in capsys.readouterr().err


def test_report_compares_runs(tmp_path, capsys):
    for strategy in ("fedavg", "oracle"):
        assert main(["run", "--strategy", strategy, "--run-config", str(QUICK),
                     "--out", str(tmp_path / strategy), "--set", "progress=false"]) == 0
    capsys.readouterr()
    plot = tmp_path / "cmp.png"
    assert main(["report", str(tmp_path / "fedavg"), str(tmp_path / "oracle"), "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert "fedavg" in out and "oracle" in out and plot.is_file()


def test_run_config_takes_inline_pairs_as_flwr_run_does(tmp_path, capsys):
    """``--run-config "seed=3"`` was read as a file name; it is Flower's syntax now, read by
    Flower's parser, and a .toml path still works (test_run_inprocess_writes_results)."""
    from fedcluster_app.cli import read_run_config

    out = tmp_path / "r"
    assert main(["run", "--run-config", 'seed=3 strategy="fedavg" num-steps=1', "--run-config",
                 str(QUICK), "--out", str(out), "--set", "progress=false"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["seed"] == 3 and summary["strategy"] == "fedavg"
    assert read_run_config('feddrift.delta=0.2 scenario="sea 4"') == {"feddrift.delta": 0.2,
                                                                      "scenario": "sea 4"}
    nested = tmp_path / "nested.toml"
    nested.write_text('seed = 4\n[feddrift]\ndelta = 0.3\n')
    assert read_run_config(str(nested)) == {"seed": 4, "feddrift.delta": 0.3}   # as Flower
    capsys.readouterr()
    for text, message in (("seed3", "expected a .toml file or key=value pairs"),
                          ("seed=3 junk", "got junk"),
                          ("strategy=ifca", "invalid format"),
                          (str(tmp_path / "none.toml"), "cannot read it")):
        assert main(["run", "--run-config", text, "--out", str(tmp_path / "x")]) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_a_table_key_the_runs_strategy_does_not_read_is_refused_naming_its_readers(
        tmp_path, capsys):
    """``--set feddrift.delta=5`` on an ifca run was silently ignored. Keys set one by one
    (--set, inline --run-config) are checked, even at their default value; a preset or a
    run-config file may hold several strategies' tables (a paper's experiment)."""
    for args, readers in (
            (["--set", "feddrift.delta=5"],
             "feddrift, feddrift-c, feddrift-eager, feddrift-eager-w, feddrift-w"),
            (["--run-config", "feddrift.delta=0.1"],        # its default value: still refused
             "feddrift, feddrift-c, feddrift-eager, feddrift-eager-w, feddrift-w"),
            (["--set", "feddrift-baselines.afa-beta=0.4"],
             "adaptive-fedavg, cfl, cfl-w, driftsurf, ifca-w")):
        assert main(["run", "--strategy", "ifca", *args, "--out", str(tmp_path / "x")]) == 2
        err = capsys.readouterr().err
        assert f"is read only by {readers} (its table" in err
        assert "this run's strategy ifca would ignore it" in err
    assert not (tmp_path / "x").exists()
    # the preset sets feddrift.delta and the baselines' keys, and runs with any of them
    assert main(["run", "--preset", "feddrift-circle2", "--strategy", "window", "--set",
                 "num-steps=2", "--set", "rounds-per-step=1", "--set", "progress=false",
                 "--set", "plot=false", "--out", str(tmp_path / "w")]) == 0
    assert main(["run", "--strategy", "feddrift", "--set", "feddrift.delta=0.2", "--set",
                 "num-steps=2", "--set", "rounds-per-step=1", "--set", "progress=false",
                 "--set", "plot=false", "--out", str(tmp_path / "f")]) == 0


def _interrupt(argv: list[str], out: Path, after_round: int) -> tuple[int, str]:
    """Run ``fedcluster <argv>`` in a process of its own, send it SIGINT (Ctrl-C) once its
    checkpoint in ``out`` is past ``after_round``; its exit status and stderr."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from fedcluster_app.core.server.checkpoint import read_checkpoint

    # Ctrl-C as a terminal delivers it: a shell that runs the tests in the background starts
    # them with SIGINT ignored, which children inherit, and Python then never raises
    # KeyboardInterrupt (the run went on to its end and exited 0)
    proc = subprocess.Popen([sys.executable, "-m", "fedcluster_app.cli", *argv], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if read_checkpoint(out)[0]["round"] > after_round:
                break
        except (FileNotFoundError, ValueError, KeyError):   # not yet, or being replaced
            pass
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


def test_ctrl_c_ends_with_one_line_naming_the_directory_and_the_resume_command(tmp_path):
    """SIGINT (Ctrl-C) of a running `fedcluster run`: no traceback, exit 130, and one line
    with the command that continues the run; that command continues it."""
    from fedcluster_app.core.server.checkpoint import read_checkpoint

    out = tmp_path / "run dir"
    rc, err = _interrupt(["run", "--run-config", str(QUICK), "--set", "rounds-per-step=500",
                          "--set", "checkpoint-every=2", "--set", "progress=false", "--out",
                          str(out)], out, 0)
    assert rc == 130 and "Traceback" not in err and "KeyboardInterrupt" not in err
    done = read_checkpoint(out)[0]["round"]
    head = f"fedcluster: interrupted: {out} has the run's checkpoint after round {done}; "
    last = err.strip().splitlines()[-1]
    assert last.startswith(head + "continue it with: fedcluster run --resume ")
    command = shlex.split(last.split("continue it with: ")[1])   # as a shell reads it
    assert command == ["fedcluster", "run", "--resume", str(out)]
    rc, err = _interrupt(command[1:], out, done)
    assert rc == 130 and "Traceback" not in err
    assert read_checkpoint(out)[0]["round"] > done          # it went on from there
    rounds = [json.loads(line)["round"] for line in (out / "metrics.jsonl").open()]
    assert rounds == list(range(1, len(rounds) + 1))        # one line per round, none twice


def test_ctrl_c_before_a_checkpoint_says_there_is_none(tmp_path):
    from fedcluster_app.cli import interrupted

    line = interrupted({"out-dir": str(tmp_path), "checkpoint-every": 0})
    assert line == (f"fedcluster: interrupted: {tmp_path} holds no checkpoint to resume from "
                    "(none was written before the run was stopped); run the same command with "
                    "--overwrite to start again")


def test_parse_assignment():
    assert parse_assignment("lr=0.5") == ("lr", 0.5)
    assert parse_assignment("strategy=ifca") == ("strategy", "ifca")
    assert parse_assignment('scenario="sea4"') == ("scenario", "sea4")
    assert parse_assignment("plot=false") == ("plot", False)
    with pytest.raises(ConfigError):
        parse_assignment("no-equals-sign")


def test_keys_makes_supernode_key_pairs_and_refuses_an_unknown_federation(tmp_path, capsys):
    assert main(["keys", str(tmp_path / "keys"), "dev1", "dev2"]) == 0
    for name in ("dev1", "dev2"):
        public = (tmp_path / "keys" / f"{name}.pub").read_text()
        assert public.startswith("ecdsa-sha2-nistp384 ")          # what SuperNode auth takes
        private = tmp_path / "keys" / name
        assert private.read_text().startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
        assert private.stat().st_mode & 0o077 == 0                 # private to its owner
    assert main(["keys", str(tmp_path / "other"), "dev3", "--register", "nowhere"]) == 2
    err = capsys.readouterr().err
    assert "unknown federation 'nowhere'" in err and "local-tls" in err
    assert not (tmp_path / "other").exists()                       # nothing made on a bad call


def test_deploy_data_dir_is_made_absolute_for_the_supernodes(tmp_path, monkeypatch):
    from fedcluster_app.cli import _absolute_data_dir

    monkeypatch.chdir(tmp_path)
    assert _absolute_data_dir("npz:data/client3.npz") == f"npz:{tmp_path}/data/client3.npz"
    assert _absolute_data_dir("hf-disk:ds") == f"hf-disk:{tmp_path}/ds"
    assert _absolute_data_dir("mnist-files") == str(tmp_path / "mnist-files")
