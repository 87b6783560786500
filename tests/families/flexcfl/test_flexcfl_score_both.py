"""FlexCFL's comparison scored under both rules in one run (``score-both``): the run itself is
unchanged, and the second rule's numbers are those of a run scored under that rule."""

from __future__ import annotations

import json

import pytest

from fedcluster_app.engine import run_inprocess

SMALL = {"scenario": "synthetic-1-1-swap", "num-steps": 10, "rounds-per-step": 1,
         "num-clusters": 3, "local-steps": 5, "progress": False, "plot": False,
         "protocol": "none"}


def _rounds(tmp_path, name: str, strategy: str, **table) -> list[dict]:
    out = tmp_path / name
    cfg = {**SMALL, "strategy": strategy, "out-dir": str(out),
           **{f"{strategy}.{k}": v for k, v in table.items()}}
    if strategy in ("flexcfl", "fedgroup"):
        cfg[f"{strategy}.pretrain-scale"] = 2
    run_inprocess(cfg)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("strategy", ["flexcfl"])
def test_both_rules_in_one_run_equal_two_runs(tmp_path, strategy):
    both = _rounds(tmp_path, "both", strategy, **{"score-both": True})
    current = _rounds(tmp_path, "current", strategy)
    last = _rounds(tmp_path, "last", strategy, **{"eval-model": "last_received"})
    scored = [r for r in both if r.get("weighted_accuracy") is not None]
    assert scored
    for b, c, lr in zip(both, current, last):
        assert b["weighted_accuracy"] == c["weighted_accuracy"]       # the run is unchanged
        assert b["assignments"] == c["assignments"]
        assert b.get("weighted_accuracy_current_group") == c["weighted_accuracy"]
        assert b.get("weighted_accuracy_last_received") == lr["weighted_accuracy"]
    # under swap-all the rules disagree somewhere (else this test could not fail)
    assert any(r["weighted_accuracy_current_group"] != r["weighted_accuracy_last_received"]
               for r in scored)
