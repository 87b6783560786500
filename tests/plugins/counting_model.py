"""``my_model.build`` that counts its calls: how often fedcluster builds a user's model."""

from __future__ import annotations

from tests.plugins import my_model

CALLS = 0


def build(input_shape, num_classes):
    global CALLS
    CALLS += 1
    return my_model.build(input_shape, num_classes)
