"""Bounded sizes (core/limits.py): every size key is capped, and so is every product of sizes
that drives a run's memory, before round 1, with a message naming the keys and the numbers;
what a user realistically runs stays accepted (docs/operations/reliability.md, "Bounded
sizes")."""

from __future__ import annotations

import math
import re

import pytest

from fedcluster_app import api
from fedcluster_app.cli import main
from fedcluster_app.core import limits
from fedcluster_app.core.config import ConfigError, parse_run_config
from fedcluster_app.core.data import schedules
from fedcluster_app.core.data.catalogue import scenario_names
from fedcluster_app.core.experiment import load_experiment
from fedcluster_app.core.models import ModelSpec, parameter_count, weight_shapes

from tests.support import ROOT
GiB = 1 << 30


def build(strategy: str = "fedavg", **config) -> object:
    """The strategy as a run builds it before round 1 (what `fedcluster run` refuses with)."""
    return api.build_strategy(load_experiment({"strategy": strategy, **config}, server=True))


def refused(match: str, strategy: str = "fedavg", **config) -> str:
    with pytest.raises(ConfigError) as err:
        build(strategy, **config)
    text = str(err.value)
    assert re.search(match, text), text
    return text


# ------------------------------------------------------------------------- one key at a time
KEY_CAPS = [
    ("num-steps", limits.MAX_STEPS), ("rounds-per-step", limits.MAX_ROUNDS),
    ("hidden", limits.MAX_HIDDEN), ("num-clusters", limits.MAX_CLUSTERS),
    ("window", limits.MAX_STEPS), ("drift-step", limits.MAX_STEPS),
    ("local-steps", limits.MAX_ITERATIONS), ("local-epochs", limits.MAX_EPOCHS),
    ("batch-size", limits.MAX_SAMPLES), ("num-classes", limits.MAX_CLASSES),
    ("classes-per-client", limits.MAX_CLASSES), ("min-nodes", limits.MAX_CLIENTS),
]


@pytest.mark.parametrize("key, cap", KEY_CAPS, ids=[k for k, _ in KEY_CAPS])
def test_every_size_key_is_capped_and_the_message_names_it(key, cap):
    with pytest.raises(ConfigError, match=rf"^{key} must be an integer in \[\d, {cap:,}\], "
                                          rf"got {cap + 1}$".replace(",", ",?")):
        parse_run_config({key: cap + 1})
    assert parse_run_config({key: cap}).raw[key] == cap      # the cap itself is a valid value


FAMILY_CAPS = [
    ("ifca", "num-clusters", limits.MAX_CLUSTERS),
    ("fedgroup", "fedgroup.num-groups", limits.MAX_CLUSTERS),
    ("fesem", "fesem.num-groups", limits.MAX_CLUSTERS),
    ("flexcfl-ifca", "flexcfl-ifca.num-groups", limits.MAX_CLUSTERS),
    ("flexcfl", "flexcfl.clients-per-round", limits.MAX_CLIENTS),
    ("flexcfl", "flexcfl.pretrain-iters", limits.MAX_ITERATIONS),
    ("cfl-rounds", "cfl-rounds.max-clusters", limits.MAX_CLUSTERS),
    ("fielding", "fielding.k-max", limits.MAX_CLUSTERS),
    ("fielding", "fielding.n-init", limits.MAX_RESTARTS),
    ("fielding", "fielding.probe-steps", limits.MAX_ITERATIONS),
    ("auxo", "auxo.max-cohorts", limits.MAX_CLUSTERS),
    ("fedrc", "fedrc.em-iters", limits.MAX_ITERATIONS),
    ("feddrift", "feddrift.subsample", limits.MAX_SAMPLES),
    ("fedccfa", "fedccfa.clf-epochs", limits.MAX_EPOCHS),
    ("fedbabu", "fedbabu.ft-epochs", limits.MAX_EPOCHS),
]


