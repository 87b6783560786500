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
* ``flexcfl-ifca-mig`` / ``fesem-mig``: IFCA-MIG and FeSEM-MIG (Fig. 6): the two baselines plus
  section 2.4's label-count check; a shifted warm client is re-assigned at once by the method's
  own rule (IFCA: lowest loss over all m models, m models down; FeSEM: nearest centre to its
  cached local model, nothing on the wire).

Options of ``flexcfl`` / ``fedgroup`` (spec 2.2, 2.9): ``measure = "madc"`` (full cosine matrix,
MADC, complete-linkage agglomerative clustering instead of SVD + k-means), ``rcc`` (RCC: m random
pre-trained clients are the centres) and ``rac`` (RAC: newcomers and migrants join a random
group). ``eval-model = "last_received"`` (every strategy here but ``flexcfl-fedavg``, spec 2.10):
each client is tested with the model it last trained from, as the authors' code scores it.

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

from fedcluster_app.core import wire as P
from fedcluster_app.families.flexcfl.client import PRETRAIN_ITERS, QUERY_PRETRAIN
from fedcluster_app.core.config import ConfigError
from fedcluster_app.core.strategy import ClusteredStrategy, Reply, Task, Weights, weighted_average
from fedcluster_app.families.foundation.ifca import IFCA

SHIFT_METRICS = ("scipy_counts", "tv")
SELECTIONS = ("paper", "fraction")
EVAL_MODELS = ("current_group", "last_received")
MEASURES = ("edc", "madc")
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


def cosine_matrix(updates: np.ndarray) -> np.ndarray:
    """S[i, j] = cos(dw_i, dw_j) over the rows of the n x d update matrix (spec Eq. 4)."""
    unit = updates / (np.linalg.norm(updates, axis=1, keepdims=True) + EPS)
    return unit @ unit.T


def madc_matrix(sim: np.ndarray) -> np.ndarray:
    """MADC(i, j) = 1/(n-2) sum_{z != i, j} |S(i, z) - S(j, z)| of an n x n similarity matrix
    (spec 2.2, the FedGroup paper's measure; the authors' ``_calculate_data_driven_measure`` with
    ``correction=True``); zero diagonal, symmetric. n <= 2 gives zeros (no third client)."""
    sim = np.asarray(sim, dtype=np.float64)
    n = sim.shape[0]
    if sim.shape != (n, n):
        raise ValueError(f"MADC needs a square similarity matrix, got shape {sim.shape}")
    out = np.zeros((n, n))
    if n <= 2:
        return out
    idx = np.arange(n)
    for i in range(n):
        diff = np.abs(sim[i][None, :] - sim)            # diff[j, z] = |S(i, z) - S(j, z)|
        total = diff.sum(axis=1)
        total -= diff[:, i]                              # leave out z = i ...
        total -= diff[idx, idx]                          # ... and z = j (same term when j = i)
        total[i] = 0.0
        out[i] = total / (n - 2)
    return (out + out.T) / 2.0                           # exact already; removes rounding asymmetry


def madc_cluster(dissimilarity: np.ndarray, m: int) -> np.ndarray:
    """Agglomerative clustering, complete linkage, on a precomputed dissimilarity (spec 2.2)."""
    from sklearn.cluster import AgglomerativeClustering

    n = dissimilarity.shape[0]
    if m >= n:
        return np.arange(n)
    ac = AgglomerativeClustering(n_clusters=m, metric="precomputed", linkage="complete")
    return ac.fit(dissimilarity).labels_.astype(int)


