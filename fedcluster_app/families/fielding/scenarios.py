"""Fielding's drift scenarios (docs/fielding/README.md, "Scenarios").

* ``labels-small-large`` (the small experiment of docs/fielding/README.md): 30 clients, 10-class Gaussian
  mixture in 64-d (means N(0, I/9), unit noise: nearest-mean accuracy 0.84 under a uniform prior),
  label groups G1 = {0..3}, G2 = {4..6}, G3 = {7..9}; client i is in group i mod 3 with its own
  Dirichlet(5) proportions. At 1/3 of the steps 30% of the clients move to the next group (small
  drift: moves, no re-clustering); at 2/3 all clients re-form into {0..4} and {5..9} (large drift:
  one global re-clustering, K 3 -> 2).
* ``labels-frequent-small``: the same groups; every step from step 2 on, 2 random clients move to
  the next group (many small drifts: where tau = 0 churns).
* ``digits-buckets`` / ``mixture-buckets``: the streaming label-bucket trace the paper built from
  Open Images (docs/fielding/README.md, Scenarios): each client's label set is split at random into
  buckets; the window holds two consecutive buckets and one new bucket streams in per time step
  (after the last bucket the stream starts over). Digits: every client holds the 10 digits in 5
  buckets of 2 (window = 4 labels), inputs with Gaussian noise (std 0.3) so that one global model
  is not already near-perfect. Mixture: 30 classes in 16-d (means N(0, 0.49 I), unit noise:
  nearest-mean accuracy 0.69 under a uniform prior); every client holds 10 of them in 5 buckets.
* ``digits-concept-swap`` (the paper's appendix experiment, docs/fielding/README.md D16): static digits
  with a uniform class prior; at step ``drift-step`` (default: 1/3 of the steps) half of the
  clients, picked at random, each swap two random labels A <-> B. Their label vectors do not
  change (uniform prior, exact label counts): only a loss-based representation (gradients) can
  see this drift.

Label counts are exact (largest remainder of p * n), so a client whose distribution does not
change reports the same label vector at every step: with ``eps-drift = 0`` only real drifts
count. Concept ids (ground truth, metrics only) are the distinct label distributions (bucket
scenarios: the distinct window label sets) or (label group, swap) pairs.
"""

from __future__ import annotations

import math

import numpy as np

from fedcluster_app.core.data.drift import (
    ClassConcept,
    ClassRealisation,
    ImageSource,
    MixtureSource,
    largest_remainder,
    swap_permutation,
)
from fedcluster_app.core.data.generators import digits_pools
from fedcluster_app.core.data.scenarios import Scenario, ScenarioSpec

TAG_MEANS = 10  # default_rng([seed, 0, 0, TAG_MEANS]): the mixture's class means
TAG_TRACE = 4  # default_rng([seed, 0, 0, TAG_TRACE]): the drift trace (who moves, buckets)
GROUPS3 = ((0, 1, 2, 3), (4, 5, 6), (7, 8, 9))
GROUPS2 = ((0, 1, 2, 3, 4), (5, 6, 7, 8, 9))


class ExactLabelRealisation(ClassRealisation):
    """A :class:`ClassRealisation` whose label counts are exactly the class prior times n
    (largest remainder), in random order; inputs are drawn as usual."""

    def draw_labels(self, concept: int, n: int, rng: np.random.Generator, *, client: int,
                    train: bool) -> np.ndarray:
        counts = largest_remainder(self.class_prior(concept, client, train), n)
        y_true = rng.permutation(np.repeat(np.arange(self.num_classes), counts))
        return y_true


def _mask(labels, num_classes: int) -> tuple[float, ...]:
    m = np.zeros(num_classes)
    m[list(labels)] = 1.0
    return tuple(float(v) for v in m)


