"""Models: an MLP for tabular data and a small CNN for images, chosen by the scenario, or the
user's own.

``model = "module:callable"`` names a user's model: ``callable(input_shape, num_classes)``
returns a ``torch.nn.Module`` whose output is ``(batch, num_classes)`` logits. Any such module
works with the strategies that exchange whole models. The personalised ones (FedCCFA, FedRep,
FedBABU: strategies with ``needs_split_model``) and Fielding's representations also need the
two parts told apart, as the built-in models have them: a ``features`` submodule (the body, with parameters) and a
``classifier`` submodule that is one ``nn.Linear`` on its output. Weights travel as a list of
NumPy arrays in ``state_dict`` order (buffers such as BatchNorm statistics included);
``ModelSpec`` is everything needed to rebuild a model.
"""

from __future__ import annotations

import copy
import inspect
import logging
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
from torch import nn

from fedcluster_app.core.config import DEVICE_RULE, is_device_name
from fedcluster_app.core.plugins import import_object, is_import_path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelSpec:
    kind: str                       # "mlp" | "cnn" | "module:callable" (a user's model)
    input_shape: tuple[int, ...]
    num_classes: int
    hidden: int = 0                 # MLP hidden width (0 = multinomial logistic regression)
    init: str = "torch"             # torch: PyTorch's defaults | normal: N(0, 1/fan_in), bias 0

    @property
    def custom(self) -> bool:
        return self.kind not in MODEL_KINDS

    def __post_init__(self) -> None:
        if self.custom and not is_import_path(self.kind):
            raise ValueError(f"unknown model {self.kind!r}; valid: {', '.join(MODEL_KINDS)} or "
                             "'package.module:callable' (your own)")
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


def _user_model(spec: ModelSpec) -> nn.Module:
    factory = import_object(spec.kind, "model")
    if not callable(factory):
        raise ValueError(f"model: {spec.kind!r} is a {type(factory).__name__}, not a callable")
    try:
        inspect.signature(factory).bind(spec.input_shape, spec.num_classes)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"model: {spec.kind!r} must accept (input_shape, num_classes): {exc}"
                         ) from None
    model = factory(spec.input_shape, spec.num_classes)
    if not isinstance(model, nn.Module):
        raise ValueError(f"model: {spec.kind!r} returned a {type(model).__name__}, expected a "
                         "torch.nn.Module")
    return model


def check_model(spec: ModelSpec) -> None:
    """Build the model once and push a zero batch through it: an import error, a wrong return
    type, an output that is not ``(batch, num_classes)`` or weights that are not numbers fail
    here, before any message is sent, with the run-config key named."""
    _constructed(spec, 0)   # the callable's own errors, as they are
    try:
        model = build_model(spec, 0)
    except Exception as exc:
        raise ValueError(f"model: {spec.kind!r} cannot be copied with copy.deepcopy "
                         f"({type(exc).__name__}: {exc}); fedcluster builds a model once per "
                         "process and copies it") from exc
    if not any(True for _ in model.parameters()):
        raise ValueError(f"model: {spec.kind!r} has no trainable parameters")
    model.eval()
    try:
        with torch.no_grad():
            out = model(torch.zeros((2, *spec.input_shape)))
    except Exception as exc:
        raise ValueError(f"model: {spec.kind!r} fails on a batch of inputs of shape "
                         f"{(2, *spec.input_shape)}: {type(exc).__name__}: {exc}") from exc
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (2, spec.num_classes):
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"model: {spec.kind!r} outputs {got} for a batch of 2, expected (2, "
                         f"{spec.num_classes}): one logit per class of the scenario")
    for name, tensor in model.state_dict().items():
        if not (tensor.is_floating_point() or tensor.dtype in (torch.int64, torch.int32)):
            raise ValueError(f"model: {spec.kind!r} has state {name!r} of dtype {tensor.dtype}; "
                             "weights must be floating point (or integer buffers)")


def build_model(spec: ModelSpec, seed: int | None = None) -> nn.Module:
    """A fresh module of its own; with a seed, the same seed gives the same initial weights
    everywhere. A seeded module is constructed once per process and seed (a user's callable is
    not called again for it): every later call gets a copy of that module, the same weights
    and buffers, so a client builds its model once and not for every message."""
    if seed is None:
        return _construct(spec, None)
    return copy.deepcopy(_constructed(spec, seed))


@lru_cache(maxsize=8)
def _constructed(spec: ModelSpec, seed: int) -> nn.Module:
    """The module ``build_model`` copies; never handed out itself (a caller could train it)."""
    return _construct(spec, seed)