def rac_group(seed: int, server_round: int, cid: int, groups: list[int]) -> int:
    """RAC (spec 2.3/2.9): a uniformly random group, drawn from a generator keyed on (seed,
    round, client): deterministic per seed, independent of the order of cold starts and of a
    resume."""
    groups = sorted(groups)
    draw = np.random.default_rng([seed, 0x5AC, server_round, cid]).integers(len(groups))
    return groups[int(draw)]


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
    """What the FlexCFL comparisons share: selection, hyper-parameter checks, accounting, the
    ``last_received`` evaluation (where the table has ``eval-model``) and the label-count shift
    test of spec 2.4 (:meth:`detect_shifts`)."""

    # key -> default; every strategy's table in pyproject.toml has exactly these keys
    HPARAMS: ClassVar[dict[str, Any]] = {"clients-per-round": 20, "selection": "paper"}

    def __init__(self, experiment) -> None:
        super().__init__(experiment)
        self.hp = self.checked_hparams(self.HPARAMS)
        self.k = self._int("clients-per-round", 1)
        self.selection = str(self.hp["selection"])
        if self.selection not in SELECTIONS:
            raise ConfigError(f"{self.name}.selection must be one of {', '.join(SELECTIONS)}, "
                              f"got {self.selection!r}")
        self.eval_model = str(self.hp.get("eval-model", "current_group"))
        if self.eval_model not in EVAL_MODELS:
            raise ConfigError(f"{self.name}.eval-model must be one of {', '.join(EVAL_MODELS)}, "
                              f"got {self.eval_model!r}")
        if "shift-metric" in self.HPARAMS:
            self.shift_metric = str(self.hp["shift-metric"])
            if self.shift_metric not in SHIFT_METRICS:
                raise ConfigError(f"{self.name}.shift-metric must be one of "
                                  f"{', '.join(SHIFT_METRICS)}, got {self.shift_metric!r}")
            self.shift_fraction = self._float("shift-threshold", 0.0)
        self.num_scenario_clients = experiment.scenario.num_clients
        self._selected: list[int] = []
        self._comm = {"models_down": 0, "models_up": 0}
        # last_received: client -> snapshot (a registry entry) of the model it last trained from
        self.received: dict[int, int] = {}
        self.snapshots: set[int] = set()
        self.eval_w0_id: int | None = None
        # the shift test: label counts at the client's last (re-)assignment, original sizes
        self.ref_counts: dict[int, np.ndarray] = {}
        self.n_orig: dict[int, int] = {}
        self.last_counts: dict[int, int] = {}

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

    def _bool(self, key: str) -> bool:
        v = self.hp[key]
        if not isinstance(v, bool):
            raise ConfigError(f"{self.name}.{key} must be true or false, got {v!r}")
        return v

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

    def note_sizes(self, cids: list[int] | None = None) -> None:
        """Remember each client's original training-set size (tau of the shift test)."""
        for cid in self.clients if cids is None else cids:
            self.n_orig.setdefault(cid, self.clients[cid].num_examples)

    # -- selection (spec 2.5)
    def select(self) -> list[int]:
        cids = self.training_clients()
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

    # -- the shift test (spec 2.4), shared by flexcfl and the -mig baselines
    def label_counts(self, grid: Grid, cids: list[int]) -> dict[int, np.ndarray]:
        """Current training label counts (``query.histogram``: no model on the wire)."""
        if not cids:
            return {}
        replies = self.query(grid, P.QUERY_HISTOGRAM, cids)
        out = {}
        for cid, r in replies.items():
            counts = np.asarray(r.metrics.get(P.HISTOGRAM, []), dtype=np.int64)
            self.last_counts[cid] = int(counts.sum())
            out[cid] = counts
        return out

    def detect_shifts(self, counts: dict[int, np.ndarray], warm: list[int]) -> list[int]:
        """The warm clients whose counts moved past the threshold since their reference:
        ``shift_distance(metric, counts, ref) > tau`` (tau = fraction x n_orig / C for
        ``scipy_counts``, the fraction for ``tv``). A client without a usable reference gets
        one now and is not shifted."""
        shifted = []
        c_num = self.exp.scenario.num_classes
        for cid in warm:
            now = counts.get(cid)
            if now is None:
                continue
            ref = self.ref_counts.get(cid)
            if ref is None or len(ref) != len(now):
                self.ref_counts[cid] = now
                continue
            tau = shift_threshold(self.shift_metric, self.shift_fraction,
                                  self.n_orig.get(cid, int(ref.sum())), c_num)
            if shift_distance(self.shift_metric, now, ref) > tau:
                shifted.append(cid)
        return shifted

    # -- accounting, and what each client received
    def exchange(self, grid: Grid, kind: str, tasks: dict[int, Task]) -> list[Reply]:
        sent = ({mid: self.models[mid] for t in tasks.values() for mid in t.models}
                if kind == P.TRAIN and self.eval_model == "last_received" else None)
        replies = super().exchange(grid, kind, tasks)
        if kind != P.EVALUATE:
            self._comm["models_down"] += sum(
                len(t.models) for c, t in tasks.items() if self.clients[c].node_id is not None)
            self._comm["models_up"] += sum(len(r.models) for r in replies)
        if sent is not None:
            self._record_received(replies, sent)
        return replies

    def _record_received(self, replies: list[Reply], sent: dict[int, Weights]) -> None:
        """``last_received`` (spec 2.10, 7.13): the model a client trained from, as it was sent
        (before this round's aggregation), kept as a registry entry until no client refers to
        it. A client whose training failed keeps its previous one."""
        snap: dict[int, int] = {}
        for r in replies:
            if len(r.models) != 1:
                continue
            (mid,) = r.models
            if mid not in sent:
                continue
            if mid not in snap:
                snap[mid] = self.new_model(sent[mid])   # the sent arrays: never changed in place
                self.snapshots.add(snap[mid])
            self.received[r.cid] = snap[mid]
        used = set(self.received.values())
        for sid in sorted(self.snapshots - used):
            self.delete_model(sid)
        self.snapshots &= used

    def w0_model_id(self) -> int:
        """w0 (the run's common initial model), what a never-trained client holds."""
        if self.eval_w0_id is None or self.eval_w0_id not in self.models:
            self.eval_w0_id = self.new_model(self.initial_weights())
        return self.eval_w0_id

    def eval_task(self, cid: int) -> Task | None:
        if self.eval_model != "last_received":
            return super().eval_task(cid)
        rec = self.clients[cid]
        if rec.cluster is None or rec.cluster not in self.models:
            return None      # not in a group (yet): not evaluated, as with current_group
        sid = self.received.get(cid)
        return Task(models=[sid if sid in self.models else self.w0_model_id()])

    def global_eval_task(self, cid: int) -> Task | None:
        hidden = self.snapshots | ({self.eval_w0_id} if self.eval_w0_id is not None else set())
        ids = sorted(m for m in self.models if m not in hidden)
        if not ids:
            return None
        return Task(models=ids, config={P.SELECT: "min-loss"} if len(ids) > 1 else {})

    def round_metrics(self) -> dict[str, Any]:
        out = dict(self._comm)   # weighted_accuracy: computed by the base for every strategy
        self._comm = {"models_down": 0, "models_up": 0}
        return out

    def strategy_state(self) -> dict[str, Any]:
        return {
            "received": {str(c): s for c, s in self.received.items()},
            "snapshots": sorted(self.snapshots), "eval_w0_id": self.eval_w0_id,
            "ref_counts": {str(c): v.tolist() for c, v in self.ref_counts.items()},
            "n_orig": {str(c): v for c, v in self.n_orig.items()},
            "last_counts": {str(c): v for c, v in self.last_counts.items()},
        }

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        self.received = {int(c): int(s) for c, s in state.get("received", {}).items()}
        self.snapshots = {int(s) for s in state.get("snapshots", [])}
        self.eval_w0_id = state.get("eval_w0_id")
        self.ref_counts = {int(c): np.asarray(v, np.int64)
                           for c, v in state.get("ref_counts", {}).items()}
        self.n_orig = {int(c): int(v) for c, v in state.get("n_orig", {}).items()}
        self.last_counts = {int(c): int(v) for c, v in state.get("last_counts", {}).items()}


