"""A user's own model, as `model = "tests.plugins.my_model:build"` names it.

The contract: ``build(input_shape, num_classes)`` returns a ``torch.nn.Module`` with one logit
per class; a ``features`` submodule and a linear ``classifier`` on its output let the
personalised strategies (FedCCFA, FedRep, FedBABU) train the two apart. BatchNorm's
buffers travel with the weights.
"""

from __future__ import annotations

import math

from torch import nn


class TwoLayerNet(nn.Module):
    def __init__(self, input_shape: tuple[int, ...], num_classes: int, width: int = 24) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), width),
                                      nn.BatchNorm1d(width), nn.Tanh())
        self.classifier = nn.Linear(width, num_classes)

    def forward(self, x):
        return self.classifier(self.features(x))


def build(input_shape, num_classes):
    return TwoLayerNet(tuple(input_shape), num_classes)


def headless(input_shape, num_classes):
    """Fine for FedAvg, IFCA or Flash; refused by FedCCFA, FedRep, FedBABU (no `classifier`)."""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes))


def wrong_output(input_shape, num_classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes + 1))


def uncopyable(input_shape, num_classes):
    """Holds a tensor computed from a parameter (not a graph leaf): copy.deepcopy refuses it."""
    model = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes))
    model.scaled = model[1].weight * 2
    return model


def not_a_module(input_shape, num_classes):
    return "a model"


def no_arguments():
    return nn.Linear(2, 2)
