"""FedRC's client populations: feature, label and concept shift at once (docs/fedrc/README.md, "The
small experiment and its acceptance checks"), plus the single-shift ablations of the paper's
Table 8.

Scenarios
---------

* ``shifts-3`` (the small experiment's data, calibrated): C = 10 classes in d = 20 dimensions,
  class means random unit directions scaled to norm 3 (drawn from the data seed),
  ``x = mu_y + N(0, I)``.
* ``shifts-3-mild``: the same with mild label skew, Dirichlet 0.5 per class (the small
  experiment's control).
* ``digits-shifts-3`` (the small experiment's digits): scikit-learn's 8x8 digits. About 80% of
  the images form the training pool and the other 20% the held-out pool (split stratified by
  class, from the data seed). Corrupted clients get one style each.
* ``shifts-feature-only``, ``shifts-label-only``, ``shifts-concept-only``: the Gaussian data of
  ``shifts-3`` with exactly one of the three shifts switched on (the paper's Table 8).

Population (all scenarios)
--------------------------

* M participating clients (default 30; the ``num_clients`` argument sets M) get ids ``0..M-1``.
  Three held-out test clients get ids ``M, M+1, M+2``, so the scenario has ``M + 3`` clients.
  The held-out clients are declared with ``Scenario(holdout_clients=(M, M+1, M+2))``: they never
  train, and strategies use them to measure global accuracy.
* Roles (docs/fedrc/README.md, D14): concept 0 (labels unchanged) goes to 40% of the clients, half of
  them feature-shifted. Concept 1 (``y -> 9 - y``) goes to 30%, a third of them feature-shifted.
  Concept 2 (``y -> (y + 1) mod 10``) goes to 30%, a third of them feature-shifted. For M = 30
  that is 6 + 6, 6 + 3 and 6 + 3 clients. For other M the concept counts are a largest-remainder
  apportionment of 40/30/30% with at least one client per concept. The corrupted count of a
  concept is its share rounded half up, capped so that every concept keeps at least one clean
  client. The roles are dealt, in block order, to a random permutation of the client ids drawn
  from the data seed (the authors' code shuffles the ids too).
* Label skew: each participating client has a class prior ``q_c ~ Dirichlet(alpha * 1_C)``
  (``alpha`` = 0.1 by default, or 0.5 for ``-mild``; the ``dirichlet_alpha`` argument overrides
  it, and ``inf`` means a uniform prior). Its labels are drawn i.i.d. from ``q_c`` over the
  *true* classes. A concept changes only the reported label (``ClassConcept.perm``).
* Feature shift, Gaussian data: each corrupted client has a severity ``s ~ U{1..5}`` and a fixed
  offset ``o ~ N(0, (0.2 s)^2 I)``. Each of its samples is ``x' = x + o + N(0, (0.2 s)^2 I)``.
* Feature shift, digits: each corrupted client has one style and a severity ``s ~ U{1..5}``,
  computed in the pool's [0, 1] units:

  - ``noise``: add Gaussian noise with sigma = s/16, then clip to [0, 1];
  - ``invert``: ``1 - x``;
  - ``translate``: shift by 1 pixel in a per-client direction (up, down, left or right), with
    zero fill;
  - ``blur``: a 3x3 mean filter with zero padding;
  - ``dropout``: each pixel is set to 0 with probability 0.1 s.

  The severity changes only ``noise`` and ``dropout``; the other styles record it but do not
  use it.
* Sizes: a participating client has n = 150 samples per step (the ``samples_per_step``
  argument sets n), split into ``n - round(0.1 n)`` training samples (135) and ``round(0.1 n)``
  local test samples (15). A nonzero ``test_samples`` argument replaces the local test size
  only. The scenario's ``samples_per_step`` / ``test_samples`` *attributes* hold the resulting
  135 / 15.
* Held-out clients: each one has 300 fresh clean samples per step, 30 per class, with labels
  mapped by its concept. The split is stratified: the ``x_train`` split (40%, the adaptation
  data) has 12 per class and the ``x_test`` split (60%, the evaluation data) has 18 per class.
  Both splits are therefore exactly balanced, and global accuracy is class-balanced. Their sizes
  do not depend on ``n``. The scenarios with three concepts get one held-out client per concept
  (0, 1, 2). ``shifts-feature-only`` and ``shifts-label-only`` have only concept 0, so their
  three held-out clients all use concept 0, with independent samples. Three clients instead of
  one make the global accuracy less noisy (540 evaluation samples instead of 180) and keep the
  same id layout.
* Digits inputs: a participating client splits every class of the training pool, once, into its
  own 90% training and 10% local test images. A held-out client splits the held-out pool 40/60
  the same way. Within one (client, step, split), the draws of a class take each image at most 3
  times (the paper's triplicated pool), or at most once for held-out clients. They fall back to
  drawing with replacement only when a class asks for more than that. A client's local test
  images are therefore never among its training images.
* Time: ``num_steps`` defaults to 1, a static population (run it with ``rounds-per-step = T``).
  With more steps, every step draws fresh samples from the same per-client distribution (the
  same concept, prior, severity, offset and style): there is no drift. A ``.cp`` schedule, a
  drift pattern other than ``none`` or a nonzero ``drift_step`` is rejected.

Determinism: global constants (class means, role permutation, digits pool split) come from
``default_rng([data_seed, 0, 0, tag])``. Per-client constants (prior, severity, offset, style,
image split) come from ``default_rng([data_seed, client, 0, tag])``. The samples of a (client,
step) use the scenario's own streams ``[data_seed, client, step, 0 / 1]``.

Diagnostics: ``scenario.client_roles`` is a list with one entry per client, held-out clients
included. Each entry is ``{"concept": int, "corrupted": bool, "style": str, "severity": int,
"holdout": bool}``, where ``style`` is ``"clean"`` (with severity 0), ``"gaussian"`` (Gaussian
data) or a digits style name. ``scenario.class_priors`` is the ``(M + 3, C)`` matrix of class
priors over the true classes; held-out clients have uniform rows. ``scenario.shifts`` is
``{"feature": bool, "label": bool, "concept": bool}`` and says which shifts are switched on.
``scenario.num_participants`` is M. The concept matrix holds every client's concept, held-out
clients included. ``scenario.realisation.client_shifts[k]`` holds client k's feature-shift
constants (``offset`` for the Gaussian data, ``direction`` for the digits' translate style).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from fedcluster_app.core.data.drift import (
    ClassConcept,
    ClassRealisation,
    balanced_labels,
    client_prior,
    cyclic_permutation,
)
from fedcluster_app.core.data.generators import ImagePool, stratified_split
from fedcluster_app.core.data.scenarios import (
    TAG_PRIOR,
    Scenario,
    ScenarioSpec,
    dirichlet_alpha_arg,
)
from fedcluster_app.families.fedrc.catalogue import VARIANTS

__all__ = [
    "DIGIT_STYLES",
    "FedRCRealisation",
    "build_fedrc",
    "class_means",
    "corrupt_digits",
    "fedrc_concepts",
    "role_table",
]

NUM_CLASSES = 10
DIM = 20
MEAN_NORM = 3.0
DEFAULT_CLIENTS = 30
DEFAULT_SAMPLES = 150
LOCAL_TEST_FRACTION = 0.1
SHIFT_SCALE = 0.2          # feature-shift std = 0.2 * severity
MAX_SEVERITY = 5
NUM_HOLDOUTS = 3
HOLDOUT_ADAPT_PER_CLASS = 12   # 40% of 30
HOLDOUT_EVAL_PER_CLASS = 18    # 60% of 30
DIGITS_HOLDOUT_FRACTION = 0.2  # ~80% of the images form the training pool (docs/fedrc/README.md)
DIGITS_COPIES = 3              # the pool is "triplicated" (each image at most 3x per draw)
DIGIT_STYLES = ("noise", "invert", "translate", "blur", "dropout")
CONCEPT_SHARES = (0.4, 0.3, 0.3)
CORRUPTED_SHARES = (0.5, 1.0 / 3.0, 1.0 / 3.0)  # of each concept's clients

# stream tags (distinct from scenarios.py's 0/1/2 and generators.py's 10/11)
TAG_MEANS = 0x6C1      # global: class means
TAG_ROLES = 0x6C2      # global: permutation of the client ids
TAG_SHIFT = 0x6C3      # per client: severity, style, offset, direction
TAG_POOL = 0x6C4       # global: digits train/held-out pool split
TAG_IMAGES = 0x6C5     # per client: the client's own image split


# ------------------------------------------------------------------------------- concepts


def fedrc_concepts(num_classes: int = NUM_CLASSES) -> list[ClassConcept]:
    """Concept 0: labels unchanged; 1: ``y -> C-1-y``; 2: ``y -> (y+1) mod C``."""
    return [
        ClassConcept("y"),
        ClassConcept(f"{num_classes - 1}-y", perm=tuple(num_classes - 1 - c
                                                         for c in range(num_classes))),
        ClassConcept(f"(y+1)%{num_classes}", perm=cyclic_permutation(num_classes, 1)),
    ]


def class_means(seed: int, num_classes: int = NUM_CLASSES, dim: int = DIM,
                norm: float = MEAN_NORM) -> np.ndarray:
    """Class means: random unit directions scaled to ``norm`` (read-only)."""
    z = np.random.default_rng([seed, 0, 0, TAG_MEANS]).standard_normal((num_classes, dim))
    m = norm * z / np.linalg.norm(z, axis=1, keepdims=True)
    m.setflags(write=False)
    return m


def _largest_remainder(shares: tuple[float, ...], total: int) -> list[int]:
    raw = [s * total for s in shares]
    counts = [int(math.floor(r)) for r in raw]
    order = sorted(range(len(raw)), key=lambda j: (-(raw[j] - counts[j]), j))
    for j in order[: total - sum(counts)]:
        counts[j] += 1
    return counts


def role_table(num_clients: int) -> list[tuple[int, bool]]:
    """``(concept, corrupted)`` of the role blocks in the order of docs/fedrc/README.md's population
    (concept 0 clean, concept 0 corrupted, concept 1 clean, ...), with ``num_clients`` entries."""
    if num_clients < len(CONCEPT_SHARES):
        raise ValueError(f"need at least {len(CONCEPT_SHARES)} clients, got {num_clients}")
    counts = _largest_remainder(CONCEPT_SHARES, num_clients)
    while min(counts) == 0:  # every concept gets at least one client
        counts[counts.index(max(counts))] -= 1
        counts[counts.index(0)] += 1
    roles: list[tuple[int, bool]] = []
    for concept, (count, share) in enumerate(zip(counts, CORRUPTED_SHARES)):
        bad = min(int(math.floor(share * count + 0.5)), max(0, count - 1))
        roles += [(concept, False)] * (count - bad) + [(concept, True)] * bad
    return roles


# ------------------------------------------------------------------------------ the digits


@lru_cache(maxsize=4)
def _digits_pools(seed: int) -> tuple[ImagePool, ImagePool]:
    """The digits split 80/20 by class (the held-out 20% feeds the held-out clients)."""
    from sklearn.datasets import load_digits  # deferred: bundled with scikit-learn

    d = load_digits()
    images = np.asarray(d.images, dtype=np.uint8)[:, None, :, :]  # values 0..16
    labels = np.asarray(d.target, dtype=np.int64)
    tr, te = stratified_split(labels, DIGITS_HOLDOUT_FRACTION,
                              np.random.default_rng([seed, 0, 0, TAG_POOL]))
    return (ImagePool(images[tr], labels[tr], NUM_CLASSES, 16.0),
            ImagePool(images[te], labels[te], NUM_CLASSES, 16.0))


_DIRECTIONS = ((-1, 0), (1, 0), (0, -1), (0, 1))  # (rows, cols): up, down, left, right


def _translate(x: np.ndarray, direction: int) -> np.ndarray:
    dr, dc = _DIRECTIONS[direction % len(_DIRECTIONS)]
    out = np.zeros_like(x)
    h, w = x.shape[-2:]
    src_r = slice(max(0, -dr), h - max(0, dr))
    dst_r = slice(max(0, dr), h - max(0, -dr))
    src_c = slice(max(0, -dc), w - max(0, dc))
    dst_c = slice(max(0, dc), w - max(0, -dc))
    out[..., dst_r, dst_c] = x[..., src_r, src_c]
    return out


def _mean_blur3(x: np.ndarray) -> np.ndarray:
    h, w = x.shape[-2:]
    pad = [(0, 0)] * (x.ndim - 2) + [(1, 1), (1, 1)]
    p = np.pad(x, pad)
    acc = np.zeros_like(x)
    for dr in range(3):
        for dc in range(3):
            acc += p[..., dr:dr + h, dc:dc + w]
    return acc / np.float32(9.0)


def corrupt_digits(x: np.ndarray, style: str, severity: int, rng: np.random.Generator,
                   direction: int = 0) -> np.ndarray:
    """One feature-shift style (docs/fedrc/README.md, Digits) applied to images in [0, 1]; float32."""
    x = np.asarray(x, dtype=np.float32)
    if style == "noise":
        out = x + rng.normal(0.0, severity / 16.0, size=x.shape).astype(np.float32)
        return np.clip(out, 0.0, 1.0)
    if style == "invert":
        return np.float32(1.0) - x
    if style == "translate":
        return _translate(x, direction)
    if style == "blur":
        return _mean_blur3(x)
    if style == "dropout":
        keep = rng.random(x.shape) >= 0.1 * severity
        return (x * keep).astype(np.float32)
    raise ValueError(f"unknown digits style {style!r}; valid: {', '.join(DIGIT_STYLES)}")


def _draw_members(members: np.ndarray, count: int, copies: int,
                  rng: np.random.Generator) -> np.ndarray:
    """``count`` of ``members``, each at most ``copies`` times when possible, else with
    replacement."""
    if count <= 0:
        return np.zeros(0, dtype=np.int64)
    if len(members) == 0:
        raise ValueError("a class has no images in this client's share of the pool")
    if count <= copies * len(members):
        pick = rng.choice(copies * len(members), size=count, replace=False)
        return members[pick % len(members)]
    return members[rng.integers(0, len(members), size=count)]


# --------------------------------------------------------------------------- realisation


@dataclass(frozen=True)
class _ClientShift:
    concept: int
    corrupted: bool
    style: str
    severity: int
    holdout: bool
    offset: np.ndarray | None = None  # Gaussian data: per-client offset
    direction: int = 0                # digits translate: index into _DIRECTIONS

    def as_dict(self) -> dict[str, object]:
        return {"concept": self.concept, "corrupted": self.corrupted, "style": self.style,
                "severity": self.severity, "holdout": self.holdout}


class _GaussianInputs:
    def __init__(self, means: np.ndarray) -> None:
        self.means = np.asarray(means, dtype=np.float64)
        self.num_classes, dim = (int(s) for s in self.means.shape)
        self.input_shape = (dim,)
        self.is_image = False

    def present(self, train: bool) -> np.ndarray:
        return np.ones(self.num_classes, dtype=bool)

    def draw(self, client: int, classes: np.ndarray, rng: np.random.Generator, *,
             train: bool, holdout: bool) -> np.ndarray:
        z = rng.standard_normal((len(classes), self.means.shape[1]))
        return (self.means[classes] + z).astype(np.float32)


class _DigitsInputs:
    """Per-client image shares of the training pool (participants: 90% train / 10% local test)
    or of the held-out pool (held-out clients: 40% adaptation / 60% evaluation)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.train_pool, self.test_pool = _digits_pools(seed)
        self.num_classes = self.train_pool.num_classes
        self.input_shape = self.train_pool.shape
        self.is_image = True
        self._shares: dict[int, tuple[list[np.ndarray], list[np.ndarray]]] = {}
        self._lock = threading.Lock()

    def present(self, train: bool) -> np.ndarray:
        return self.train_pool.present & self.test_pool.present

    def _share(self, client: int, holdout: bool) -> tuple[list[np.ndarray], list[np.ndarray]]:
        with self._lock:
            hit = self._shares.get(client)
        if hit is not None:
            return hit
        pool = self.test_pool if holdout else self.train_pool
        frac = 0.6 if holdout else LOCAL_TEST_FRACTION
        rng = np.random.default_rng([self.seed, client, 0, TAG_IMAGES])
        first, second = [], []
        for members in pool.class_indices:
            members = members[rng.permutation(len(members))]
            k = int(math.floor(frac * len(members) + 0.5))
            if len(members) >= 2:
                k = min(max(k, 1), len(members) - 1)  # both parts non-empty
            second.append(np.sort(members[:k]))
            first.append(np.sort(members[k:]))
        out = (first, second)
        with self._lock:
            self._shares[client] = out
        return out

    def draw(self, client: int, classes: np.ndarray, rng: np.random.Generator, *,
             train: bool, holdout: bool) -> np.ndarray:
        pool = self.test_pool if holdout else self.train_pool
        parts = self._share(client, holdout)[0 if train else 1]
        copies = 1 if holdout else DIGITS_COPIES
        classes = np.asarray(classes, dtype=np.int64)
        idx = np.empty(len(classes), dtype=np.int64)
        for c in range(self.num_classes):
            pos = np.flatnonzero(classes == c)
            if len(pos):
                idx[pos] = _draw_members(parts[c], len(pos), copies, rng)
        return pool.get(idx)