# ------------------------------------------------------------------------------- FlexCFL
class FlexCFL(PaperSelection):
    name = "flexcfl"
    description = ("FlexCFL: EDC group cold start, newcomer cold start, migration on label "
                   "shift, inter-group aggregation (eta-g)")
    MIGRATION = True
    HPARAMS: ClassVar[dict[str, Any]] = {
        "num-groups": 0, "pretrain-scale": 0, "pretrain-iters": 50, "eta-g": 0.0,
        "migration": True, "shift-metric": "scipy_counts", "shift-threshold": 0.2,
        "group-init": "pretrained", "cold-start": "lazy", "measure": "edc", "rcc": False,
        "rac": False, "eval-model": "current_group", **PaperSelection.HPARAMS,
    }

    def __init__(self, experiment) -> None:
        super().__init__(experiment)
        n = self.num_scenario_clients
        self.m = self.num_groups_hp()
        self.rcc = self._bool("rcc")
        self.rac = self._bool("rac")
        self.measure = str(self.hp["measure"]).lower()
        if self.measure not in MEASURES:
            raise ConfigError(f"{self.name}.measure must be one of {', '.join(MEASURES)} (any "
                              f"case), got {self.hp['measure']!r}")
        if self.rcc and self.measure != "edc":
            raise ConfigError(f"{self.name}.measure = {self.hp['measure']!r} has no use with "
                              f"{self.name}.rcc = true (RCC forms no clusters); set one of them")
        alpha = self._int("pretrain-scale", 0)
        if self.rcc:
            self.n_pre = self.m                # RCC: m random pre-trained clients (spec 2.9)
        elif alpha:
            self.n_pre = alpha * self.m
            if self.n_pre > n:
                raise ConfigError(
                    f"{self.name}.pretrain-scale x num-groups (alpha x m = {alpha} x {self.m} = "
                    f"{self.n_pre}) is larger than the number of clients ({n})")
        else:
            self.n_pre = min(20 * self.m, n)   # the paper's alpha = 20, capped at N (spec 2.2)
        if self.rac and self.n_pre >= n:
            log(WARNING, "%s.rac: alpha x m = %d >= N = %d, so there is no newcomer to assign at "
                "random (spec 7.20); only migrants are", self.name, self.n_pre, n)
        self.pretrain_iters = self._int("pretrain-iters", 1)
        self.eta_g = self._float("eta-g", 0.0)
        self.migration = bool(self.hp["migration"]) and self.MIGRATION
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
        self.grouped = False
        self.pre_clients: list[int] = []
        self.pre_labels: list[int] = []
        self.embedding: np.ndarray | None = None        # M_d (edc) or the MADC matrix (madc)
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
        self.note_sizes()

    def on_new_client(self, cid: int) -> None:
        self.note_sizes([cid])   # cold until selected

    def w0_model_id(self) -> int:
        return self.w0_id

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
        """Spec 2.2 (Algorithm 3), once, as a pre-round exchange: EDC + k-means++, or MADC +
        complete-linkage agglomerative clustering (``measure``), or RCC (``rcc``, spec 2.9)."""
        self.grouped = True
        cids = sorted(self.clients)
        rng = np.random.default_rng([self.cfg.seed, 0xF1E7])  # not self.rng: selection uses it
        n_pre = min(self.n_pre, len(cids))
        self.pre_clients = sorted(int(c) for c in rng.choice(cids, size=n_pre, replace=False))
        updates = self._pretrain(grid, self.pre_clients)
        if len(updates) < len(self.pre_clients):
            log(WARNING, "%s: %d of %d pre-training updates left out of the %s", self.name,
                len(self.pre_clients) - len(updates), len(self.pre_clients),
                "random centres" if self.rcc else "SVD")
        if self.rcc:
            # RCC: the j-th drawn client (by id) is group j's centre; no SVD, no clustering
            members_of = {gid: [c] for gid, c in zip(self.group_ids, self.pre_clients)
                          if c in updates}
            self.pre_clients = [c for c in self.pre_clients if c in updates]
            self.pre_labels = [self.group_ids.index(g) for g, ms in members_of.items()
                               for _ in ms]
            self._form_groups(members_of, updates)
            return
        rows = sorted(updates)
        if not rows:
            log(WARNING, "%s: no usable pre-training update; every group starts at w0", self.name)
            return
        mat = np.stack([updates[c][0] for c in rows])
        k = min(self.m, len(rows))
        if self.measure == "madc":
            self.embedding = madc_matrix(cosine_matrix(mat))
            labels = madc_cluster(self.embedding, k)
        else:
            self.embedding = edc_embedding(mat, self.m)
            labels = edc_kmeans(self.embedding, k, self.cfg.seed)
        self.pre_clients, self.pre_labels = rows, [int(x) for x in labels]
        self._form_groups({gid: [c for c, lab in zip(rows, labels) if lab == j]
                           for j, gid in enumerate(self.group_ids)}, updates)

    def _form_groups(self, members_of: dict[int, list[int]],
                     updates: dict[int, tuple[np.ndarray, np.ndarray]]) -> None:
        """Group g: direction = the unweighted mean of its members' updates, model = w0 + it
        (``group-init = "pretrained"``), members warm with their reference counts."""
        w0 = flatten(self.models[self.w0_id])
        for gid in self.group_ids:
            members = members_of.get(gid, [])
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
        log(INFO, "%s: group cold start on %d clients: sizes %s", self.name,
            sum(map(len, members_of.values())), [len(self.members(g)) for g in self.group_ids])

    def nearest_group(self, delta: np.ndarray) -> int | None:
        """argmin_j (1 - cos(dw0_j, delta)) / 2 over the fixed directions; ties: lowest id."""
        if not self.directions:
            return self.group_ids[0] if self.group_ids else None
        dis = {g: (1.0 - cosine(self.directions[g], delta)) / 2.0 for g in sorted(self.directions)}
        return min(dis, key=lambda g: (dis[g], g))

    def choose_group(self, cid: int, delta: np.ndarray) -> int | None:
        """The cold start's choice: the nearest direction, or (RAC) a uniformly random group
        among those with a direction."""
        if self.rac and self.directions:
            return rac_group(self.cfg.seed, self.round, cid, sorted(self.directions))
        return self.nearest_group(delta)

    def cold_start(self, grid: Grid, cids: list[int], why: str, old: dict | None = None) -> None:
        """Spec 2.3: pre-train from w0 on the current data, join the closest initial direction
        (RAC: a random group; the pre-training still runs, as in the authors' code, and gives
        the reference counts)."""
        for cid, (delta, counts) in self._pretrain(grid, cids).items():
            g = self.choose_group(cid, delta)
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
        shifted = self.detect_shifts(self.label_counts(grid, warm), warm)
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
        return super().strategy_state() | {
            "group_ids": self.group_ids, "w0_id": self.w0_id, "grouped": self.grouped,
            "directions": {str(g): _encode(v) for g, v in self.directions.items()},
            "pre_clients": self.pre_clients, "pre_labels": self.pre_labels,
            "totals": self.totals,
        }

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        super().load_strategy_state(state)
        self.group_ids = [int(g) for g in state["group_ids"]]
        self.w0_id = state["w0_id"]
        self.grouped = bool(state["grouped"])
        self.directions = {int(g): _decode(v) for g, v in state["directions"].items()}
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
                                         "eval-model": "current_group", **PaperSelection.HPARAMS}

    def __init__(self, experiment) -> None:
        super().__init__(experiment)
        self.m = self.num_groups_hp()
        self.weighted = bool(self.hp["weighted"])
        if self.hp["init"] not in ("w0", "min-loss"):
            raise ConfigError(f"{self.name}.init must be 'w0' or 'min-loss', got "
                              f"{self.hp['init']!r}")
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

    def assign_clients(self, grid: Grid, cids: list[int]) -> None:
        """FeSEM's rule for ``cids``: the nearest centre to the local solution; with ``init =
        "min-loss"`` a client without one takes the centre of lowest training loss."""
        fresh = set()
        if self.hp["init"] == "min-loss":
            fresh = {c for c in cids if c not in self.local}
            replies = self.query(grid, P.QUERY_LOSSES, fresh, models=self.center_ids) if fresh else {}
            for cid, r in replies.items():
                losses = dict(zip(r.metrics[P.MODEL_IDS], r.metrics[P.LOSSES]))
                self.assign(cid, min(sorted(losses), key=lambda m: losses[m]))
        self.assign_selected([c for c in cids if c not in fresh])

    def before_round(self, grid: Grid, step: int, new_step: bool) -> None:
        self._selected = self.select()
        self.assign_clients(grid, self._selected)

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
        return super().strategy_state() | {
            "center_ids": self.center_ids,
            "local": {str(c): _encode(v) for c, v in self.local.items()}}

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        super().load_strategy_state(state)
        self.center_ids = [int(g) for g in state["center_ids"]]
        self.local = {int(c): _decode(v) for c, v in state["local"].items()}


