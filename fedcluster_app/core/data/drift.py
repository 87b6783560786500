"""Concept realisations: how a concept id turns into data.

Two kinds of datasets:

* **tabular** (SINE, CIRCLE, SEA): a concept *is* a decision rule (``generators.SineConcept``,
  ``CircleConcept``, ``SeaConcept``); :class:`TabularRealisation` samples it.
* **class-based** (Gaussian mixture, image pools): a sample is drawn as "pick a class from the
  client's class prior, then an input of that class", and a :class:`ClassConcept` modifies that
  draw. :class:`ClassRealisation` does it. A :class:`ClassConcept` combines any of

  - *label shift*: ``prior_weights`` multiply the client's own class prior (a Dirichlet draw, or
    uniform), which is then renormalised. Zeros restrict the classes that occur (FedDrift's
    MNIST-L), a skewed vector concentrates the prior;
  - *feature shift*: ``angle`` rotates images (``scipy.ndimage.rotate``, ``reshape=False``);
    ``noise_std`` adds Gaussian noise ``N(0, noise_std^2)`` to every input value (images are
    clipped back to ``[0, 1]``, mixture inputs are not);
  - *concept shift*: ``perm`` relabels, ``y -> perm[y]`` (label swaps, permutations). The
    class prior and the inputs refer to the *true* class; only the reported label changes.

Train and test data of a (client, step) come from the same concept and the same client prior;
pool datasets draw test inputs from a held-out test pool.

Small pools: a pool dataset draws with replacement, as many samples as asked. When the pool a
client draws from holds fewer rows than asked (a small dataset, a disjoint shard, a user's own
partition), the client uses what it has instead: each row at most once, the prior's share of
the pool's rows per class (the whole pool when the prior is the pool's own class frequencies),
so that it trains on, reports and is tested on distinct rows. ``oversample = True`` keeps the
draws with replacement (run-config key ``oversample``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from fedcluster_app.core.data.generators import ImagePool

__all__ = [
    "FEDCCFA_SWAP_PAIRS",
    "ClassConcept",
    "ClassRealisation",
    "ImageSource",
    "MixtureSource",
    "TabularRealisation",
    "balanced_labels",
    "client_prior",
    "cyclic_permutation",
    "fedccfa_group",
    "interpolate",
    "largest_remainder",
    "swap_permutation",
]

#: FedCCFA's label-swap pairs of groups G1, G2, G3 (docs/fedccfa/README.md, The algorithm).
FEDCCFA_SWAP_PAIRS = ((1, 2), (3, 4), (5, 6))


def fedccfa_group(client: int) -> int:
    """FedCCFA's swap group of a client: 0 (G1) if ``client % 10`` in {0,1,2}, 1 (G2) if in
    {3,4,5}, 2 (G3) if in {6,7,8,9}."""
    r = client % 10
    return 0 if r < 3 else (1 if r < 6 else 2)


def swap_permutation(num_classes: int, a: int, b: int) -> tuple[int, ...]:
    """The permutation that exchanges classes ``a`` and ``b`` (an involution)."""
    perm = list(range(num_classes))
    perm[a], perm[b] = perm[b], perm[a]
    return tuple(perm)


def cyclic_permutation(num_classes: int, shift: int = 1) -> tuple[int, ...]:
    """``y -> (y + shift) % num_classes``: every class relabelled (a derangement for shift != 0)."""
    return tuple((c + shift) % num_classes for c in range(num_classes))


@dataclass(frozen=True)
class ClassConcept:
    """One concept of a class-based dataset (see the module docstring). Defaults = no change."""

    name: str = "original"
    perm: tuple[int, ...] | None = None
    angle: float = 0.0
    noise_std: float = 0.0
    prior_weights: tuple[float, ...] | None = None

    def interpolate(self, other: object, frac: float) -> ClassConcept | None:
        """The concept a fraction ``frac`` of the way to ``other``: angle, noise and prior weights
        move linearly. ``None`` where that is meaningless (the label mappings differ)."""
        if not isinstance(other, ClassConcept) or self.perm != other.perm:
            return None
        if (self.angle, self.noise_std, self.prior_weights) == (
                other.angle, other.noise_std, other.prior_weights):
            return None
        weights = None
        if self.prior_weights is not None or other.prior_weights is not None:
            n = len(self.prior_weights or other.prior_weights or ())
            a = np.asarray(self.prior_weights if self.prior_weights is not None else [1.0] * n)
            b = np.asarray(other.prior_weights if other.prior_weights is not None else [1.0] * n)
            weights = tuple(float(v) for v in a + frac * (b - a))
        return ClassConcept(
            name=f"{self.name}->{other.name}@{frac:.2f}",
            perm=self.perm,
            angle=float(self.angle + frac * (other.angle - self.angle)),
            noise_std=float(self.noise_std + frac * (other.noise_std - self.noise_std)),
            prior_weights=weights,
        )


def interpolate(a: object, b: object, frac: float) -> object | None:
    """Intermediate concept between ``a`` and ``b`` (any concept type), or ``None``."""
    fn = getattr(a, "interpolate", None)
    return fn(b, frac) if fn is not None else None


def largest_remainder(p: np.ndarray, n: int) -> np.ndarray:
    """Integer counts summing to ``n`` closest to ``p * n`` (largest remainder; ties to the
    lower index)."""
    p = np.asarray(p, dtype=np.float64)
    raw = p * n
    counts = np.floor(raw).astype(np.int64)
    rest = n - int(counts.sum())
    if rest > 0:
        order = sorted(range(len(p)), key=lambda j: (-(raw[j] - counts[j]), j))
        for j in order[:rest]:
            counts[j] += 1
    return counts


def balanced_labels(present: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """The ``present`` classes (a mask over all classes) ``ceil(n / present classes)`` times
    each, in random order: a class-balanced sample of at least ``n`` labels."""
    classes = np.flatnonzero(present)
    if len(classes) == 0:
        raise ValueError("the test pool holds no class at all")
    per = max(1, -(-int(n) // len(classes)))
    return rng.permutation(np.repeat(classes, per)).astype(np.int64)


def client_prior(num_classes: int, alpha: float, rng: np.random.Generator) -> np.ndarray:
    """A client's class prior: ``Dirichlet(alpha * 1)``, or uniform for ``alpha = inf``."""
    if np.isinf(alpha):
        return np.full(num_classes, 1.0 / num_classes)
    p = rng.dirichlet(np.full(num_classes, float(alpha)))
    if not np.all(np.isfinite(p)) or p.sum() <= 0:  # tiny alpha can underflow
        p = np.zeros(num_classes)
        p[rng.integers(num_classes)] = 1.0
    return p / p.sum()


