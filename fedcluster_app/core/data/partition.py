"""How a pool dataset is shared across clients (run-config keys ``partition`` and ``disjoint``).

Every pool family (digits, MNIST, ..., a user's ``dataset``, River tables) draws each
(client, step) sample as "pick a class from the client's class prior, then an input of that
class". The partition decides the priors and which inputs a client may draw:

* ``disjoint = false`` (default): every client draws from the whole train pool, with
  replacement, following its prior: ``iid`` = the pool's class frequencies, ``dirichlet`` =
  ``Dirichlet(alpha)`` (the scenarios' default, unchanged), ``pathological`` = uniform over ``k``
  classes, client ``i`` getting classes ``i, i+1, ..., i+k-1`` (mod C) so that all classes occur;
* ``disjoint = true``: the train pool is split into disjoint shards by Flower Datasets'
  partitioners (``IidPartitioner``, ``DirichletPartitioner``, ``PathologicalPartitioner`` with
  first-deterministic classes), seeded by the data seed; a client draws its step samples, with
  replacement, only from its shard, following the shard's class frequencies. Test samples still
  come from the held-out test pool, following the same frequencies;
* ``partition-column`` (a user's table): each distinct value of the column is one client's
  natural partition, its train rows and its own test rows (:func:`natural_realisation`);
  ``partition`` and ``disjoint`` do not apply.

A client whose shard (or pool) holds fewer rows than a step asks for uses each of its rows once
instead of drawing with replacement, unless ``oversample`` (``drift.py``).

The concepts (label maps, rotation, noise, prior weights) apply on top in both modes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from fedcluster_app.core.data.drift import ClassConcept, ClassRealisation, ImageSource
from fedcluster_app.core.data.generators import ClassPool

__all__ = ["PARTITIONS", "FeaturePool", "FeatureSource", "ShardRealisation", "client_priors",
           "disjoint_shards", "natural_realisation", "partition_realisation"]

TAG_SHARDS = 12  # default_rng([seed, 0, 0, 12]) shuffles a pool before it is split into shards
#: valid ``partition`` values ("" = the scenario's default, a Dirichlet prior)
PARTITIONS = ("iid", "dirichlet", "pathological")


class FeaturePool(ClassPool):
    """Flat ``(N, F)`` features of one split grouped by class, the tabular twin of
    :class:`~fedcluster_app.core.data.generators.ImagePool` (same interface, no rotation)."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, num_classes: int,
                 max_value: float = 1.0) -> None:
        images = np.asarray(images, dtype=np.float32)
        labels = np.asarray(labels, dtype=np.int64)
        if images.ndim != 2 or len(images) != len(labels):
            raise ValueError(f"feature pool needs (N, F) inputs and N labels, got "
                             f"{images.shape} and {labels.shape}")
        super().__init__(images, labels, num_classes)
        self.max_value = 1.0   # features are used as they are (the argument mirrors ImagePool's)

    def get(self, idx: np.ndarray, angle: float = 0.0) -> np.ndarray:
        if float(angle) % 360.0:
            raise ValueError("rotation needs image inputs; this dataset has flat features")
        return self.images[idx].copy()


class FeatureSource(ImageSource):
    """Train/test feature pools; like an image source, but noise is not clipped to [0, 1]."""

    def __init__(self, train_pool: FeaturePool, test_pool: FeaturePool) -> None:
        super().__init__(train_pool, test_pool)  # type: ignore[arg-type]
        self.is_image = False


def _subpool(pool, idx: np.ndarray):
    return type(pool)(pool.images[idx], pool.labels[idx], pool.num_classes, pool.max_value)


def _frequencies(labels: np.ndarray, num_classes: int) -> np.ndarray:
    counts = np.bincount(np.asarray(labels, dtype=np.int64), minlength=num_classes)[:num_classes]
    return counts / max(1, counts.sum())


def client_priors(partition: str, num_classes: int, num_clients: int, k: int,
                  frequencies: np.ndarray) -> np.ndarray:
    """``(num_clients, C)`` class priors of the shared-pool mode for ``iid`` and
    ``pathological`` (``dirichlet`` keeps the scenario's own draw)."""
    if partition == "iid":
        return np.tile(np.asarray(frequencies, dtype=np.float64), (num_clients, 1))
    if partition == "pathological":
        priors = np.zeros((num_clients, num_classes))
        for client in range(num_clients):
            priors[client, [(client + j) % num_classes for j in range(k)]] = 1.0 / k
        return priors
    raise ValueError(f"partition {partition!r} has no shared-pool prior here")