# ------------------------------------------------------------------------------- baselines
class FlexIFCA(PaperSelection, IFCA):
    name = "flexcfl-ifca"
    description = ("IFCA as in the FlexCFL paper: all m models down, min-loss choice, unweighted "
                   "mean, paper selection")
    HPARAMS: ClassVar[dict[str, Any]] = {"num-groups": 0, "weighted": False,
                                         "eval-model": "current_group", **PaperSelection.HPARAMS}

    def __init__(self, experiment) -> None:
        super().__init__(experiment)
        self.m = self.num_groups_hp()
        self.weighted = bool(self.hp["weighted"])
        self.center_ids: list[int] = []

    def on_start(self) -> None:
        # distinct random models (ids 0..m-1)
        self.center_ids = [self.new_model(self.initial_weights(salt=k)) for k in range(self.m)]
        for cid in self.clients:
            self.assign(cid, self.center_ids[0])

    def num_clusters(self) -> int:
        return len(self.center_ids)

    def before_round(self, grid: Grid, step: int, new_step: bool) -> None:
        self._selected = self.select()

    def plan_train(self, step: int) -> dict[int, Task]:
        return {c: Task(models=list(self.center_ids), config={P.SELECT: "min-loss"})
                for c in self._selected}

    def on_train_replies(self, step: int, replies: list[Reply]) -> None:
        for r in replies:
            self.assign(r.cid, int(r.metrics[P.CHOSEN]))
        for mid, items in self.collect_updates(replies).items():
            self.models[mid] = weighted_average(
                items if self.weighted else [(w, 1.0) for w, _ in items])

    def strategy_state(self) -> dict[str, Any]:
        return super().strategy_state() | {"center_ids": self.center_ids}

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        super().load_strategy_state(state)
        # checkpoints written before center_ids was kept: the m models were ids 0..m-1
        self.center_ids = [int(g) for g in state.get("center_ids", range(self.m))]


