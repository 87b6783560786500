"""Data generators: FedDrift's tabular concepts, a Gaussian class mixture, and image pools.

Everything here is deterministic given the ``numpy.random.Generator`` it is handed; the scenarios
(see ``scenarios.py``) hand each (client, step) its own generator.

* Tabular concepts, exactly as in docs/feddrift/README.md, "Data and drift schedules" (SEA: D11):
  SINE (``x ~ U[0,1]^2``, ``y = 1 if x2 <= sin(x1)``; concept B flips the labels), CIRCLE
  (``x ~ U[0,1]^2``, ``y = 0`` inside the circle, 1 outside), SEA (``x ~ U[0,10]^3``,
  ``y = 1 if x1 + x2 <= threshold``, ``x3`` pure noise, every label flipped with probability
  0.1). Features are raw (no normalisation); labels are computed from the returned ``float32``
  features, so the rule holds exactly on what the caller sees.
* :func:`mixture_means`: class means of a Gaussian mixture ``x = mean_y + N(0, I)``, scaled so that
  the nearest-mean (Bayes) classifier is right ~96% of the time, i.e. an MLP learns the static
  problem to ~95%.
* :class:`ImagePool`: images of one split grouped by class, drawn with replacement; optional
  rotation (precomputed and cached per angle for small pools). :func:`digits_pools` builds the
  train/test pools of scikit-learn's bundled 8x8 digits; :func:`torchvision_pools` those of a local
  MNIST / Fashion-MNIST / CIFAR-10 copy.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

__all__ = [
    "CIRCLE_CONCEPTS",
    "CircleConcept",
    "ClassPool",
    "ImagePool",
    "SEA_THRESHOLDS",
    "SEA_THRESHOLDS_AUTHORS",
    "SINE_CONCEPTS",
    "SeaConcept",
    "SineConcept",
    "digits_pools",
    "mixture_means",
    "rotate_images",
    "stratified_split",
    "torchvision_pools",
]

# Fixed stream tags of "global" draws (not tied to one (client, step)); they come from
# np.random.default_rng([seed, 0, 0, tag]). Per-(client, step) tags live in scenarios.py.
TAG_MIXTURE_MEANS = 10
TAG_POOL_SPLIT = 11


# ---------------------------------------------------------------------------------- tabular


@dataclass(frozen=True)
class SineConcept:
    """SINE: ``x ~ U[0,1]^2``; ``y = 1`` if ``x2 <= sin(x1)`` else 0, flipped when ``flipped``."""

    flipped: bool = False
    name: str = "A"

    dim = 2

    def label(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        y = (x[:, 1] <= np.sin(x[:, 0])).astype(np.int64)
        return 1 - y if self.flipped else y

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        x = rng.uniform(0.0, 1.0, size=(n, 2)).astype(np.float32)
        return x, self.label(x)

    def interpolate(self, other: object, frac: float) -> None:
        return None  # a label flip has no intermediate concept


@dataclass(frozen=True)
class CircleConcept:
    """CIRCLE: ``x ~ U[0,1]^2``; ``y = 0`` inside (``|x - centre|^2 <= r^2``), 1 outside."""

    centre: tuple[float, float]
    radius: float
    name: str = "A"

    dim = 2

    def label(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        d2 = (x[:, 0] - self.centre[0]) ** 2 + (x[:, 1] - self.centre[1]) ** 2
        return (d2 > self.radius**2).astype(np.int64)

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        x = rng.uniform(0.0, 1.0, size=(n, 2)).astype(np.float32)
        return x, self.label(x)

    def interpolate(self, other: object, frac: float) -> CircleConcept | None:
        """The circle a fraction ``frac`` of the way to ``other`` (centre and radius linear)."""
        if not isinstance(other, CircleConcept):
            return None
        c = tuple(float(a + frac * (b - a)) for a, b in zip(self.centre, other.centre))
        r = float(self.radius + frac * (other.radius - self.radius))
        name = f"{self.name}->{other.name}@{frac:.2f}"
        return CircleConcept(c, r, name=name)  # type: ignore[arg-type]


@dataclass(frozen=True)
class SeaConcept:
    """SEA: ``x ~ U[0,10]^3``; ``y = 1`` if ``x1 + x2 <= threshold`` else 0 (``x3`` is noise);
    each label flipped independently with probability ``noise``."""

    threshold: float
    noise: float = 0.10
    name: str = "A"

    dim = 3

    def label(self, x: np.ndarray) -> np.ndarray:
        """Noise-free labels."""
        x = np.asarray(x, dtype=np.float64)
        return (x[:, 0] + x[:, 1] <= self.threshold).astype(np.int64)

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        x = rng.uniform(0.0, 10.0, size=(n, 3)).astype(np.float32)
        y = self.label(x)
        flip = rng.random(n) < self.noise
        return x, np.where(flip, 1 - y, y).astype(np.int64)

    def interpolate(self, other: object, frac: float) -> SeaConcept | None:
        """The threshold a fraction ``frac`` of the way to ``other``'s (same label noise)."""
        if not isinstance(other, SeaConcept):
            return None
        t = float(self.threshold + frac * (other.threshold - self.threshold))
        return SeaConcept(t, self.noise, name=f"{self.name}->{other.name}@{frac:.2f}")