@pytest.mark.parametrize("strategy, key, cap", FAMILY_CAPS, ids=[k for _, k, _ in FAMILY_CAPS])
def test_every_cluster_count_and_iteration_key_of_the_families_is_capped(strategy, key, cap):
    refused(rf"^{re.escape(key)} must be an integer in \[\d, {cap:,}\]".replace(",", ",?"),
            strategy, **{key: cap + 1})


# ---------------------------------------------------------------------- products, before round 1
def test_the_issues_case_clients_and_samples_each_at_their_cap_is_refused():
    """num-clients and samples-per-step each at their own cap were accepted and no round ended
    in 90 s: the data a step draws is refused, naming both keys and the numbers."""
    text = refused(r"num-clients x \(samples-per-step \+ test-samples\) x bytes a row = "
                   r"100,000 x \(1,000,000 \+ 100\) x 40 = 3,725.7 GiB drawn per time step, "
                   r"over the cap of 16.0 GiB",
                   **{"num-clients": limits.MAX_CLIENTS, "samples-per-step": limits.MAX_SAMPLES})
    assert "lower num-clients, samples-per-step or test-samples" in text
    assert 'docs/operations/reliability.md, "Bounded sizes"' in text


def test_a_step_of_data_just_over_its_cap_is_refused_and_just_under_it_accepted():
    # mixture-swap: 8-d rows of 40 bytes; 10,000 clients, 100 test samples a step
    per_client = limits.MAX_STEP_DATA_BYTES // (10_000 * 40) - 100
    build(**{"num-clients": 10_000, "samples-per-step": per_client})
    refused("drawn per time step", **{"num-clients": 10_000, "samples-per-step": per_client + 1})


def test_clients_times_steps_is_refused_before_the_concept_matrix_is_built():
    # 100,000 x 10,000 int64 entries would be 8 GB: refused by the run config alone
    with pytest.raises(ConfigError, match=r"num-clients x num-steps = 100,000 x 10,000 = "
                                          r"1,000,000,000 client-steps"):
        parse_run_config({"num-clients": 100_000, "num-steps": 10_000})


def test_clients_times_rounds_is_refused():
    text = refused(r"num-clients x num-steps x rounds-per-step = 20,000 x 6 x 500 = "
                   r"60,000,000 client-rounds, over the cap of 50,000,000",
                   **{"num-clients": 20_000, "rounds-per-step": 500})
    assert "round records" in text


def test_steps_times_rounds_per_step_is_refused():
    refused(r"num-steps x rounds-per-step = 10,000 x 1,000 = 10,000,000 rounds, over the cap "
            r"of 1,000,000", **{"num-steps": 10_000, "rounds-per-step": 1_000})


def test_clients_times_classes_is_refused_before_the_priors_are_built():
    with pytest.raises(ConfigError, match=r"num-clients x num-classes = 100,000 x 10,000"):
        parse_run_config({"num-clients": 100_000, "num-classes": 10_000})


def test_one_clients_window_of_data_is_capped():
    # digits: 8x8 inputs, 264 bytes a row; 20 steps of 1,000,000 samples is 4.9 GiB
    refused(r"\(window x samples-per-step \+ test-samples\) x bytes a row = \(20 x 1,000,000 \+ "
            r"100\) x 264 = 4.9 GiB held by one client, over the cap of 4.0 GiB",
            **{"scenario": "digits-swap", "num-steps": 20, "window": 20,
               "samples-per-step": limits.MAX_SAMPLES})


def test_the_rows_one_client_trains_on_in_a_round_are_capped():
    refused(r"local-steps x batch-size = 1,000,000 x 1,000 = 1,000,000,000 rows a client trains "
            r"on per round", **{"samples-per-step": 1_000, "local-steps": limits.MAX_ITERATIONS,
                                "batch-size": 1_000})
    refused(r"local-epochs x window x samples-per-step = 10,000 x 1 x 100,000",
            **{"samples-per-step": 100_000, "local-steps": 0,
               "local-epochs": limits.MAX_EPOCHS})