# ------------------------------------------------------------------------------- -MIG
class MigrationMixin:
    """IFCA-MIG / FeSEM-MIG (spec 4.3, 6, Fig. 6): the baseline plus section 2.4's check. Every
    round, before training, every warm client (one the method has assigned at least once) sends
    its label counts (``query.histogram``, no model); one whose counts moved past the threshold
    since its reference is re-assigned at once by the method's own rule (:meth:`reassign`), and
    its reference becomes its current counts. The reference is first set when the client is
    first assigned. Reported per round: ``shifted_clients``, ``shift_reassignments`` and
    ``migrations`` (re-assignments that changed the group)."""

    MIG_HPARAMS: ClassVar[dict[str, Any]] = {"shift-metric": "scipy_counts",
                                             "shift-threshold": 0.2}

    def __init__(self, experiment) -> None:
        super().__init__(experiment)  # type: ignore[call-arg]  (the baseline strategy's)
        self._mig_init()

    def on_start(self) -> None:
        super().on_start()  # type: ignore[misc]
        self.note_sizes()

    def on_new_client(self, cid: int) -> None:
        super().on_new_client(cid)  # type: ignore[misc]
        self.note_sizes([cid])

    def _mig_init(self) -> None:
        self.mig_totals = {"shift_reassignments": 0, "migrations": 0}
        self._mig_round = dict.fromkeys(self.mig_totals, 0)
        self._shifted: list[int] = []
        self._counts_now: dict[int, np.ndarray] = {}

    def _mig_count(self, what: str, n: int = 1) -> None:
        self._mig_round[what] += n
        self.mig_totals[what] += n

    def migrate(self, grid: Grid) -> None:
        """The shift test on the warm clients, then :meth:`reassign` of the shifted ones."""
        warm = sorted(c for c in self.ref_counts if c in self.clients)
        cold_selected = [c for c in self._selected if c not in self.ref_counts]
        self._counts_now = self.label_counts(grid, sorted(set(warm) | set(cold_selected)))
        shifted = self.detect_shifts(self._counts_now, warm)
        self._shifted = shifted
        if not shifted:
            return
        old = {c: self.clients[c].cluster for c in shifted}
        done = self.reassign(grid, shifted)
        for c in done:
            self.ref_counts[c] = self._counts_now[c]
        self._mig_count("shift_reassignments", len(done))
        self._mig_count("migrations", sum(1 for c in done if self.clients[c].cluster != old[c]))

    def set_reference(self, cids: list[int]) -> None:
        """A client's first assignment: its current counts become its reference."""
        for c in cids:
            if c not in self.ref_counts and c in self._counts_now:
                self.ref_counts[c] = self._counts_now[c]

    def round_metrics(self) -> dict[str, Any]:
        out = super().round_metrics()
        out.update(self._mig_round)
        out["shifted_clients"] = self._shifted
        self._mig_round = dict.fromkeys(self.mig_totals, 0)
        self._shifted = []
        return out

    def summary_extra(self) -> dict[str, Any]:
        return {f"{k}_total": v for k, v in self.mig_totals.items()}

    def strategy_state(self) -> dict[str, Any]:
        return super().strategy_state() | {"mig_totals": self.mig_totals}

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        super().load_strategy_state(state)
        self.mig_totals = {k: int(v) for k, v in state["mig_totals"].items()}


