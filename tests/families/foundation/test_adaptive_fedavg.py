"""Adaptive-FedAvg as the FedCCFA paper runs it (docs/fedccfa/README.md, "Adaptive-FedAvg's
learning-rate schedule"): the schedule on numbers worked out by hand, the round-based strategy
sending the adapted lr and keeping the schedule in its checkpoint, its constants checked."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Message

from fedcluster_app.client_app import app as client_app
from fedcluster_app.core import wire as P
from fedcluster_app.core.config import ConfigError, default_run_config, merge_overrides
from fedcluster_app.core.experiment import load_experiment
from fedcluster_app.engine import InProcessGrid, run_inprocess
from tests.support import fedccfa_tiny as tiny


def test_adaptive_lr_schedule_on_hand_computed_values():
    """The FedCCFA paper's Adaptive-FedAvg constants (beta 0.7 / 0.3 / 0.7, eta0 0.01;
    docs/fedccfa/README.md, D20), m^_0 = 0 (authors' code)."""
    from fedcluster_app.families.foundation.adaptive_fedavg import AdaptiveLR

    s = AdaptiveLR(0.01, 0.7, 0.3, 0.7, zero_start=True)
    assert s.lr == 0.01                                    # round 1 trains at eta0
    # t = 1, w = [1, 3]: v1 = 0.7 * mean([1, 9]) = 3.5, v^1 = 3.5 / 0.7 = 5; ratio 1:
    # rho1 = 0.3, rho^1 = 1 -> lr = min(0.01, 0.01 * 1 / 1)
    assert s.update(np.array([1.0, 3.0]), 1) == pytest.approx(0.01, abs=1e-15)
    assert s.s_hat_prev == pytest.approx(5.0)
    # t = 2, w = [2, 3]: m^1 = [1, 3], mean((w - m^1)^2) = 0.5; v2 = 0.3 * 3.5 + 0.7 * 0.5 = 1.4,
    # v^2 = 1.4 / 0.91 = 20/13; ratio = 4/13; rho2 = 0.21 + 0.3 * 4/13 = 393/1300,
    # rho^2 = rho2 / 0.51 = 131/221; lr = 0.01 * (131/221) / 2
    assert s.update(np.array([2.0, 3.0]), 2) == pytest.approx(0.01 * 131 / 442, rel=1e-12)
    assert s.s_hat_prev == pytest.approx(20 / 13, rel=1e-12)
    np.testing.assert_allclose(s.mu / (1 - 0.7 ** 2), [27 / 17, 3.0], rtol=1e-12)   # m^2
    # a jump of the weights (a drift) raises the variance ratio: capped at eta0
    assert s.update(np.array([100.0, 3.0]), 3) == 0.01


def test_adaptive_fedavg_rounds_sends_the_adapted_lr(tmp_path):
    import json
    from pathlib import Path

    from fedcluster_app.api import build_strategy
    from fedcluster_app.families.foundation.adaptive_fedavg import (
        AdaptiveFedAvg,
        AdaptiveLR,
    )
    from fedcluster_app.families.foundation.cfl import flatten

    sent: dict[int, list[dict]] = {}

    def spy(msg: Message, ctx):
        if msg.metadata.message_type.startswith("train"):
            cfg = dict(msg.content.config_records[P.CONFIG])
            sent.setdefault(int(cfg[P.ROUND]), []).append(cfg)
        return client_app(msg, ctx)

    rc = merge_overrides(default_run_config(), tiny(tmp_path, strategy="adaptive-fedavg-rounds",
                                                    **{"rounds-per-step": 3}))
    s = build_strategy(load_experiment(rc))
    assert isinstance(s, AdaptiveFedAvg)
    after: list = []                                     # the global weights after each round
    agg = s.on_train_replies
    s.on_train_replies = lambda step, replies: (agg(step, replies), after.append(flatten(s.models[0])))
    s.run(InProcessGrid(rc, 10, client_app=spy), rc["out-dir"])
    assert sorted(sent) == list(range(1, 7)) and all(len(v) == 10 for v in sent.values())
    ref = AdaptiveLR(0.01, 0.7, 0.3, 0.7)
    want = [0.01] + [ref.update(w, t) for t, w in enumerate(after[:-1], start=1)]
    for rnd, lr in enumerate(want, start=1):
        assert [c["lr"] for c in sent[rnd]] == pytest.approx([lr] * 10, rel=1e-12)
        # only the lr travels: momentum and weight decay are the run's shared recipe
        assert not any({"optimizer", "momentum", "weight-decay"} & set(c) for c in sent[rnd])
    assert want[1] == 0.01 and want[2] < 0.01             # rho^_1 = 1; then the schedule moves
    lines = [json.loads(x) for x in Path(rc["out-dir"], "metrics.jsonl").read_text().splitlines()]
    assert [r["lr"] for r in lines] == pytest.approx(want, rel=1e-12)
    # the schedule's state is checkpointed: a resumed run sends the same next lr
    fresh = AdaptiveFedAvg(load_experiment(rc))
    fresh.load_checkpoint(Path(rc["out-dir"]))
    assert fresh.schedule.lr == s.schedule.lr == lines[-1]["next_lr"]


@pytest.mark.parametrize("key,value", [("beta1", 1.0), ("beta2", 0.0), ("beta3", -0.5),
                                       ("beta1", "fast"), ("gamma", 0.5), ("eta0", 0.01),
                                       ("momentum", 0.9), ("weight-decay", 0.0)])
def test_adaptive_fedavg_rounds_bad_constants(tmp_path, key, value):
    name = f"adaptive-fedavg-rounds.{key}"
    with pytest.raises(ConfigError, match=key):
        run_inprocess(tiny(tmp_path, strategy="adaptive-fedavg-rounds", **{name: value}))