SINE_CONCEPTS = (SineConcept(False, "A"), SineConcept(True, "B"))
CIRCLE_CONCEPTS = (
    CircleConcept((0.2, 0.5), 0.15, "A"),
    CircleConcept((0.6, 0.5), 0.25, "B"),
)
#: SEA thresholds of concepts A, B, C, D (FedDrift paper; 10% label noise on all of them).
SEA_THRESHOLDS = (9.0, 8.0, 7.0, 9.5)
#: the thresholds of the FedDrift authors' SEA data files (concept1-4.csv, labelled
#: ``[x2 + x3 > t]`` with about 10% of the labels flipped: our rule up to a relabelling):
#: concepts B and D are the same, so their SEA-4 has three distinct concepts
SEA_THRESHOLDS_AUTHORS = (8.0, 9.0, 7.0, 9.0)


# ---------------------------------------------------------------------------------- mixture


def _nearest_mean_accuracy(means: np.ndarray, y: np.ndarray, z: np.ndarray, scale: float) -> float:
    m = scale * means
    x = m[y] + z
    d2 = ((x[:, None, :] - m[None, :, :]) ** 2).sum(axis=-1)
    return float((d2.argmin(axis=1) == y).mean())


@lru_cache(maxsize=32)
def _mixture_means_cached(num_classes: int, dim: int, seed: int, target: float) -> np.ndarray:
    rng = np.random.default_rng([seed, 0, 0, TAG_MIXTURE_MEANS])
    means = rng.standard_normal((num_classes, dim))
    means -= means.mean(axis=0, keepdims=True) if num_classes > 1 else 0.0
    norms = np.linalg.norm(means, axis=1, keepdims=True)
    means = means / np.maximum(norms, 1e-12)  # unit directions; the scale is calibrated below
    if num_classes < 2:
        return means
    # Calibrate the scale with common random numbers: the nearest-mean rule is the Bayes rule
    # for equal priors and identity covariance, so its accuracy is the best any model can do.
    n = 20000
    y = rng.integers(0, num_classes, size=n)
    z = rng.standard_normal((n, dim))
    lo, hi = 0.0, 1.0
    while _nearest_mean_accuracy(means, y, z, hi) < target and hi < 1e4:
        hi *= 2.0
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        if _nearest_mean_accuracy(means, y, z, mid) < target:
            lo = mid
        else:
            hi = mid
    out = hi * means
    out.setflags(write=False)
    return out


def mixture_means(
    num_classes: int, dim: int, seed: int, target_accuracy: float = 0.96
) -> np.ndarray:
    """Class means ``(num_classes, dim)`` of the mixture ``x = mean_y + N(0, I)``, drawn from
    ``seed`` and scaled so that the Bayes (nearest-mean) accuracy under uniform class priors is
    ``target_accuracy`` (default 0.96: an MLP reaches ~95%). Read-only; cached."""
    if num_classes < 1 or dim < 1:
        raise ValueError(f"need num_classes >= 1 and dim >= 1, got {num_classes}, {dim}")
    if not 0.0 < target_accuracy < 1.0:
        raise ValueError(f"target_accuracy must be in (0, 1), got {target_accuracy}")
    return _mixture_means_cached(int(num_classes), int(dim), int(seed), float(target_accuracy))


# ------------------------------------------------------------------------------------ pools


def rotate_images(images: np.ndarray, angle: float) -> np.ndarray:
    """Rotate ``(N, C, H, W)`` images by ``angle`` degrees in the H-W plane
    (``scipy.ndimage.rotate``, ``reshape=False``, bilinear, zero fill). Returns ``float32``."""
    x = np.asarray(images, dtype=np.float32)
    if float(angle) % 360.0 == 0.0:
        return x.copy()
    from scipy import ndimage  # deferred: only image scenarios need it

    out = ndimage.rotate(x, float(angle), axes=(-1, -2), reshape=False, order=1,
                         mode="constant", cval=0.0)
    return np.asarray(out, dtype=np.float32)


