"""Local training and evaluation in PyTorch, shared by clients and benchmarks.

Minibatch randomness comes from a NumPy generator the caller seeds from (seed, client, round,
model), so a run is reproducible whichever process or engine executes the client. Data go to
the device the model is on (``device`` in the run config), results come back as NumPy/floats.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.optim.optimizer import register_optimizer_step_post_hook

from fedcluster_app.core.config import TrainConfig
from fedcluster_app.core.sampling import bootstrap_rows, choice_batches, fresh_draws, seeded


def limit_threads() -> None:
    """One intra-op thread per client (FEDCLUSTER_TORCH_THREADS to change it).

    The models are small and every simulated client already gets its own CPU; with more
    threads, torch's thread pool spins against the other clients and a 0.4 ms step can take
    15 ms on a loaded 2-core machine.
    """
    wanted = int(os.environ.get("FEDCLUSTER_TORCH_THREADS", "1"))
    if torch.get_num_threads() != wanted:
        torch.set_num_threads(wanted)


def as_tensor(a: np.ndarray, dtype=np.float32, device: torch.device | str | None = None
              ) -> torch.Tensor:
    """Scenario data are read-only (cached and shared); torch wants writable memory, so copy those."""
    a = np.ascontiguousarray(a, dtype=dtype)
    t = torch.from_numpy(a if a.flags.writeable else a.copy())
    return t if device is None or str(device) == "cpu" else t.to(device)


def device_of(model: nn.Module) -> torch.device:
    """Where the model's parameters are (its inputs must go there too)."""
    return next(model.parameters()).device


def _tensors(x: np.ndarray, y: np.ndarray, device: torch.device | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
    return as_tensor(x, device=device), as_tensor(y, np.int64, device)


class StepCount:
    """How many optimizer steps ran inside :func:`counting_steps`."""

    count = 0


@contextlib.contextmanager
def counting_steps() -> Iterator[StepCount]:
    """Count every optimizer step taken inside (any optimizer, any phase): for training code
    that steps its own optimizers instead of yielding jobs (``core/client/handlers.py`` counts
    the jobs' steps itself)."""
    counted = StepCount()

    def hook(*_args) -> None:
        counted.count += 1

    handle = register_optimizer_step_post_hook(hook)
    try:
        yield counted
    finally:
        handle.remove()


def make_optimizer(params: list[torch.Tensor], cfg: TrainConfig) -> torch.optim.Optimizer:
    """The local optimizer over ``params`` (a model's trainable parameters, or the batched
    engine's stacked ones: both optimizers act element by element)."""
    if cfg.optimizer == "adam":
        # amsgrad + L2 as in the FedDrift paper's setup; weight_decay defaults to 0
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay, amsgrad=True)
    return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


def batch_indices(n: int, cfg: TrainConfig, rng: np.random.Generator) -> list[np.ndarray]:
    """The minibatches of one round: ``local-steps`` random batches, or whole shuffled epochs
    (``drop-last``: without the last partial batch of each epoch, as torch's DataLoader)."""
    if cfg.local_steps > 0:   # rng.choice(n, size, replace=False) per step, drawn in one call
        return choice_batches(rng, n, min(cfg.batch_size, n), cfg.local_steps)
    batches = []
    end = n - n % cfg.batch_size if cfg.drop_last else n
    for _ in range(cfg.local_epochs):
        order = rng.permutation(n)
        batches += [order[i : i + cfg.batch_size] for i in range(0, end, cfg.batch_size)]
    return batches


def round_draws(words: tuple[int, ...], n: int, cfg: TrainConfig, bootstrap: bool = False
                ) -> tuple[np.ndarray | None, list[np.ndarray]]:
    """What a fresh generator ``rng = seeded(*words)`` (a client's stream for one model and
    round) draws for training on n rows: with ``bootstrap`` first ``bootstrap_rows(rng, n)``
    (else None: all rows), then ``batch_indices`` over those rows. (rows, minibatches)."""
    if cfg.local_steps > 0:
        drawn = fresh_draws(words, n, cfg.batch_size, cfg.local_steps, bootstrap)
        if drawn is not None:
            return drawn
    rng = seeded(*words)
    rows = bootstrap_rows(rng, n) if bootstrap else None
    return rows, batch_indices(n if rows is None else len(rows), cfg, rng)


