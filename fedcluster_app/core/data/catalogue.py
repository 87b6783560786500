"""The catalogue of named scenarios: their definitions, the registry families add to, and
each paper's protocol for its scenarios.

``ScenarioDef`` entries are built by ``scenarios.py`` (the core's data kinds: the table in its
docstring); a family with data of its own registers a builder (``register_scenario``). Both
kinds share one namespace, listed by :func:`list_scenarios`.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

# data_dir value for a scenario's metadata without its files (the server of a deployment)
METADATA_ONLY = "<metadata-only>"


@dataclass(frozen=True)
class ScenarioDef:
    """A scenario of the standard catalogue: a data kind with its concepts (the table in the
    module docstring), a schedule (a bundled ``.cp`` name or a drift pattern) and its sizes.
    The core defines the mixtures, River's streams and the image pools; a family adds its own with
    :func:`define_scenario` (FedDrift: SINE-2, CIRCLE-2, SEA-2, SEA-4)."""

    name: str
    description: str
    data: str  # sine | circle | sea | river | mixture | digits | mnist | fashion-mnist | cifar10
    # sea: "2"/"4"; river: stagger/agrawal/hyperplane/rbf/rbf-drift; mixture: swap/prior/
    # noise/mix; class pools: POOL_VARIANTS
    variant: str
    schedule: str  # a bundled schedule name ("Y", "F") or a drift pattern
    num_clients: int = 10
    num_steps: int = 6
    drift_step: int = 3
    samples: int = 500
    test_samples: int = 200
    alpha: float = math.inf  # default Dirichlet label skew (inf = uniform class prior)

    @property
    def tabular(self) -> bool:
        return self.data in ("sine", "circle", "sea", "river")

    @property
    def needs_data_dir(self) -> bool:
        return self.data in ("mnist", "fashion-mnist", "cifar10")

    @property
    def user_pool(self) -> bool:
        """A pool whose data come from ``sources.py``: the user's ``dataset`` or a River table."""
        return self.data == "dataset" or self.data.startswith("table:")

    @property
    def pool(self) -> bool:
        """A class pool: images, the user's dataset or a River table (partition applies)."""
        return self.data in ("digits", "mnist", "fashion-mnist", "cifar10") or self.user_pool


