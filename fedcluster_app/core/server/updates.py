"""The arithmetic of client updates, apart from the strategy base that uses it: weighted
averages of models, an update's norm (also in one compiled call where the client half has
loaded the compiled trainer), the weighted median the norm bound compares with, and scaling an
update down to the bound. Pure NumPy: no Flower, no strategy state."""

from __future__ import annotations

import math
import sys

import numpy as np

Weights = list[np.ndarray]


def weighted_average(items: list[tuple[Weights, float]]) -> Weights:
    total = float(sum(w for _, w in items))
    if total <= 0:
        raise ValueError("weighted average needs a positive total weight")
    out = [np.zeros(a.shape, dtype=np.float64) for a in items[0][0]]
    for arrays, w in items:
        for acc, a in zip(out, arrays):
            acc += a * (w / total)
    return [a.astype(np.float32) for a in out]


#: a returned model may change each weight by at most this x the model's RMS weight (or 1):
#: honest local training moves weights by a fraction of that
MAX_UPDATE_SCALE = 1e3


def update_norm(weights: Weights, sent: Weights) -> float:
    """Euclidean norm of ``weights - sent`` over the float arrays (in float64: 1e30 weights do
    not overflow it): each array's squares summed as ``np.sum`` sums them, the arrays' sums
    added one after the other. The exchange's checks compute the same number in one compiled
    call where they can (``SentModel``)."""
    total = 0.0
    for a, b in zip(weights, sent):
        if a.dtype.kind != "f":
            continue
        d = np.subtract(a, b, dtype=np.float64)   # (a - b) ** 2 summed as np.sum sums it,
        d *= d                                    # with fewer temporaries and calls (the
        total += float(np.add.reduce(d, axis=None))   # reduction d.sum() runs, directly)
    return math.sqrt(total)


class SentModel:
    """A model as sent in one exchange, with what checking its updates needs computed once (a
    KUE round checks 100 returned models against 10 sent ones): its float weights' count
    (``size``: the square root of it), its root-mean-square weight (``scale``, at least 1) and,
    when it has the run's shapes and dtypes, its float arrays concatenated for the compiled
    norm. Replies have been checked to have the run's shapes and cast to its dtypes, so their
    float arrays are then this model's.

    Once the compiled MLP trainer is loaded (the in-process engine's FedDrift-family training
    loads it) ``update_norm`` runs in one compiled call (``compiled_mlp.squared_distances``: NumPy's
    pairwise sum per array, the arrays' sums added in order, the same number): a few NumPy calls
    per array cost a KUE round, 100 models of 4 arrays, more than the arithmetic. Otherwise
    (e.g. a deployed ServerApp, which never trains) NumPy's, so the server does not load Numba."""

    def __init__(self, weights: Weights, shapes: tuple, dtypes: tuple | None) -> None:
        self.weights = weights
        self.floats = [i for i, a in enumerate(weights) if a.dtype.kind == "f"]
        self.size = math.sqrt(sum(weights[i].size for i in self.floats) or 1)
        self.flat = self.sizes = None
        if (self.floats and dtypes is not None
                and all(type(a) is np.ndarray for a in weights)
                and tuple(tuple(a.shape) for a in weights) == shapes
                and tuple(a.dtype for a in weights) == tuple(dtypes)):
            self.flat = np.concatenate([weights[i].ravel() for i in self.floats], dtype=np.float64)
            self.sizes = np.array([weights[i].size for i in self.floats], dtype=np.int64)
        compiled = sys.modules.get("fedcluster_app.core.client.compiled_mlp")
        if self.flat is not None and compiled is not None:
            # its norm against zeros: (0 - a)^2 is a^2, so the compiled sums give the same number
            zeros = np.zeros_like(self.flat)
            own = math.sqrt(compiled.squared_distances(zeros, self.flat, self.sizes))
        else:
            own = update_norm(weights, [0.0] * len(weights))
        self.scale = max(1.0, own / self.size)

    def update_norm(self, weights: Weights) -> float:
        """``update_norm(weights, <this model>)`` for a checked reply's arrays: the same number."""
        compiled = sys.modules.get("fedcluster_app.core.client.compiled_mlp")
        if self.flat is None or compiled is None:
            return update_norm(weights, self.weights)
        flat = np.concatenate([weights[i].ravel() for i in self.floats], dtype=np.float64)
        return math.sqrt(compiled.squared_distances(flat, self.flat, self.sizes))


def weighted_median(values: list[float], weights: list[float]) -> float:
    """The smallest value at which the cumulative weight reaches half the total; the plain
    median when the weights are all equal (or none is positive)."""
    # the plain case (every update of a hard assignment) in Python: NumPy's calls on a dozen
    # numbers cost more than the sort
    clipped = [max(float(x), 0.0) for x in weights]
    if not all(map(math.isfinite, clipped)) or sum(clipped) <= 0 or len(set(clipped)) == 1:
        return _median(values)
    w = np.asarray(clipped)
    order = np.argsort(values, kind="stable")
    v, w = np.asarray(values, dtype=np.float64)[order], w[order]
    return float(v[np.searchsorted(np.cumsum(w), 0.5 * w.sum())])


def _median(values: list[float]) -> float:
    """``np.median(values)``, the same number: the middle value, or the mean of the middle two
    as NumPy takes it, (a + b) / 2 (NumPy itself for non-finite values or none)."""
    if not values or not all(map(math.isfinite, values)):
        return float(np.median(values))
    v = sorted(map(float, values))
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2


def scale_update(weights: Weights, sent: Weights, factor: float) -> Weights:
    """``sent + factor * (weights - sent)`` on the float arrays; other arrays as returned."""
    return [(b + factor * (a.astype(np.float64) - b)).astype(a.dtype) if a.dtype.kind == "f" else a
            for a, b in zip(weights, sent)]
