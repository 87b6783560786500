"""Named data-and-drift scenarios.

A :class:`Scenario` fixes, for every client ``k`` and time step ``t`` (1-based), the ground-truth
concept ``concept(k, t)`` and regenerates that (client, step)'s data on demand. Nothing is stored:
the training sample of (k, t) is drawn from ``np.random.default_rng([data_seed, k, t, 0])`` and
the test sample from ``np.random.default_rng([data_seed, k, t, 1])`` (per-client constants such
as the class prior use ``[data_seed, k, 0, 2]``), so any process rebuilds identical data from the
scenario arguments alone. Train and test of a step follow the same concept. Class-based
scenarios also give a class-balanced test sample of (k, t) (``Scenario.balanced_test``, from
``[data_seed, k, t, 3]``): the same concept with every class equally often, the global accuracy
beside the personalised one of the client's own test split.

Scenario families and what the drift patterns mean for each
------------------------------------------------------------

``drift_pattern`` (``build_scenario(drift_pattern=...)``) replaces a scenario's own schedule with a
programmatic one; ``d`` is ``drift_step``. "Drifting clients" and their "target" concept depend
on the family:

=================  ======================================  ==================  ================
family             concepts (id: meaning)                  drifting clients    target concept
=================  ======================================  ==================  ================
sine2              0: A, 1: B (= A with labels flipped)    first half          1
circle2            0: A, 1: B (circles: docs/feddrift/README.md)  first half          1
sea2 / sea4        thresholds 0: 9, 1: 8 (/ 2: 7, 3: 9.5)  first half          1 / 1 + k % 3
sea2/4-authors     thresholds 0: 8, 1: 9 (/ 2: 7, 3: 9)    first half          1 / 1 + k % 3
mixture-swap       0: original, 1: labels y -> (y+1) % C   first half          1
mixture-prior      0: client prior, 1: 90% of the mass on  first half          1
                   the first half of the classes
mixture-noise      0: original, 1: + N(0, 1^2) (inputs     first half          1
                   already have unit noise; not clipped)
mixture-mix        as ``*-mix`` with C = 4, noise std 1    first half          1 + k % 3
*-static, *-swap   0: original, 1: swap 1<->2, 2: swap     all (FedCCFA        group + 1
                   3<->4, 3: swap 5<->6 (FedCCFA groups)   groups, k % 10)
*-rotate           0: upright, 1: rotated by 90 degrees    even k              1
*-noise            0: clean, 1: + N(0, 0.5^2), clipped     even k              1
*-permute          0: original, 1: labels y -> (y+1) % C   first half          1
*-prior            as mixture-prior (C classes)            first half          1
*-mix              0: original, 1: concentrated (as        first half          1 + k % 3
                   ``-prior``), 2: noise 0.5 (as
                   ``-noise``), 3: permuted (as
                   ``-permute``): label, feature and
                   concept shift in one scenario
stagger3           STAGGER rules 0: small and red, 1:      first half          1 + k % 2
                   green or circle, 2: medium or large
agrawal4           Agrawal functions 0, 1, 2, 3            first half          1 + k % 3
hyperplane2        0: A, 1: B (Hyperplane seeds 7, 8)      first half          1
rbf4               RandomRBF centroid sets 0..3            first half          1 + k % 3
rbf-drift          RandomRBFDrift at item 0 / item 4000    first half          1
=================  ======================================  ==================  ================

("first half" = clients ``0 .. max(1, P // 2) - 1``.)

* ``none``: every client stays on concept 0 (no drift).
* ``sudden``: drifting clients move to their target at step ``d`` and stay.
* ``recurring``: drifting clients move to their target at ``d`` and then alternate between
  concept 0 and the target every ``max(1, (T - d + 1) // 2)`` steps (with the defaults: one
  switch and one return, like FedCCFA's "reoccurring" swap at round 100 and revert at 150).
* ``staggered``: FedDrift's MNIST-R: all clients on 0 before ``d``; at ``d`` and every 2 steps
  after, each client draws one of the family's base concepts uniformly and keeps it.
* ``incremental``: drifting clients reach their target through intermediate concepts, one per
  step from ``d`` on, where the realisation allows it: CIRCLE (centre and radius move), SEA
  (threshold moves), rotation (angles 30, 60, then 90 degrees), noise (std 1/6, 1/3, then 1/2;
  mixture-noise 1/3, 2/3, then 1), the prior weights (``*-prior``, mixture-prior); two
  intermediates at fractions 1/3 and 2/3, appended as new concept ids after the base concepts.
  Label swaps have no intermediate, so, as in FedCCFA, the swap groups drift one after another:
  G1 at ``d``, G2 at ``d + 1``, G3 at ``d + 2``. SINE (a label flip) and mixture-swap and
  ``*-permute`` (one permutation) have neither, so ``incremental`` = ``sudden``; in ``*-mix``
  the prior and noise clients walk through their intermediates while the permuted ones switch
  at ``d``; of River's streams (``river_streams.py``) the hyperplane moves (its weights) and
  RandomRBFDrift moves (its centroids, to intermediate stream positions); the others
  (STAGGER, Agrawal, RBF) drift suddenly.

``schedule`` replaces the schedule with a ``.cp`` file (or a bundled FedDrift schedule by name,
``"Y"``, ``"F"``, ...); its concept ids must be base concepts of the family.

Pool families and user data
---------------------------

The class pools (``digits``, ``mnist``, ``fmnist``, ``cifar10``, ``dataset``: the run-config key
``dataset`` read by ``sources.py``, and River's bundled tables ``imagesegments``, ``shuttle``,
``phishing``, ``bananas``) share the realisations ``static``, ``swap``, ``permute``, ``rotate``,
``noise``, ``prior`` and ``mix`` (``<pool>-<realisation>``). ``swap`` needs at least 7 classes (with
fewer, ``static`` has the one concept ``original``), ``rotate`` needs images: River tables have
neither with fewer than 7 classes, nor ``rotate``. Images get the ``cnn``, flat features an
``mlp`` of width ``max(16, 2 x features)``. ``partition`` and ``disjoint`` (``partition.py``)
decide how any pool is shared across clients; the defaults keep every scenario's data unchanged.
A user's table may instead name a ``partition_column``: one client per distinct value, with its
own rows. A client whose pool holds fewer rows than a step asks for uses each row once
(``drift.py``; ``oversample`` draws with replacement as before): ``Scenario.short_clients``
names them, ``Scenario.rows_held`` caps what they report.

Deployment: a SuperNode may hold its own file (node-config ``data-dir = "npz:PATH"``, see
``client_app.make_client``); the server then builds the scenario with ``data_dir =
METADATA_ONLY`` and, when it cannot read ``dataset`` itself, takes the number of classes and the
input shape from ``num_classes`` / ``input_shape`` (run-config ``num-classes`` / ``input-shape``).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import operator
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

import fedcluster_app.core.data.schedules as sch
from fedcluster_app.core.config import DataSettings, suggest
from fedcluster_app.core.data.catalogue import (
    _DEFS,
    _EXTRA,
    METADATA_ONLY,
    ScenarioDef,
    scenario_names,
)
from fedcluster_app.core.data.drift import (
    FEDCCFA_SWAP_PAIRS,
    ClassConcept,
    ClassRealisation,
    ImageSource,
    MixtureSource,
    TabularRealisation,
    client_prior,
    cyclic_permutation,
    fedccfa_group,
    interpolate,
    swap_permutation,
)
from fedcluster_app.core.data.generators import (
    CIRCLE_CONCEPTS,
    SEA_THRESHOLDS,
    SEA_THRESHOLDS_AUTHORS,
    SINE_CONCEPTS,
    SeaConcept,
    digits_pools,
    mixture_means,
    torchvision_pools,
)
from fedcluster_app.core.data.pools import (
    PoolSpec,
    check_not_pool,
    nonneg_int,
    partitioned,
    pool_args,
    user_pool_info,
    user_source,
)
from fedcluster_app.core.data.partition import check_groups, natural_realisation
from fedcluster_app.core.data.preprocessing import NONE as NO_PREPROCESSING
from fedcluster_app.core.data.preprocessing import scaling
from fedcluster_app.core.data.river_streams import river_concepts
from fedcluster_app.core.limits import check_client_steps

__all__ = [
    "DRIFT_PATTERNS",
    "Scenario",
    "ScenarioSpec",
    "StepData",
    "build_scenario",
    "short_clients_line",
]

# Stream tags of the per-(client, step) generators: default_rng([data_seed, client, step, tag]).
TAG_TRAIN = 0
TAG_TEST = 1
TAG_PRIOR = 2  # per-client constants use step 0
TAG_BALANCED = 3  # the class-balanced test sample of (client, step): Scenario.balanced_test

#: Valid ``drift_pattern`` values ("" = the scenario's own schedule).
DRIFT_PATTERNS = ("none", "sudden", "incremental", "recurring", "staggered")
_PATTERN_ALIASES = {"reoccurring": "recurring", "static": "none"}

# mixture defaults
MIXTURE_CLASSES = 4
MIXTURE_DIM = 8
# mixture-noise's std. The inputs already carry unit noise (x = mean_y + N(0, I)), so 0.5
# barely shows: a logistic regression fitted on 2000 concept-0 samples scores 0.954 / 0.961 /
# 0.959 on clean test data (mixture seeds 0 / 1 / 2), 0.931 / 0.939 / 0.932 with added std 0.5,
# 0.850 / 0.868 / 0.857 with std 1 (~0.76 with 1.5): std 1 doubles the input variance, a
# 10-point drop. The noise is isotropic, so the nearest-mean rule stays the best one (a model
# refitted on noisy data also scores ~0.86): the drop is what the shift costs, not a mistake a
# cluster model could fix.
MIXTURE_NOISE_STD = 1.0
# image concepts
ROTATE_ANGLE = 90.0
NOISE_STD = 0.5
INCREMENTAL_FRACTIONS = (1.0 / 3.0, 2.0 / 3.0)


@dataclass(frozen=True)
class StepData:
    """The data of one (client, time step). Arrays are shared with the scenario's cache and
    read-only: copy before modifying in place."""

    x_train: np.ndarray  # float32, (n_train, *input_shape)
    y_train: np.ndarray  # int64, (n_train,)
    x_test: np.ndarray  # float32, (n_test, *input_shape)
    y_test: np.ndarray  # int64, (n_test,)
    concept: int  # ground-truth concept id (metrics and the Oracle only)


def _nbytes(data: StepData) -> int:
    return data.x_train.nbytes + data.y_train.nbytes + data.x_test.nbytes + data.y_test.nbytes


class _BoundedCache:
    """Least recently used first out, bounded by its number of entries and by the bytes of
    its values (``nbytes(value)``); the newest entry always stays. Not locked: its owner's
    lock guards it."""

    def __init__(self, nbytes: Callable[[Any], int]) -> None:
        self.entries: OrderedDict = OrderedDict()
        self.bytes = 0
        self._nbytes = nbytes

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, key) -> bool:
        return key in self.entries

    def get(self, key):
        hit = self.entries.get(key)
        if hit is not None:
            self.entries.move_to_end(key)
        return hit

    def put(self, key, value, max_entries: int, max_bytes: int) -> None:
        if key not in self.entries:
            self.bytes += self._nbytes(value)
        self.entries[key] = value
        self.entries.move_to_end(key)
        while len(self.entries) > 1 and (len(self.entries) > max_entries
                                         or self.bytes > max_bytes):
            self.bytes -= self._nbytes(self.entries.popitem(last=False)[1])


# ---------------------------------------------------------------------------------- families


@dataclass
class _Family:
    concepts: list[object]
    labels: list[str]
    drifting: Callable[[int], list[int]]  # num_clients -> drifting clients
    target: Callable[[int], int]  # client -> target concept
    sequential_groups: bool = False  # incremental = groups drift one after another


def _first_half(p: int) -> list[int]:
    return list(range(max(1, p // 2)))


def _even(p: int) -> list[int]:
    return list(range(0, p, 2))


def _family(d: ScenarioDef, num_classes: int = 10, image: bool = True) -> _Family:
    """The concepts of ``d``; a class pool's depend on its number of classes and on whether
    its inputs are images (a user's dataset, River tables)."""
    if d.data == "sine":
        return _Family(list(SINE_CONCEPTS), ["A", "B"], _first_half, lambda k: 1)
    if d.data == "circle":
        return _Family(list(CIRCLE_CONCEPTS), ["A", "B"], _first_half, lambda k: 1)
    if d.data == "sea":     # variant "2" / "4", or "2-authors" / "4-authors"
        count, _, authors = d.variant.partition("-")
        n = int(count)
        names = "ABCD"[:n]
        thresholds = SEA_THRESHOLDS_AUTHORS if authors else SEA_THRESHOLDS
        concepts = [SeaConcept(t, 0.10, name) for t, name in zip(thresholds, names)]
        target = (lambda k: 1) if n == 2 else (lambda k: 1 + k % 3)
        return _Family(list(concepts), list(names), _first_half, target)
    if d.data == "river":
        concepts = river_concepts(d.variant)
        others = len(concepts) - 1
        return _Family(concepts, [c.name for c in concepts], _first_half,
                       lambda k: 1 + k % others)
    if d.data == "mixture":
        c = MIXTURE_CLASSES
        if d.variant == "mix":
            return _mixed(c, MIXTURE_NOISE_STD)
        second = {"swap": _permuted(c), "prior": _concentrated(c),
                  "noise": _noisy(MIXTURE_NOISE_STD)}[d.variant]
        return _Family([ClassConcept("original"), second], ["original", second.name],
                       _first_half, lambda k: 1)
    return _pool_family(d, num_classes, image)   # the class pools (images, yours, River tables)


def _permuted(c: int) -> ClassConcept:
    """Concept shift: every label relabelled, y -> (y+1) % c."""
    return ClassConcept("permuted", perm=cyclic_permutation(c, 1))


def _concentrated(c: int) -> ClassConcept:
    """Label shift: weights that put 90% of a uniform prior on the first half of the classes."""
    half = max(1, c // 2)
    low = [half / (9.0 * (c - half))] * (c - half)
    return ClassConcept("concentrated", prior_weights=tuple([1.0] * half + low))


def _noisy(std: float) -> ClassConcept:
    """Feature shift: additive Gaussian noise N(0, std^2) on every input value."""
    return ClassConcept(f"noise {std:g}", noise_std=std)


def _mixed(c: int, noise_std: float) -> _Family:
    """The ``mix`` variant: label (1), feature (2) and concept (3) shift in one scenario; the
    first half of the clients drift, client ``k`` to ``1 + k % 3``, so all three kinds occur."""
    concepts = [ClassConcept("original"), _concentrated(c), _noisy(noise_std), _permuted(c)]
    return _Family(concepts, [x.name for x in concepts], _first_half, lambda k: 1 + k % 3)


def _pool_family(d: ScenarioDef, c: int, image: bool) -> _Family:
    """Concepts of a class pool with ``c`` classes (the module docstring's table)."""
    if d.variant in ("static", "swap"):
        if c < 7:
            if d.variant == "static":
                return _Family([ClassConcept("original")], ["original"], lambda p: [],
                               lambda k: 0)
            raise ValueError(f"scenario {d.name}: FedCCFA's label swaps (1<->2, 3<->4, 5<->6) "
                             f"need at least 7 classes, the data have {c}; use "
                             f"{d.name.rsplit('-', 1)[0]}-permute (y -> (y+1) % C) instead")
        concepts = [ClassConcept("original")] + [
            ClassConcept(f"swap {a}<->{b}", perm=swap_permutation(c, a, b))
            for a, b in FEDCCFA_SWAP_PAIRS
        ]
        return _Family(concepts, [x.name for x in concepts], lambda p: list(range(p)),
                       lambda k: fedccfa_group(k) + 1, sequential_groups=True)
    if d.variant in ("permute", "prior"):
        second = _permuted(c) if d.variant == "permute" else _concentrated(c)
        return _Family([ClassConcept("original"), second], ["original", second.name],
                       _first_half, lambda k: 1)
    if d.variant == "mix":
        return _mixed(c, NOISE_STD)
    if d.variant == "rotate":
        if not image:
            raise ValueError(f"scenario {d.name}: rotation needs image data, but the data are flat "
                             f"features (tabular); use {d.name.rsplit('-', 1)[0]}-noise, -permute "
                             f"or -prior")
        concepts = [ClassConcept("upright"), ClassConcept("rotated 90", angle=ROTATE_ANGLE)]
    elif d.variant == "noise":
        concepts = [ClassConcept("clean"), _noisy(NOISE_STD)]
    else:  # pragma: no cover - guarded by _defs
        raise AssertionError(d.variant)
    return _Family(concepts, [x.name for x in concepts], _even, lambda k: 1)


def _programmatic(fam: _Family, pattern: str, p: int, t: int, d: int, seed: int
                  ) -> tuple[np.ndarray, list[object], list[str]]:
    concepts, labels = list(fam.concepts), list(fam.labels)
    m = np.zeros((t, p), dtype=np.int64)
    clients = fam.drifting(p)
    by_target: dict[int, list[int]] = {}
    for k in clients:
        by_target.setdefault(fam.target(k), []).append(k)
    if pattern == "none":
        pass
    elif pattern == "sudden":
        for tgt, cols in by_target.items():
            m[:, cols] = sch.sudden(p, t, d, cols, tgt)[:, cols]
    elif pattern == "recurring":
        period = max(1, (t - d + 1) // 2)
        for tgt, cols in by_target.items():
            m[:, cols] = sch.recurring(p, t, d, period, cols, (0, tgt))[:, cols]
    elif pattern == "staggered":
        m = sch.staggered_random(p, t, len(fam.concepts), seed, first_step=d, every=2)
    elif pattern == "incremental":
        for i, tgt in enumerate(sorted(by_target)):
            cols = by_target[tgt]
            if fam.sequential_groups:
                if d + i <= t:
                    m[:, cols] = sch.sudden(p, t, d + i, cols, tgt)[:, cols]
                continue
            mids = [interpolate(concepts[0], concepts[tgt], f) for f in INCREMENTAL_FRACTIONS]
            path = [tgt]
            if all(c is not None for c in mids):
                path = []
                for f, c in zip(INCREMENTAL_FRACTIONS, mids):
                    concepts.append(c)
                    labels.append(f"{labels[0]}->{labels[tgt]} {f:.2f}")
                    path.append(len(concepts) - 1)
                path.append(tgt)
            m[:, cols] = sch.incremental(p, t, d, cols, path)[:, cols]
    else:  # pragma: no cover - validated earlier
        raise AssertionError(pattern)
    return m, concepts, labels


def _fit_rows(m: np.ndarray, t: int) -> np.ndarray:
    """Truncate to ``t`` rows, or extend by repeating the last row (as FedDrift's test step)."""
    if t <= len(m):
        return m[:t].copy()
    return np.concatenate([m, np.repeat(m[-1:], t - len(m), axis=0)], axis=0)


def _resolve_schedule_source(schedule: str) -> tuple[str, str]:
    """("file", abspath) or ("bundled", name)."""
    s = schedule.strip()
    p = Path(os.path.expanduser(s))
    if not p.exists() and os.sep not in s and "/" not in s:
        key = s[:-3] if s.lower().endswith(".cp") else s
        if key.upper() in sch.bundled_schedule_names():
            return "bundled", key.upper()
    return "file", str(p.resolve()) if p.exists() else str(p.absolute())


# ---------------------------------------------------------------------------------- Scenario


@dataclass(frozen=True)
class ScenarioSpec:
    """A scenario's build arguments by name: what any process rebuilds it from (pickling),
    the key of the builder's cache and the scenario's ``params``.

    ``build_scenario`` resolves them for the scenarios of the standard catalogue: the name
    normalised, every "scenario default" (0 / "") of ``samples_per_step``, ``test_samples``
    and ``dirichlet_alpha`` replaced by the value it stands for, a schedule's path made
    absolute, and ``pool`` the checked pool arguments (:class:`PoolSpec`). A registered
    scenario's builder (``register_scenario``) gets the arguments as the user gave them and
    resolves them itself; its spec holds them as given, with ``pool = None`` (it reads none).
    """

    name: str
    seed: int = 0
    num_clients: int = 0
    num_steps: int = 0
    samples_per_step: int = 0
    test_samples: int = 0
    schedule: str = ""
    drift_pattern: str = ""
    drift_step: int = 0
    dirichlet_alpha: float = 0.0
    data_dir: str = ""
    pool: PoolSpec | None = None

    def arguments(self) -> dict[str, object]:
        """Every argument by name, the pool's among them (``build_scenario``'s keywords and
        ``name``)."""
        own = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name != "pool"}
        return {**own, **(dataclasses.asdict(self.pool) if self.pool is not None else {})}


def concept_changes(matrix: np.ndarray) -> list[tuple[int, int, int, int]]:
    """``(step, client, old_concept, new_concept)`` for every step > 1 where a client's concept
    differs from the step before, ordered by step then client (``matrix``: steps x clients,
    step 1 in row 0)."""
    m = np.asarray(matrix)
    return [(t, int(k), int(m[t - 2, k]), int(m[t - 1, k]))
            for t in range(2, m.shape[0] + 1) for k in np.flatnonzero(m[t - 1] != m[t - 2])]

class Scenario:
    """One concrete scenario instance; deterministic given its parameters (see module doc).

    Attributes: ``name``, ``description`` (one line), ``num_clients``, ``num_steps`` (steps are
    1-based), ``num_classes``, ``num_concepts`` (concept ids are ``0..num_concepts-1``; not all
    need to occur), ``input_shape``, ``model`` ("mlp" or "cnn"), ``hidden`` (default MLP width,
    0 = unused), plus ``data_seed``, ``samples_per_step``, ``test_samples``, ``drift_pattern``
    (the resolved schedule source), ``drift_step``, ``dirichlet_alpha``, ``concept_labels``,
    ``spec`` (the normalised build arguments, :class:`ScenarioSpec`) and ``params`` (the same
    as a dict).

    ``preprocessing`` says how a raw input (as the data source holds it) became what the
    model sees (``preprocessing.py``): a run's export and serving apply it to new inputs.

    ``holdout_clients`` are clients that never train (FedRC's non-participating test clients):
    strategies send them no training, and they measure *global* accuracy. Their ``x_train``
    split is the labelled adaptation data a new client may use before predicting (choosing a
    cluster, estimating its cluster weights), their ``x_test`` split the data it is scored on.
    """

    # The step-data cache holds every client's current and previous step (a round touches each
    # client's window once, and FedDrift-style protocols test on the next step), so a round of
    # N clients never regenerates data, within a memory budget that bounds it for large inputs.
    STEP_CACHE_SIZE = 128               # entries at least, 2 per client above 64 clients
    STEP_CACHE_BYTES = 1 << 30          # and never more than this many bytes of arrays
    STEPS_CACHE_BYTES = 1 << 28         # the same for concatenated steps (train_steps)

    def __init__(self, *, name: str, description: str, matrix: np.ndarray,
                 realisation_factory: Callable[[], object], num_classes: int,
                 input_shape: tuple[int, ...], model: str, hidden: int, data_seed: int,
                 samples_per_step: int, test_samples: int, drift_pattern: str, drift_step: int,
                 dirichlet_alpha: float, concept_labels: list[str], spec: ScenarioSpec,
                 holdout_clients: tuple[int, ...] = (), large_files: bool = False,
                 notes: tuple[str, ...] = (),
                 preprocessing: dict | None = NO_PREPROCESSING,
                 class_names: tuple = ()) -> None:
        self.name = name
        self.description = description
        self._matrix = np.asarray(matrix, dtype=np.int64).copy()
        self._matrix.setflags(write=False)
        self.num_steps, self.num_clients = (int(s) for s in self._matrix.shape)
        self.num_classes = int(num_classes)
        self.num_concepts = int(self._matrix.max()) + 1
        self.input_shape = tuple(int(s) for s in input_shape)
        self.model = model
        self.hidden = int(hidden)
        self.data_seed = int(data_seed)
        self.samples_per_step = int(samples_per_step)
        self.test_samples = int(test_samples)
        self.drift_pattern = drift_pattern
        self.drift_step = int(drift_step)
        self.dirichlet_alpha = float(dirichlet_alpha)
        self.concept_labels = tuple(concept_labels[: self.num_concepts])
        #: the build arguments it is rebuilt from (``params`` reads them by name)
        self.spec = spec
        self.holdout_clients = tuple(sorted(int(c) for c in holdout_clients))
        if any(not 0 <= c < self.num_clients for c in self.holdout_clients):
            raise ValueError(f"holdout clients {self.holdout_clients} outside 0..{self.num_clients - 1}")
        if len(self.holdout_clients) >= self.num_clients:
            raise ValueError("a scenario needs at least one client that is not held out")
        self._factory = realisation_factory
        # its pools are read from large files (torchvision): not loaded just to report sizes
        self._large_files = bool(large_files)
        self._notes = tuple(notes)      # what reading the data changed (data_report)
        #: how a raw input becomes a model input (``preprocessing.py``); None: unknown here
        #: (the server of a deployment cannot read the data that a user's table standardises)
        self.preprocessing = preprocessing
        #: class i's label as a user's data wrote it, where remap-labels numbered them (else ())
        self.class_names = tuple(class_names)
        self._realisation: object | None = None
        self._lock = threading.Lock()
        self._cache = _BoundedCache(_nbytes)            # (client, step) -> StepData
        # (client, step) -> its class-balanced test sample (balanced_test)
        self._balanced_cache = _BoundedCache(lambda xy: xy[0].nbytes + xy[1].nbytes)
        # (client, steps) -> their training data concatenated (train_steps)
        self._steps_cache = _BoundedCache(lambda xy: xy[0].nbytes + xy[1].nbytes)

    # -- identity ---------------------------------------------------------------------------
    @property
    def params(self) -> dict[str, object]:
        """The build arguments by name (``spec``)."""
        return self.spec.arguments()

    def __repr__(self) -> str:
        return (f"Scenario({self.name!r}, clients={self.num_clients}, steps={self.num_steps}, "
                f"concepts={self.num_concepts}, seed={self.data_seed})")

    def __reduce__(self):  # pickles as its build arguments; rebuilt (and cached) on load
        return (_rebuild, (self.spec,))

    # -- ground truth -----------------------------------------------------------------------
    def _check(self, client: int, step: int) -> tuple[int, int]:
        try:
            client, step = operator.index(client), operator.index(step)
        except TypeError:
            raise ValueError(f"client and step must be integers, got {client!r}, {step!r}"
                             ) from None
        if not 0 <= client < self.num_clients:
            raise ValueError(f"client {client} out of range 0..{self.num_clients - 1} "
                             f"(scenario {self.name})")
        if not 1 <= step <= self.num_steps:
            raise ValueError(f"step {step} out of range 1..{self.num_steps} (time steps are "
                             f"1-based; scenario {self.name})")
        return client, step

    def concept(self, client: int, step: int) -> int:
        """Ground-truth concept id of ``client`` at time step ``step`` (1-based)."""
        client, step = self._check(client, step)
        return int(self._matrix[step - 1, client])

    def concept_matrix(self) -> np.ndarray:
        """Copy of the ``(num_steps, num_clients)`` concept matrix (row ``t-1`` = step ``t``)."""
        return self._matrix.copy()

    def drift_events(self) -> list[tuple[int, int, int, int]]:
        """``(step, client, old_concept, new_concept)`` for every step > 1 where the concept of a
        client changes, ordered by step then client."""
        return concept_changes(self._matrix)

    # -- data -------------------------------------------------------------------------------
    @property
    def realisation(self):
        """The concept realiser (built on first use: image pools load lazily)."""
        if self._realisation is None:
            with self._lock:
                if self._realisation is None:
                    self._realisation = self._factory()
        return self._realisation

    def _generate(self, client: int, step: int) -> StepData:
        concept = int(self._matrix[step - 1, client])
        real = self.realisation
        rng = np.random.default_rng([self.data_seed, client, step, TAG_TRAIN])
        x_tr, y_tr = real.sample(concept, self.samples_per_step, rng, client=client, train=True)
        rng = np.random.default_rng([self.data_seed, client, step, TAG_TEST])
        x_te, y_te = real.sample(concept, self.test_samples, rng, client=client, train=False)
        arrays = []
        for a, dt in ((x_tr, np.float32), (y_tr, np.int64), (x_te, np.float32), (y_te, np.int64)):
            a = np.ascontiguousarray(a, dtype=dt)
            a.setflags(write=False)
            arrays.append(a)
        return StepData(*arrays, concept=concept)

    def short_clients(self) -> dict[int, tuple[int | None, int | None]]:
        """The clients whose pool holds fewer rows than a step asks for (``samples_per_step``
        to train, ``test_samples`` to test), which then use each of their rows once
        (``drift.py``): client -> (train rows, test rows), None where that split is not short.
        ``{}`` where this process cannot tell: generated data, data that live on the devices,
        or large image files it has not loaded."""
        if self._realisation is None and self._large_files:
            return {}
        try:
            short = getattr(self.realisation, "short", None)
        except RuntimeError:     # the server of a deployment: the data live on the devices
            return {}
        if short is None:
            return {}
        out = {}
        for k in range(self.num_clients):
            rows = (short(k, self.samples_per_step, True), short(k, self.test_samples, False))
            if rows != (None, None):
                out[k] = rows
        return out

    def data_report(self, clients: Iterable[int] | None = None) -> list[str]:
        """The log lines a run starts with about its data: how the labels were renumbered
        (``remap-labels``) and which of ``clients`` (default: all) are short of rows."""
        short = self.short_clients()
        if clients is not None:
            short = {k: short[k] for k in clients if k in short}
        return [*self._notes, *([short_clients_line(self, short)] if short else [])]

    def rows_held(self, client: int) -> int | None:
        """The training rows ``client`` holds when they are fewer than ``samples_per_step`` (a
        client never reports more examples than that), else None."""
        short = getattr(self.realisation, "short", None)
        return short(client, self.samples_per_step, True) if short is not None else None

    def max_client_examples(self) -> int | None:
        """The most training examples one client holds over the whole run (every step's
        training data; servers cap a reply's num-examples with it); None when unknown."""
        sizes = getattr(self, "user_sizes", None)   # scenarios with per-client dataset sizes
        per_step = max(sizes) if sizes else self.samples_per_step
        return per_step * self.num_steps if per_step > 0 else None

    def step_data(self, client: int, step: int) -> StepData:
        """Train and test data of ``client`` at ``step``: deterministic, cached (bounded LRU)."""
        client, step = self._check(client, step)
        return self._cached(self._cache, (client, step), lambda: self._generate(client, step),
                            self.STEP_CACHE_BYTES)

    def has_balanced_test(self) -> bool | None:
        """Whether :meth:`balanced_test` can draw for this scenario's data (a class-based
        realisation: a mixture, a class pool); None where this process cannot tell without
        loading large files it has not loaded, or where the data live on the devices."""
        if self._realisation is None and self._large_files:
            return None
        try:
            real = self.realisation
        except RuntimeError:     # the server of a deployment: the data live on the devices
            return None
        return hasattr(real, "balanced_sample")

    def balanced_test(self, client: int, step: int) -> tuple[np.ndarray, np.ndarray]:
        """A class-balanced test sample of ``client`` at ``step``: its concept there (the same
        label map, rotation and noise as its own test split) with every class of the test pool
        equally often, at least ``test_samples`` of them, whatever the client's class prior
        (``ClassRealisation.balanced_sample``). Its own stream (``[data_seed, client, step,
        TAG_BALANCED]``), so no other draw changes; cached like ``step_data``, read-only."""
        client, step = self._check(client, step)
        return self._cached(self._balanced_cache, (client, step),
                            lambda: self._draw_balanced(client, step), self.STEP_CACHE_BYTES)

    def _draw_balanced(self, client: int, step: int) -> tuple[np.ndarray, np.ndarray]:
        sample = getattr(self.realisation, "balanced_sample", None)
        if sample is None:
            raise ValueError(f"scenario {self.name} has no class-balanced test set: its data "
                             f"are drawn from decision rules, not classes (a class pool or a "
                             f"mixture has one)")
        rng = np.random.default_rng([self.data_seed, client, step, TAG_BALANCED])
        x, y = sample(int(self._matrix[step - 1, client]), self.test_samples, rng, client=client)
        data = (np.ascontiguousarray(x, dtype=np.float32), np.ascontiguousarray(y, dtype=np.int64))
        for a in data:
            a.setflags(write=False)
        return data

    def _cache_entries(self) -> int:
        return max(self.STEP_CACHE_SIZE, 2 * self.num_clients)

    def _cached(self, cache: _BoundedCache, key, make, max_bytes: int):
        """``cache``'s entry for ``key``, made by ``make()`` outside the lock on a miss (two
        threads may both make it; the arrays are the same) and kept within the bounds."""
        with self._lock:
            hit = cache.get(key)
        if hit is not None:
            return hit
        data = make()
        with self._lock:
            cache.put(key, data, self._cache_entries(), max_bytes)
        return data

    def window(self, client: int, step: int, size: int) -> tuple[np.ndarray, np.ndarray]:
        """Training data of steps ``max(1, step - size + 1) .. step``, concatenated ``(x, y)``."""
        client, step = self._check(client, step)
        size = operator.index(size)
        if size < 1:
            raise ValueError(f"window size must be >= 1, got {size}")
        return self.train_steps(client, range(max(1, step - size + 1), step + 1))

    def train_steps(self, client: int, steps: Iterable[int]) -> tuple[np.ndarray, np.ndarray]:
        """Training data of ``steps`` (in that order), concatenated ``(x, y)``, read-only.
        Cached like ``step_data`` (bounded LRU): a client trains on the same steps every
        round of a step, and concatenating a long history each time cost a FedDrift round
        about as much as drawing its minibatches."""
        key = (operator.index(client), tuple(operator.index(t) for t in steps))
        if not key[1]:
            raise ValueError("no time steps given")
        return self._cached(self._steps_cache, key, lambda: self._concatenate(*key),
                            self.STEPS_CACHE_BYTES)

    def _concatenate(self, client: int, steps: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        parts = [self.step_data(client, t) for t in steps]
        if len(parts) == 1:
            return parts[0].x_train, parts[0].y_train
        data = (np.concatenate([p.x_train for p in parts], axis=0),
                np.concatenate([p.y_train for p in parts], axis=0))
        for a in data:
            a.setflags(write=False)
        return data


def short_clients_line(scenario: Scenario,
                       short: dict[int, tuple[int | None, int | None]]) -> str:
    """One log line on the clients of ``Scenario.short_clients`` (what they hold and do)."""
    def rows(which: int) -> str:
        held = {k: r[which] for k, r in short.items() if r[which] is not None}
        if len(held) == 1:
            (k, n), = held.items()
            return f"client {k} holds {n} rows"
        if len(set(held.values())) == 1:
            return (f"clients {_ids(held)} hold {next(iter(held.values()))} rows each")
        shown = ", ".join(f"{k}: {n}" for k, n in list(held.items())[:12])
        return (f"clients {_ids(held)} hold fewer (client: rows {shown}"
                f"{', ...' if len(held) > 12 else ''})")

    parts = []
    if any(r[0] is not None for r in short.values()):
        parts.append(f"samples-per-step = {scenario.samples_per_step}, but {rows(0)}: each trains "
                     f"on its rows once and reports that count as num-examples")
    if any(r[1] is not None for r in short.values()):
        parts.append(f"test-samples = {scenario.test_samples}, but {rows(1)}: each is tested on "
                     f"those distinct rows")
    return f"small data: {'; '.join(parts)} (oversample = true draws with replacement instead)"


def _ids(clients: dict[int, int]) -> str:
    ids = sorted(clients)
    if ids == list(range(ids[0], ids[-1] + 1)) and len(ids) > 2:
        return f"{ids[0]}-{ids[-1]}"
    return ", ".join(map(str, ids[:20])) + (", ..." if len(ids) > 20 else "")


# ----------------------------------------------------------------------------------- builder

def _rebuild(spec: ScenarioSpec) -> Scenario:
    if spec.name in _EXTRA:
        return build_scenario(**spec.arguments())
    return _build_cached(spec)


def dirichlet_alpha_arg(value: object) -> float:
    """The ``dirichlet_alpha`` build argument as a float >= 0 (0 = default, inf = no skew)."""
    try:
        alpha = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"dirichlet_alpha must be a number, got {value!r}") from None
    if math.isnan(alpha) or alpha < 0:
        raise ValueError(f"dirichlet_alpha must be >= 0 (0 = the scenario's default, inf = no "
                         f"label skew), got {value!r}")
    return alpha


def build_scenario(name: str, data: DataSettings | None = None, *, seed: int = 0,
                   num_clients: int = 0, num_steps: int = 0,
                   samples_per_step: int = 0, test_samples: int = 0, schedule: str = "",
                   drift_pattern: str = "", drift_step: int = 0, dirichlet_alpha: float = 0.0,
                   data_dir: str = "", dataset: str = "", partition: str = "",
                   disjoint: bool = False, classes_per_client: int = 0,
                   test_fraction: float = 0.0, num_classes: int = 0,
                   input_shape: str = "", label_column: str = "", feature_columns: str = "",
                   partition_column: str = "", dataset_args: str = "",
                   remap_labels: bool = False, oversample: bool = False) -> Scenario:
    """Build (or fetch from the cache) the scenario ``name`` (see :func:`list_scenarios`).

    The data settings come either as keywords or as ``data``, the run config's data group
    (``RunConfig.data``, a :class:`~fedcluster_app.core.config.DataSettings`, whose fields are
    these keywords; ``seed``, the run's data seed, is given beside it); a keyword set beside
    ``data`` would be ignored, so it is refused.

    ``0`` / ``""`` means "the scenario's default" for every argument. ``seed`` is the data seed.
    ``schedule`` is the path of a ``.cp`` concept matrix (or a bundled FedDrift schedule name
    such as ``"Y"`` / ``"F"``) that replaces the scenario's schedule: ``num_clients`` = its
    columns, ``num_steps`` = its rows unless given (rows are then cut, or the last row repeated).
    A bundled default schedule is tiled over clients (client ``k`` uses column ``k % 10``) when
    ``num_clients`` differs. ``drift_pattern`` replaces the schedule with a programmatic pattern
    (module docstring); ``drift_step`` is its first drifted step (default: the scenario's, 3 for
    the 6-step scenarios, 4 for the 11-step ones, capped at ``num_steps``); it also moves the
    drift of scenarios whose own schedule is programmatic (``mixture-*``, image families) and has
    no effect on ``.cp`` schedules (``Scenario.drift_step`` then reports their first drift).
    ``dirichlet_alpha`` sets the per-client Dirichlet class prior of class-based scenarios
    (``inf`` = uniform; images default to 1.0, mixtures to uniform; tabular scenarios ignore it).
    ``data_dir`` is the local torchvision directory that ``mnist-*``, ``fmnist-*`` and
    ``cifar10-*`` need.

    Pool families only (images, ``dataset-*``, River tables): ``dataset`` is the data of the
    ``dataset-*`` scenarios (``sources.py``: ``npz:PATH``, ``imagefolder:PATH``, ``hf-disk:PATH``,
    ``river:<Table>``, ``package.module:callable``), ``test_fraction`` (default 0.25) the share of
    a source without a test split held out for testing; ``partition`` (``iid``, ``dirichlet``,
    ``pathological`` with ``classes_per_client``, default 2), and ``disjoint`` (disjoint client
    shards) decide how the pool is shared across clients (``partition.py``). ``num_classes``
    and ``input_shape`` (e.g. ``"1,28,28"``) describe a ``dataset`` that this process cannot
    read (the server of a deployment, ``data_dir = METADATA_ONLY``). ``label_column``,
    ``feature_columns`` (``"a,b,c"``), ``partition_column`` (each distinct value one client's
    rows; ``num_clients`` 0 = one client per value), ``dataset_args`` (``"key=value,..."`` for a
    callable) and ``remap_labels`` say how to read ``dataset`` (``tables.py``, ``labels.py``);
    ``oversample`` makes a client whose pool holds fewer rows than a step asks for draw with
    replacement instead of using each row once (``drift.py``).

    Identical arguments return the same (cached) object.

    Raises:
        ValueError: unknown name or pattern, negative numbers, bad schedule file, drift_step out
            of range, missing data_dir for a torchvision scenario.
        FileNotFoundError: data_dir lacks the dataset's files.
    """
    key = str(name).strip().lower()
    given = dict(num_clients=num_clients, num_steps=num_steps,
                 samples_per_step=samples_per_step, test_samples=test_samples,
                 schedule=schedule, drift_pattern=drift_pattern, drift_step=drift_step,
                 dirichlet_alpha=dirichlet_alpha, data_dir=data_dir, dataset=dataset,
                 partition=partition, disjoint=disjoint, classes_per_client=classes_per_client,
                 test_fraction=test_fraction, num_classes=num_classes, input_shape=input_shape,
                 label_column=label_column, feature_columns=feature_columns,
                 partition_column=partition_column, dataset_args=dataset_args,
                 remap_labels=remap_labels, oversample=oversample)
    if data is not None:
        given = _settings_arguments(data, given)
    if key in _EXTRA:
        check_not_pool(key, given)
        return _EXTRA[key][1](seed=seed, **{k: given[k] for k in _SHARED_ARGUMENTS})
    if key not in _DEFS:
        raise ValueError(f"unknown scenario {name!r}{suggest(key, scenario_names())}; valid "
                         f"names: {', '.join(scenario_names())}")
    d = _DEFS[key]
    seed = nonneg_int("seed", seed)
    num_clients = nonneg_int("num_clients", given["num_clients"])
    num_steps = nonneg_int("num_steps", given["num_steps"])
    samples_per_step = nonneg_int("samples_per_step", given["samples_per_step"])
    test_samples = nonneg_int("test_samples", given["test_samples"])
    drift_step = nonneg_int("drift_step", given["drift_step"])
    alpha = dirichlet_alpha_arg(given["dirichlet_alpha"])
    drift_pattern = given["drift_pattern"]
    pattern = str(drift_pattern).strip().lower()
    pattern = _PATTERN_ALIASES.get(pattern, pattern)
    if pattern and pattern not in DRIFT_PATTERNS:
        raise ValueError(f"unknown drift_pattern {drift_pattern!r}; valid: "
                         f"{', '.join(DRIFT_PATTERNS)} (or \"\" for the scenario's own schedule)")
    schedule = str(given["schedule"]).strip()
    if schedule and pattern:
        raise ValueError("give either schedule (a .cp file) or drift_pattern, not both")
    if schedule:
        kind, ref = _resolve_schedule_source(schedule)
        schedule = ref if kind == "file" else f"bundled:{ref}"
    data_dir = str(given["data_dir"]).strip()
    if d.needs_data_dir and data_dir == METADATA_ONLY:
        pass  # the server of a deployment: the data live on the devices
    elif d.needs_data_dir:
        if not data_dir:
            raise ValueError(
                f"scenario {key} reads {d.data} from a local directory: set the run-config key "
                f"`data-dir` (build_scenario(data_dir=...)) to the root of the torchvision files"
            )
        data_dir = os.path.abspath(os.path.expanduser(data_dir))
    elif not (d.data == "dataset" and data_dir == METADATA_ONLY):  # a server may lack `dataset`
        data_dir = ""
    pool = pool_args(d, given)
    if alpha and pool.partition_column:
        raise ValueError("partition-column gives each client its own rows and their class "
                         "frequencies; dirichlet-alpha would be ignored (leave it 0)")
    if alpha == 0.0 or d.tabular:
        alpha = d.alpha if not d.tabular else math.inf
    return _build_cached(ScenarioSpec(
        name=key, seed=seed, num_clients=num_clients, num_steps=num_steps,
        samples_per_step=samples_per_step or d.samples,
        test_samples=test_samples or d.test_samples, schedule=schedule, drift_pattern=pattern,
        drift_step=drift_step, dirichlet_alpha=alpha, data_dir=data_dir, pool=pool))


#: the build arguments every scenario reads (a registered scenario's builder gets these and
#: ``seed``); the others (``ScenarioSpec.pool``) are the pool families'
_SHARED_ARGUMENTS = tuple(f.name for f in dataclasses.fields(ScenarioSpec)
                          if f.name not in ("name", "seed", "pool"))


def _settings_arguments(data: DataSettings, keywords: dict[str, object]) -> dict[str, object]:
    """``build_scenario``'s keyword arguments from ``data``; ``keywords`` (those given beside
    it) must be left at their defaults, which they would not override."""
    if not isinstance(data, DataSettings):
        raise TypeError(f"build_scenario's data must be a DataSettings (the run config's data "
                        f"group, RunConfig.data), got {type(data).__name__}")
    defaults = {k: v.default for k, v in inspect.signature(build_scenario).parameters.items()}
    beside = [k for k, v in keywords.items() if v != defaults[k]]
    if beside:
        raise ValueError(f"build_scenario got data settings and also {', '.join(beside)}; "
                         f"set {'it' if len(beside) == 1 else 'them'} in the data settings "
                         f"(dataclasses.replace) instead")
    return {f.name: getattr(data, f.name) for f in dataclasses.fields(DataSettings)}


def _load_schedule(ref: str) -> tuple[np.ndarray, str]:
    if ref.startswith("bundled:"):
        letter = ref.split(":", 1)[1]
        return sch.bundled_schedule(letter), f"bundled schedule {letter}"
    return sch.load_cp(ref), f"schedule file {ref!r}"


@lru_cache(maxsize=64)
def _build_cached(spec: ScenarioSpec) -> Scenario:
    """The scenario ``spec`` describes (resolved and checked by ``build_scenario``); cached on
    ``spec``, so identical arguments give the same object."""
    d, pool = _DEFS[spec.name], spec.pool
    name, seed, num_clients, num_steps = spec.name, spec.seed, spec.num_clients, spec.num_steps
    schedule, pattern, drift_step = spec.schedule, spec.drift_pattern, spec.drift_step
    alpha, data_dir = spec.dirichlet_alpha, spec.data_dir
    partition, partition_column, oversample = pool.partition, pool.partition_column, pool.oversample
    info = user_pool_info(d, pool, seed, data_dir) if d.user_pool else None
    # partition-column: one client per distinct value (known where the data are readable)
    natural = (len(info.data.group_names) if partition_column and info is not None
               and info.data is not None else 0)
    if partition_column and not (num_clients or natural):
        raise ValueError(f"partition-column {partition_column!r}: this process (the server of a "
                         f"deployment) cannot read dataset {pool.dataset!r} to count its values; "
                         f"set num-clients")
    fam = _family(d) if info is None else _family(d, info.num_classes, info.image)
    n_base = len(fam.concepts)
    description = d.description
    if schedule:
        m, what = _load_schedule(schedule)
        if num_clients and m.shape[1] != num_clients:
            raise ValueError(f"{what} has {m.shape[1]} columns (clients) but num_clients = "
                             f"{num_clients} was requested: expected {num_clients} columns, found "
                             f"{m.shape[1]}")
        if m.max() >= n_base:
            t, k = (int(v[0]) for v in np.nonzero(m >= n_base))
            raise ValueError(f"{what}: concept id {int(m[t, k])} (step {t + 1}, client {k}) but "
                             f"scenario {name} defines only {n_base} concepts "
                             f"(ids 0..{n_base - 1})")
        steps = num_steps or len(m)
        check_client_steps(m.shape[1], steps)    # before the rows are repeated to num_steps
        m = _fit_rows(m, steps)
        concepts, labels = fam.concepts, fam.labels
        source = what
        description += f" [{what}]"
    else:
        p = num_clients or natural or d.num_clients
        t = num_steps or d.num_steps
        check_client_steps(p, t)                 # before a steps x clients matrix is built
        own = pattern or d.schedule
        if own in DRIFT_PATTERNS:
            if drift_step and not 1 <= drift_step <= t:
                raise ValueError(f"drift_step {drift_step} outside 1..{t} (num_steps)")
            ds = drift_step or min(d.drift_step, t)
            m, concepts, labels = _programmatic(fam, own, p, t, ds, seed)
            source = own
            if pattern:
                description += f" [drift pattern {own} from step {ds}]"
            drift_step = ds
        else:
            base = sch.bundled_schedule(own)
            m = _fit_rows(base[:, np.arange(p) % base.shape[1]], t)
            concepts, labels = fam.concepts, fam.labels
            source = f"bundled schedule {own}"
    if drift_step and not 1 <= drift_step <= len(m):
        raise ValueError(f"drift_step {drift_step} outside 1..{len(m)} (num_steps)")
    if source not in DRIFT_PATTERNS:  # a .cp schedule: report its first drifted step
        changed = np.flatnonzero((m[1:] != m[:-1]).any(axis=1))
        drift_step = int(changed[0]) + 2 if len(changed) else 0

    p = m.shape[1]
    if natural:
        check_groups(natural, p, partition_column, info.data.group_names)
    concepts = list(concepts)
    preprocessing: dict | None = NO_PREPROCESSING   # generated inputs are the model's inputs
    if d.tabular:
        def factory(concepts=concepts):
            return TabularRealisation(concepts)
        num_classes = max(int(getattr(c, "num_classes", 2)) for c in concepts)
        input_shape = (int(concepts[0].dim),)  # type: ignore[attr-defined]
        model, hidden = "mlp", 2 * input_shape[0]
        if d.data == "river":
            hidden = max(16, hidden)
    else:
        num_classes = (MIXTURE_CLASSES if d.data == "mixture" else
                       info.num_classes if info is not None else 10)
        if partition == "pathological" and not 1 <= pool.classes_per_client <= num_classes:
            raise ValueError(f"classes-per-client must be in 1..{num_classes} (the number of "
                             f"classes of scenario {name}), got {pool.classes_per_client}")
        priors = np.stack([
            client_prior(num_classes, alpha, np.random.default_rng([seed, k, 0, TAG_PRIOR]))
            for k in range(p)
        ])
        if d.data == "mixture":
            input_shape, model, hidden = (MIXTURE_DIM,), "mlp", 32

            def factory(concepts=concepts, priors=priors):
                means = mixture_means(MIXTURE_CLASSES, MIXTURE_DIM, seed)
                return ClassRealisation(MixtureSource(means), concepts, priors)
        elif d.data == "digits":
            input_shape, model, hidden = (1, 8, 8), "cnn", 0
            preprocessing = scaling(16.0)     # digits_pools: pixels 0..16

            def factory(concepts=concepts, priors=priors):
                return ClassRealisation(ImageSource(*digits_pools(seed)), concepts, priors,
                                        oversample)
        elif info is not None:  # a user's dataset or a River table (sources.py)
            input_shape = info.input_shape
            model, hidden = ("cnn", 0) if info.image else ("mlp", max(16, 2 * input_shape[0]))
            preprocessing = info.data.preprocessing() if info.data is not None else None

            def factory(concepts=concepts, priors=priors, info=info, p=p):
                if info.data is None:
                    raise RuntimeError(f"scenario {name} was built without its data (on the "
                                       f"server of a deployment); its data live on the clients")
                if partition_column:
                    data = info.data
                    return natural_realisation(user_source(info), concepts, data.groups_train,
                                               data.groups_test, data.group_names, p,
                                               partition_column, oversample)
                return ClassRealisation(user_source(info), concepts, priors, oversample)
        else:
            from fedcluster_app.core.data.loaders import IMAGE_DATASETS, _check_files

            input_shape, model, hidden = IMAGE_DATASETS[d.data][1], "cnn", 0
            preprocessing = scaling(255.0)    # torchvision_pools: uint8 pixels
            if data_dir != METADATA_ONLY:
                _check_files(d.data, Path(data_dir))  # fail early; the pools load lazily

            def factory(concepts=concepts, priors=priors):
                if data_dir == METADATA_ONLY:
                    raise RuntimeError(f"scenario {name} was built without its data (on the "
                                       f"server of a deployment); its data live on the clients")
                return ClassRealisation(ImageSource(*torchvision_pools(d.data, data_dir)),
                                        concepts, priors, oversample)
        if partition_column:
            description += f" [partition-column {partition_column}: one client per value]"
        if partition not in ("", "dirichlet") or pool.disjoint:
            factory = partitioned(factory, partition, pool.disjoint, p, alpha,
                                  pool.classes_per_client, seed)
            description += (f" [partition {partition or 'dirichlet'}"
                            f"{', disjoint shards' if pool.disjoint else ''}]")
    return Scenario(
        name=name, description=description, matrix=m, realisation_factory=factory,
        num_classes=num_classes, input_shape=input_shape, model=model, hidden=hidden,
        data_seed=seed, samples_per_step=spec.samples_per_step, test_samples=spec.test_samples,
        drift_pattern=source, drift_step=drift_step, dirichlet_alpha=alpha,
        concept_labels=list(labels), spec=spec, large_files=d.needs_data_dir,
        notes=(info.data.label_note,) if info is not None and info.data is not None
        and info.data.label_note else (), preprocessing=preprocessing,
        class_names=info.data.class_names if info is not None and info.data is not None else (),
    )
