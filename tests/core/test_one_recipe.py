"""One training recipe for every strategy: each shared training setting reaches every registered
strategy's clients, so a comparison that sets a recipe for all gets it for all.

Each key is changed alone from a base recipe, and the run must come out different (its
losses, accuracies and the like in metrics.jsonl): a strategy whose clients ignored the key would
give the same numbers. What a family sets on top of the recipe is a hyper-parameter of its own
(its table in pyproject.toml); the keys it once redeclared are refused, naming the shared one.
"""

from __future__ import annotations

import json

import pytest

from fedcluster_app.api import STRATEGIES
from fedcluster_app.core.config import MOVED_KEYS, ConfigError
from fedcluster_app.engine import run_inprocess
from tests.support import WALL_CLOCK

# small enough for every strategy to train in its first rounds; SGD so that momentum counts
BASE = {"scenario": "mixture-swap", "num-clients": 4, "num-steps": 2, "rounds-per-step": 1,
        "samples-per-step": 40, "test-samples": 20, "optimizer": "sgd", "lr": 0.05,
        "momentum": 0.5, "weight-decay": 0.001, "batch-size": 8, "local-steps": 2,
        "progress": False, "plot": False, "protocol": "none", "batch-clients": False}
#: each shared training setting, and a value it is changed to
CHANGES = {"optimizer": "adam", "lr": 0.02, "momentum": 0.0, "weight-decay": 0.01,
           "batch-size": 5, "local-steps": 3, "prox-mu": 0.5}
#: ... and in whole epochs instead of steps (40 rows in batches of 7: drop-last drops 5)
EPOCHS = {"local-steps": 0, "local-epochs": 1, "batch-size": 7}
EPOCH_CHANGES = {"local-epochs": 2, "drop-last": True}
#: a strategy may refuse a setting it has no use for, naming it, instead of honouring it
REFUSABLE = {"prox-mu"}


def _numbers(tmp_path, name: str, cfg: dict) -> list[dict] | str:
    """The run's metrics without wall-clock readings, or the refusal of a key it has no use
    for (the message must name it)."""
    out = tmp_path / name
    try:
        run_inprocess({**cfg, "out-dir": str(out)})
    except ConfigError as exc:
        key = name.split("=")[0]
        if key in REFUSABLE and f"{key} must be" in str(exc):
            return "refused"
        raise
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in WALL_CLOCK} for row in rows]


@pytest.mark.matrix
@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_every_shared_training_setting_reaches_the_clients(tmp_path, strategy):
    ignored = []
    for base_cfg, changes in (({**BASE, "strategy": strategy}, CHANGES),
                              ({**BASE, **EPOCHS, "strategy": strategy}, EPOCH_CHANGES)):
        base = _numbers(tmp_path, f"base-{len(changes)}", base_cfg)
        ignored += [key for key, value in changes.items()
                    if _numbers(tmp_path, f"{key}={value}", {**base_cfg, key: value}) == base]
    assert ignored == [], f"{strategy}'s clients ignore the shared training setting(s) {ignored}"


@pytest.mark.parametrize("old,new", sorted(MOVED_KEYS.items()))
def test_a_key_the_shared_recipe_replaced_is_refused_naming_it(tmp_path, old, new):
    strategy = next(name for name, cls in sorted(STRATEGIES.items())
                    if cls.Params.table == old.split(".")[0])
    with pytest.raises(ConfigError, match=rf"{old} is no longer a run-config key: the shared "
                                          rf"training setting {new.split()[0]}"):
        run_inprocess({**BASE, "strategy": strategy, old: 1, "out-dir": str(tmp_path / "x")})


def test_the_family_tables_no_longer_redeclare_the_recipe():
    shared = {"optimizer", "lr", "momentum", "weight-decay", "local-steps", "local-epochs",
              "batch-size", "drop-last"}
    for name, cls in sorted(STRATEGIES.items()):
        assert not shared & set(cls.Params.keys()), (name, sorted(shared & set(cls.Params.keys())))