# --------------------------------------------------------------------------------- realisers


class Realisation(Protocol):
    num_classes: int
    input_shape: tuple[int, ...]
    concepts: Sequence[object]

    def sample(self, concept: int, n: int, rng: np.random.Generator, *, client: int,
               train: bool) -> tuple[np.ndarray, np.ndarray]: ...


class TabularRealisation:
    """Samples tabular concepts (objects with ``sample(n, rng)``, ``dim`` and optionally
    ``num_classes``, 2 when absent: FedDrift's streams are binary, River's RBF is not)."""

    def __init__(self, concepts: Sequence[object]) -> None:
        self.concepts = list(concepts)
        self.num_classes = max(int(getattr(c, "num_classes", 2)) for c in self.concepts)
        self.input_shape = (int(self.concepts[0].dim),)  # type: ignore[attr-defined]

    def sample(self, concept: int, n: int, rng: np.random.Generator, *, client: int,
               train: bool) -> tuple[np.ndarray, np.ndarray]:
        return self.concepts[concept].sample(n, rng)  # type: ignore[attr-defined]


class MixtureSource:
    """Inputs of a Gaussian class mixture: ``x = means[y] + N(0, I)`` (train and test alike)."""

    def __init__(self, means: np.ndarray) -> None:
        self.means = np.asarray(means, dtype=np.float64)
        self.num_classes = int(self.means.shape[0])
        self.input_shape = (int(self.means.shape[1]),)
        self.is_image = False

    def present(self, train: bool) -> np.ndarray:
        return np.ones(self.num_classes, dtype=bool)

    def rows(self, train: bool) -> None:
        """A generator: no finite pool of rows."""
        return None

    def draw(self, classes: np.ndarray, rng: np.random.Generator, *, train: bool,
             angle: float) -> np.ndarray:
        if angle:
            raise ValueError("rotation needs image inputs; a Gaussian mixture has none")
        z = rng.standard_normal((len(classes), self.means.shape[1]))
        return (self.means[classes] + z).astype(np.float32)


class ImageSource:
    """Inputs drawn with replacement from a train pool and a held-out test pool."""

    def __init__(self, train_pool: ImagePool, test_pool: ImagePool) -> None:
        if train_pool.shape != test_pool.shape:
            raise ValueError(f"train/test pools differ in shape: {train_pool.shape} vs "
                             f"{test_pool.shape}")
        self.train_pool = train_pool
        self.test_pool = test_pool
        self.num_classes = train_pool.num_classes
        self.input_shape = train_pool.shape
        self.is_image = True

    def present(self, train: bool) -> np.ndarray:
        return self.pool(train).present

    def pool(self, train: bool) -> ImagePool:
        return self.train_pool if train else self.test_pool

    def rows(self, train: bool) -> int:
        """How many rows the split's pool holds."""
        return len(self.pool(train))

    def draw(self, classes: np.ndarray, rng: np.random.Generator, *, train: bool,
             angle: float) -> np.ndarray:
        pool = self.pool(train)
        return pool.get(pool.draw_indices(classes, rng), angle)


