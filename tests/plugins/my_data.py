"""A user's dataset loader for the ``dataset = "tests.plugins.my_data:load"`` tests."""

from __future__ import annotations

import numpy as np

CENTRES = np.array([[0.0, 0.0], [4.0, 0.0], [0.0, 4.0]])


def load(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Three Gaussian blobs in 2-d, 60 points each; ``seed`` is the run's data seed."""
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(3), 60)
    x = CENTRES[y] + rng.normal(0.0, 0.5, size=(len(y), 2))
    return x.astype(np.float32), y


def load_torch():
    """The same blobs as a torch ``Dataset`` of ``(x, y)`` pairs."""
    import torch
    from torch.utils.data import TensorDataset

    x, y = load()
    return TensorDataset(torch.from_numpy(x), torch.from_numpy(y))


def load_wrong() -> str:
    """Returns the wrong type: the scenario must say what it expected."""
    return "not a dataset"
