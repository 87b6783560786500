"""The model and data both apps share: fedcluster's MLP (8 -> 32, ReLU -> 4) written out in
torch, and the mixture-swap scenario's data of one client at one time step."""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F


def mlp() -> nn.Module:
    # fedcluster_app.core.models.MLP's layers and parameter order (features, then classifier)
    return nn.Sequential(nn.Flatten(), nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))


@functools.lru_cache(maxsize=1)
def scenario(num_clients: int, num_steps: int, seed: int):
    from fedcluster_app.core.data.scenarios import build_scenario

    return build_scenario("mixture-swap", seed=seed, num_clients=num_clients,
                          num_steps=num_steps)


def time_step(server_round: int, rounds_per_step: int) -> int:
    return (server_round - 1) // rounds_per_step + 1


def train(model: nn.Module, x: np.ndarray, y: np.ndarray, *, lr: float, steps: int,
          batch_size: int, seed: int) -> float:
    """``steps`` Adam steps on minibatches drawn with replacement; the mean loss."""
    rng = np.random.default_rng(seed)
    xt, yt = torch.from_numpy(np.array(x)), torch.from_numpy(np.array(y))   # writable copies
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    total = 0.0
    for _ in range(steps):
        idx = torch.from_numpy(rng.integers(0, len(yt), batch_size))
        opt.zero_grad()
        loss = F.cross_entropy(model(xt[idx]), yt[idx])
        loss.backward()
        opt.step()
        total += loss.item()
    return total / max(steps, 1)


@torch.no_grad()
def test(model: nn.Module, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    model.eval()
    logits = model(torch.from_numpy(np.array(x)))
    yt = torch.from_numpy(np.array(y))
    return float(F.cross_entropy(logits, yt)), float((logits.argmax(1) == yt).float().mean())
