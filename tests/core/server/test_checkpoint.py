"""Checkpoint and resume: a crashed run continues exactly where its last checkpoint left it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedcluster_app.api import STRATEGIES
from fedcluster_app.core.results import load_run
from fedcluster_app.core.server.strategy import read_checkpoint
from fedcluster_app.engine import InProcessGrid, run_inprocess
from tests.support import WALL_CLOCK


class CrashingGrid(InProcessGrid):
    """The server 'dies' when it starts round ``crash_round``."""

    crash_round = 7

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        if any(m.metadata.group_id == str(self.crash_round) for m in messages):
            raise RuntimeError("server crashed")
        return super().send_and_receive(messages, timeout=timeout)


@pytest.mark.matrix
@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_resume_after_crash_gives_the_uninterrupted_metrics(fast_config, tmp_path, strategy):
    """The server dies in round 7 (every client process with it: the resumed run gets new
    nodes with an empty context.state); resumed from the checkpoint of round 4, which holds the
    clients' state too, every round's record equals the uninterrupted run's."""
    full = run_inprocess(fast_config(strategy=strategy, out_dir=str(tmp_path / "full")))
    _, full_rounds = load_run(Path(full["out_dir"]))
    if len(full_rounds) < 8:
        pytest.skip(f"{strategy} runs {len(full_rounds)} rounds here")

    out = tmp_path / "crashed"
    cfg = fast_config(strategy=strategy, out_dir=str(out), checkpoint_every=4)
    with pytest.raises(RuntimeError, match="server crashed"):
        run_inprocess(cfg, grid_cls=CrashingGrid)
    assert json.loads((out / "summary.json").read_text())["status"] == "failed"
    assert not list(out.glob("*.tmp"))

    resumed = run_inprocess(cfg | {"resume-from": str(out)})
    _, rounds = load_run(out)
    assert resumed["status"] == "completed" and resumed["resumed_after_round"] == 4
    strip = lambda rs: [{k: v for k, v in r.items() if k not in WALL_CLOCK} for r in rs]  # noqa: E731
    assert strip(rounds) == strip(full_rounds)


def test_without_client_state_a_personal_strategy_does_not_resume_exactly(fast_config, tmp_path):
    """The control of the test above: local's models live only on the clients."""
    full = run_inprocess(fast_config(strategy="local", out_dir=str(tmp_path / "full")))
    out = tmp_path / "crashed"
    cfg = fast_config(strategy="local", out_dir=str(out), checkpoint_every=4,
                      checkpoint_client_state=False)
    with pytest.raises(RuntimeError, match="server crashed"):
        run_inprocess(cfg, grid_cls=CrashingGrid)
    run_inprocess(cfg | {"resume-from": str(out)})
    accuracy = lambda d: [r["accuracy"] for r in load_run(d)[1]]  # noqa: E731
    assert accuracy(out)[:4] == accuracy(Path(full["out_dir"]))[:4]
    assert accuracy(out)[4:] != accuracy(Path(full["out_dir"]))[4:]


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


@pytest.mark.parametrize("damage", ["shape", "nan", "inf", "client-state"])
def test_a_checkpoint_with_wrong_shapes_non_finite_weights_or_bad_client_state_is_refused(
        fast_config, tmp_path, damage):
    import numpy as np

    from fedcluster_app.core.server.checkpoint import read_client_states, write_checkpoint

    summary = run_inprocess(fast_config(strategy="ifca", checkpoint_every=4))
    meta, models = read_checkpoint(Path(summary["out_dir"]))
    states = read_client_states(Path(summary["out_dir"]))
    assert sorted(states) == list(range(10))            # every client's context.state is in it
    mid = meta["model_ids"][0]
    if damage == "shape":
        models[mid][0] = np.zeros((3, 3), np.float32)
    elif damage in ("nan", "inf"):
        models[mid][1] = np.full_like(models[mid][1], np.nan if damage == "nan" else np.inf)
    else:
        states[2] = b"\xff\x00 not a record"
    meta["round"] = 4
    bad = tmp_path / "bad" / "checkpoint.npz"
    write_checkpoint(bad, meta, models, states)
    before = bad.read_bytes()
    expected = {"shape": "has shapes", "nan": "non-finite", "inf": "non-finite",
                "client-state": "state of client 2 is corrupt"}[damage]
    with pytest.raises(ValueError, match=expected):
        run_inprocess(fast_config(strategy="ifca", checkpoint_every=4, resume_from=str(bad),
                                  out_dir=str(tmp_path / "bad")))
    assert bad.read_bytes() == before and sorted(p.name for p in bad.parent.iterdir()) == [bad.name]