def _int(key: str, value, default: int) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{key} must be an integer >= 0 (0 = the scenario's default), got {value!r}")
    return int(value) or default


def _common(name: str, kwargs: dict, clients: int, steps: int, samples: int, test: int):
    if str(kwargs.get("schedule", "")).strip() or str(kwargs.get("drift_pattern", "")).strip():
        raise ValueError(f"scenario {name} has its own drift trace: schedule and drift-pattern "
                         "cannot replace it")
    seed = _int("seed", kwargs.get("seed", 0), 0) if kwargs.get("seed", 0) else 0
    p = _int("num_clients", kwargs.get("num_clients", 0), clients)
    t = _int("num_steps", kwargs.get("num_steps", 0), steps)
    n = _int("samples_per_step", kwargs.get("samples_per_step", 0), samples)
    nt = _int("test_samples", kwargs.get("test_samples", 0), test)
    if p < 4:
        raise ValueError(f"scenario {name} needs at least 4 clients, got {p}")
    if t < 2:
        raise ValueError(f"scenario {name} needs at least 2 time steps, got {t}")
    return seed, p, t, n, nt, ScenarioSpec(name=name, **kwargs)   # the arguments as given


def _dirichlet_priors(p: int, c: int, alpha: float, seed: int) -> np.ndarray:
    return np.stack([np.random.default_rng([seed, k, 0, 2]).dirichlet(np.full(c, alpha))
                     for k in range(p)])


def gaussian_means(num_classes: int, dim: int, scale: float, seed: int) -> np.ndarray:
    """Class means N(0, scale^2 I) of the mixture x = mean_y + N(0, I) (``labels-small-large``: 10
    classes, 64-d, scale 1/3 = unit means with noise sigma 3; nearest-mean accuracy 0.84 under a
    uniform prior)."""
    return np.random.default_rng([seed, 0, 0, TAG_MEANS]).standard_normal((num_classes, dim)) * scale


def _mixture_factory(num_classes: int, dim: int, scale: float, seed: int, concepts, priors):
    def factory():
        return ExactLabelRealisation(MixtureSource(gaussian_means(num_classes, dim, scale, seed)),
                                     concepts, priors)
    return factory


def _digits_factory(seed: int, concepts, priors):
    def factory():
        return ExactLabelRealisation(ImageSource(*digits_pools(seed)), concepts, priors)
    return factory


# ------------------------------------------------------------------------------ label groups
def group_scenario(name: str, description: str, frequent: bool, **kwargs) -> Scenario:
    seed, p, t, n, nt, spec = _common(name, kwargs, 30, 20 if frequent else 12, 80, 100)
    groups = list(GROUPS3) + list(GROUPS2)
    concepts = [ClassConcept(f"labels {g[0]}-{g[-1]}", prior_weights=_mask(g, 10)) for g in groups]
    rng = np.random.default_rng([seed, 0, 0, TAG_TRACE])
    m = np.zeros((t, p), dtype=np.int64)
    group = np.arange(p) % 3
    if frequent:
        first = 2
        for step in range(1, t + 1):
            if step >= 2:
                movers = rng.choice(p, size=2, replace=False)
                group[movers] = (group[movers] + 1) % 3
            m[step - 1] = group
    else:
        d = _int("drift_step", kwargs.get("drift_step", 0), t // 3 + 1)
        large = max(d + 1, (2 * t) // 3 + 1)
        if not 2 <= d < large <= t:
            raise ValueError(f"{name}: drift_step {d} leaves no room for the large drift "
                             f"(num_steps {t})")
        first = d
        movers = rng.choice(p, size=max(1, round(0.3 * p)), replace=False)
        for step in range(1, t + 1):
            if step == d:
                group[movers] = (group[movers] + 1) % 3
            if step >= large:
                group = 3 + np.arange(p) % 2
            m[step - 1] = group
    priors = _dirichlet_priors(p, 10, 5.0, seed)
    return Scenario(
        name=name, description=description, matrix=m,
        realisation_factory=_mixture_factory(10, 64, 1.0 / 3.0, seed, concepts, priors),
        num_classes=10, input_shape=(64,), model="mlp", hidden=0, data_seed=seed,
        samples_per_step=n, test_samples=nt, drift_pattern="fielding label groups",
        drift_step=first, dirichlet_alpha=5.0, concept_labels=[c.name for c in concepts],
        spec=spec)


# ------------------------------------------------------------------------------ label buckets
def bucket_scenario(name: str, description: str, data: str, **kwargs) -> Scenario:
    if data == "digits":
        classes, held, buckets, clients = 10, 10, 5, 30
    else:
        classes, held, buckets, clients = 30, 10, 5, 50
    seed, p, t, n, nt, spec = _common(name, kwargs, clients, 9, 200, 100)
    rng = np.random.default_rng([seed, 0, 0, TAG_TRACE])
    windows = []
    for _ in range(p):
        labels = rng.choice(classes, size=held, replace=False)
        parts = np.array_split(rng.permutation(labels), buckets)
        windows.append([frozenset(int(v) for v in np.concatenate(
            [parts[(s - 1) % buckets], parts[s % buckets]])) for s in range(1, t + 1)])
    table: dict[frozenset, int] = {}
    m = np.zeros((t, p), dtype=np.int64)
    for k in range(p):
        for s in range(t):
            m[s, k] = table.setdefault(windows[k][s], len(table))
    noise = 0.3 if data == "digits" else 0.0
    concepts = [ClassConcept("labels " + ",".join(map(str, sorted(w))),
                             noise_std=noise, prior_weights=_mask(w, classes))
                for w, _ in sorted(table.items(), key=lambda kv: kv[1])]
    priors = _dirichlet_priors(p, classes, 2.0, seed)
    if data == "digits":
        factory = _digits_factory(seed, concepts, priors)
        shape, hidden = (1, 8, 8), 32
    else:
        factory = _mixture_factory(classes, 16, 0.7, seed, concepts, priors)
        shape, hidden = (16,), 64
    return Scenario(
        name=name, description=description, matrix=m, realisation_factory=factory,
        num_classes=classes, input_shape=shape, model="mlp", hidden=hidden, data_seed=seed,
        samples_per_step=n, test_samples=nt, drift_pattern="fielding label buckets",
        drift_step=2, dirichlet_alpha=2.0, concept_labels=[c.name for c in concepts],
        spec=spec)


# ------------------------------------------------------------------------------ concept swap
def swap_scenario(name: str, description: str, **kwargs) -> Scenario:
    seed, p, t, n, nt, spec = _common(name, kwargs, 20, 6, 200, 100)
    d = _int("drift_step", kwargs.get("drift_step", 0), max(2, math.ceil(t / 3)))
    if not 2 <= d <= t:
        raise ValueError(f"{name}: drift_step {d} outside 2..{t}")
    rng = np.random.default_rng([seed, 0, 0, TAG_TRACE])
    swapped = rng.choice(p, size=p // 2, replace=False)
    pairs: dict[tuple[int, int], int] = {}
    m = np.zeros((t, p), dtype=np.int64)
    for k in sorted(swapped):
        a, b = sorted(int(v) for v in rng.choice(10, size=2, replace=False))
        cid = pairs.setdefault((a, b), len(pairs) + 1)
        m[d - 1:, k] = cid
    concepts = [ClassConcept("original")] + [
        ClassConcept(f"swap {a}<->{b}", perm=swap_permutation(10, a, b))
        for (a, b), _ in sorted(pairs.items(), key=lambda kv: kv[1])]
    priors = np.full((p, 10), 0.1)
    return Scenario(
        name=name, description=description, matrix=m,
        realisation_factory=_digits_factory(seed, concepts, priors),
        num_classes=10, input_shape=(1, 8, 8), model="mlp", hidden=32, data_seed=seed,
        samples_per_step=n, test_samples=nt, drift_pattern="fielding label swaps",
        drift_step=d, dirichlet_alpha=math.inf, concept_labels=[c.name for c in concepts],
        spec=spec)
