"""Checkpoint and resume: a crashed run continues exactly where its last checkpoint left it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedcluster_app.core.results import load_run
from fedcluster_app.core.strategy import read_checkpoint
from fedcluster_app.engine import InProcessGrid, run_inprocess


class CrashingGrid(InProcessGrid):
    """The server 'dies' when it starts round ``crash_round``."""

    crash_round = 7

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        if any(m.metadata.group_id == str(self.crash_round) for m in messages):
            raise RuntimeError("server crashed")
        return super().send_and_receive(messages, timeout=timeout)


@pytest.mark.parametrize("strategy", ["ifca", "oracle"])
def test_resume_after_crash_gives_the_uninterrupted_metrics(fast_config, tmp_path, strategy):
    full = run_inprocess(fast_config(strategy=strategy, out_dir=str(tmp_path / "full")))
    _, full_rounds = load_run(Path(full["out_dir"]))

    out = tmp_path / "crashed"
    cfg = fast_config(strategy=strategy, out_dir=str(out), checkpoint_every=4)
    with pytest.raises(RuntimeError, match="server crashed"):
        run_inprocess(cfg, grid_cls=CrashingGrid)
    assert json.loads((out / "summary.json").read_text())["status"] == "failed"
    assert not list(out.glob("*.tmp"))

    resumed = run_inprocess(cfg | {"resume-from": str(out)})
    _, rounds = load_run(out)
    assert resumed["status"] == "completed"
    assert [r["round"] for r in rounds] == list(range(1, 13))
    strip = lambda rs: [(r["accuracy"], r["num_clusters"], r["ari"]) for r in rs]  # noqa: E731
    assert strip(rounds) == strip(full_rounds)


def test_checkpoint_holds_models_and_assignments(fast_config, tmp_path):
    summary = run_inprocess(fast_config(strategy="ifca", num_clusters=3))
    meta, models = read_checkpoint(Path(summary["out_dir"]))
    assert meta["round"] == 12 and meta["model_ids"] == [0, 1, 2]
    assert {c["cid"] for c in meta["clients"]} == set(range(10))
    assert all(c["cluster"] in (0, 1, 2) for c in meta["clients"])
    assert sorted(models) == [0, 1, 2] and all(len(w) == 4 for w in models.values())  # 3 MLPs


def test_resume_from_a_missing_checkpoint_is_a_clear_error(fast_config, tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        run_inprocess(fast_config(resume_from=str(tmp_path / "nothing-here")))


def test_a_foreign_or_corrupt_checkpoint_is_refused_and_left_untouched(fast_config, tmp_path):
    summary = run_inprocess(fast_config(strategy="ifca"))
    ckpt = Path(summary["out_dir"]) / "checkpoint.npz"
    original = ckpt.read_bytes()
    with pytest.raises(ValueError, match="strategy = 'ifca'; this run has strategy = 'fedavg'"):
        run_inprocess(fast_config(strategy="fedavg", resume_from=str(ckpt), out_dir=str(tmp_path / "a")))
    with pytest.raises(ValueError, match="scenario = 'mixture-swap'; this run has scenario = 'mixture-prior'"):
        run_inprocess(fast_config(strategy="ifca", scenario="mixture-prior", resume_from=str(ckpt),
                                  out_dir=str(tmp_path / "b")))
    corrupt = tmp_path / "corrupt.npz"
    corrupt.write_bytes(original[: len(original) // 2])
    with pytest.raises(ValueError, match="corrupt"):
        run_inprocess(fast_config(strategy="ifca", resume_from=str(corrupt), out_dir=str(tmp_path / "c")))
    assert ckpt.read_bytes() == original
    assert corrupt.read_bytes() == original[: len(original) // 2]
