"""The NumPyClient over a client's drifting data stream.

At time step t the client trains on the window of its last ``window`` steps and tests on the
held-out split of step t. Its data are regenerated deterministically from (scenario, client,
step, seed) on every call, so the only memory it keeps between rounds is what lives in
``context.state``: its personal model (strategies whose model never leaves the client),
counters, and with ``optimizer-state = "step"`` its optimizers' state per model for the current
time step.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, MetricRecord, RecordDict
from flwr.client import NumPyClient
from torch import nn

from fedcluster_app.core import codec
from fedcluster_app.core import wire as P
from fedcluster_app.core.client.batched import FitJob, run_jobs
from fedcluster_app.core.config import TrainConfig
from fedcluster_app.core.experiment import Experiment
from fedcluster_app.core.models import (
    build_model,
    initial_weights,
    prepare_device,
    resolve_device,
    scratch_model,
    set_weights,
)
from fedcluster_app.core.sampling import seeded
from fedcluster_app.core.training import (
    OptimizerState,
    evaluate,
    evaluate_mixture,
    limit_threads,
    round_draws,
)

PERSONAL_KEY = "personal-model"
COUNTERS_KEY = "client-counters"
OPTIMIZER_PREFIX = P.OPTIMIZER_PREFIX   # + stream id (a model id): one record per model
_STATE_STEP = "time-step"               # the time step an optimizer state belongs to

# the shared training settings a message may not change (wire.TRAIN_OVERRIDES are the ones it may)
_FIXED_TRAIN_KEYS = frozenset(f.name.replace("_", "-") for f in dataclasses.fields(TrainConfig)
                              ) - set(P.TRAIN_OVERRIDES)


@functools.lru_cache(maxsize=256)
def _with_overrides(base: TrainConfig, overrides: tuple[tuple[str, type, Any], ...]) -> TrainConfig:
    """``base`` with a message's overrides, once per distinct overrides (the value's type is part
    of the key: 1, 1.0 and True hash alike); every message of a round asks for the same one."""
    return dataclasses.replace(base, **{name: value for name, _, value in overrides})


class StreamClient(NumPyClient):
    def __init__(self, client_id: int, experiment: Experiment, state: RecordDict) -> None:
        scenario = experiment.scenario
        if not 0 <= client_id < scenario.num_clients:
            raise ValueError(
                f"client id {client_id} is outside the scenario {scenario.name!r}, which has "
                f"{scenario.num_clients} clients (ids 0..{scenario.num_clients - 1})"
            )
        limit_threads()
        self.client_id = client_id
        self.exp = experiment
        self.state = state
        self.device = resolve_device(experiment.cfg.device)
        prepare_device(self.device, experiment.cfg.deterministic)
        # optimizer states handed to this message's jobs, kept when its handler finishes
        self._open_states: dict[str, tuple[int, OptimizerState]] = {}

    # -- models on this client's device -------------------------------------------------------
    def scratch(self, weights: list[np.ndarray]) -> nn.Module:
        """The cached scratch module loaded with ``weights`` (do not keep it across calls)."""
        return scratch_model(self.exp.spec, weights, self.device)

    def fresh_model(self, seed: int | None = 0, weights: list[np.ndarray] | None = None
                    ) -> nn.Module:
        """A module of its own (safe to keep), on this client's device."""
        model = build_model(self.exp.spec, seed).to(self.device)
        if weights is not None:
            set_weights(model, weights)
        return model

    # -- data ---------------------------------------------------------------------------
    def train_data(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        return self.exp.scenario.window(self.client_id, step, self.exp.cfg.window)

    def test_data(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        data = self.exp.scenario.step_data(self.client_id, step)
        return data.x_test, data.y_test

    def steps_data(self, steps: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """Training data of the given time steps, concatenated (e.g. a cluster's history);
        read-only."""
        return self.exp.scenario.train_steps(self.client_id, [int(t) for t in steps])

    def fit_data(self, config: dict, model_id: int) -> tuple[np.ndarray, np.ndarray]:
        """What to train or probe on: ``data-steps[.<id>]`` if the server says so, else the window."""
        steps = config.get(f"{P.DATA_STEPS}.{model_id}", config.get(P.DATA_STEPS))
        return self.steps_data(list(steps)) if steps else self.train_data(int(config[P.STEP]))

    def eval_data(self, config: dict) -> tuple[np.ndarray, np.ndarray]:
        step = int(config.get(P.TEST_STEP, config[P.STEP]))
        if config.get(P.TEST_SPLIT, "test") == "train":
            return self.steps_data([step])
        return self.test_data(step)

    def balanced_data(self, config: dict) -> tuple[np.ndarray, np.ndarray] | None:
        """The class-balanced test sample of the step :meth:`eval_data` tests on, where the
        server asks for it (``balanced-test``, on the test split), else None."""
        if not config.get(P.BALANCED_TEST) or config.get(P.TEST_SPLIT, "test") != "test":
            return None
        step = int(config.get(P.TEST_STEP, config[P.STEP]))
        return self.exp.scenario.balanced_test(self.client_id, step)

    def concept(self, step: int) -> int:
        return int(self.exp.scenario.concept(self.client_id, step))

    def stream(self, server_round: int, model_id: int) -> tuple[int, ...]:
        """The seed words of this client's random stream for one model in one round."""
        return (self.exp.cfg.seed, self.client_id, server_round, model_id + 2**16)

    def rng(self, server_round: int, model_id: int) -> np.random.Generator:
        return seeded(*self.stream(server_round, model_id))

    def draws(self, server_round: int, model_id: int, n: int, cfg: TrainConfig,
              bootstrap: bool = False) -> tuple[np.ndarray | None, list[np.ndarray]]:
        """The minibatches (after a bootstrap sample of the rows, with ``bootstrap``) that the
        stream of ``model_id`` draws for training on n rows: ``training.round_draws``."""
        return round_draws(self.stream(server_round, model_id), n, cfg, bootstrap)

    def train_config(self, config: dict) -> TrainConfig:
        """The run's shared training settings, with the round's overrides a message may set."""
        fixed = _FIXED_TRAIN_KEYS.intersection(config)
        if fixed:
            raise ValueError(f"the message sets the run's training setting(s) "
                             f"{', '.join(sorted(fixed))}, which only the run config sets (a "
                             f"message may change {', '.join(P.TRAIN_OVERRIDES)})")
        overrides = tuple((P.TRAIN_OVERRIDES[k], type(v), v) for k, v in config.items()
                          if k in P.TRAIN_OVERRIDES)
        try:
            return _with_overrides(self.exp.cfg.train, overrides)
        except TypeError:       # an unhashable value: replace() takes it (or refuses it) itself
            return dataclasses.replace(self.exp.cfg.train, **{k: v for k, _, v in overrides})

    # -- NumPyClient ----------------------------------------------------------------------
    def fit(self, parameters, config):
        job = self.fit_job(parameters, config)
        (weights, loss), = run_jobs([job])
        self.keep_optimizer_states()
        self.count_trained()
        return weights, self.examples(len(job.y)), {P.TRAIN_LOSS: loss}

    def examples(self, n: int) -> int:
        """``n`` training rows as num-examples: at most the rows this client holds when they are
        fewer than a step asks for (a window of several steps repeats them)."""
        held = self.exp.scenario.rows_held(self.client_id)
        return n if held is None else min(int(n), held)

    def honest_counts(self, metrics: dict, model_metrics: dict) -> tuple[dict, dict]:
        """A training reply's metrics with every num-examples capped by :meth:`examples`."""
        def cap(m: dict) -> dict:
            if P.NUM_EXAMPLES not in m:
                return m
            return {**m, P.NUM_EXAMPLES: self.examples(m[P.NUM_EXAMPLES])}

        return cap(metrics), {mid: cap(m) for mid, m in model_metrics.items()}

    def fit_job(self, parameters, config, **kw) -> FitJob:
        """What ``fit`` trains, as a job a handler yields (``core/client/batched.py``): the model
        ``model-id`` on its data, minibatches drawn from this client's stream for that model."""
        mid = int(config.get(P.MODEL_ID, 0))
        x, y = self.fit_data(config, mid)
        return self.job(parameters, x, y, config, mid, **kw)

    def job(self, weights, x, y, config, stream_id: int, cfg: TrainConfig | None = None,
            **kw) -> FitJob:
        """A training job on (x, y) whose minibatches come from stream ``stream_id`` of this
        client's round."""
        cfg = cfg or self.train_config(config)
        kw.setdefault("optimizer_state", self.optimizer_state(config, stream_id, cfg))
        if len(y) == 0:
            raise ValueError("no training data")
        _, batches = self.draws(int(config[P.ROUND]), stream_id, len(y), cfg)
        return FitJob(self.exp.spec, weights, x, y, batches, cfg, device=self.device, **kw)

    def evaluate(self, parameters, config):
        x, y = self.eval_data(config)
        model = self.scratch(parameters)
        loss, acc = evaluate(model, x, y)
        metrics = {P.ACCURACY: acc}
        if (balanced := self.balanced_data(config)) is not None:
            metrics[P.BALANCED_ACCURACY] = evaluate(model, *balanced)[1]
        return loss, len(y), metrics

    # -- extra calls the clustered strategies need ------------------------------------------
    def evaluate_mixture(self, models: list[list[np.ndarray]], weights: list[float], config):
        """Test accuracy of the weighted mixture of several models (soft cluster assignments)."""
        if len(weights) != len(models) or min(weights) < 0 or sum(weights) <= 0:
            raise ValueError(f"mixture weights {weights} do not fit {len(models)} models")
        x, y = self.eval_data(config)
        nets = [self.fresh_model(0, w) for w in models]
        loss, acc = evaluate_mixture(nets, weights, x, y)
        metrics = {P.ACCURACY: acc}
        if (balanced := self.balanced_data(config)) is not None:
            metrics[P.BALANCED_ACCURACY] = evaluate_mixture(nets, weights, *balanced)[1]
        return loss, len(y), metrics

    def losses(self, models: list[list[np.ndarray]], config: dict) -> tuple[list[float], list[float]]:
        """Loss and accuracy of every model on the training window (or ``data-steps``)."""
        x, y = self.fit_data(config, -2)
        pairs = [evaluate(self.scratch(w), x, y) for w in models]
        return [p[0] for p in pairs], [p[1] for p in pairs]

    def label_histogram(self, step: int) -> np.ndarray:
        _, y = self.train_data(step)
        return np.bincount(y, minlength=self.exp.scenario.num_classes).astype(np.int64)

    # -- memory in context.state ------------------------------------------------------------
    def personal_weights(self) -> list[np.ndarray]:
        """This client's own model; created from a client-specific seed on first use."""
        if PERSONAL_KEY in self.state.array_records:
            return codec.unpack_arrays(self.state.array_records[PERSONAL_KEY])
        return initial_weights(self.exp.spec, seed=self.exp.cfg.seed * 100_003 + self.client_id)

    def store_personal(self, weights: list[np.ndarray]) -> None:
        self.state[PERSONAL_KEY] = codec.pack_arrays(weights)

    def optimizer_state(self, config: dict, stream_id: int, cfg: TrainConfig | None = None
                        ) -> OptimizerState | None:
        """With ``optimizer-state = "step"`` (as the FedDrift authors' clients, whose optimizers
        live for one time step): the state this client's optimizer of model ``stream_id`` was
        left in by its last training in the current time step, ``{}`` if there was none (a
        fresh optimizer). The trainer updates it in place and :meth:`keep_optimizer_states`
        stores it once the message's handler has finished. ``None`` (the default,
        ``optimizer-state = "round"``): a fresh optimizer every round, nothing kept. ``cfg``:
        the message's training config, when the caller has it already."""
        if (cfg or self.train_config(config)).optimizer_state != "step":
            return None
        step, key = int(config[P.STEP]), f"{OPTIMIZER_PREFIX}{stream_id}"
        state: OptimizerState = {}
        record = self.state.array_records.get(key)
        if record is not None and int(codec.to_numpy(record[_STATE_STEP])) == step:
            state = {name: codec.to_numpy(a) for name, a in record.items() if name != _STATE_STEP}
        self._open_states[key] = (step, state)
        return state

    def keep_optimizer_states(self) -> None:
        """Store the optimizer states this message's training left (see
        :meth:`optimizer_state`) and drop those of earlier time steps."""
        if not self._open_states:
            return
        step = max(s for s, _ in self._open_states.values())
        for key in [k for k, r in self.state.array_records.items() if k.startswith(OPTIMIZER_PREFIX)
                    and int(codec.to_numpy(r[_STATE_STEP])) != step]:
            del self.state[key]
        for key, (s, state) in self._open_states.items():
            record = ArrayRecord()
            for name, a in state.items():
                record[name] = codec.to_array(np.asarray(a))
            record[_STATE_STEP] = codec.to_array(np.asarray(s, dtype=np.int64))
            self.state[key] = record
        self._open_states.clear()

    def count_trained(self) -> None:
        self._count("trained")

    def first_time(self, what: str) -> bool:
        """True the first time this node asks (kept in ``context.state``, which outlives the
        process of one message), False after."""
        counters = self.state.metric_records.get(COUNTERS_KEY)
        if counters is not None and counters.get(what, 0):
            return False
        self._count(what)
        return True

    def _count(self, what: str) -> None:
        if COUNTERS_KEY not in self.state.metric_records:
            self.state[COUNTERS_KEY] = MetricRecord({})
        counters = self.state.metric_records[COUNTERS_KEY]
        counters[what] = int(counters.get(what, 0)) + 1