class FedRCRealisation(ClassRealisation):
    """Labels from the client's prior (held-out clients: exactly balanced), inputs from the
    Gaussian classes or the client's share of the digits, then the client's feature shift and
    its concept's label map."""

    def __init__(self, source: _GaussianInputs | _DigitsInputs, concepts: list[ClassConcept],
                 priors: np.ndarray, shifts: list[_ClientShift]) -> None:
        super().__init__(source, concepts, priors)  # type: ignore[arg-type]
        self.client_shifts = list(shifts)

    def sample(self, concept: int, n: int, rng: np.random.Generator, *, client: int,
               train: bool) -> tuple[np.ndarray, np.ndarray]:
        sh = self.client_shifts[client]
        if sh.holdout:  # exactly balanced, whatever n the scenario asks for
            per = HOLDOUT_ADAPT_PER_CLASS if train else HOLDOUT_EVAL_PER_CLASS
            y_true = rng.permutation(np.repeat(np.arange(self.num_classes, dtype=np.int64), per))
        else:
            y_true = self.draw_labels(concept, n, rng, client=client, train=train)
        return self._realise_for(client, concept, y_true, rng, train=train)

    def balanced_sample(self, concept: int, n: int, rng: np.random.Generator, *, client: int
                        ) -> tuple[np.ndarray, np.ndarray]:
        """Every class equally often, from the client's own test inputs and with its feature
        shift (the base's class-balanced sample, on this scenario's per-client inputs)."""
        y_true = balanced_labels(self.source.present(False), n, rng)
        return self._realise_for(client, concept, y_true, rng, train=False)

    def _realise_for(self, client: int, concept: int, y_true: np.ndarray,
                     rng: np.random.Generator, *, train: bool) -> tuple[np.ndarray, np.ndarray]:
        """Inputs of the true classes from the client's share, its feature shift, the label map."""
        sh = self.client_shifts[client]
        x = self.source.draw(client, y_true, rng, train=train,  # type: ignore[call-arg]
                             holdout=sh.holdout)
        if sh.corrupted:
            if sh.offset is not None:
                std = SHIFT_SCALE * sh.severity
                x = x + sh.offset.astype(np.float32) + rng.normal(
                    0.0, std, size=x.shape).astype(np.float32)
            else:
                x = corrupt_digits(x, sh.style, sh.severity, rng, sh.direction)
        perm = self.concepts[concept].perm
        y = y_true if perm is None else np.asarray(perm, dtype=np.int64)[y_true]
        return np.ascontiguousarray(x, dtype=np.float32), y.astype(np.int64)