def disjoint_shards(labels: np.ndarray, partition: str, num_clients: int, alpha: float, k: int,
                    seed: int) -> list[np.ndarray]:
    """Disjoint train-pool index sets, one per client, from Flower Datasets' partitioners
    (``dirichlet`` with ``alpha = inf`` means no label skew: iid)."""
    from datasets import Dataset
    from flwr_datasets.partitioner import (DirichletPartitioner, IidPartitioner,
                                           PathologicalPartitioner)

    labels = np.asarray(labels, dtype=np.int64)
    n = len(labels)
    if n < num_clients:
        raise ValueError(f"disjoint: the train pool has {n} samples, fewer than the "
                         f"{num_clients} clients; expected at least one sample per client")
    if partition == "iid" or (partition == "dirichlet" and math.isinf(alpha)):
        part = IidPartitioner(num_clients)
    elif partition == "dirichlet":
        part = DirichletPartitioner(num_clients, "label", float(alpha),
                                    min_partition_size=max(1, min(10, n // (4 * num_clients))),
                                    self_balancing=False, shuffle=True, seed=int(seed))
    elif partition == "pathological":
        part = PathologicalPartitioner(num_clients, "label", int(k),
                                       class_assignment_mode="first-deterministic",
                                       shuffle=True, seed=int(seed))
    else:  # pragma: no cover - checked by build_scenario
        raise ValueError(f"unknown partition {partition!r}")
    # shuffled first (seeded): IidPartitioner cuts contiguous blocks, and pools are often sorted
    order = np.random.default_rng([seed, 0, 0, TAG_SHARDS]).permutation(n)
    part.dataset = Dataset.from_dict({"label": labels[order], "index": order})
    try:
        shards = [np.sort(np.asarray(part.load_partition(i)["index"], dtype=np.int64))
                  for i in range(num_clients)]
    except Exception as exc:
        raise ValueError(f"disjoint {partition} partition of {n} samples into {num_clients} "
                         f"shards failed ({exc}); use fewer clients, a larger dirichlet-alpha "
                         f"(dirichlet) or disjoint = false") from exc
    empty = [i for i, s in enumerate(shards) if len(s) == 0]
    if empty:
        raise ValueError(f"disjoint {partition} partition left clients {empty} without data "
                         f"({n} samples, {num_clients} clients); use fewer clients, more "
                         f"classes-per-client or disjoint = false")
    return shards


class ShardRealisation(ClassRealisation):
    """Each client draws its training inputs only from its own shard of the train pool, and its
    test inputs from its own test shard when it has one (else the whole test pool); its prior is
    the shard's class frequencies."""

    def __init__(self, source: ImageSource, concepts: Sequence[ClassConcept],
                 shards: Sequence[np.ndarray], test_shards: Sequence[np.ndarray] | None = None,
                 oversample: bool = False) -> None:
        labels = source.train_pool.labels
        priors = np.stack([_frequencies(labels[s], source.num_classes) for s in shards])
        super().__init__(source, concepts, priors, oversample)
        self.shards = [np.asarray(s, dtype=np.int64) for s in shards]
        self.test_shards = (None if test_shards is None else
                            [np.asarray(s, dtype=np.int64) for s in test_shards])
        self._clients: dict[tuple[int, bool], ClassRealisation] = {}

    def _client(self, client: int, train: bool = True) -> ClassRealisation:
        """The realisation of one client's shard; its test shard follows its own class
        frequencies (all of a natural partition's test rows), the train shard's otherwise."""
        key = (client, bool(train))
        real = self._clients.get(key)
        if real is None:
            src = self.source
            test = (src.test_pool if self.test_shards is None
                    else _subpool(src.test_pool, self.test_shards[client]))
            shard = type(src)(_subpool(src.train_pool, self.shards[client]), test)
            priors = self.priors[client:client + 1]
            if not train:
                priors = _frequencies(test.labels, src.num_classes)[None]
            real = ClassRealisation(shard, self.concepts, priors, self.oversample)
            self._clients[key] = real
        return real

    def rows(self, client: int, train: bool) -> int:
        if train or self.test_shards is not None:
            return self._client(client, train).rows(0, train)
        return super().rows(client, train)

    def sample(self, concept: int, n: int, rng: np.random.Generator, *, client: int,
               train: bool) -> tuple[np.ndarray, np.ndarray]:
        if not train and self.test_shards is None:
            return super().sample(concept, n, rng, client=client, train=False)
        return self._client(client, train).sample(concept, n, rng, client=0, train=train)


def natural_realisation(source: ImageSource, concepts: Sequence[ClassConcept],
                        groups_train: np.ndarray, groups_test: np.ndarray, names: Sequence[str],
                        num_clients: int, column: str, oversample: bool = False
                        ) -> ShardRealisation:
    """Client ``k`` holds the rows of the ``k``-th value of ``partition-column`` (sorted), its
    train rows and its own test rows. One value for several clients is a SuperNode's own file:
    every client index reads it (only this node's is used)."""
    check_groups(len(names), num_clients, column, names)
    ids = [0] * num_clients if len(names) == 1 else list(range(num_clients))
    train = [np.flatnonzero(groups_train == g) for g in ids]
    test = [np.flatnonzero(groups_test == g) for g in ids]
    return ShardRealisation(source, concepts, train, test, oversample)


def check_groups(found: int, num_clients: int, column: str, names: Sequence[str]) -> None:
    """``partition-column`` must give one value per client (or one value: a node's own file)."""
    if found == 1 or found == num_clients:
        return
    shown = ", ".join(repr(n) for n in list(names)[:6]) + (", ..." if found > 6 else "")
    raise ValueError(f"partition-column {column!r}: found {found} distinct values ({shown}) for "
                     f"num-clients = {num_clients}; expected one value per client: set "
                     f"num-clients = {found} (or 0: one client per value)")


def partition_realisation(base: ClassRealisation, partition: str, disjoint: bool,
                          num_clients: int, alpha: float, k: int, seed: int) -> ClassRealisation:
    """``base`` (a pool or mixture realisation with the scenario's Dirichlet priors) re-partitioned
    as the module docstring says."""
    src = base.source
    pool = getattr(src, "train_pool", None)
    if disjoint:
        if pool is None:
            raise ValueError("disjoint = true needs a pool dataset (images, a user dataset or a "
                             "River table); a generated mixture has no pool to split")
        return ShardRealisation(src, base.concepts, disjoint_shards(
            pool.labels, partition or "dirichlet", num_clients, alpha, k, seed),
            oversample=base.oversample)
    if partition in ("", "dirichlet"):
        return base
    freq = (_frequencies(pool.labels, base.num_classes) if pool is not None
            else np.full(base.num_classes, 1.0 / base.num_classes))
    return ClassRealisation(src, base.concepts,
                            client_priors(partition, base.num_classes, num_clients, k, freq),
                            base.oversample)
