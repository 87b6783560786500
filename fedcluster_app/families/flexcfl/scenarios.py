"""FlexCFL's data (docs/flexcfl/README.md, "The algorithm" and "The small experiment"): Synthetic(a, b) of
the FedProx line of work, a digits-pairs variant, and the paper's client-level distribution shifts.

Each scenario starts from a fixed set of per-user datasets (user ``u`` = client ``u`` at step 1)
and moves data between clients over time:

* ``swap-all``: at every step from ``drift_step`` (default 2) on, a random permutation pi of the
  clients is drawn and client pi[k] is paired with pi[n-1-k]; each pair exchanges its whole data
  (train and test) with probability ``p`` (docs/flexcfl/README.md, The algorithm: client-level shifts);
* ``swap-part``: the same pairs; a chosen pair (c1, c2) moves every sample of one label a in
  L1 \\ L2 from c1 to c2 and of one label b in L2 \\ L1 from c2 to c1, where Lc are the labels
  present in both the train and the test data of c; ineligible pairs are skipped
  (docs/flexcfl/README.md, D11);
* ``incremental``: each client releases 25 %, 50 %, 75 %, 100 % of its *original* training
  set (a prefix of a fixed per-client order), one more quarter every ``drift_step`` steps
  (default 50); test sets do not change (docs/flexcfl/README.md, D12).

The time steps are the paper's rounds: run these scenarios with ``rounds-per-step = 1`` and
``window = 1`` (the presets do). The swap schedule is precomputed from the data seed and the
step only (``default_rng([data_seed, 0x5A5, step])``), over all clients, so every algorithm sees
the same shifts (docs/flexcfl/README.md, D11).

A client's data at a step is a *holding*: a set of (user, label) blocks (plus the released
fraction for ``incremental``). Every distinct holding is a concept id; ``concept(k, t)`` is
therefore the identity of the data client k holds, not a cluster (Synthetic has no ground-truth
clusters). The realisation returns a client-specific number of samples (the holding's size),
whatever ``samples_per_step`` asks; ``samples_per_step`` > 0 instead caps every user's dataset
at that many samples (an optional cap for time) and ``test_samples`` is unused.

``drift_pattern`` overrides a scenario's shift: ``none``, ``swap-all``, ``swap-part`` or
``incremental``, with an optional probability ``@p`` for the swaps (``swap-all@0.1``); a
probability outside [0, 1] is rejected.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedcluster_app.core.data.scenarios import Scenario, ScenarioSpec

__all__ = [
    "SHIFT_KINDS",
    "ShiftSpec",
    "parse_shift",
    "swap_pairs",
    "synthetic_users",
    "digits_pair_users",
    "holdings_schedule",
]

SHIFT_KINDS = ("none", "swap-all", "swap-part", "incremental")
DEFAULT_SWAP_P = 0.05
INCREMENTAL_EVERY = 50          # releases at rounds 0 / 50 / 100 / 150
TAG_SHIFT = 0x5A5
TAG_INCREMENTAL = 0x1AC


@dataclass(frozen=True)
class UserData:
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


@dataclass(frozen=True)
class ShiftSpec:
    kind: str = "none"
    p: float = DEFAULT_SWAP_P
    start: int = 2               # first step a swap may happen (step 1 = the original data)
    every: int = INCREMENTAL_EVERY

    def __post_init__(self) -> None:
        if self.kind not in SHIFT_KINDS:
            raise ValueError(f"unknown shift {self.kind!r}; valid: {', '.join(SHIFT_KINDS)}")
        if not (isinstance(self.p, (int, float)) and math.isfinite(self.p) and 0.0 <= self.p <= 1.0):
            raise ValueError(f"swap probability must be in [0, 1], got {self.p!r}")
        if self.start < 1 or self.every < 1:
            raise ValueError(f"shift start and incremental interval must be >= 1, got "
                             f"{self.start}, {self.every}")


def parse_shift(text: str, default: ShiftSpec) -> ShiftSpec:
    """``drift_pattern`` of these scenarios: "" (the scenario's own), a kind, or ``kind@p``."""
    text = str(text).strip().lower()
    if not text:
        return default
    kind, _, prob = text.partition("@")
    if kind not in SHIFT_KINDS:
        raise ValueError(f"unknown drift_pattern {text!r} for a FlexCFL scenario; valid: "
                         f"{', '.join(SHIFT_KINDS)}, optionally with a swap probability "
                         f"(e.g. swap-all@0.1)")
    p = default.p
    if prob:
        try:
            p = float(prob)
        except ValueError:
            raise ValueError(f"swap probability in drift_pattern {text!r} is not a number"
                             ) from None
        if not (math.isfinite(p) and 0.0 <= p <= 1.0):
            raise ValueError(f"swap probability in drift_pattern {text!r} must be in [0, 1], "
                             f"got {p}")
    return ShiftSpec(kind, p, default.start, default.every)


# ------------------------------------------------------------------------------- generators

def _softmax_argmax(logits: np.ndarray) -> np.ndarray:
    # argmax(softmax(z)) = argmax(z); kept explicit to mirror the generator's definition
    z = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    return np.argmax(p, axis=1)


def synthetic_users(alpha: float, beta: float, num_users: int, seed: int, cap: int = 0
                    ) -> list[UserData]:
    """Synthetic(alpha, beta) exactly as docs/flexcfl/README.md (The algorithm: Synthetic; D17): FedProx's
    ``generate_synthetic.py``, non-IID.

    One ``np.random.RandomState(seed)`` consumed in the original order: all sizes, all u_k,
    all B_k, the v_k per user, then per user W_k, b_k and x; then per user a shuffle and the
    90/10 split. ``cap`` > 0 keeps the first ``cap`` shuffled samples of each user.
    """
    dim, num_class = 60, 10
    rs = np.random.RandomState(seed)
    sizes = rs.lognormal(4, 2, num_users).astype(int) + 50
    mean_w = rs.normal(0, alpha, num_users)
    mean_b = mean_w
    big_b = rs.normal(0, beta, num_users)
    cov_x = np.diag(np.power(np.arange(1, dim + 1, dtype=np.float64), -1.2))
    mean_x = np.stack([rs.normal(big_b[i], 1, dim) for i in range(num_users)])
    users = []
    raw = []
    for i in range(num_users):
        w = rs.normal(mean_w[i], 1, (dim, num_class))
        b = rs.normal(mean_b[i], 1, num_class)
        xx = rs.multivariate_normal(mean_x[i], cov_x, int(sizes[i]))
        yy = _softmax_argmax(xx @ w + b)
        raw.append((xx, yy))
    for xx, yy in raw:
        order = rs.permutation(len(yy))
        if cap:
            order = order[:cap]
        xx, yy = xx[order], yy[order]
        n_train = int(0.9 * len(yy))
        users.append(UserData(xx[:n_train].astype(np.float32), yy[:n_train].astype(np.int64),
                              xx[n_train:].astype(np.float32), yy[n_train:].astype(np.int64)))
    return users


def digits_pair_users(num_users: int, seed: int, cap: int = 0) -> list[UserData]:
    """``digits-pairs`` (docs/flexcfl/README.md, Scenarios): scikit-learn's 8x8 digits (64 features / 16);
    user u owns classes u mod 10 and (u + 1) mod 10; each class pool is split evenly among the
    users holding it; 80/20 split."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (np.asarray(d.data, dtype=np.float64) / 16.0).astype(np.float32)
    y = np.asarray(d.target, dtype=np.int64)
    rng = np.random.default_rng([seed, 0xD161])
    holders = {c: [u for u in range(num_users) if c in (u % 10, (u + 1) % 10)] for c in range(10)}
    parts: dict[int, list[np.ndarray]] = {u: [] for u in range(num_users)}
    for c in range(10):
        pool = rng.permutation(np.flatnonzero(y == c))
        if holders[c]:
            for u, chunk in zip(holders[c], np.array_split(pool, len(holders[c]))):
                parts[u].append(chunk)
    users = []
    for u in range(num_users):
        idx = rng.permutation(np.concatenate(parts[u])) if parts[u] else np.zeros(0, np.int64)
        if cap:
            idx = idx[:cap]
        n_train = int(0.8 * len(idx))
        users.append(UserData(x[idx[:n_train]], y[idx[:n_train]], x[idx[n_train:]],
                              y[idx[n_train:]]))
    return users


# ------------------------------------------------------------------------------- the shifts

Holding = tuple  # ((user, label), ...) sorted, plus ("frac", f) for incremental


def swap_pairs(num_clients: int, rng: np.random.Generator) -> list[tuple[int, int]]:
    """pi[k] with pi[n-1-k], k < n // 2 (docs/flexcfl/README.md, The algorithm: client-level shifts)."""
    perm = rng.permutation(num_clients)
    return [(int(perm[k]), int(perm[num_clients - 1 - k])) for k in range(num_clients // 2)]


def _labels_in(users: list[UserData], blocks: frozenset, train: bool) -> set[int]:
    out = set()
    for u, lab in blocks:
        y = users[u].y_train if train else users[u].y_test
        if np.any(y == lab):
            out.add(lab)
    return out


def holdings_schedule(users: list[UserData], num_steps: int, shift: ShiftSpec, seed: int
                      ) -> tuple[np.ndarray, list[Holding], int]:
    """(concept matrix steps x clients, holding of every concept id, number of swap events)."""
    n = len(users)
    blocks = [frozenset((u, int(lab)) for lab in np.unique(np.concatenate(
        [users[u].y_train, users[u].y_test]))) for u in range(n)]
    ids: dict[Holding, int] = {}
    holdings: list[Holding] = []

    def intern(h: Holding) -> int:
        if h not in ids:
            ids[h] = len(holdings)
            holdings.append(h)
        return ids[h]

    def frac_at(step: int) -> float:
        if shift.kind != "incremental":
            return 1.0
        return min(1.0, 0.25 * (1 + (step - 1) // shift.every))

    matrix = np.zeros((num_steps, n), dtype=np.int64)
    events = 0
    for step in range(1, num_steps + 1):
        if step >= shift.start and shift.kind in ("swap-all", "swap-part") and n >= 2:
            rng = np.random.default_rng([seed, TAG_SHIFT, step])
            for c1, c2 in swap_pairs(n, rng):
                if rng.random() >= shift.p:
                    continue
                if shift.kind == "swap-all":
                    blocks[c1], blocks[c2] = blocks[c2], blocks[c1]
                    events += 1
                    continue
                l1 = _labels_in(users, blocks[c1], True) & _labels_in(users, blocks[c1], False)
                l2 = _labels_in(users, blocks[c2], True) & _labels_in(users, blocks[c2], False)
                d1, d2 = sorted(l1 - l2), sorted(l2 - l1)
                if not d1 or not d2:
                    continue  # ineligible pair: skipped, the others still swap (D11)
                a, b = int(rng.choice(d1)), int(rng.choice(d2))
                move_a = {blk for blk in blocks[c1] if blk[1] == a}
                move_b = {blk for blk in blocks[c2] if blk[1] == b}
                blocks[c1] = frozenset((blocks[c1] - move_a) | move_b)
                blocks[c2] = frozenset((blocks[c2] - move_b) | move_a)
                events += 1
        f = frac_at(step)
        for c in range(n):
            matrix[step - 1, c] = intern((tuple(sorted(blocks[c])), f))
    return matrix, holdings, events


class HoldingRealisation:
    """concept id -> the data of that holding (a client-specific number of samples)."""

    def __init__(self, users: list[UserData], holdings: list[Holding], num_classes: int,
                 seed: int) -> None:
        self.users = users
        self.holdings = holdings
        self.num_classes = num_classes
        # incremental release order: a fixed random order of each user's training set
        self.orders = [np.random.default_rng([seed, TAG_INCREMENTAL, u]).permutation(
            len(users[u].y_train)) for u in range(len(users))]

    def sample(self, concept: int, n: int, rng: np.random.Generator, *, client: int,
               train: bool) -> tuple[np.ndarray, np.ndarray]:
        blocks, frac = self.holdings[concept]
        xs, ys = [], []
        for u, lab in blocks:
            d = self.users[u]
            if train:
                order = self.orders[u]
                if frac < 1.0:
                    order = np.sort(order[: int(math.ceil(frac * len(order)))])
                else:
                    order = np.arange(len(order))
                x, y = d.x_train[order], d.y_train[order]
            else:
                x, y = d.x_test, d.y_test
            keep = y == lab
            xs.append(x[keep])
            ys.append(y[keep])
        dim = self.users[0].x_train.shape[1]
        if not xs:
            return np.zeros((0, dim), np.float32), np.zeros(0, np.int64)
        return np.concatenate(xs), np.concatenate(ys)


# ------------------------------------------------------------------------------- scenarios

def _int_arg(key: str, value: object) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{key} must be an integer >= 0 (0 = the scenario's default), got "
                         f"{value!r}")
    return value


def holdings_scenario(name: str, description: str, data: str, own_shift: str, clients: int,
                      steps: int, *, seed=0, num_clients=0, num_steps=0, samples_per_step=0,
                      test_samples=0, schedule="", drift_pattern="", drift_step=0,
                      dirichlet_alpha=0.0, data_dir="") -> Scenario:
    """The scenario ``name`` of ``catalogue.py``: users of ``data`` (synthetic | digits),
    ``clients`` and ``steps`` by default, under ``own_shift`` (a ``drift_pattern``) unless the
    build arguments give another."""
    spec = ScenarioSpec(   # the arguments as given
        name=name, seed=seed, num_clients=num_clients, num_steps=num_steps,
        samples_per_step=samples_per_step, test_samples=test_samples, schedule=schedule,
        drift_pattern=drift_pattern, drift_step=drift_step, dirichlet_alpha=dirichlet_alpha,
        data_dir=data_dir)
    seed = _int_arg("seed", seed)
    n = _int_arg("num_clients", num_clients) or clients
    t = _int_arg("num_steps", num_steps) or steps
    cap = _int_arg("samples_per_step", samples_per_step)
    ds = _int_arg("drift_step", drift_step)
    if schedule:
        raise ValueError(f"scenario {name} has its own shift schedule; a .cp schedule does "
                         f"not apply (use drift-pattern = {', '.join(SHIFT_KINDS)})")
    if n < 2:
        raise ValueError(f"scenario {name} needs at least 2 clients, got {n}")
    default_shift = parse_shift(own_shift, ShiftSpec())
    base = default_shift
    if ds:
        base = (ShiftSpec(base.kind, base.p, base.start, ds) if base.kind == "incremental"
                else ShiftSpec(base.kind, base.p, ds, base.every))
    shift = parse_shift(str(drift_pattern), base)
    if ds and shift.kind == "incremental" and shift.every != ds:
        shift = ShiftSpec(shift.kind, shift.p, shift.start, ds)
    if data == "synthetic":
        users = synthetic_users(1.0, 1.0, n, seed, cap)
        dim = 60
    else:
        users = digits_pair_users(n, seed, cap)
        dim = 64
    matrix, holdings, events = holdings_schedule(users, t, shift, seed)
    labels = [f"holding {i}" for i in range(len(holdings))]

    def factory(users=users, holdings=holdings):
        return HoldingRealisation(users, holdings, 10, seed)

    desc = description
    if shift != default_shift:
        desc += f" [shift {shift.kind}, p={shift.p:g}]"
    scen = Scenario(
        name=name, description=desc, matrix=matrix, realisation_factory=factory,
        num_classes=10, input_shape=(dim,), model="mlp", hidden=0, data_seed=seed,
        samples_per_step=cap, test_samples=0, drift_pattern=shift.kind,
        drift_step=shift.start if shift.kind in ("swap-all", "swap-part") else 0,
        dirichlet_alpha=math.inf, concept_labels=labels, spec=spec)
    scen.shift = shift            # type: ignore[attr-defined]
    scen.swap_events = events     # type: ignore[attr-defined]
    scen.user_sizes = [len(u.y_train) for u in users]  # type: ignore[attr-defined]
    return scen
