"""Bad input fails early with a clear message; bad clients lose nothing but themselves."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from flwr.app import ArrayRecord

from fedcluster_app.api import STRATEGIES
from fedcluster_app.client_app import app as client_app
from fedcluster_app.core import wire as P
from fedcluster_app.core.config import ConfigError
from fedcluster_app.core.results import load_run
from fedcluster_app.engine import run_inprocess


class CountingApp:
    def __init__(self):
        self.calls = 0

    def __call__(self, msg, ctx):
        self.calls += 1
        return client_app(msg, ctx)


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ({"strategy": "no-such-algo"}, "valid strategies: " + ", ".join(sorted(STRATEGIES))),
        ({"scenario": "no-such-data"}, "circle2"),
        ({"lr": -0.1}, "lr must be > 0"),
        ({"num-clusters": 0}, "num-clusters must be an integer in [1, 1000]"),
        ({"rounds-per-step": 0}, "rounds-per-step must be an integer in [1, 1,000,000]"),
        ({"fraction-train": 1.5}, "fraction-train must be in (0, 1]"),
        ({"optimizer": "lbfgs"}, "optimizer must be"),
        ({"schedule": "/no/such/file.cp"}, "schedule file not found"),
        # non-finite and impossible sizes: refused here, not accepted (inf) or left to hang
        ({"weight-decay": float("inf")}, "weight-decay must be >= 0, got inf"),
        ({"prox-mu": float("inf")}, "prox-mu must be >= 0, got inf"),
        ({"node-wait-s": float("inf")}, "node-wait-s must be >= 0"),
        ({"num-clients": 10_000_000}, "num-clients must be an integer in [0, 100,000], got 10000000"),
        ({"samples-per-step": 1_000_000_000}, "samples-per-step must be an integer in "
                                              "[0, 1,000,000], got 1000000000"),
    ],
)
def test_invalid_config_fails_before_the_first_round(fast_config, overrides, expected):
    app = CountingApp()
    with pytest.raises(ValueError) as err:
        run_inprocess(fast_config(**overrides), num_nodes=10, client_app=app)
    assert expected in str(err.value)
    assert app.calls == 0


def test_unknown_config_key_is_named(fast_config):
    with pytest.raises(ConfigError, match="unknown run-config key 'learning-rate'"):
        run_inprocess(fast_config() | {"learning-rate": 0.1})


def test_schedule_with_wrong_number_of_columns(fast_config, tmp_path):
    cp = tmp_path / "three.cp"
    cp.write_text("0 0 0\n0 1 1\n1 1 1\n")
    app = CountingApp()
    with pytest.raises(ValueError, match="column"):
        run_inprocess(fast_config(scenario="circle2", schedule=str(cp), num_clients=10),
                      num_nodes=10, client_app=app)
    assert app.calls == 0


def _corrupt(reply, how):
    for key in list(reply.content.array_records):
        arrays = reply.content.array_records[key].to_numpy_ndarrays()
        if how == "shape":
            arrays[0] = np.zeros((3, 3), np.float32)
        else:
            arrays[0] = np.full_like(arrays[0], np.nan)
        reply.content[key] = ArrayRecord(arrays)
    return reply


def misbehaving_app(msg, ctx):
    """Client 3 replies with wrong shapes, client 4 with NaNs, client 5 raises when training."""
    pid = ctx.node_config["partition-id"]
    if pid == 5 and msg.metadata.message_type == P.TRAIN:
        raise RuntimeError("disk full")
    reply = client_app(msg, ctx)
    if msg.metadata.message_type == P.TRAIN and pid in (3, 4):
        reply = _corrupt(reply, "shape" if pid == 3 else "nan")
    return reply


@pytest.mark.parametrize("strategy", ["fedavg", "ifca"])
def test_bad_replies_are_rejected_and_the_run_goes_on(fast_config, strategy):
    summary = run_inprocess(fast_config(strategy=strategy), client_app=misbehaving_app)
    _, rounds = load_run(Path(summary["out_dir"]))
    assert summary["status"] == "completed" and len(rounds) == 12
    assert all(r["failures"] == 3 for r in rounds)       # counted in metrics.jsonl
    assert all(r["trained_clients"] == 7 for r in rounds)
    assert all(r["evaluated_clients"] == 10 for r in rounds)
    assert summary["failures"] == 36
    assert summary["mean_accuracy"] > 0.4                  # the bad updates never reached a model


def test_nodes_without_or_with_a_taken_client_id_are_refused_and_the_run_goes_on(fast_config, caplog):
    from fedcluster_app.core.config import default_run_config, merge_overrides
    from fedcluster_app.engine import InProcessGrid
    from fedcluster_app.server_app import run_server

    def node_config(i):
        if i == 10:
            return {}                          # a SuperNode started without client-id
        if i == 11:
            return {"client-id": 4}            # claims an id another live node holds
        return {"client-id": i}

    rc = merge_overrides(default_run_config(), fast_config(strategy="fedavg"))
    grid = InProcessGrid(rc, 12, node_config=node_config)
    caplog.set_level("INFO", logger="flwr")
    summary = run_server(grid, rc)
    _, rounds = load_run(Path(summary["out_dir"]))
    assert summary["status"] == "completed"
    assert all(r["evaluated_clients"] == 10 and r["failures"] == 0 for r in rounds)
    text = caplog.text
    assert "could not answer the discovery query" in text and "client-id" in text
    assert "client id 4 is already held by node" in text


def test_a_schedule_with_an_out_of_range_concept_id_names_the_file(fast_config, tmp_path):
    cp = tmp_path / "huge.cp"
    cp.write_text("0 0\n0 99999999999999999999\n")
    with pytest.raises(ValueError, match=rf"schedule file '{cp}', line 2: concept id "
                                         r"99999999999999999999 is out of range"):
        run_inprocess(fast_config(scenario="circle2", schedule=str(cp)), client_app=CountingApp())


@pytest.mark.parametrize("bind", [False, True])
def test_with_bind_client_ids_no_other_node_takes_over_a_client_id(fast_config, caplog, bind):
    """Client 4's node stops answering after round 2; from round 4 another node claims
    client id 4. Without bind-client-ids it takes the client over (a device that came back
    under a new node id, as without authentication); with it, the first node owns the id for
    the run: the newcomer is refused and logged, and it never trains as client 4."""
    from fedcluster_app.client_app import app as honest
    from fedcluster_app.core.config import default_run_config, merge_overrides
    from fedcluster_app.engine import InProcessGrid
    from fedcluster_app.server_app import run_server

    class LateNode(InProcessGrid):   # node 10 (the claimant) joins from round 4
        round = 0

        def get_node_ids(self):
            ids = list(self.contexts)
            return ids if self.round >= 4 else ids[:10]

    def app(msg, ctx):
        config = msg.content["config"]
        grid.round = max(grid.round, int(config.get(P.ROUND, 0)))
        if ctx.node_config["client-id"] == 4 and ctx.node_id == owner and grid.round >= 3:
            raise ConnectionError("device offline")
        return honest(msg, ctx)

    rc = merge_overrides(default_run_config(),
                         fast_config(strategy="fedavg", num_steps=3, bind_client_ids=bind))
    grid = LateNode(rc, 11, client_app=app,
                    node_config=lambda i: {"client-id": 4 if i == 10 else i})
    owner = list(grid.contexts)[4]
    claimant = list(grid.contexts)[10]
    caplog.set_level("INFO", logger="flwr")
    summary = run_server(grid, rc)
    _, rounds = load_run(Path(summary["out_dir"]))
    assert summary["status"] == "completed"
    trained_4_late = [r["round"] for r in rounds[4:] if 4 not in r["failed_clients"]]
    from fedcluster_app.core.server.checkpoint import read_checkpoint

    owners = {c["cid"]: c["owner"] for c in read_checkpoint(Path(summary["out_dir"]))[0]["clients"]}
    if bind:
        assert f"node {claimant} refused: client id 4 belongs to node {owner}" in caplog.text
        assert trained_4_late == []   # client 4 is its owner's only: offline, it misses rounds
        assert owners[4] == owner     # kept for a resumed run
    else:
        assert f"client 4 is back on node {claimant}" in caplog.text
        assert trained_4_late == [5, 6]
        assert set(owners.values()) == {None}
