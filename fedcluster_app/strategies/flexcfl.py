"""FlexCFL (Duan et al.) and the baselines of its paper, on one client selection.

Spec: ``shared/specs/flexcfl.md``. Strategies:

* ``flexcfl``: group cold start (alpha*m pre-training clients, truncated SVD of the un-centred
  update matrix, cosine of each update to the m leading directions = the EDC embedding,
  k-means++), fixed group directions, newcomer cold start (pre-train from w0, join the group
  whose *initial* direction is closest), migration of warm clients whose label counts moved past
  the threshold (``shift-metric``: the paper's ``scipy_counts`` or the label-aware ``tv``),
  intra-group FedAvg and inter-group aggregation with rate ``eta-g`` (0 = identity, section 2.7);
  only the client's own group model is sent.
* ``fedgroup``: the same without migration (the static FedGroup).
* ``fesem``: FeSEM, each selected client joins the centre nearest (L2) to its last local
  solution (cached on the server; w0 for a client never trained); unweighted mean per centre.
  The assignment rule is :func:`nearest_model` / :meth:`FeSEM.assignment_vector`, reusable.
* ``flexcfl-ifca``: IFCA as the FlexCFL paper runs it (all m models down, min-loss choice on the
  client, *unweighted* mean per model, section 6) on the paper's selection.
* ``flexcfl-fedavg``: FedAvg on the paper's selection (the reference of the comparisons).

Selection (``selection = "paper"``, section 2.5): round-robin over the clients sorted by id for
the first N/K rounds, then ``random.Random(t + seed).sample(clients, K)``: stateless, identical
for every method. ``selection = "fraction"`` uses the base's ``fraction-train`` sampling instead
(with m = 1, eta-g = 0, ``group-init = "w0"`` and ``cold-start = "eager"`` FlexCFL is then the
foundation's ``fedavg`` exactly).

Every strategy here reports per round: ``weighted_accuracy`` (correct / test samples over all
evaluated clients, section 2.10), ``models_down`` / ``models_up`` (models moved by training and
query messages, evaluation excluded: the communication of section 2.8), and FlexCFL adds
``newcomers``, ``shift_cold_starts``, ``migrations`` and ``group_sizes``.
"""

from __future__ import annotations

import base64
import math
import random
from logging import INFO, WARNING
from typing import Any, ClassVar

import numpy as np
from flwr.common.logger import log
from flwr.serverapp import Grid

from .. import protocol as P
from ..clients.flexcfl import PRETRAIN_ITERS, QUERY_PRETRAIN
from ..config import ConfigError
from .base import ClusteredStrategy, Reply, Task, Weights, weighted_average
from .ifca import IFCA

SHIFT_METRICS = ("scipy_counts", "tv")
SELECTIONS = ("paper", "fraction")
EPS = 1e-12


# ------------------------------------------------------------------------------- helpers
def flatten(weights: Weights) -> np.ndarray:
    """All layers concatenated in state_dict order, float64."""
    return np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in weights])


def unflatten(vec: np.ndarray, like: Weights) -> Weights:
    out, pos = [], 0
    for a in like:
        out.append(vec[pos : pos + a.size].reshape(a.shape).astype(np.float32))
        pos += a.size
    return out


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / ((np.linalg.norm(a) + EPS) * (np.linalg.norm(b) + EPS)))


def edc_embedding(updates: np.ndarray, m: int) -> np.ndarray:
    """M_d[i, k] = cos(dw_i, v_k), v_k the top-m right singular vectors of the un-centred
    n x d update matrix (spec 2.2, 7.4); EDC(i, j) = ||M_d[i] - M_d[j]|| / m."""
    _, _, vt = np.linalg.svd(updates, full_matrices=False)
    v = vt[:m]                                           # (m, d), unit rows
    norms = np.linalg.norm(updates, axis=1, keepdims=True) + EPS
    md = (updates @ v.T) / norms
    if md.shape[1] < m:                                  # rank < m: pad (never the case for d >> n)
        md = np.pad(md, ((0, 0), (0, m - md.shape[1])))
    return md


