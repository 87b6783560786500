"""How large a run may be: every size key's cap, and the caps on the products of sizes that
drive a run's memory, checked before round 1 (docs/operations/reliability.md, "Bounded sizes").

A key is capped alone by its field's bound (``param(..., le=MAX_...)``). Keys within their
caps can still multiply to a run that cannot work on one machine (100,000 clients of 1,000,000
samples each: each key accepted, no round ever ended), so the products are capped too, each by
the memory it implies. A refusal names the keys, their values and the cap, and raises
:class:`ConfigError` (``fedcluster run`` exits 2 before anything is written). The budgets
assume one machine of 16-32 GB, the same machine every process of a simulation shares.

A leaf module (no package import but ``hparams``): the run config's fields, the families'
hyper-parameters and the schedule reader take their caps from here.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from fedcluster_app.core.hparams import ConfigError

GiB = 1 << 30

# ----------------------------------------------------------------------- one key at a time
#: clients of one run: each has its own data stream, record and metrics entries
MAX_CLIENTS = 100_000
#: samples a client draws per time step (samples-per-step, test-samples, batch-size, ...)
MAX_SAMPLES = 1_000_000
#: time steps (num-steps, window, drift-step, a schedule file's rows)
MAX_STEPS = 10_000
#: rounds of one run (rounds-per-step alone, and num-steps x rounds-per-step): a round keeps a
#: record of 2.7 KB in memory (measured, clients' entries apart) and writes a line of
#: metrics.jsonl, so 1,000,000 rounds hold ~2.7 GB
MAX_ROUNDS = 1_000_000
#: the MLP's hidden width; its model (inputs x hidden) is capped by MAX_MODEL_BYTES too
MAX_HIDDEN = 65_536
#: cluster models a strategy starts with or may grow to (num-clusters, num-groups,
#: max-clusters, k-max, max-cohorts); the papers use 2-10, a silhouette search up to N - 1
MAX_CLUSTERS = 1_000
#: classes of a dataset (num-classes, classes-per-client); a client draws from a prior over
#: them, so num-clients x classes is capped too (MAX_CLIENT_CLASSES)
MAX_CLASSES = 10_000
#: optimiser steps of one client and round, or of a strategy's own phase (local-steps,
#: pretrain-iters, probe-steps, em-iters, bal-steps)
MAX_ITERATIONS = 1_000_000
#: epochs of one client and round (local-epochs, clf-epochs, newcomer-epochs, ft-epochs)
MAX_EPOCHS = 10_000
#: restarts of a clustering (n-init, n-keep)
MAX_RESTARTS = 1_000

# ------------------------------------------------------------------------------ products
#: num-clients x rounds: a round's record keeps every client's accuracy and assignment,
#: about 120 bytes a client in memory (the whole run's records are kept for the summary and
#: the plot) and 40 bytes in metrics.jsonl (measured): 50 M client-rounds are ~6 GB held and
#: ~2 GB written. Before the scenario exists, num-clients x num-steps is held to it as well
#: (the concept matrix, 8 bytes an entry, is built from them; a round per step at least).
MAX_CLIENT_ROUNDS = 50_000_000
#: num-clients x classes: every client's class prior is built with the scenario (8 bytes a
#: class): 800 MB
MAX_CLIENT_CLASSES = 100_000_000
#: num-clients x (samples-per-step + test-samples) x the bytes of a row (float32 inputs and an
#: int64 label): the data one time step draws. It is drawn client by client and a process
#: caches 1.25 GiB of it, so this bounds time more than memory, and a step over the cache is
#: drawn again every round: at the 0.6 M rows/s the 8-d mixture draws (40-byte rows) and the
#: 0.12 M rows/s of the 8x8 digits (264-byte rows), measured, 16 GiB is 11 and 9 minutes
MAX_STEP_DATA_BYTES = 16 * GiB
#: (window x samples-per-step + test-samples) x the bytes of a row: the data one client holds
#: at once (its window's training steps concatenated and its test split), on its device or,
#: in a simulation, in the process that runs it; the caches always keep the newest entry
MAX_CLIENT_DATA_BYTES = 4 * GiB
#: rows one client trains on in a round: local-steps x min(batch-size, its rows), or
#: local-epochs x its rows; their indices are drawn at once (8 bytes each): 800 MB
MAX_ROUND_ROWS = 100_000_000
#: the model's parameters (and buffers) x 4 bytes: one model; a strategy holds several, a
#: client one, the batched engine one per client of a round
MAX_MODEL_BYTES = 1 * GiB
#: the models a strategy keeps from its start (num-clusters, num-groups; Local: one per
#: client) x the model's bytes, held by the server (by the clients in a simulation)
MAX_MODELS_BYTES = 8 * GiB
#: the clients trained per round (fraction-train x num-clients) x the models each is sent
#: (IFCA's, FedRC's, FedSoft's: every model they keep) x the model's bytes: a round's models
#: out and back, all held at once by the server and, in a simulation, by the clients' process
#: (measured: 1.4-2x that at the peak: IFCA, 10 clients x 100 models of 3.4 MB, 4.7 GB above
#: its baseline; FedAvg, 100,000 clients x 55 kB, over 10 GB within round 1): ~16 GB
MAX_ROUND_MODELS_BYTES = 8 * GiB

WHERE = "docs/operations/reliability.md, \"Bounded sizes\""


def _gib(nbytes: float) -> str:
    return f"{nbytes / GiB:,.1f} GiB" if nbytes >= GiB / 10 else f"{nbytes / 2**20:,.1f} MiB"


def refuse(keys: str, values: str, result: str, cap: str, lower: str) -> ConfigError:
    """The one refusal: ``keys`` (their product) = ``values`` = ``result``, over ``cap``."""
    return ConfigError(f"run too large: {keys} = {values} = {result}, over the cap of {cap}; "
                       f"lower {lower} ({WHERE})")


def check_client_steps(clients: int, steps: int) -> None:
    """``num-clients x num-steps`` within MAX_CLIENT_ROUNDS, before a concept matrix of that
    many entries is built (a run has at least one round per step)."""
    if clients * steps > MAX_CLIENT_ROUNDS:
        raise refuse("num-clients x num-steps", f"{clients:,} x {steps:,}",
                     f"{clients * steps:,} client-steps (a round each at least)",
                     f"{MAX_CLIENT_ROUNDS:,} client-rounds", "num-clients or num-steps")


def check_client_classes(clients: int, classes: int) -> None:
    """``num-clients x num-classes`` within MAX_CLIENT_CLASSES, before the clients' class
    priors are built."""
    if clients * classes > MAX_CLIENT_CLASSES:
        raise refuse("num-clients x num-classes", f"{clients:,} x {classes:,}",
                     f"{clients * classes:,} class priors", f"{MAX_CLIENT_CLASSES:,} (8 bytes "
                     "each)", "num-clients or num-classes")


def row_bytes(input_shape: tuple[int, ...]) -> int:
    """One row of data: float32 inputs and an int64 label."""
    return 4 * math.prod(input_shape) + 8


def check_run(cfg: Any, scenario: Any, parameters: int) -> None:
    """Every product cap on the run's real sizes (the scenario's where the config says 0):
    ``cfg`` a RunConfig, ``scenario`` its Scenario, ``parameters`` the model's numbers."""
    clients, steps, per_step = scenario.num_clients, scenario.num_steps, cfg.rounds_per_step
    if clients > MAX_CLIENTS:      # a schedule's columns, one client per partition value
        raise ConfigError(f"run too large: the scenario has {clients:,} clients (its schedule's "
                          f"columns or its dataset's partition values), over the cap of "
                          f"{MAX_CLIENTS:,} (num-clients) ({WHERE})")
    if steps > MAX_STEPS:
        raise ConfigError(f"run too large: the scenario has {steps:,} time steps, over the cap "
                          f"of {MAX_STEPS:,} (num-steps) ({WHERE})")
    if scenario.num_classes > MAX_CLASSES:
        raise ConfigError(f"run too large: the dataset has {scenario.num_classes:,} classes, "
                          f"over the cap of {MAX_CLASSES:,} (num-classes) ({WHERE})")
    check_client_classes(clients, scenario.num_classes)
    rounds = steps * per_step
    if rounds > MAX_ROUNDS:
        raise refuse("num-steps x rounds-per-step", f"{steps:,} x {per_step:,}",
                     f"{rounds:,} rounds", f"{MAX_ROUNDS:,} (~2.7 GB of round records)",
                     "num-steps or rounds-per-step")
    if clients * rounds > MAX_CLIENT_ROUNDS:
        raise refuse("num-clients x num-steps x rounds-per-step",
                     f"{clients:,} x {steps:,} x {per_step:,}",
                     f"{clients * rounds:,} client-rounds",
                     f"{MAX_CLIENT_ROUNDS:,} (~6 GB of round records in memory)",
                     "num-clients, num-steps or rounds-per-step")
    _check_data(cfg, scenario)
    model = 4 * parameters
    if model > MAX_MODEL_BYTES:
        hidden = cfg.hidden or scenario.hidden
        raise refuse(f"the model's parameters x 4 bytes ({cfg.model or scenario.model}"
                     f"{f', hidden = {hidden:,}' if hidden else ''})", f"{parameters:,} x 4",
                     _gib(model), _gib(MAX_MODEL_BYTES), "hidden or the model's size")