def test_a_model_too_large_is_refused_before_it_is_built():
    """hidden at its cap on 3x64x64 inputs: 806 M parameters, counted on the meta device
    (nothing allocated), refused naming hidden."""
    refused(r"the model's parameters x 4 bytes \(mlp, hidden = 65,536\) = 806,027,274 x 4 = "
            r"3.0 GiB, over the cap of 1.0 GiB; lower hidden",
            **{"scenario": "dataset-static", "dataset": "npz:/no/such/data.npz",
               "input-shape": "3,64,64", "num-classes": 10, "model": "mlp",
               "hidden": limits.MAX_HIDDEN})


def test_clusters_times_model_size_is_refused_for_a_strategy_that_sends_every_model():
    """IFCA sends its K models to every client it trains: 1,000 clusters (their cap) of a
    3.4 MB model (hidden at its cap) for 10 clients is 31.7 GiB a round; each alone is fine."""
    big = {"scenario": "hyperplane2", "hidden": limits.MAX_HIDDEN}
    build("ifca", **big)
    build("ifca", **{"scenario": "hyperplane2", "num-clusters": limits.MAX_CLUSTERS})
    refused(r"fraction-train x num-clients x the models each is sent \(num-clusters\) x the "
            r"model's parameters x 4 bytes = 1 x 10 x 1,000 x 851,970 x 4 = 31.7 GiB of models "
            r"a round sends and gets back, over the cap of 8.0 GiB; lower num-clients, "
            r"fraction-train, num-clusters or the model's size",
            "ifca", **big, **{"num-clusters": limits.MAX_CLUSTERS})
    # FedAvg ignores num-clusters: the same sizes are one model
    build("fedavg", **big, **{"num-clusters": limits.MAX_CLUSTERS})
    refused(r"the models each is sent \(num-clusters\)", "fedrc", **big, **{"num-clusters": 500})


def test_the_models_a_strategy_keeps_are_capped():
    """Local keeps a personal model per client: 1,000 clients of a 19.6 MB MLP, even when a
    round trains only 1% of them."""
    refused(r"local's models \(num-clients\) x the model's parameters x 4 bytes = 1,000 x "
            r"4,915,210 x 4 = 18.3 GiB of models kept, over the cap of 8.0 GiB",
            "local", **{"scenario": "digits-swap", "model": "mlp", "hidden": limits.MAX_HIDDEN,
                        "num-clients": 1_000, "fraction-train": 0.01})


def test_clients_times_model_size_is_refused_for_one_model():
    # 100,000 clients of digits' MLP at hidden 20,000 (6 MB): 559 GiB of models a round
    refused(r"fraction-train x num-clients x the model's parameters x 4 bytes = 1 x 100,000 x "
            r"1,500,010 x 4", **{"scenario": "digits-swap", "model": "mlp", "hidden": 20_000,
                                 "num-clients": limits.MAX_CLIENTS, "samples-per-step": 10,
                                 "test-samples": 10})


# ---------------------------------------------------------------------- a schedule file's size
def test_a_schedule_wider_than_the_clients_cap_is_refused_at_its_first_line(tmp_path):
    path = tmp_path / "wide.cp"
    path.write_text(" ".join(["0"] * (limits.MAX_CLIENTS + 1)) + "\n" + "0\n" * 3)
    with pytest.raises(ConfigError, match=rf"schedule file '{re.escape(str(path))}': line 1 has "
                                          rf"100,001 columns "
                                          rf"\(clients\), over the cap of 100,000 \(the run-config "
                                          rf"key schedule"):
        load_experiment({"scenario": "sine2", "schedule": str(path)})


def test_a_schedule_longer_than_the_steps_cap_is_refused(tmp_path):
    path = tmp_path / "long.cp"
    path.write_text("0 1\n" * (limits.MAX_STEPS + 1))
    with pytest.raises(ConfigError, match=r"10,001 rows \(time steps\) of 2 columns \(clients\) "
                                          r"by line 10001, over the cap of 10,000 rows"):
        schedules.load_cp(path)