def local_train(
    model: nn.Module,
    x: np.ndarray,
    y: np.ndarray,
    cfg: TrainConfig,
    rng: np.random.Generator,
    sample_weights: np.ndarray | None = None,
    prox_center: list[np.ndarray] | None = None,
    batches: list[np.ndarray] | None = None,
    optimizer_state: OptimizerState | None = None,
) -> float:
    """Train ``model`` in place on (x, y); returns the mean training loss.

    With ``cfg.prox_mu > 0`` the FedProx term mu/2 * ||w - w_start||^2 keeps the update close to
    the model the server sent (or to ``prox_center``, e.g. FedSoft's importance-weighted mix of
    the cluster centres: sum_k u_k/2 ||w - c_k||^2 has the gradient of 1/2 ||w - sum_k u_k c_k||^2
    when sum_k u_k = 1). ``sample_weights`` (one per sample) weight the per-sample losses,
    still averaged over the batch size (soft clustering: FedEM, FedRC). ``batches`` (minibatch
    indices drawn beforehand from ``rng`` by ``batch_indices``) replaces the draw.
    ``optimizer_state`` (``optimizer-state = "step"``) is the optimizer's state to continue
    from (empty: a fresh optimizer); it is replaced, in place, by the state after training.
    """
    if len(y) == 0:
        raise ValueError("no training data")
    dev = device_of(model)
    xt, yt = _tensors(x, y, dev)
    wt = None if sample_weights is None else as_tensor(sample_weights, device=dev)
    model.train()
    opt = make_optimizer([p for p in model.parameters() if p.requires_grad], cfg)
    if optimizer_state:
        load_optimizer_state(opt, optimizer_state)
    anchor = None
    if cfg.prox_mu > 0:
        anchor = ([p.detach().clone() for p in model.parameters()] if prox_center is None
                  else [as_tensor(a, device=dev) for a in prox_center])
    if batches is None:
        batches = batch_indices(len(yt), cfg, rng)
    # the losses add up where they are computed, in float64 (the same sums as Python floats):
    # reading each one back would make the host wait for the GPU at every step
    total = torch.zeros((), dtype=torch.float64, device=dev)
    for idx_t in minibatches_on(batches, dev):
        opt.zero_grad(set_to_none=True)
        if wt is None:
            loss = F.cross_entropy(model(xt[idx_t]), yt[idx_t])
        else:
            per_sample = F.cross_entropy(model(xt[idx_t]), yt[idx_t], reduction="none")
            loss = (wt[idx_t] * per_sample).mean()
        total += loss.detach().double()
        if anchor is not None:
            prox = sum(((p - a) ** 2).sum() for p, a in zip(model.parameters(), anchor))
            loss = loss + 0.5 * cfg.prox_mu * prox
        loss.backward()
        opt.step()
    if optimizer_state is not None:
        optimizer_state.clear()
        optimizer_state.update(optimizer_state_arrays(opt))
    return float(total) / max(len(batches), 1)


def minibatches_on(batches: list[np.ndarray], device: torch.device | str) -> list[torch.Tensor]:
    """Every minibatch's row indices on ``device``, copied there in one transfer (a copy per
    step would make the host wait for the GPU at every step)."""
    array = getattr(batches, "array", None)      # sampling.Minibatches: already one array
    if array is not None:
        return list(arrays_on([array], np.int64, device)[0])
    return arrays_on(batches, np.int64, device)


def arrays_on(arrays: list[np.ndarray], dtype, device: torch.device | str
              ) -> list[torch.Tensor]:
    """The arrays as tensors of ``dtype`` on ``device``, each in its own shape, after one
    copy of their concatenation."""
    if not len(arrays):
        return []
    flat = np.concatenate([np.asarray(a, dtype).ravel() for a in arrays])
    parts = torch.from_numpy(flat).to(device).split([np.size(a) for a in arrays])
    return [t.view(np.shape(a)) for t, a in zip(parts, arrays)]


#: an optimizer's per-parameter state as arrays: ``"<parameter index>.<name>"`` -> array, the
#: names of torch's Adam (``step``, ``exp_avg``, ``exp_avg_sq``, ``max_exp_avg_sq``) and SGD
#: (``momentum_buffer``); the NumPy kernel reads and writes the same names
OptimizerState = dict[str, np.ndarray]


def optimizer_state_arrays(opt: torch.optim.Optimizer) -> OptimizerState:
    return {f"{i}.{name}": value.detach().cpu().numpy().copy() if torch.is_tensor(value)
            else np.asarray(value, dtype=np.float64)
            for i, state in opt.state_dict()["state"].items()
            for name, value in state.items() if value is not None}


def load_optimizer_state(opt: torch.optim.Optimizer, arrays: OptimizerState) -> None:
    """Continue ``opt`` from ``arrays`` (``optimizer_state_arrays`` of an optimizer over
    parameters of the same shapes)."""
    state: dict[int, dict] = {}
    for key, value in arrays.items():
        i, name = key.split(".", 1)
        state.setdefault(int(i), {})[name] = torch.as_tensor(np.array(value))
    current = opt.state_dict()
    opt.load_state_dict({"state": state, "param_groups": current["param_groups"]})


@torch.no_grad()
def predict_proba(models: list[nn.Module], weights: list[float], x: np.ndarray) -> torch.Tensor:
    """Class probabilities (on the CPU) of a model, or of a mixture of models with the given
    weights."""
    probs = None
    for model, w in zip(models, weights):
        model.eval()
        p = F.softmax(model(as_tensor(x, device=device_of(model))), dim=1).cpu() * float(w)
        probs = p if probs is None else probs + p
    assert probs is not None
    return probs


@torch.no_grad()
def sample_losses(model: nn.Module, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per-sample cross-entropy of one model (eval mode), as float64."""
    xt, yt = _tensors(x, y, device_of(model))
    model.eval()
    return F.cross_entropy(model(xt), yt, reduction="none").double().cpu().numpy()


@torch.no_grad()
def evaluate(model: nn.Module, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) of one model on (x, y)."""
    if len(y) == 0:
        return float("nan"), float("nan")
    xt, yt = _tensors(x, y, device_of(model))
    model.eval()
    logits = model(xt)
    loss = float(F.cross_entropy(logits, yt))
    acc = float((logits.argmax(1) == yt).float().mean())
    return loss, acc


@torch.no_grad()
def evaluate_mixture(
    models: list[nn.Module], weights: list[float], x: np.ndarray, y: np.ndarray
) -> tuple[float, float]:
    """(negative log-likelihood, accuracy) of the weighted mixture of the models' predictions."""
    yt = as_tensor(y, np.int64)
    total = float(sum(weights))
    probs = predict_proba(models, [w / total for w in weights], x)
    nll = float(-torch.log(probs[torch.arange(len(yt)), yt].clamp_min(1e-12)).mean())
    acc = float((probs.argmax(1) == yt).float().mean())
    return nll, acc