class ClassPool:
    """The inputs of one split grouped by class, from which (client, step) samples are drawn
    with replacement, uniformly within a class: the part an image pool and a pool of flat
    features (``partition.FeaturePool``) share. The inputs are kept as ``images``, the name
    the sources read."""

    UNIT = "samples"   # what the error message calls the inputs

    def __init__(self, inputs: np.ndarray, labels: np.ndarray, num_classes: int) -> None:
        self.images = inputs
        self.labels = labels
        self.num_classes = int(num_classes)
        self.class_indices = [np.flatnonzero(labels == c) for c in range(self.num_classes)]
        self.present = np.array([len(ix) > 0 for ix in self.class_indices])

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self.images.shape[1:])

    def draw_indices(self, classes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One pool index per entry of ``classes``, uniform within the class, with replacement."""
        classes = np.asarray(classes, dtype=np.int64)
        idx = np.empty(len(classes), dtype=np.int64)
        for c in range(self.num_classes):
            pos = np.flatnonzero(classes == c)
            if len(pos) == 0:
                continue
            members = self.class_indices[c]
            if len(members) == 0:
                raise ValueError(f"class {c} has no {self.UNIT} in this pool")
            idx[pos] = members[rng.integers(0, len(members), size=len(pos))]
        return idx


class ImagePool(ClassPool):
    """The images of one split, grouped by class, from which (client, step) samples are drawn
    with replacement.

    ``images`` is ``(N, C, H, W)`` in any numeric dtype (kept as given, e.g. ``uint8`` to save
    memory); dividing by ``max_value`` maps it to ``[0, 1]``. Rotated copies of the whole pool are
    computed once per angle and cached when the pool is small (at most ``ROTATE_CACHE_VALUES``
    values, e.g. the digits); for big pools (MNIST, CIFAR-10) a full rotated copy per angle would
    cost hundreds of MB per process, so only the drawn images are rotated.
    """

    ROTATE_CACHE_VALUES = 4_000_000
    ROTATE_CACHE_ANGLES = 8
    UNIT = "images"

    def __init__(self, images: np.ndarray, labels: np.ndarray, num_classes: int,
                 max_value: float = 1.0) -> None:
        images = np.asarray(images)
        labels = np.asarray(labels, dtype=np.int64)
        if images.ndim != 4:
            raise ValueError(f"pool images must have shape (N, C, H, W), got {images.shape}")
        if len(images) != len(labels):
            raise ValueError(f"{len(images)} images but {len(labels)} labels")
        if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
            raise ValueError(f"pool labels must be in 0..{num_classes - 1}")
        super().__init__(images, labels, num_classes)
        self.max_value = float(max_value)
        self._rotated: dict[float, np.ndarray] = {}
        self._lock = threading.Lock()

    def _float(self, idx: np.ndarray | slice) -> np.ndarray:
        return self.images[idx].astype(np.float32) / np.float32(self.max_value)

    def get(self, idx: np.ndarray, angle: float = 0.0) -> np.ndarray:
        """``float32`` images ``idx`` in ``[0, 1]``, rotated by ``angle`` degrees."""
        angle = float(angle) % 360.0
        if angle == 0.0:
            return self._float(idx)
        if self.images.size > self.ROTATE_CACHE_VALUES:
            return rotate_images(self._float(idx), angle)
        with self._lock:
            rotated = self._rotated.get(angle)
        if rotated is None:
            rotated = rotate_images(self._float(slice(None)), angle)
            rotated.setflags(write=False)
            with self._lock:
                if len(self._rotated) >= self.ROTATE_CACHE_ANGLES:
                    self._rotated.pop(next(iter(self._rotated)))
                self._rotated[angle] = rotated
        return rotated[idx]


def stratified_split(labels: np.ndarray, test_fraction: float, rng: np.random.Generator
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Indices ``(train, test)``: per class, a random ``round(test_fraction * n_c)`` go to test."""
    labels = np.asarray(labels)
    train, test = [], []
    for c in np.unique(labels):
        ix = np.flatnonzero(labels == c)
        ix = ix[rng.permutation(len(ix))]
        k = int(round(test_fraction * len(ix)))
        test.append(ix[:k])
        train.append(ix[k:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


@lru_cache(maxsize=8)
def digits_pools(seed: int) -> tuple[ImagePool, ImagePool]:
    """Train/test pools of scikit-learn's bundled 8x8 digits (1797 images, no download):
    pixels 0..16 scaled to ``[0, 1]``, shape ``(1, 8, 8)``, split 75/25 stratified by class with a
    split drawn from ``seed``. Cached per seed."""
    from sklearn.datasets import load_digits  # deferred: bundled with scikit-learn

    d = load_digits()
    images = np.asarray(d.images, dtype=np.uint8)[:, None, :, :]  # values 0..16
    labels = np.asarray(d.target, dtype=np.int64)
    rng = np.random.default_rng([seed, 0, 0, TAG_POOL_SPLIT])
    tr, te = stratified_split(labels, 0.25, rng)
    return (ImagePool(images[tr], labels[tr], 10, 16.0),
            ImagePool(images[te], labels[te], 10, 16.0))


@lru_cache(maxsize=4)
def torchvision_pools(name: str, data_dir: str) -> tuple[ImagePool, ImagePool]:
    """Train/test pools of a local torchvision dataset (``mnist``, ``fashion-mnist``,
    ``cifar10``): the dataset's own train and test splits, stored as ``uint8``. Cached."""
    from fedcluster_app.core.data.loaders import load_image_dataset_uint8

    xtr, ytr = load_image_dataset_uint8(name, data_dir, train=True)
    xte, yte = load_image_dataset_uint8(name, data_dir, train=False)
    return (ImagePool(xtr, ytr, 10, 255.0), ImagePool(xte, yte, 10, 255.0))