class FlexIFCAMig(MigrationMixin, FlexIFCA):
    """IFCA-MIG: a shifted warm client (selected or not) receives all m models and takes the one
    of lowest training loss (``query.losses``; ties: the lowest id), as the authors' code re-runs
    IFCA's assignment on every shifted client: m models down per shifted client (spec 2.8)."""

    name = "flexcfl-ifca-mig"
    description = ("IFCA-MIG: flexcfl-ifca plus the label-shift check; a shifted client takes "
                   "the lowest-loss model at once (m models down)")
    HPARAMS: ClassVar[dict[str, Any]] = {**FlexIFCA.HPARAMS, **MigrationMixin.MIG_HPARAMS}

    def before_round(self, grid: Grid, step: int, new_step: bool) -> None:
        self._selected = self.select()
        self.migrate(grid)

    def reassign(self, grid: Grid, cids: list[int]) -> list[int]:
        replies = self.query(grid, P.QUERY_LOSSES, cids, models=list(self.center_ids))
        done = []
        for cid, r in sorted(replies.items()):
            losses = dict(zip((int(m) for m in r.metrics[P.MODEL_IDS]), r.metrics[P.LOSSES]))
            self.assign(cid, min(sorted(losses), key=lambda m: (losses[m], m)))
            done.append(cid)
        return done

    def on_train_replies(self, step: int, replies: list[Reply]) -> None:
        super().on_train_replies(step, replies)
        self.set_reference([r.cid for r in replies])     # assigned by its min-loss choice