def edc_kmeans(md: np.ndarray, m: int, seed: int) -> np.ndarray:
    """k-means++ (n_init 10, max_iter 20, fixed seed) on the rows of M_d (spec 2.2, 7.5)."""
    import warnings

    from sklearn.cluster import KMeans

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # "fewer distinct clusters than n_clusters": handled
        km = KMeans(n_clusters=m, init="k-means++", max_iter=20, n_init=10, random_state=seed)
        return km.fit(md).labels_.astype(int)


def shift_distance(metric: str, counts: np.ndarray, ref: np.ndarray) -> float:
    """``scipy_counts``: scipy's 1-D Wasserstein distance between the two count vectors taken as
    samples of C values (label identity ignored; the paper's code); ``tv``: total variation of
    the label distributions (label-aware)."""
    counts, ref = np.asarray(counts, float), np.asarray(ref, float)
    if metric == "scipy_counts":
        from scipy.stats import wasserstein_distance

        return float(wasserstein_distance(counts, ref))
    a, b = counts.sum(), ref.sum()
    if a <= 0 and b <= 0:
        return 0.0
    if a <= 0 or b <= 0:
        return 1.0
    return float(0.5 * np.abs(counts / a - ref / b).sum())


def shift_threshold(metric: str, fraction: float, n_orig: int, num_classes: int) -> float:
    """tau_i = fraction * n_orig / C for ``scipy_counts`` (Eq. 9), ``fraction`` for ``tv``."""
    return fraction * n_orig / num_classes if metric == "scipy_counts" else fraction


def inter_group_aggregate(models: dict[int, np.ndarray], eta_g: float) -> dict[int, np.ndarray]:
    """Spec 2.7 (the code's normalised form): w_j = sum_l a_jl w_l / sum_l a_jl with a_jj = 1,
    a_jl = eta_g / ||w_l|| for l != j, norms from the inputs, all groups at once."""
    if eta_g == 0 or len(models) < 2:
        return dict(models)
    ids = sorted(models)
    inv = {g: eta_g / (np.linalg.norm(models[g]) + EPS) for g in ids}
    out = {}
    for j in ids:
        coeff = {l: (1.0 if l == j else inv[l]) for l in ids}
        total = sum(coeff.values())
        out[j] = sum(coeff[l] * models[l] for l in ids) / total
    return out


def nearest_model(vec: np.ndarray, candidates: dict[int, np.ndarray]) -> int:
    """The candidate id with the smallest L2 distance to ``vec`` (ties: the lowest id)."""
    return min(sorted(candidates), key=lambda k: float(np.linalg.norm(vec - candidates[k])))


def _encode(vec: np.ndarray) -> str:
    return base64.b64encode(np.asarray(vec, dtype=np.float64).tobytes()).decode()


def _decode(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype=np.float64).copy()