def test_a_schedules_entries_and_lines_are_capped_while_it_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr(schedules, "MAX_CLIENT_ROUNDS", 100)
    path = tmp_path / "many.cp"
    path.write_text("0 0 0 0 0 0 0 0 0 0\n" * 11)           # 110 entries, 10 each line
    with pytest.raises(ConfigError, match="11 rows .* by line 11"):
        schedules.load_cp(path)
    monkeypatch.setattr(schedules, "_MAX_LINE", 40)
    path.write_text("0 " * 30 + "\n")
    with pytest.raises(ConfigError, match="line 1 is longer than 40 characters"):
        schedules.load_cp(path)


def test_a_schedule_repeated_to_num_steps_is_capped_before_the_matrix_is_built(tmp_path):
    path = tmp_path / "one-row.cp"
    path.write_text(" ".join(["0"] * limits.MAX_CLIENTS) + "\n")
    with pytest.raises(ConfigError, match=r"num-clients x num-steps = 100,000 x 1,000"):
        load_experiment({"scenario": "sine2", "schedule": str(path), "num-steps": 1_000})


# ------------------------------------------------------------------ what users run stays accepted
def test_the_largest_realistic_runs_are_accepted():
    # users ask for 100,000 clients (with small steps of data); measured: 166 s a round and
    # 3.7 GB at the peak for FedAvg on this scenario (docs/operations/reliability.md)
    build(**{"num-clients": limits.MAX_CLIENTS, "samples-per-step": 100})
    # the papers' largest population (Fielding: Open Images, 5,078 clients), 500 samples of
    # 8x8 images a step, with the CNN, under FedAvg and under IFCA's three models
    five_k = {"scenario": "digits-swap", "num-clients": 5_078, "samples-per-step": 500}
    build(**five_k)
    build("ifca", **five_k, **{"num-clusters": 3})
    # a long stream, and a wide MLP
    build(**{"num-steps": limits.MAX_STEPS, "rounds-per-step": 100})
    build(**{"hidden": 4_096, "num-clients": 1_000})


def test_every_scenario_and_strategy_at_their_defaults_is_within_the_caps():
    """Existing configurations are unchanged: every scenario (but those that read files this
    machine lacks) and every registered strategy, at their defaults, pass every check."""
    for name in scenario_names():
        if name.startswith(("dataset-", "mnist-", "fmnist-", "cifar10-")):
            continue
        load_experiment({"scenario": name}, server=True)
    for name in api.STRATEGIES:
        build(name, scenario="mixture-swap")


def test_the_meta_count_is_the_built_models():
    for spec in (ModelSpec("mlp", (8,), 4, 32), ModelSpec("mlp", (18,), 7, 0),
                 ModelSpec("cnn", (1, 8, 8), 10), ModelSpec("cnn", (3, 32, 32), 10, 0, "normal")):
        assert parameter_count(spec) == sum(math.prod(s) for s in weight_shapes(spec))


# --------------------------------------------------------------------------------- the command
def test_a_refused_run_exits_2_before_anything_is_written(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "--set", f"num-clients={limits.MAX_CLIENTS}", "--set",
                 f"samples-per-step={limits.MAX_SAMPLES}", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "run too large: num-clients x (samples-per-step + test-samples)" in err
    assert not out.exists()
    assert main(["run", "--strategy", "ifca", "--set", "scenario=hyperplane2", "--set",
                 f"hidden={limits.MAX_HIDDEN}", "--set", f"num-clusters={limits.MAX_CLUSTERS}",
                 "--out", str(out)]) == 2
    assert "the models each is sent (num-clusters)" in capsys.readouterr().err
    assert not out.exists()


def test_every_cap_is_documented():
    """docs/operations/reliability.md's "Bounded sizes" names every cap of core/limits.py."""
    text = (ROOT / "docs/operations/reliability.md").read_text()
    section = text[text.index("## Bounded sizes"):]
    section = section[:section.index("\n## ", 1)]
    caps = [name for name in dir(limits) if name.startswith("MAX_")]
    assert len(caps) >= 15
    assert [name for name in caps if f"`{name}`" not in section] == []