class FeSEMMig(MigrationMixin, FeSEM):
    """FeSEM-MIG: a shifted warm client is re-assigned by FeSEM's rule, the centre nearest (L2)
    to its cached last local solution: no message with a model (spec 2.8: 2K per round)."""

    name = "fesem-mig"
    description = ("FeSEM-MIG: fesem plus the label-shift check; a shifted client joins the "
                   "centre nearest to its cached local model at once")
    HPARAMS: ClassVar[dict[str, Any]] = {**FeSEM.HPARAMS, **MigrationMixin.MIG_HPARAMS}

    def before_round(self, grid: Grid, step: int, new_step: bool) -> None:
        self._selected = self.select()
        self.migrate(grid)
        self.assign_clients(grid, self._selected)
        self.set_reference([c for c in self._selected if self.clients[c].cluster is not None])

    def reassign(self, grid: Grid, cids: list[int]) -> list[int]:
        self.assign_clients(grid, cids)
        return [c for c in cids if self.clients[c].cluster is not None]


class FlexFedAvg(PaperSelection):
    name = "flexcfl-fedavg"
    description = "FedAvg on the FlexCFL paper's client selection (its reference baseline)"

    def before_round(self, grid: Grid, step: int, new_step: bool) -> None:
        self._selected = self.select()

    def plan_train(self, step: int) -> dict[int, Task]:
        mids = self.clusters_in_use()
        return {c: Task(models=[self.clients[c].cluster]) for c in self._selected
                if self.clients[c].cluster in mids}

