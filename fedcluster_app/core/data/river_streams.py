"""Tabular concepts built on River's synthetic drift streams (``river.datasets.synth``).

A concept is one *fixed* configuration of a River generator (its decision rule); the drift
schedule stays the scenario's, so drift patterns and ``.cp`` files work as for SINE / SEA. Each
``sample(n, rng)`` seeds the generator's sample stream with ``int(rng.integers(2**31))`` and
takes its first ``n`` items, so a (client, step) sample is deterministic from the scenario's
generator while the rule depends only on the concept's own parameters.

* :class:`StaggerConcept`: ``STAGGER(classification_function=0/1/2)``; the three categorical
  features (size, colour, shape; 3 values each) one-hot encoded: 9 inputs.
* :class:`AgrawalConcept`: ``Agrawal(classification_function=f)``; 6 numeric features plus
  ``car`` and ``zipcode`` standardised with fixed constants, ``elevel`` one-hot: 13 inputs.
* :class:`HyperplaneConcept`: a hyperplane of River's ``Hyperplane`` in ``d`` dimensions with
  explicit weights (drawn as River draws them from a seed), so intermediate hyperplanes exist.
* :class:`RbfConcept`: ``RandomRBF(seed_model=...)``: one centroid set per concept.
* :class:`RbfDriftConcept`: ``RandomRBFDrift``: one stream whose centroids move; a concept is a
  position on it (the centroids after so many items), and its items keep moving a little.

Cost of ``sample(500, rng)`` (one core): STAGGER ~3 ms, Hyperplane ~4 ms, RandomRBF ~6 ms,
RandomRBFDrift ~6 ms plus ~40 us per item skipped to its position (~0.15 s for concept B),
Agrawal 50-90 ms (River builds every Agrawal item with ``eval``): the slowest, ~10 s for all the
data of a 10-client, 11-step scenario, spread over its clients. River itself is imported on the
first sample (~2 s), so building a scenario's metadata does not pay for it.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass

import numpy as np

__all__ = [
    "AGRAWAL_FUNCTIONS",
    "HYPERPLANE_SEEDS",
    "RBF_SEEDS",
    "RIVER_VARIANTS",
    "AgrawalConcept",
    "HyperplaneConcept",
    "RbfConcept",
    "StaggerConcept",
    "hyperplane_weights",
    "river_concepts",
]


def _synth():
    """River's generators, imported on first use (importing River takes seconds)."""
    from river.datasets import synth

    return synth


def _sample_seed(rng: np.random.Generator) -> int:
    return int(rng.integers(2**31))


def _take(generator: object, n: int) -> list[tuple[dict, int]]:
    return list(itertools.islice(iter(generator), int(n)))  # type: ignore[call-overload]


def _labels(items: list[tuple[dict, int]]) -> np.ndarray:
    return np.fromiter((y for _, y in items), dtype=np.int64, count=len(items))


def _one_hot(codes: np.ndarray, sizes: tuple[int, ...]) -> np.ndarray:
    out = np.zeros((len(codes), sum(sizes)), dtype=np.float32)
    offset = 0
    for j, size in enumerate(sizes):
        out[np.arange(len(codes)), offset + codes[:, j]] = 1.0
        offset += size
    return out


# ----------------------------------------------------------------------------------- STAGGER


#: RandomRBFDrift: every centroid moves RBF_DRIFT_SPEED per item; concept B is the stream after
#: RBF_DRIFT_ITEMS items (a move of 1.0 along each centroid's direction, bouncing off the unit
#: cube: an MLP fit on A scores 0.93 on A and 0.50 on B), while the 500 items of one step move
#: them 1/8 of that. Skipping to B costs about 0.15 s per (client, step) sample on one core.
RBF_DRIFT_SPEED = 2.5e-4
RBF_DRIFT_ITEMS = 4000


@dataclass(frozen=True)
class StaggerConcept:
    """STAGGER function ``function`` (0: small and red; 1: green or circle; 2: medium or large).

    ``balance``: River's ``balance_classes``, on by default because function 0 is true for only
    1 in 9 inputs; a model that always says 0 would otherwise score ~90%. River's balanced
    stream alternates 1, 0, 1, ..., so the items are shuffled with ``rng``."""

    function: int
    name: str = "A"
    balance: bool = True

    dim = 9
    num_classes = 2

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        gen = _synth().STAGGER(classification_function=self.function, seed=_sample_seed(rng),
                               balance_classes=self.balance)
        items = _take(gen, n)
        codes = np.array([[x["size"], x["color"], x["shape"]] for x, _ in items],
                         dtype=np.int64).reshape(len(items), 3)
        order = rng.permutation(len(items))
        return _one_hot(codes, (3, 3, 3))[order], _labels(items)[order]

    def interpolate(self, other: object, frac: float) -> None:
        return None  # boolean rules have no intermediate


# ----------------------------------------------------------------------------------- Agrawal