class ClassRealisation:
    """Samples :class:`ClassConcept` concepts on top of a mixture or image source, with a
    per-client class prior (``priors[client]``)."""

    def __init__(self, source: MixtureSource | ImageSource, concepts: Sequence[ClassConcept],
                 priors: np.ndarray, oversample: bool = False) -> None:
        self.source = source
        self.oversample = bool(oversample)
        self.concepts = list(concepts)
        self.num_classes = source.num_classes
        self.input_shape = source.input_shape
        self.priors = np.asarray(priors, dtype=np.float64)
        for c in self.concepts:
            if c.perm is not None and sorted(c.perm) != list(range(self.num_classes)):
                raise ValueError(f"concept {c.name!r}: {c.perm} is not a permutation of "
                                 f"0..{self.num_classes - 1}")
            if c.prior_weights is not None and len(c.prior_weights) != self.num_classes:
                raise ValueError(f"concept {c.name!r}: needs {self.num_classes} prior weights")

    def class_prior(self, concept: int, client: int, train: bool = True) -> np.ndarray:
        """The prior over *true* classes of ``client`` under ``concept`` (classes missing from the
        pool get zero mass)."""
        c = self.concepts[concept]
        present = self.source.present(train)
        base = self.priors[client] * present
        w = np.ones(self.num_classes) if c.prior_weights is None else np.asarray(c.prior_weights)
        p = base * w
        if p.sum() <= 0:  # the client's prior has no mass where the concept puts it
            p = w * present
        if p.sum() <= 0:
            p = present.astype(np.float64)
        if p.sum() <= 0:
            raise ValueError("the data pool holds no images at all")
        return p / p.sum()

    def rows(self, client: int, train: bool) -> int | None:
        """How many rows the pool ``client`` draws from holds (None: a generator, or a source
        that does not say)."""
        rows = getattr(self.source, "rows", None)
        return rows(train) if rows is not None else None

    def short(self, client: int, n: int, train: bool) -> int | None:
        """The rows ``client`` holds when they are fewer than the ``n`` samples asked for (it
        then uses each at most once: module docstring), else None."""
        held = None if self.oversample else self.rows(client, train)
        return held if held is not None and n > held else None

    def sample(self, concept: int, n: int, rng: np.random.Generator, *, client: int,
               train: bool) -> tuple[np.ndarray, np.ndarray]:
        if self.short(client, n, train) is not None:
            return self.sample_distinct(concept, rng, client=client, train=train)
        y_true = self.draw_labels(concept, n, rng, client=client, train=train)
        return self.realise(concept, y_true, rng, train=train)

    def sample_distinct(self, concept: int, rng: np.random.Generator, *, client: int,
                        train: bool) -> tuple[np.ndarray, np.ndarray]:
        """The rows of a pool smaller than the sample asked for, each at most once: the prior's
        share of the pool's size per class (largest remainder), capped by the rows of the
        class, in random order."""
        pool = self.source.pool(train)
        counts = largest_remainder(self.class_prior(concept, client, train), len(pool))
        idx = [rng.permutation(members)[:k] for members, k in zip(pool.class_indices, counts)
               if k > 0]
        idx = np.concatenate(idx) if idx else np.zeros(0, dtype=np.int64)
        idx = idx[rng.permutation(len(idx))]
        c = self.concepts[concept]
        return self.transform(concept, pool.get(idx, c.angle), pool.labels[idx], rng)

    def balanced_sample(self, concept: int, n: int, rng: np.random.Generator, *, client: int
                        ) -> tuple[np.ndarray, np.ndarray]:
        """A class-balanced test sample of ``concept`` as ``client`` sees it: every class of
        the test pool ``ceil(n / classes)`` times (whatever the client's or the concept's class
        prior), inputs drawn with replacement from the test pool, then the concept's rotation,
        noise and label map: the global accuracy beside the personalised one (a label map
        permutes the classes, so the reported labels are balanced too)."""
        return self.realise(concept, balanced_labels(self.source.present(False), n, rng), rng,
                            train=False)

    def draw_labels(self, concept: int, n: int, rng: np.random.Generator, *, client: int,
                    train: bool) -> np.ndarray:
        """The true classes of ``n`` samples (subclasses change how labels are drawn)."""
        p = self.class_prior(concept, client, train)
        return rng.choice(self.num_classes, size=n, p=p).astype(np.int64)

    def realise(self, concept: int, y_true: np.ndarray, rng: np.random.Generator, *,
                train: bool) -> tuple[np.ndarray, np.ndarray]:
        """Inputs for the true classes, with the concept's rotation, noise and label map."""
        x = self.source.draw(y_true, rng, train=train, angle=self.concepts[concept].angle)
        return self.transform(concept, x, y_true, rng)

    def transform(self, concept: int, x: np.ndarray, y_true: np.ndarray,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """The concept's noise and label map on inputs ``x`` of the true classes ``y_true``."""
        c = self.concepts[concept]
        if c.noise_std > 0:
            x = x + rng.normal(0.0, c.noise_std, size=x.shape).astype(np.float32)
            if self.source.is_image:
                np.clip(x, 0.0, 1.0, out=x)
        y = y_true if c.perm is None else np.asarray(c.perm, dtype=np.int64)[y_true]
        return np.ascontiguousarray(x, dtype=np.float32), y.astype(np.int64)