def _defs() -> dict[str, ScenarioDef]:
    out: list[ScenarioDef] = [
        ScenarioDef("mixture-swap", "Gaussian 4-class mixture in 8-d; clients 0-4 get permuted labels "
             "from step 3 (small, fast)", "mixture", "swap", "sudden", samples=200,
             test_samples=100),
        ScenarioDef("mixture-prior", "Gaussian 4-class mixture in 8-d; label shift: clients 0-4 put 90% "
             "of their data on classes 0-1 from step 3", "mixture", "prior", "sudden",
             samples=200, test_samples=100),
        ScenarioDef("mixture-noise", "Gaussian 4-class mixture in 8-d; feature shift: clients 0-4 "
             "get additive Gaussian noise (std 1) from step 3", "mixture", "noise", "sudden",
             samples=200, test_samples=100),
        ScenarioDef("mixture-mix", "Gaussian 4-class mixture in 8-d; label, feature and concept "
             "shift mixed: of clients 0-4, 0 and 3 put 90% of their data on classes 0-1, 1 and 4 "
             "get additive Gaussian noise (std 1), 2 relabels y -> (y+1) % 4, from step 3",
             "mixture", "mix", "sudden", samples=200, test_samples=100),
        # River's synthetic streams (river_streams.py); concepts and targets: module docstring
        ScenarioDef("stagger3", "STAGGER (River): 3 boolean rules on one-hot size/colour/shape "
             "(9-d), balanced classes; clients 0-4 switch to rule 1 + k % 2 at step 3", "river",
             "stagger", "sudden"),
        ScenarioDef("agrawal4", "Agrawal (River): loan functions 0-3 on 13-d standardised "
             "features, balanced classes; 4-concept schedule F", "river", "agrawal", "F",
             num_steps=11, drift_step=4),
        ScenarioDef("hyperplane2", "Hyperplane (River): two 10-d hyperplanes 66 degrees apart, 5% "
             "label noise; staggered 2-concept schedule Y", "river", "hyperplane", "Y",
             num_steps=11, drift_step=4),
        ScenarioDef("rbf4", "RandomRBF (River): 4 centroid sets (20 centroids, 4 classes) in 10-d; "
             "staggered: each client draws a concept at steps 3 and 5", "river", "rbf",
             "staggered"),
        ScenarioDef("rbf-drift", "RandomRBFDrift (River): 20 moving centroids (4 classes, 10-d); clients 0-4 follow the moving stream from step 3 through two intermediate "
             "positions (incremental)", "river", "rbf-drift", "incremental"),
    ]
    images = {
        "digits": ("scikit-learn 8x8 digits", 200, 100),
        "mnist": ("MNIST (local data-dir)", 500, 200),
        "fmnist": ("Fashion-MNIST (local data-dir)", 500, 200),
        "cifar10": ("CIFAR-10 (local data-dir)", 500, 200),
    }
    for prefix, (label, n, n_test) in images.items():
        data = "fashion-mnist" if prefix == "fmnist" else prefix
        common = dict(samples=n, test_samples=n_test, alpha=1.0)
        out += [
            ScenarioDef(f"{prefix}-static", f"{label}, Dirichlet(1) label skew, no drift", data,
                 "static", "none", **common),
            ScenarioDef(f"{prefix}-swap", f"{label}; concept shift: FedCCFA label swaps (1<->2, 3<->4, "
                 "5<->6 by client group) at step 3", data, "swap", "sudden", **common),
            ScenarioDef(f"{prefix}-rotate", f"{label}; feature shift: even clients see images rotated "
                 "by 90 degrees from step 3", data, "rotate", "sudden", **common),
            ScenarioDef(f"{prefix}-noise", f"{label}; feature shift: even clients get additive "
                 "Gaussian noise (std 0.5) from step 3", data, "noise", "sudden", **common),
            *_pool_variants(prefix, label, data, ("permute", "prior", "mix"), **common),
        ]
    # a user's dataset (run-config key `dataset`) and the tables River ships (sources.py)
    out += _pool_variants("dataset", "your dataset (run-config key dataset)", "dataset",
                          POOL_VARIANTS, samples=200, test_samples=100, alpha=1.0)
    for table, (label, classes) in RIVER_TABLE_POOLS.items():
        variants = [v for v in POOL_VARIANTS if v != "rotate" and (v != "swap" or classes >= 7)]
        out += _pool_variants(table.lower(), label, f"table:{table}", variants, samples=200,
                              test_samples=100, alpha=1.0)
    return {d.name: d for d in out}


#: the realisations of every class pool (swap needs >= 7 classes, rotate needs images)
POOL_VARIANTS = ("static", "swap", "permute", "rotate", "noise", "prior", "mix")
#: River's bundled classification tables: (description, number of classes)
RIVER_TABLE_POOLS = {
    "ImageSegments": ("River's ImageSegments table (7 classes, 18 features)", 7),
    "Shuttle": ("River's Shuttle table (2 classes, 9 features)", 2),
    "Phishing": ("River's Phishing table (2 classes, 9 features)", 2),
    "Bananas": ("River's Bananas table (2 classes, 2 features)", 2),
}
_VARIANT_TEXT = {
    "static": "Dirichlet(1) label skew, no drift",
    "swap": "concept shift: FedCCFA label swaps (1<->2, 3<->4, 5<->6 by client group) at step 3",
    "permute": "concept shift: the first half of the clients relabel y -> (y+1) % C from step 3",
    "rotate": "feature shift: even clients see images rotated by 90 degrees from step 3",
    "noise": "feature shift: even clients get additive Gaussian noise (std 0.5) from step 3",
    "prior": "label shift: the first half of the clients put 90% of their data on the first "
             "half of the classes from step 3",
    "mix": "label, feature and concept shift mixed: of the first half of the clients, those with "
           "k % 3 = 0 put 90% of their data on the first half of the classes, k % 3 = 1 get "
           "additive Gaussian noise (std 0.5), k % 3 = 2 relabel y -> (y+1) % C, from step 3",
}