# Agrawal's features, standardised as z = (v - centre) / (width / sqrt(12)) with the ranges the
# generator draws from (read from its code: commission is 0 or U[10k, 85k], hvalue
# (8 - zipcode) * 100k * U[0.5, 1.5] is in [0, 1.2M]); a uniform feature then has mean 0 and
# variance 1, and the constants never depend on the data. ``car`` (20 makes) and ``zipcode``
# (9 towns) are scaled the same way rather than one-hot: no function used here reads ``car``,
# and ``zipcode`` acts through ``hvalue``, so 29 extra one-hot inputs would only add noise.
# ``elevel`` (5 levels) is one-hot: functions 2 and 3 test set membership of it.
_AGRAWAL_SCALED = (
    ("salary", 20_000.0, 150_000.0),
    ("commission", 0.0, 85_000.0),
    ("age", 20.0, 80.0),
    ("hvalue", 0.0, 1_200_000.0),
    ("hyears", 1.0, 30.0),
    ("loan", 0.0, 500_000.0),
    ("car", 1.0, 20.0),
    ("zipcode", 0.0, 8.0),
)
_AGRAWAL_CENTRE = np.array([(lo + hi) / 2 for _, lo, hi in _AGRAWAL_SCALED])
_AGRAWAL_SCALE = np.array([(hi - lo) / math.sqrt(12.0) for _, lo, hi in _AGRAWAL_SCALED])
AGRAWAL_ELEVELS = 5
#: Agrawal functions of the concepts: 0 (age), 1 (salary band by age), 2 (education by age),
#: 3 (salary band by age and education). Functions 4-9 are skipped: 7 and 9 are true for under 2%
#: of inputs (balancing them needs 25-250 draws per positive) and River's function 4 tests
#: salaries of 200k-500k in some branches, which never occur, so 0-3 give 4 well-posed rules.
AGRAWAL_FUNCTIONS = (0, 1, 2, 3)


@dataclass(frozen=True)
class AgrawalConcept:
    """Agrawal function ``function`` (River's numbering), classes balanced by River's
    ``balance_classes`` so accuracy reads the same under every concept."""

    function: int
    name: str = "A"
    balance: bool = True

    dim = len(_AGRAWAL_SCALED) + AGRAWAL_ELEVELS
    num_classes = 2

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        gen = _synth().Agrawal(classification_function=self.function, seed=_sample_seed(rng),
                               balance_classes=self.balance)
        items = _take(gen, n)
        raw = np.array([[x[f] for f, _, _ in _AGRAWAL_SCALED] for x, _ in items],
                       dtype=np.float64).reshape(len(items), len(_AGRAWAL_SCALED))
        elevel = np.array([[x["elevel"]] for x, _ in items], dtype=np.int64).reshape(-1, 1)
        x = np.concatenate([((raw - _AGRAWAL_CENTRE) / _AGRAWAL_SCALE).astype(np.float32),
                            _one_hot(elevel, (AGRAWAL_ELEVELS,))], axis=1)
        order = rng.permutation(len(items))  # a balanced stream alternates its labels
        return x[order], _labels(items)[order]

    def interpolate(self, other: object, frac: float) -> None:
        return None  # different rule families have no intermediate


# -------------------------------------------------------------------------------- Hyperplane


def hyperplane_weights(seed: int, dim: int) -> tuple[float, ...]:
    """The weights River's ``Hyperplane(seed=seed, n_features=dim)`` starts from: its first
    ``dim`` draws of ``random.Random(seed)`` (checked against River's labels in the tests)."""
    r = random.Random(seed)
    return tuple(r.random() for _ in range(dim))


@dataclass(frozen=True)
class HyperplaneConcept:
    """River's Hyperplane rule ``y = 1`` iff ``sum_i w_i x_i >= sum_i w_i / 2`` with fixed
    weights, ``x ~ U[0,1]^d`` from River's stream, each label flipped with probability ``noise``.

    River's generator draws its weights and its inputs from one seed, so a concept cannot be
    "a seed" if every (client, step) is to get fresh inputs: the weights are held here, River
    supplies the inputs (without its own noise or drift) and the rule is applied to them."""

    weights: tuple[float, ...]
    noise: float = 0.05
    name: str = "A"

    num_classes = 2

    @classmethod
    def from_seed(cls, seed: int, dim: int = 10, noise: float = 0.05, name: str = "A"
                  ) -> HyperplaneConcept:
        return cls(hyperplane_weights(seed, dim), noise, name)

    @property
    def dim(self) -> int:
        return len(self.weights)

    def label(self, x: np.ndarray) -> np.ndarray:
        """Noise-free labels."""
        w = np.asarray(self.weights, dtype=np.float64)
        x = np.asarray(x, dtype=np.float64)
        return (x @ w >= 0.5 * w.sum()).astype(np.int64)

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        gen = _synth().Hyperplane(seed=_sample_seed(rng), n_features=self.dim, mag_change=0.0,
                                  noise_percentage=0.0)
        items = _take(gen, n)
        x = np.array([[x[i] for i in range(self.dim)] for x, _ in items],
                     dtype=np.float32).reshape(len(items), self.dim)
        y = self.label(x)
        flip = rng.random(len(y)) < self.noise
        return x, np.where(flip, 1 - y, y).astype(np.int64)

    def interpolate(self, other: object, frac: float) -> HyperplaneConcept | None:
        """The hyperplane whose weights are a fraction ``frac`` of the way to ``other``'s."""
        if not isinstance(other, HyperplaneConcept) or other.dim != self.dim:
            return None
        w = tuple(float(a + frac * (b - a)) for a, b in zip(self.weights, other.weights))
        return HyperplaneConcept(w, self.noise, name=f"{self.name}->{other.name}@{frac:.2f}")