# ------------------------------------------------------------------------------- base
class PaperSelection(ClusteredStrategy):
    """What the FlexCFL comparisons share: selection, hyper-parameter checks, accounting."""

    # key -> default; every strategy's table in pyproject.toml has exactly these keys
    HPARAMS: ClassVar[dict[str, Any]] = {"clients-per-round": 20, "selection": "paper"}

    def __init__(self, experiment) -> None:
        super().__init__(experiment)
        hp = self.hparams()
        unknown = sorted(set(hp) - set(self.HPARAMS))
        if unknown:
            raise ConfigError(f"unknown {self.name} hyper-parameter(s) {', '.join(unknown)}; "
                              f"valid: {', '.join(sorted(self.HPARAMS))}")
        self.hp = {k: hp.get(k, v) for k, v in self.HPARAMS.items()}
        self.k = self._int("clients-per-round", 1)
        self.selection = str(self.hp["selection"])
        if self.selection not in SELECTIONS:
            raise ConfigError(f"{self.name}.selection must be one of {', '.join(SELECTIONS)}, "
                              f"got {self.selection!r}")
        self.num_scenario_clients = experiment.scenario.num_clients
        self._selected: list[int] = []
        self._comm = {"models_down": 0, "models_up": 0}

    def _int(self, key: str, minimum: int) -> int:
        v = self.hp[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v or v < minimum:
            raise ConfigError(f"{self.name}.{key} must be an integer >= {minimum}, got {v!r}")
        return int(v)

    def _float(self, key: str, minimum: float) -> float:
        v = self.hp[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                or v < minimum:
            raise ConfigError(f"{self.name}.{key} must be a finite number >= {minimum}, got {v!r}")
        return float(v)

    def num_groups_hp(self) -> int:
        m = self.hp["num-groups"]
        if isinstance(m, bool) or not isinstance(m, (int, float)) or int(m) != m:
            raise ConfigError(f"{self.name}.num-groups (m) must be an integer >= 1, got {m!r}")
        m = int(m) or self.cfg.num_clusters
        if m < 1:
            raise ConfigError(f"{self.name}.num-groups (m) must be >= 1, got {m}")
        if m > self.num_scenario_clients:
            raise ConfigError(f"{self.name}.num-groups (m) = {m} is larger than the number of "
                              f"clients ({self.num_scenario_clients})")
        return m

    # -- selection (spec 2.5)
    def select(self) -> list[int]:
        cids = sorted(c for c in self.clients if c not in self.holdouts)
        if not cids:
            return []
        if self.selection == "fraction":
            return self.sample(cids, self.cfg.fraction_train)
        n, k = len(cids), min(self.k, len(cids))
        t = self.round - 1
        if t * k < n:
            start = (t * k) % n
            return sorted(cids[(start + i) % n] for i in range(k))
        return sorted(random.Random(t + self.cfg.seed).sample(cids, k))

    # -- accounting
    def exchange(self, grid: Grid, kind: str, tasks: dict[int, Task]) -> list[Reply]:
        replies = super().exchange(grid, kind, tasks)
        if kind != P.EVALUATE:
            self._comm["models_down"] += sum(
                len(t.models) for c, t in tasks.items() if self.clients[c].node_id is not None)
            self._comm["models_up"] += sum(len(r.models) for r in replies)
        return replies

    def round_metrics(self) -> dict[str, Any]:
        out = dict(self._comm)   # weighted_accuracy: computed by the base for every strategy
        self._comm = {"models_down": 0, "models_up": 0}
        return out


# ------------------------------------------------------------------------------- FlexCFL
class FlexCFL(PaperSelection):
    name = "flexcfl"
    description = ("FlexCFL: EDC group cold start, newcomer cold start, migration on label "
                   "shift, inter-group aggregation (eta-g)")
    MIGRATION = True
    HPARAMS: ClassVar[dict[str, Any]] = {
        "num-groups": 0, "pretrain-scale": 0, "pretrain-iters": 50, "eta-g": 0.0,
        "migration": True, "shift-metric": "scipy_counts", "shift-threshold": 0.2,
        "group-init": "pretrained", "cold-start": "lazy", **PaperSelection.HPARAMS,
    }

    def __init__(self, experiment) -> None:
        super().__init__(experiment)
        n = self.num_scenario_clients
        self.m = self.num_groups_hp()
        alpha = self._int("pretrain-scale", 0)
        if alpha:
            self.n_pre = alpha * self.m
            if self.n_pre > n:
                raise ConfigError(
                    f"{self.name}.pretrain-scale x num-groups (alpha x m = {alpha} x {self.m} = "
                    f"{self.n_pre}) is larger than the number of clients ({n})")
        else:
            self.n_pre = min(20 * self.m, n)   # the paper's alpha = 20, capped at N (spec 2.2)
        self.pretrain_iters = self._int("pretrain-iters", 1)
        self.eta_g = self._float("eta-g", 0.0)
        self.migration = bool(self.hp["migration"]) and self.MIGRATION
        self.shift_metric = str(self.hp["shift-metric"])
        if self.shift_metric not in SHIFT_METRICS:
            raise ConfigError(f"{self.name}.shift-metric must be one of "
                              f"{', '.join(SHIFT_METRICS)}, got {self.shift_metric!r}")
        self.shift_fraction = self._float("shift-threshold", 0.0)
        self.group_init = str(self.hp["group-init"])
        if self.group_init not in ("pretrained", "w0"):
            raise ConfigError(f"{self.name}.group-init must be 'pretrained' or 'w0', got "
                              f"{self.group_init!r}")
        self.cold_mode = str(self.hp["cold-start"])
        if self.cold_mode not in ("lazy", "eager"):
            raise ConfigError(f"{self.name}.cold-start must be 'lazy' or 'eager', got "
                              f"{self.cold_mode!r}")
        self.group_ids: list[int] = []
        self.w0_id: int | None = None
        self.directions: dict[int, np.ndarray] = {}     # fixed after the group cold start
        self.ref_counts: dict[int, np.ndarray] = {}
        self.n_orig: dict[int, int] = {}
        self.last_counts: dict[int, int] = {}
        self.grouped = False
        self.pre_clients: list[int] = []
        self.pre_labels: list[int] = []
        self.embedding: np.ndarray | None = None        # M_d of the group cold start
        self.totals = {"newcomers": 0, "shift_cold_starts": 0, "migrations": 0,
                       "pretrain_left_out": 0}
        self._round = dict.fromkeys(self.totals, 0)
        self._shifted: list[int] = []

    # -- set-up
    def on_start(self) -> None:
        # group models first (ids 0..m-1, so m = 1 trains model 0 as fedavg does), then w0
        w0 = self.initial_weights()
        self.group_ids = [self.new_model([a.copy() for a in w0]) for _ in range(self.m)]
        self.w0_id = self.new_model(w0)
        for cid, rec in self.clients.items():
            self.n_orig.setdefault(cid, rec.num_examples)

    def on_new_client(self, cid: int) -> None:
        self.n_orig.setdefault(cid, self.clients[cid].num_examples)   # cold until selected

    def before_round(self, grid: Grid, step: int, new_step: bool) -> None:
        if not self.grouped:
            self.group_cold_start(grid)
        if self.migration:
            self.check_shifts(grid)
        self._selected = self.select()
        if self.cold_mode == "eager":
            cold = [c for c in sorted(self.clients) if self.clients[c].cluster is None]
        else:
            cold = [c for c in self._selected if self.clients[c].cluster is None]
        if cold:
            self.cold_start(grid, cold, "newcomers")

    # -- pre-training
    def _pretrain(self, grid: Grid, cids: list[int]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """cid -> (flattened update from w0, label counts); bad updates are left out, logged."""
        replies = self.query(grid, QUERY_PRETRAIN, cids, models=[self.w0_id],
                             config={PRETRAIN_ITERS: self.pretrain_iters})
        w0 = flatten(self.models[self.w0_id])
        out = {}
        for cid in cids:
            r = replies.get(cid)
            if r is None or self.w0_id not in r.models:
                why = ("missing or rejected (e.g. non-finite values)" if r is None
                       else "empty: no training data")
                log(WARNING, "round %d: %s: pre-training update of client %d %s; left out of "
                    "the SVD / cold start", self.round, self.name, cid, why)
                self._count("pretrain_left_out")
                continue
            delta = flatten(r.models[self.w0_id]) - w0
            if not np.all(np.isfinite(delta)):
                log(WARNING, "round %d: %s: pre-training update of client %d is not finite; "
                    "left out of the SVD / cold start", self.round, self.name, cid)
                self._count("pretrain_left_out")
                continue
            counts = np.asarray(r.metrics.get(P.HISTOGRAM, []), dtype=np.int64)
            self.last_counts[cid] = int(counts.sum())
            out[cid] = (delta, counts)
        return out

    def group_cold_start(self, grid: Grid) -> None:
        """Spec 2.2 (Algorithm 3), once, as a pre-round exchange."""
        self.grouped = True
        cids = sorted(self.clients)
        rng = np.random.default_rng([self.cfg.seed, 0xF1E7])  # not self.rng: selection uses it
        n_pre = min(self.n_pre, len(cids))
        self.pre_clients = sorted(int(c) for c in rng.choice(cids, size=n_pre, replace=False))
        updates = self._pretrain(grid, self.pre_clients)
        if len(updates) < len(self.pre_clients):
            log(WARNING, "%s: %d of %d pre-training updates left out of the SVD", self.name,
                len(self.pre_clients) - len(updates), len(self.pre_clients))
        rows = sorted(updates)
        w0 = flatten(self.models[self.w0_id])
        if not rows:
            log(WARNING, "%s: no usable pre-training update; every group starts at w0", self.name)
            return
        mat = np.stack([updates[c][0] for c in rows])
        k = min(self.m, len(rows))
        self.embedding = edc_embedding(mat, self.m)
        labels = edc_kmeans(self.embedding, k, self.cfg.seed)
        self.pre_clients, self.pre_labels = rows, [int(x) for x in labels]
        for j, gid in enumerate(self.group_ids):
            members = [c for c, lab in zip(rows, labels) if lab == j]
            if not members:
                log(WARNING, "%s: group %d got no pre-training client; it stays at w0 and takes "
                    "no newcomers", self.name, gid)
                continue
            direction = np.mean([updates[c][0] for c in members], axis=0)   # unweighted
            self.directions[gid] = direction
            if self.group_init == "pretrained":
                self.models[gid] = unflatten(w0 + direction, self.models[gid])
            for c in members:
                self.assign(c, gid)
                self.ref_counts[c] = updates[c][1]
        log(INFO, "%s: group cold start on %d clients: sizes %s", self.name, len(rows),
            [len(self.members(g)) for g in self.group_ids])

    def nearest_group(self, delta: np.ndarray) -> int | None:
        """argmin_j (1 - cos(dw0_j, delta)) / 2 over the fixed directions; ties: lowest id."""
        if not self.directions:
            return self.group_ids[0] if self.group_ids else None
        dis = {g: (1.0 - cosine(self.directions[g], delta)) / 2.0 for g in sorted(self.directions)}
        return min(dis, key=lambda g: (dis[g], g))

    def cold_start(self, grid: Grid, cids: list[int], why: str, old: dict | None = None) -> None:
        """Spec 2.3: pre-train from w0 on the current data, join the closest initial direction."""
        for cid, (delta, counts) in self._pretrain(grid, cids).items():
            g = self.nearest_group(delta)
            self.assign(cid, g)
            self.ref_counts[cid] = counts
            self._count(why)
            if old is not None and old.get(cid) != g:
                self._count("migrations")

    def _count(self, what: str) -> None:
        self._round[what] += 1
        self.totals[what] += 1

    # -- migration (spec 2.4)
    def check_shifts(self, grid: Grid) -> None:
        warm = [c for c in sorted(self.clients) if self.clients[c].cluster in self.group_ids]
        if not warm:
            return
        replies = self.query(grid, P.QUERY_HISTOGRAM, warm)
        shifted = []
        c_num = self.exp.scenario.num_classes
        for cid in warm:
            r = replies.get(cid)
            if r is None:
                continue
            counts = np.asarray(r.metrics.get(P.HISTOGRAM, []), dtype=np.int64)
            self.last_counts[cid] = int(counts.sum())
            ref = self.ref_counts.get(cid)
            if ref is None or len(ref) != len(counts):
                self.ref_counts[cid] = counts
                continue
            tau = shift_threshold(self.shift_metric, self.shift_fraction,
                                  self.n_orig.get(cid, int(ref.sum())), c_num)
            if shift_distance(self.shift_metric, counts, ref) > tau:
                shifted.append(cid)
        self._shifted = shifted
        if not shifted:
            return
        old = {c: self.clients[c].cluster for c in shifted}
        for c in shifted:
            self.assign(c, None)
        self.cold_start(grid, shifted, "shift_cold_starts", old)
        for c in shifted:   # a failed re-cold-start keeps the client where it was
            if self.clients[c].cluster is None:
                self.assign(c, old[c])

    # -- training
    def plan_train(self, step: int) -> dict[int, Task]:
        plan = {}
        for cid in self._selected:
            rec = self.clients.get(cid)
            if rec is None or rec.cluster not in self.group_ids:
                continue
            if self.last_counts.get(cid, 1) == 0:
                continue     # no training data: skipped in training, still evaluated (7.22)
            plan[cid] = Task(models=[rec.cluster])
        return plan

    def on_train_replies(self, step: int, replies: list[Reply]) -> None:
        super().on_train_replies(step, replies)       # intra-group FedAvg (n-weighted)
        if self.eta_g > 0:
            active = [g for g in self.group_ids if self.members(g)]
            flat = {g: flatten(self.models[g]) for g in active}
            for g, vec in inter_group_aggregate(flat, self.eta_g).items():
                self.models[g] = unflatten(vec, self.models[g])

    # -- reporting and state
    def round_metrics(self) -> dict[str, Any]:
        out = super().round_metrics()
        out.update(self._round)
        out["group_sizes"] = [len(self.members(g)) for g in self.group_ids]
        out["shifted_clients"] = self._shifted
        self._round = dict.fromkeys(self.totals, 0)
        self._shifted = []
        return out

    def summary_extra(self) -> dict[str, Any]:
        return {f"{k}_total": v for k, v in self.totals.items()} | {
            "pretrain_clients": len(self.pre_clients),
            "group_sizes_final": [len(self.members(g)) for g in self.group_ids]}

    def strategy_state(self) -> dict[str, Any]:
        return {
            "group_ids": self.group_ids, "w0_id": self.w0_id, "grouped": self.grouped,
            "directions": {str(g): _encode(v) for g, v in self.directions.items()},
            "ref_counts": {str(c): v.tolist() for c, v in self.ref_counts.items()},
            "n_orig": {str(c): v for c, v in self.n_orig.items()},
            "last_counts": {str(c): v for c, v in self.last_counts.items()},
            "pre_clients": self.pre_clients, "pre_labels": self.pre_labels,
            "totals": self.totals,
        }

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        self.group_ids = [int(g) for g in state["group_ids"]]
        self.w0_id = state["w0_id"]
        self.grouped = bool(state["grouped"])
        self.directions = {int(g): _decode(v) for g, v in state["directions"].items()}
        self.ref_counts = {int(c): np.asarray(v, np.int64) for c, v in state["ref_counts"].items()}
        self.n_orig = {int(c): int(v) for c, v in state["n_orig"].items()}
        self.last_counts = {int(c): int(v) for c, v in state["last_counts"].items()}
        self.pre_clients = [int(c) for c in state["pre_clients"]]
        self.pre_labels = [int(c) for c in state["pre_labels"]]
        self.totals = {k: int(v) for k, v in state["totals"].items()}


class FedGroup(FlexCFL):
    name = "fedgroup"
    description = "FedGroup: FlexCFL's EDC grouping and newcomer cold start, no migration"
    MIGRATION = False
    HPARAMS: ClassVar[dict[str, Any]] = {
        k: v for k, v in FlexCFL.HPARAMS.items()
        if k not in ("migration", "shift-metric", "shift-threshold")
    }

    def __init__(self, experiment) -> None:
        self.HPARAMS = {**type(self).HPARAMS, "migration": False, "shift-metric": "scipy_counts",
                        "shift-threshold": 0.2}
        super().__init__(experiment)


# ------------------------------------------------------------------------------- FeSEM
class FeSEM(PaperSelection):
    """FeSEM (Xie et al.): m randomly initialised centres; a selected client joins the centre
    nearest to :meth:`assignment_vector` (its last local solution; w0 if never trained), trains
    it, and each centre becomes the (unweighted, or n-weighted) mean of its trained copies.
    ``init = "min-loss"``: a client without a local solution joins the centre of lowest loss on
    its training data instead (FeSEM as the FedRC paper runs it, spec fedrc.md 6)."""

    name = "fesem"
    description = "FeSEM: each selected client joins the centre nearest (L2) to its last local model"
    HPARAMS: ClassVar[dict[str, Any]] = {"num-groups": 0, "weighted": False, "init": "w0",
                                         **PaperSelection.HPARAMS}

    def __init__(self, experiment) -> None:
        super().__init__(experiment)
        self.m = self.num_groups_hp()
        self.weighted = bool(self.hp["weighted"])
        if self.hp["init"] not in ("w0", "min-loss"):
            raise ConfigError(f"fesem.init must be 'w0' or 'min-loss', got {self.hp['init']!r}")
        self.local: dict[int, np.ndarray] = {}     # server cache of local solutions (flattened)
        self.center_ids: list[int] = []

    def on_start(self) -> None:
        self.center_ids = [self.new_model(self.initial_weights(salt=j)) for j in range(self.m)]
        self._w0 = flatten(self.initial_weights())

    def assignment_vector(self, cid: int) -> np.ndarray:
        if not hasattr(self, "_w0"):
            self._w0 = flatten(self.initial_weights())
        return self.local.get(cid, self._w0)

    def assign_selected(self, cids: list[int]) -> None:
        centers = {g: flatten(self.models[g]) for g in self.center_ids}
        for cid in cids:
            self.assign(cid, nearest_model(self.assignment_vector(cid), centers))

    def before_round(self, grid: Grid, step: int, new_step: bool) -> None:
        self._selected = self.select()
        fresh = set()
        if self.hp["init"] == "min-loss":
            fresh = {c for c in self._selected if c not in self.local}
            replies = self.query(grid, P.QUERY_LOSSES, fresh, models=self.center_ids) if fresh else {}
            for cid, r in replies.items():
                losses = dict(zip(r.metrics[P.MODEL_IDS], r.metrics[P.LOSSES]))
                self.assign(cid, min(sorted(losses), key=lambda m: losses[m]))
        self.assign_selected([c for c in self._selected if c not in fresh])

    def plan_train(self, step: int) -> dict[int, Task]:
        return {c: Task(models=[self.clients[c].cluster]) for c in self._selected
                if self.clients[c].cluster is not None}

    def on_train_replies(self, step: int, replies: list[Reply]) -> None:
        for r in replies:
            for mid, w in r.models.items():
                self.local[r.cid] = flatten(w)
        for mid, items in self.collect_updates(replies).items():
            self.models[mid] = weighted_average(
                items if self.weighted else [(w, 1.0) for w, _ in items])

    def strategy_state(self) -> dict[str, Any]:
        return {"center_ids": self.center_ids,
                "local": {str(c): _encode(v) for c, v in self.local.items()}}

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        self.center_ids = [int(g) for g in state["center_ids"]]
        self.local = {int(c): _decode(v) for c, v in state["local"].items()}


# ------------------------------------------------------------------------------- baselines
class FlexIFCA(PaperSelection, IFCA):
    name = "flexcfl-ifca"
    description = ("IFCA as in the FlexCFL paper: all m models down, min-loss choice, unweighted "
                   "mean, paper selection")
    HPARAMS: ClassVar[dict[str, Any]] = {"num-groups": 0, "weighted": False,
                                         **PaperSelection.HPARAMS}

    def __init__(self, experiment) -> None:
        super().__init__(experiment)
        self.m = self.num_groups_hp()
        self.weighted = bool(self.hp["weighted"])

    def on_start(self) -> None:
        for k in range(self.m):
            self.new_model(self.initial_weights(salt=k))   # distinct random models
        for cid in self.clients:
            self.assign(cid, 0)

    def before_round(self, grid: Grid, step: int, new_step: bool) -> None:
        self._selected = self.select()

    def plan_train(self, step: int) -> dict[int, Task]:
        ids = sorted(self.models)
        return {c: Task(models=ids, config={P.SELECT: "min-loss"}) for c in self._selected}

    def on_train_replies(self, step: int, replies: list[Reply]) -> None:
        for r in replies:
            self.assign(r.cid, int(r.metrics[P.CHOSEN]))
        for mid, items in self.collect_updates(replies).items():
            self.models[mid] = weighted_average(
                items if self.weighted else [(w, 1.0) for w, _ in items])


class FlexFedAvg(PaperSelection):
    name = "flexcfl-fedavg"
    description = "FedAvg on the FlexCFL paper's client selection (its reference baseline)"

    def before_round(self, grid: Grid, step: int, new_step: bool) -> None:
        self._selected = self.select()

    def plan_train(self, step: int) -> dict[int, Task]:
        mids = self.clusters_in_use()
        return {c: Task(models=[self.clients[c].cluster]) for c in self._selected
                if self.clients[c].cluster in mids}


STRATEGY_CLASSES = [FlexCFL, FedGroup, FeSEM, FlexIFCA, FlexFedAvg]