# ------------------------------------------------------------------------------- builders


def _int_arg(key: str, value: object) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{key} must be an integer, got {value!r}")
    if value < 0:
        raise ValueError(f"{key} must be >= 0 (0 = the scenario's default), got {value!r}")
    return int(value)


def build_fedrc(name: str, *, seed=0, num_clients=0, num_steps=0, samples_per_step=0,
                test_samples=0, schedule="", drift_pattern="", drift_step=0, dirichlet_alpha=0.0,
                data_dir="") -> Scenario:
    """Build the FedRC scenario ``name`` (uncached; ``build_scenario`` caches). See the module
    docstring for the arguments' meaning here."""
    key = str(name).strip().lower()
    if key not in VARIANTS:
        raise ValueError(f"unknown FedRC scenario {name!r}; valid: {', '.join(sorted(VARIANTS))}")
    v = VARIANTS[key]
    spec = ScenarioSpec(   # the arguments as given
        name=key, seed=seed, num_clients=num_clients, num_steps=num_steps,
        samples_per_step=samples_per_step, test_samples=test_samples, schedule=schedule,
        drift_pattern=drift_pattern, drift_step=drift_step, dirichlet_alpha=dirichlet_alpha,
        data_dir=data_dir)
    seed = _int_arg("seed", seed)
    m = _int_arg("num_clients", num_clients) or DEFAULT_CLIENTS
    t = _int_arg("num_steps", num_steps) or 1
    n = _int_arg("samples_per_step", samples_per_step) or DEFAULT_SAMPLES
    nt_given = _int_arg("test_samples", test_samples)
    if _int_arg("drift_step", drift_step):
        raise ValueError(f"scenario {key} is a static population (no drift): drift_step must be "
                         f"0, got {drift_step!r}")
    if str(schedule).strip():
        raise ValueError(f"scenario {key} is a static population: a .cp schedule does not apply "
                         f"(got schedule = {schedule!r})")
    pattern = str(drift_pattern).strip().lower()
    if pattern not in ("", "none", "static"):
        raise ValueError(f"scenario {key} is a static population: drift_pattern must be \"\" or "
                         f"\"none\", got {drift_pattern!r}")
    if m < NUM_HOLDOUTS:
        raise ValueError(f"scenario {key} needs num_clients >= 3 (one per concept), got {m}")
    n_test_default = int(math.floor(LOCAL_TEST_FRACTION * n + 0.5))
    if n < 2 or n - max(1, n_test_default) < 1:
        raise ValueError(f"scenario {key} needs samples_per_step >= 2 (90% train / 10% local "
                         f"test), got {n}")
    n_test_default = max(1, n_test_default)
    n_train = n - n_test_default
    n_test = nt_given or n_test_default
    alpha = dirichlet_alpha_arg(dirichlet_alpha)
    alpha = alpha or v.alpha

    # roles, dealt to a permutation of the participants' ids
    table = role_table(m)
    order = np.random.default_rng([seed, 0, 0, TAG_ROLES]).permutation(m)
    role_of: list[tuple[int, bool]] = [(0, False)] * m
    for pos, cid in enumerate(order):
        concept, corrupted = table[pos]
        role_of[int(cid)] = (concept if v.concept else 0, corrupted and v.feature)
    holdout_concepts = [0, 1, 2] if v.concept else [0, 0, 0]

    shifts: list[_ClientShift] = []
    for cid in range(m):
        concept, corrupted = role_of[cid]
        if not corrupted:
            shifts.append(_ClientShift(concept, False, "clean", 0, False))
            continue
        rng = np.random.default_rng([seed, cid, 0, TAG_SHIFT])
        s = int(rng.integers(1, MAX_SEVERITY + 1))
        if v.data == "gauss":
            offset = rng.normal(0.0, SHIFT_SCALE * s, size=DIM)
            offset.setflags(write=False)
            shifts.append(_ClientShift(concept, True, "gaussian", s, False, offset=offset))
        else:
            style = DIGIT_STYLES[int(rng.integers(len(DIGIT_STYLES)))]
            direction = int(rng.integers(len(_DIRECTIONS)))
            shifts.append(_ClientShift(concept, True, style, s, False, direction=direction))
    for concept in holdout_concepts:
        shifts.append(_ClientShift(concept, False, "clean", 0, True))
    total = m + NUM_HOLDOUTS
    holdouts = tuple(range(m, total))

    priors = np.stack(
        [client_prior(NUM_CLASSES, alpha, np.random.default_rng([seed, k, 0, TAG_PRIOR]))
         for k in range(m)]
        + [np.full(NUM_CLASSES, 1.0 / NUM_CLASSES)] * NUM_HOLDOUTS)
    priors.setflags(write=False)
    matrix = np.tile(np.array([sh.concept for sh in shifts], dtype=np.int64), (t, 1))
    concepts = fedrc_concepts(NUM_CLASSES)

    if v.data == "gauss":
        input_shape, model, hidden = (DIM,), "mlp", 32

        def factory():
            return FedRCRealisation(_GaussianInputs(class_means(seed)), concepts, priors, shifts)
    else:
        input_shape, model, hidden = (1, 8, 8), "cnn", 0

        def factory():
            return FedRCRealisation(_DigitsInputs(seed), concepts, priors, shifts)

    description = v.description
    if alpha != v.alpha:
        description += f" [Dirichlet {alpha:g}]"
    scen = Scenario(
        name=key, description=description, matrix=matrix, realisation_factory=factory,
        num_classes=NUM_CLASSES, input_shape=input_shape, model=model, hidden=hidden,
        data_seed=seed, samples_per_step=n_train, test_samples=n_test, drift_pattern="static",
        drift_step=0, dirichlet_alpha=alpha, concept_labels=[c.name for c in concepts],
        spec=spec, holdout_clients=holdouts)
    scen.client_roles = [sh.as_dict() for sh in shifts]  # type: ignore[attr-defined]
    scen.class_priors = priors  # type: ignore[attr-defined]
    shifts_on = {"feature": v.feature, "label": not math.isinf(alpha), "concept": v.concept}
    scen.shifts = shifts_on  # type: ignore[attr-defined]
    scen.num_participants = m  # type: ignore[attr-defined]
    return scen