def _pool_variants(prefix: str, label: str, data: str, variants, **common) -> list[ScenarioDef]:
    """The ``<prefix>-<variant>`` scenarios of a class pool (static = no drift, else sudden)."""
    return [ScenarioDef(f"{prefix}-{v}", f"{label}{', ' if v == 'static' else '; '}"
                        f"{_VARIANT_TEXT[v]}", data, v, "none" if v == "static" else "sudden",
                        **common) for v in variants]


_DEFS = _defs()
#: the scenarios the core defines itself (families add theirs: :func:`scenario_names`)
SCENARIO_NAMES: tuple[str, ...] = tuple(sorted(_DEFS))


def define_scenario(d: ScenarioDef) -> None:
    """Add a scenario of the standard catalogue (its data kind is one of the core's)."""
    key = d.name.strip().lower()
    if key in _DEFS or key in _EXTRA:
        raise ValueError(f"scenario {d.name!r} is already defined")
    _DEFS[key] = d


# Scenario families defined in other modules (FlexCFL's Synthetic(a,b), FedRC's populations, ...):
# name -> (description, builder). See register_scenario.
_EXTRA: dict[str, tuple[str, Callable[..., object]]] = {}


def register_scenario(name: str, description: str, builder: Callable[..., object]) -> None:
    """Add a named scenario built by ``builder(**kwargs)``.

    ``kwargs`` are :func:`build_scenario`'s keyword arguments as the user gave them (``0`` /
    ``""`` = "your default"); the builder validates them (ValueError naming the problem) and
    returns a :class:`Scenario` (or an object with the same interface) whose ``spec`` is a
    ``ScenarioSpec`` of those kwargs and ``name`` (its ``params``, and what another process
    rebuilds it from). Results are cached: identical arguments give the same object.
    """
    key = name.strip().lower()
    if key in _DEFS or key in _EXTRA:
        raise ValueError(f"scenario {name!r} is already defined")
    _EXTRA[key] = (description, lru_cache(maxsize=32)(builder))


def lazy_builder(path: str, *args: object) -> Callable[..., object]:
    """A builder for :func:`register_scenario` that imports ``package.module:function`` on the
    first build and returns ``function(*args, **kwargs)``: a family's catalogue declares its
    scenarios without importing their data code (numpy and the rest), so that listing them
    (``fedcluster list``) stays instant."""
    module, _, attr = path.partition(":")

    def build(**kwargs: object) -> object:
        return getattr(importlib.import_module(module), attr)(*args, **kwargs)

    return build


# Each paper's protocol for its own scenarios: run-config settings (rounds per step, local
# work, optimizer, learning rate, model width, K) applied where the user left the default.
_PROTOCOLS: dict[str, dict[str, object]] = {}


def set_protocol(name: str, settings: dict[str, object]) -> None:
    """Declare the run-config settings the paper behind scenario ``name`` uses."""
    key = name.strip().lower()
    if key not in _DEFS and key not in _EXTRA:
        raise ValueError(f"protocol for unknown scenario {name!r}")
    _PROTOCOLS[key] = dict(settings)


def scenario_protocol(name: str) -> dict[str, object]:
    """The declared protocol of a scenario (``{}`` when it has none)."""
    return dict(_PROTOCOLS.get(str(name).strip().lower(), {}))


def reads_dataset(name: str) -> bool:
    """Whether scenario ``name`` draws its data from the run-config key ``dataset``."""
    d = _DEFS.get(str(name).strip().lower())
    return d is not None and d.data == "dataset"


def scenario_names() -> tuple[str, ...]:
    """Every scenario name, the built-in families and the registered ones, sorted."""
    return tuple(sorted([*_DEFS, *_EXTRA]))


def list_scenarios() -> list[tuple[str, str]]:
    """``(name, one-line description)`` of every named scenario, sorted by name."""
    return [(n, _DEFS[n].description if n in _DEFS else _EXTRA[n][0]) for n in scenario_names()]