# -------------------------------------------------------------------------------------- RBF


@dataclass(frozen=True)
class RbfConcept:
    """``RandomRBF(seed_model=seed_model)``: the centroid set (centres, labels, spreads,
    weights) is the concept; the inputs come from a per-sample ``seed_sample``.

    No intermediate concept: two centroid sets label their centroids independently, so there is
    no path between them, and ``RandomRBFDrift`` moves centroids item by item inside one
    stream, which a fixed per-step concept cannot express."""

    seed_model: int
    name: str = "A"
    dim: int = 10
    num_classes: int = 4
    n_centroids: int = 20

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        gen = _synth().RandomRBF(seed_model=self.seed_model, seed_sample=_sample_seed(rng),
                                 n_classes=self.num_classes, n_features=self.dim,
                                 n_centroids=self.n_centroids)
        items = _take(gen, n)
        x = np.array([[x[i] for i in range(self.dim)] for x, _ in items],
                     dtype=np.float32).reshape(len(items), self.dim)
        return x, _labels(items)

    def interpolate(self, other: object, frac: float) -> None:
        return None


@dataclass(frozen=True)
class RbfDriftConcept:
    """``RandomRBFDrift``: River's RBF stream whose first ``n_drift_centroids`` centroids (all
    of them here) move ``change_speed`` per item along fixed random directions (bouncing off
    the unit cube). A concept is a *position* on that stream: the centroids after ``position`` items. The
    movement depends only on ``seed_model`` and the item count, not on the sample seed, so
    the samples of a (client, step) are River's items ``position .. position + n`` of a stream
    with its own sample seed: the concept keeps drifting a little inside the step, as River's
    stream does. Intermediate concepts are intermediate positions (incremental drift)."""

    seed_model: int
    position: int
    name: str = "A"
    dim: int = 10
    num_classes: int = 4
    n_centroids: int = 20
    n_drift_centroids: int = 20
    change_speed: float = RBF_DRIFT_SPEED

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        gen = _synth().RandomRBFDrift(
            seed_model=self.seed_model, seed_sample=_sample_seed(rng), n_classes=self.num_classes,
            n_features=self.dim, n_centroids=self.n_centroids, change_speed=self.change_speed,
            n_drift_centroids=self.n_drift_centroids)
        items = list(itertools.islice(iter(gen), self.position, self.position + n))
        x = np.array([[x[i] for i in range(self.dim)] for x, _ in items],
                     dtype=np.float32).reshape(len(items), self.dim)
        return x, _labels(items)

    def interpolate(self, other: object, frac: float) -> RbfDriftConcept | None:
        """The stream a fraction ``frac`` of the way from this position to ``other``'s."""
        if not isinstance(other, RbfDriftConcept) or other.seed_model != self.seed_model:
            return None
        position = int(round(self.position + frac * (other.position - self.position)))
        return RbfDriftConcept(self.seed_model, position, f"{self.name}->{other.name}@{frac:.2f}",
                               self.dim, self.num_classes, self.n_centroids,
                               self.n_drift_centroids, self.change_speed)


# --------------------------------------------------------------------------------- families

#: River's Hyperplane seeds of concepts A and B: of the seeds 0-9, the pair whose hyperplanes are
#: furthest apart (66 degrees; the noise-free labels disagree on 37% of inputs), so the drift is
#: large (random pairs are ~45 degrees apart: all of River's weights are positive).
HYPERPLANE_SEEDS = (7, 8)
#: RandomRBF ``seed_model`` of concepts A..D.
RBF_SEEDS = (1, 2, 3, 4)
RIVER_VARIANTS = ("stagger", "agrawal", "hyperplane", "rbf", "rbf-drift")


def river_concepts(variant: str) -> list[object]:
    """The base concepts of a River family (concept id = position)."""
    names = "ABCD"
    if variant == "stagger":
        return [StaggerConcept(f, names[f]) for f in range(3)]
    if variant == "agrawal":
        return [AgrawalConcept(f, names[i]) for i, f in enumerate(AGRAWAL_FUNCTIONS)]
    if variant == "hyperplane":
        return [HyperplaneConcept.from_seed(s, 10, 0.05, names[i])
                for i, s in enumerate(HYPERPLANE_SEEDS)]
    if variant == "rbf":
        return [RbfConcept(s, names[i]) for i, s in enumerate(RBF_SEEDS)]
    if variant == "rbf-drift":   # the stream's start, and after RBF_DRIFT_ITEMS items
        return [RbfDriftConcept(RBF_SEEDS[0], 0, "A"),
                RbfDriftConcept(RBF_SEEDS[0], RBF_DRIFT_ITEMS, "B")]
    raise ValueError(f"unknown River family {variant!r}; valid: {', '.join(RIVER_VARIANTS)}")
