"""Models: an MLP for tabular data and a small CNN for images, chosen by the scenario.

Both split into ``features`` (the body) and ``classifier`` (the last linear layer), because
FedCCFA, FedRep and FedBABU train or share the two parts differently. Weights travel as a list
of NumPy arrays in ``state_dict`` order; ``ModelSpec`` is everything needed to rebuild a model.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
from torch import nn


@dataclass(frozen=True)
class ModelSpec:
    kind: str                       # "mlp" | "cnn"
    input_shape: tuple[int, ...]
    num_classes: int
    hidden: int = 0                 # MLP hidden width (0 = multinomial logistic regression)
    init: str = "torch"             # torch: PyTorch's defaults | normal: N(0, 1/fan_in), bias 0

    def __post_init__(self) -> None:
        if self.kind not in MODEL_KINDS:
            raise ValueError(f"unknown model {self.kind!r}; valid: {', '.join(MODEL_KINDS)}")
        if self.init not in INITS:
            raise ValueError(f"unknown init {self.init!r}; valid: {', '.join(INITS)}")
        if self.kind == "cnn" and len(self.input_shape) != 3:
            raise ValueError(f"the cnn needs (channels, height, width) inputs, got {self.input_shape}")


class MLP(nn.Module):
    """d -> hidden (ReLU) -> C, as in the FedDrift paper (hidden = 2d for its tabular data)."""

    def __init__(self, in_features: int, hidden: int, num_classes: int) -> None:
        super().__init__()
        if hidden > 0:
            self.features: nn.Module = nn.Sequential(
                nn.Flatten(), nn.Linear(in_features, hidden), nn.ReLU()
            )
            width = hidden
        else:
            self.features = nn.Flatten()
            width = in_features
        self.classifier = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class CNN(nn.Module):
    """Two conv blocks (3x3, ReLU, 2x2 max-pool) and a 64-unit layer before the classifier."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        channels, height, width = input_shape
        self.features = nn.Sequential(
            nn.Conv2d(channels, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(32 * (height // 4) * (width // 4), 64), nn.ReLU(),
        )
        self.classifier = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


MODEL_KINDS = ("mlp", "cnn")
INITS = ("torch", "normal")


def build_model(spec: ModelSpec, seed: int | None = None) -> nn.Module:
    """A fresh model; with a seed, the same seed gives the same initial weights everywhere."""
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        if spec.kind == "mlp":
            model: nn.Module = MLP(int(np.prod(spec.input_shape)), spec.hidden, spec.num_classes)
        else:
            model = CNN(spec.input_shape, spec.num_classes)
        if spec.init == "normal":   # FedRC's calibrated recipe (docs/fedrc.md, D11)
            for layer in model.modules():
                if isinstance(layer, (nn.Linear, nn.Conv2d)):
                    fan_in = layer.weight[0].numel()
                    nn.init.normal_(layer.weight, 0.0, fan_in ** -0.5)
                    nn.init.zeros_(layer.bias)
        return model


def split_model(model: nn.Module) -> tuple[nn.Module, nn.Linear]:
    """``(features, classifier)``: the feature extractor (with parameters) and the linear
    classifier that personalised strategies (FedCCFA, FedRep, FedBABU) train apart."""
    features = getattr(model, "features", None)
    head = getattr(model, "classifier", None)
    if not isinstance(head, nn.Linear) or features is None or not any(
            True for _ in features.parameters()):
        raise ValueError("this model has no separable classifier head (a feature extractor with "
                         "parameters followed by a linear classifier)")
    return features, head


def initial_weights(spec: ModelSpec, seed: int) -> list[np.ndarray]:
    return get_weights(build_model(spec, seed))


def get_weights(model: nn.Module) -> list[np.ndarray]:
    return [t.detach().cpu().numpy().copy() for t in model.state_dict().values()]


def set_weights(model: nn.Module, weights: list[np.ndarray]) -> None:
    state = model.state_dict()
    if len(weights) != len(state):
        raise ValueError(f"expected {len(state)} arrays, got {len(weights)}")
    with torch.no_grad():
        for (name, tensor), array in zip(state.items(), weights):
            if tuple(array.shape) != tuple(tensor.shape):
                raise ValueError(f"{name}: expected shape {tuple(tensor.shape)}, got {array.shape}")
            tensor.copy_(torch.from_numpy(np.asarray(array, dtype=np.float32)))


@lru_cache(maxsize=32)
def weight_shapes(spec: ModelSpec) -> tuple[tuple[int, ...], ...]:
    """Shapes of the arrays of a model of this spec (used to validate client replies)."""
    return tuple(tuple(t.shape) for t in build_model(spec, 0).state_dict().values())


@lru_cache(maxsize=8)
def _scratch_model(spec: ModelSpec) -> nn.Module:
    return build_model(spec, 0)


def scratch_model(spec: ModelSpec, weights: list[np.ndarray]) -> nn.Module:
    """A cached module of this spec loaded with ``weights`` (saves rebuilding it per message).

    Callers must not keep it across calls: the next call overwrites its weights.
    """
    model = _scratch_model(spec)
    set_weights(model, weights)
    return model