def _construct(spec: ModelSpec, seed: int | None) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        if spec.custom:
            model = _user_model(spec)
        elif spec.kind == "mlp":
            model: nn.Module = MLP(int(np.prod(spec.input_shape)), spec.hidden, spec.num_classes)
        else:
            model = CNN(spec.input_shape, spec.num_classes)
        if spec.init == "normal":   # FedRC's calibrated recipe (docs/fedrc/README.md, D11)
            for layer in model.modules():
                if isinstance(layer, (nn.Linear, nn.Conv2d)):
                    fan_in = layer.weight[0].numel()
                    nn.init.normal_(layer.weight, 0.0, fan_in ** -0.5)
                    nn.init.zeros_(layer.bias)
        return model


SPLIT_CONTRACT = ("a `features` submodule with parameters and a `classifier` submodule that is "
                  "one nn.Linear applied to its output")


def split_model(model: nn.Module) -> tuple[nn.Module, nn.Linear]:
    """``(features, classifier)``: the feature extractor (with parameters) and the linear
    classifier that personalised strategies (FedCCFA, FedRep, FedBABU) train apart."""
    features = getattr(model, "features", None)
    head = getattr(model, "classifier", None)
    if not isinstance(head, nn.Linear) or not isinstance(features, nn.Module) or not any(
            True for _ in features.parameters()):
        raise ValueError(f"this model has no separable classifier head: it needs {SPLIT_CONTRACT}")
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
    return tuple(tuple(t.shape) for t in _state(spec).values())


def parameter_count(spec: ModelSpec) -> int:
    """The numbers a model of this spec holds (its state_dict: parameters and buffers). A
    built-in model is counted on PyTorch's meta device, which allocates nothing, so a model too
    large to build is measured and refused (``limits.check_run``) before it takes memory; a
    user's model was built once already by ``check_model``."""
    if spec.custom:
        return sum(math.prod(shape) for shape in weight_shapes(spec))
    with torch.device("meta"):
        model = _construct(spec, None)
    return sum(t.numel() for t in model.state_dict().values())


def weight_dtypes(spec: ModelSpec) -> tuple[np.dtype, ...]:
    """NumPy dtypes of the arrays of a model of this spec (replies are cast to them)."""
    return tuple(torch.empty((), dtype=t.dtype).numpy().dtype for t in _state(spec).values())


@lru_cache(maxsize=8)
def _state(spec: ModelSpec) -> dict[str, torch.Tensor]:
    return build_model(spec, 0).state_dict()


@lru_cache(maxsize=8)
def cached_model(spec: ModelSpec, device: str) -> nn.Module:
    """One module of this spec per device, built once: for its structure (its weights are
    whatever was loaded into it last)."""
    return build_model(spec, 0).to(device)


def scratch_model(spec: ModelSpec, weights: list[np.ndarray], device: str = "cpu") -> nn.Module:
    """A cached module of this spec on ``device`` loaded with ``weights`` (saves rebuilding it
    per message).

    Callers must not keep it across calls: the next call overwrites its weights.
    """
    model = cached_model(spec, str(device))
    set_weights(model, weights)
    return model


# ------------------------------------------------------------------------------- devices
_fallback_logged = False


def resolve_device(device: str) -> str:
    """The torch device a client trains on. ``auto``: the first GPU this process sees (under
    Ray, the one its ``num-gpus`` share gives it), else the CPU with one log line. ``cuda`` or
    ``cuda:N`` without that GPU is an error, never a silent fallback."""
    global _fallback_logged
    if not is_device_name(device):
        raise ValueError(f"device must be {DEVICE_RULE}, got {device!r}")
    if device == "cpu":
        return "cpu"
    available = torch.cuda.is_available()
    count = torch.cuda.device_count() if available else 0
    if device == "auto":
        if count:
            return "cuda:0"
        if not _fallback_logged:
            log.info("device = auto: no GPU visible to this process, training on the CPU")
            _fallback_logged = True
        return "cpu"
    index = int(device.split(":", 1)[1]) if ":" in device else 0
    if index >= count:
        seen = f"{count} GPU(s)" if count else "no GPU (torch.cuda.is_available() is False)"
        raise ValueError(f"device = {device!r}, but this process sees {seen}; use device = "
                         "'auto' to fall back to the CPU, or 'cpu'")
    return f"cuda:{index}"


def prepare_device(device: str, deterministic: bool = True) -> None:
    """What a process that trains on ``device`` sets up: on a GPU, cuDNN's deterministic
    algorithms unless ``deterministic`` (the run-config key) is false. Its fastest convolution
    algorithms add in any order: on an H200 two FedCCFA runs with the same seed differed by
    1.5e-8 with them, while nine runs repeated bit for bit with the deterministic ones, which
    cost batched CNN rounds 1.2-2.3x there (docs/operations/performance.md, "On a GPU")."""
    if str(device).startswith("cuda"):
        torch.backends.cudnn.deterministic = bool(deterministic)
        torch.backends.cudnn.benchmark = False