def _check_data(cfg: Any, scenario: Any) -> None:
    clients, steps = scenario.num_clients, scenario.num_steps
    # a scenario of per-client dataset sizes (samples-per-step 0): its largest client's step
    train = scenario.samples_per_step or (scenario.max_client_examples() or 0) // steps
    test, row = scenario.test_samples, row_bytes(scenario.input_shape)
    step = clients * (train + test) * row
    if step > MAX_STEP_DATA_BYTES:
        raise refuse("num-clients x (samples-per-step + test-samples) x bytes a row",
                     f"{clients:,} x ({train:,} + {test:,}) x {row:,}",
                     f"{_gib(step)} drawn per time step", _gib(MAX_STEP_DATA_BYTES),
                     "num-clients, samples-per-step or test-samples")
    window = min(cfg.window, steps)
    held = (window * train + test) * row
    if held > MAX_CLIENT_DATA_BYTES:
        raise refuse("(window x samples-per-step + test-samples) x bytes a row",
                     f"({window:,} x {train:,} + {test:,}) x {row:,}",
                     f"{_gib(held)} held by one client", _gib(MAX_CLIENT_DATA_BYTES),
                     "window, samples-per-step or test-samples")
    t, rows = cfg.train, window * train
    if t.local_steps > 0:
        keys, values = "local-steps x batch-size", f"{t.local_steps:,} x {t.batch_size:,}"
        trained = t.local_steps * min(t.batch_size, rows)
        if t.batch_size > rows:
            values += f" (its {rows:,} rows)"
    else:
        keys = "local-epochs x window x samples-per-step"
        values, trained = f"{t.local_epochs:,} x {window:,} x {train:,}", t.local_epochs * rows
    if trained > MAX_ROUND_ROWS:
        raise refuse(keys, values, f"{trained:,} rows a client trains on per round",
                     f"{MAX_ROUND_ROWS:,} (their indices are drawn at once, 8 bytes each)",
                     keys.replace(" x ", ", "))


class ModelCount(NamedTuple):
    """The models a strategy keeps from its start (``ClusteredStrategy.model_count``)."""

    kept: int = 1      # held from the start (by the server; Local: one per client, on them)
    each: int = 1      # sent to (or trained by) each client it trains, per round
    key: str = ""      # the run-config key that sets them


def check_models(strategy: str, count: ModelCount, parameters: int, fraction: float,
                 clients: int) -> None:
    """The models ``strategy`` keeps, and those a round exchanges with the clients it trains
    (``fraction`` of ``clients``: fraction-train x num-clients), x the model's bytes."""
    model = 4 * parameters
    kept = count.kept * model
    if kept > MAX_MODELS_BYTES:
        raise refuse(f"{strategy}'s models ({count.key}) x the model's parameters x 4 bytes",
                     f"{count.kept:,} x {parameters:,} x 4", f"{_gib(kept)} of models kept",
                     _gib(MAX_MODELS_BYTES), f"{count.key} or the model's size")
    exchanged = math.ceil(fraction * clients) * count.each * model
    if exchanged > MAX_ROUND_MODELS_BYTES:
        many = count.each > 1
        raise refuse("fraction-train x num-clients"
                     f"{f' x the models each is sent ({count.key})' if many else ''} x the "
                     "model's parameters x 4 bytes",
                     f"{fraction:g} x {clients:,}{f' x {count.each:,}' if many else ''} x "
                     f"{parameters:,} x 4", f"{_gib(exchanged)} of models a round sends and "
                     f"gets back", _gib(MAX_ROUND_MODELS_BYTES),
                     f"num-clients, fraction-train{f', {count.key}' if many else ''} or the "
                     "model's size")
