"""Client side of FedCCFA and its decoupled/adaptive baselines (docs/fedccfa/README.md, "One round of
``fedccfa``" and "Baselines").

Message kinds:

* ``train.fedccfa``: the server sends the global model (extractor theta(t) + the fixed initial
  classifier phi(0)) and, in the config, the results of the client's previous participation
  (the cluster-mean classifier rows and anchors of the classes where it sat in a cluster of >= 2
  clients). The client applies them to its personal state, then runs the five client steps in
  the order of docs/fedccfa/README.md, "One round of ``fedccfa``" (``ccfa-algo = fedccfa``) or a
  baseline's local training (``fedrep``, ``fedbabu``, ``flash``). It returns the model (trained
  extractor + phi(0) unchanged) under the id it was sent, and, for FedCCFA, one extra record
  ``model.-2`` = [balanced W, balanced b, personal W, personal b, local anchors (C x d), anchor
  mask (C,)], which the strategy takes out of the reply and validates on its own (a bad record
  rejects only that client's rows).
* ``query.fedccfa_eval``: the same pending results are applied; the client is tested with the
  global extractor + its personal classifier (FedCCFA, FedRep), after fine-tuning (FedBABU), or
  with the model sent (Flash). Replies ``accuracy`` (its own test split of the current step: the
  paper's personalised accuracy; another step's with ``test-step``, e.g. the next one under
  ``score-next-step``, the fine-tuning of FedBABU still on the current step) and
  ``gen-accuracy`` (the entire test pool relabelled with the client's current concept: the
  paper's generalised accuracy; only when scored on the current step's test split), and with
  ``balanced-test`` ``balanced-accuracy``: the same model on the class-balanced test sample of
  the step it is scored on (``StreamClient.balanced_data``).

Persistent memory lives in ``context.state`` only (it survives between rounds, also when the
client is not sampled, in simulation and deployment): the personal classifier, the anchor set,
the round of the last training (so stale server results are never applied twice over newer
training) and Flash's previous validation loss. No optimiser state is kept: every phase gets a
fresh optimiser.

Every phase trains with the run's shared recipe (``client.train_config``: optimizer, momentum,
weight decay, batch size, drop-last), as every strategy's client does; the extractor (the whole
model for Flash) also with its learning rate and local steps or epochs. Only what the papers
define beyond it comes from the family's hyper-parameters (``params.py``): the classifier
phases' learning rates and epochs, FedBABU's fine-tuning and Flash's early stopping.
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from flwr.app import MetricRecord
from torch import nn
from torch.nn import functional as F

from fedcluster_app.core import codec
from fedcluster_app.core import wire as P
from fedcluster_app.core.config import TrainConfig
from fedcluster_app.core.models import (
    get_weights,
    split_model,
)
from fedcluster_app.core.client.handlers import counts_steps
from fedcluster_app.core.client.stream_client import StreamClient
from fedcluster_app.core.training import (
    as_tensor,
    batch_indices,
    device_of,
    make_optimizer,
)
from fedcluster_app.core.training import evaluate as evaluate_model
from fedcluster_app.families.fedccfa.params import FamilyParams, FlashParams
from fedcluster_app.families.fedccfa.wire import (
    ALIGNED,
    ENTROPY,
    EPOCHS_RUN,
    EVAL_KIND,
    EXTRA,
    GEN_ACCURACY,
    LAMBDA,
    NEWCOMER,
    PENDING_ANCHOR_CLASSES,
    PENDING_ANCHORS,
    PENDING_CLASSES,
    PENDING_ROUND,
    PENDING_ROWS,
    PERSONAL_AGE,
    TRAIN_KIND,
    read_params,
)

STATE_CLASSIFIER = "fedccfa.personal-classifier"   # ArrayRecord [W (C x d), b (C,)]
STATE_ANCHORS = "fedccfa.anchors"                  # ArrayRecord [A (C x d), mask (C,)]
STATE_META = "fedccfa.meta"                        # MetricRecord: trained-round, personal-age, ...


# ------------------------------------------------------------------------------- helpers
def _optimizer(params, cfg: TrainConfig, lr: float) -> torch.optim.Optimizer:
    """The shared recipe's optimizer at a phase's learning rate."""
    return make_optimizer(list(params), dataclasses.replace(cfg, lr=float(lr)))


def _freeze(module: nn.Module, frozen: bool) -> None:
    for p in module.parameters():
        p.requires_grad_(not frozen)


def _epochs(n: int, cfg: TrainConfig, epochs: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Whole shuffled epochs of the shared batch size: the length of a phase the papers give
    in epochs of their own (the classifier's, FedBABU's fine-tuning)."""
    return batch_indices(n, dataclasses.replace(cfg, local_steps=0, local_epochs=int(epochs)), rng)


def _train_head(head: nn.Linear, z: torch.Tensor, y: torch.Tensor, batches: list[np.ndarray],
                lr: float, cfg: TrainConfig) -> float:
    """Train only the classifier on fixed features ``z`` (the extractor is frozen)."""
    opt = _optimizer(head.parameters(), cfg, lr)
    total = 0.0
    for idx in batches:
        i = torch.from_numpy(np.asarray(idx)).to(z.device)
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(head(z[i]), y[i])
        loss.backward()
        opt.step()
        total += float(loss.detach())
    return total / max(1, len(batches))


def alignment_loss(z: torch.Tensor, y: torch.Tensor, anchors: torch.Tensor, tau: float
                   ) -> torch.Tensor:
    """Eq. 8: cross-entropy of cos(z, A_i)/tau over the C anchors (anchors are constants)."""
    sims = F.cosine_similarity(z[:, None, :], anchors[None, :, :], dim=2) / tau
    return F.cross_entropy(sims, y)


# ------------------------------------------------------------------------------- state
def _meta(client: StreamClient) -> MetricRecord:
    if STATE_META not in client.state.metric_records:
        client.state[STATE_META] = MetricRecord({"trained-round": -1, "personal-age": 0})
    return client.state.metric_records[STATE_META]


def personal_classifier(client: StreamClient) -> list[np.ndarray] | None:
    if STATE_CLASSIFIER in client.state.array_records:
        return codec.unpack_arrays(client.state.array_records[STATE_CLASSIFIER])
    return None


def anchors(client: StreamClient, num_classes: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    if STATE_ANCHORS in client.state.array_records:
        a, m = codec.unpack_arrays(client.state.array_records[STATE_ANCHORS])
        return a.copy(), m.copy()
    return np.zeros((num_classes, dim), np.float32), np.zeros(num_classes, np.float32)


def apply_pending(client: StreamClient, config: dict) -> bool:
    """Apply the server's cluster results of this client's last training (idempotent: they are
    replacement values). Results of an older training than the client's latest are ignored."""
    if PENDING_ROUND not in config:
        return False
    meta = _meta(client)
    if int(config[PENDING_ROUND]) != int(meta["trained-round"]):
        return False
    clf = personal_classifier(client)
    if clf is not None and PENDING_CLASSES in config:
        w, b = (a.copy() for a in clf)
        classes = [int(c) for c in config[PENDING_CLASSES]]
        rows = np.asarray(config[PENDING_ROWS], np.float32).reshape(len(classes), w.shape[1] + 1)
        for c, row in zip(classes, rows):
            w[c], b[c] = row[:-1], row[-1]
        client.state[STATE_CLASSIFIER] = codec.pack_arrays([w, b])
    if PENDING_ANCHOR_CLASSES in config and clf is not None:
        a, m = anchors(client, clf[0].shape[0], clf[0].shape[1])
        classes = [int(c) for c in config[PENDING_ANCHOR_CLASSES]]
        vals = np.asarray(config[PENDING_ANCHORS], np.float32).reshape(len(classes), a.shape[1])
        for c, v in zip(classes, vals):
            a[c], m[c] = v, 1.0
        client.state[STATE_ANCHORS] = codec.pack_arrays([a, m])
    return True


# ------------------------------------------------------------------------------- training
def _begin(client: StreamClient, config: dict, models: dict[int, list[np.ndarray]], kind: str
           ) -> tuple[int, list[np.ndarray], str, FamilyParams]:
    """What every FedCCFA-family message starts with: its one model, the algorithm and its
    hyper-parameters, and the server's pending results of the client's last training applied
    to its personal state."""
    if len(models) != 1:
        raise ValueError(f"{kind} needs exactly one model, got {sorted(models)}")
    (mid, weights), = models.items()
    algo, p = read_params(config)
    apply_pending(client, config)
    return mid, weights, algo, p


def train(client: StreamClient, config: dict, models: dict[int, list[np.ndarray]]):
    mid, weights, algo, p = _begin(client, config, models, TRAIN_KIND)
    rnd = int(config[P.ROUND])
    x, y = client.train_data(int(config[P.STEP]))
    if len(y) == 0:
        raise ValueError("no training data")
    model = client.fresh_model(0, weights)
    model.train()
    rng = client.rng(rnd, 7_000 + mid)
    xt, yt = as_tensor(x, device=client.device), as_tensor(y, np.int64, client.device)
    cfg = client.train_config(config)
    metrics: dict[str, Any] = {P.NUM_EXAMPLES: int(len(y))}
    extra = None
    if algo in ("fedccfa", "fedrep"):
        features, head = split_model(model)
        extra = _train_decoupled(client, p, cfg, algo, features, head, xt, yt, rng, rnd, metrics)
    elif algo == "fedbabu":
        features, head = split_model(model)
        _freeze(head, True)
        metrics[P.TRAIN_LOSS] = _train_full(model, features.parameters(), xt, yt,
                                            batch_indices(len(yt), cfg, rng), cfg.lr, cfg)
        _freeze(head, False)
    elif algo == "flash":
        metrics.update(_train_flash(client, config, p, cfg, model, xt, yt, rng))
    return metrics, {mid: get_weights(model)}, {}, ({EXTRA: extra} if extra is not None else {})


def _train_full(model, params, xt, yt, batches: list[np.ndarray], lr: float, cfg: TrainConfig
                ) -> float:
    opt = _optimizer([w for w in params if w.requires_grad], cfg, lr)
    total = 0.0
    for idx in batches:
        i = torch.from_numpy(idx).to(xt.device)
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(xt[i]), yt[i])
        loss.backward()
        opt.step()
        total += float(loss.detach())
    return total / max(1, len(batches))


def _train_decoupled(client, p, cfg: TrainConfig, algo, features, head, xt, yt, rng, rnd,
                     metrics) -> list[np.ndarray] | None:
    C = head.out_features
    phi0 = [head.weight.detach().clone(), head.bias.detach().clone()]
    y_np = yt.cpu().numpy()
    counts = np.bincount(y_np, minlength=C)
    _freeze(features, True)
    with torch.no_grad():
        z_all = features(xt)
    bal = None
    # 1. balanced classifier (clustering input): phi(0) + s steps on m samples of every class
    if algo == "fedccfa":
        present = np.flatnonzero(counts > 0)
        m = int(min(p.bal_per_class, counts[present].min()))
        idx = np.concatenate([rng.choice(np.flatnonzero(y_np == c), size=m, replace=False)
                              for c in present])
        _train_head(head, z_all, yt, [idx] * p.bal_steps, p.bal_lr, cfg)
        bal = [head.weight.detach().cpu().numpy().copy(), head.bias.detach().cpu().numpy().copy()]
    # 2. personal classifier: the stored one, else the balanced one (FedRep: phi(0)), 1 epoch
    meta = _meta(client)
    stored = personal_classifier(client)
    with torch.no_grad():
        if stored is not None:
            head.weight.copy_(torch.from_numpy(stored[0]))
            head.bias.copy_(torch.from_numpy(stored[1]))
            age = int(meta["personal-age"]) + 1
        else:
            if bal is None:
                head.weight.copy_(phi0[0])
                head.bias.copy_(phi0[1])
            age = 1
    _train_head(head, z_all, yt, _epochs(len(yt), cfg, p.clf_epochs, rng), p.clf_lr, cfg)
    # 3. entropy weight
    entropy = float(-(lambda p: (p * np.log(p)).sum())(counts[counts > 0] / counts.sum()))
    if algo == "fedccfa":
        lam = entropy / p.gamma if p.weight_mode == "entropy" else p.fixed_weight
    else:
        lam = 0.0
    # 4. extractor: CE + lambda * alignment to the held anchors, classifier frozen
    _freeze(features, False)
    _freeze(head, True)
    d = head.in_features
    a_held, a_mask = anchors(client, C, d)
    align = (algo == "fedccfa" and lam > 0 and rnd - 1 >= p.align_start
             and bool(a_mask.all()))
    a_t = torch.from_numpy(a_held).to(xt.device) if align else None
    opt = _optimizer(features.parameters(), cfg, cfg.lr)
    total, batches = 0.0, batch_indices(len(yt), cfg, rng)
    for idx in batches:
        i = torch.from_numpy(idx).to(xt.device)
        opt.zero_grad(set_to_none=True)
        z = features(xt[i])
        loss = F.cross_entropy(head(z), yt[i])
        if align:
            loss = loss + lam * alignment_loss(z, yt[i], a_t, p.tau)
        loss.backward()
        opt.step()
        total += float(loss.detach())
    _freeze(head, False)
    personal = [head.weight.detach().cpu().numpy().copy(),
                head.bias.detach().cpu().numpy().copy()]
    # 5. local anchors with the new extractor over all local samples
    with torch.no_grad():
        z_new = features(xt).cpu().numpy()
    local = np.zeros((C, d), np.float32)
    mask = (counts > 0).astype(np.float32)
    for c in np.flatnonzero(counts > 0):
        local[c] = z_new[y_np == c].mean(axis=0)
    # the model goes back with phi(0) as its classifier: the server's classifier never changes
    with torch.no_grad():
        head.weight.copy_(phi0[0])
        head.bias.copy_(phi0[1])
    # state: personal classifier, own anchors for present classes (absent keep their last one)
    client.state[STATE_CLASSIFIER] = codec.pack_arrays(personal)
    a_held[mask > 0] = local[mask > 0]
    client.state[STATE_ANCHORS] = codec.pack_arrays([a_held, np.maximum(a_mask, mask)])
    meta["trained-round"] = rnd
    meta["personal-age"] = age
    metrics.update({P.TRAIN_LOSS: total / max(1, len(batches)), ENTROPY: entropy, LAMBDA: lam,
                    ALIGNED: int(align), PERSONAL_AGE: age})
    if algo != "fedccfa":
        return None
    return [bal[0], bal[1], personal[0], personal[1], local, mask]


def _flash_passes(n: int, cfg: TrainConfig, rng: np.random.Generator) -> list[list[np.ndarray]]:
    """Flash's training passes, each followed by its validation check: the shared
    ``local-epochs`` whole epochs, or ``local-steps`` steps cut into passes of an epoch's
    number of batches."""
    if cfg.local_steps == 0:
        return [_epochs(n, cfg, 1, rng) for _ in range(cfg.local_epochs)]
    steps, per_pass = batch_indices(n, cfg, rng), -(-n // cfg.batch_size)
    return [steps[i:i + per_pass] for i in range(0, len(steps), per_pass)]


def _train_flash(client, config, p: FlashParams, cfg: TrainConfig, model, xt, yt, rng
                 ) -> dict[str, Any]:
    """Flash client: up to E passes (the shared local epochs, or local steps in passes of an
    epoch's length), early stop when 0 < prev - loss < threshold/(pass+1), with the validation
    loss on the client's test split of the step; prev persists across rounds."""
    xv, yv = client.test_data(int(config[P.STEP]))
    meta = _meta(client)
    prev = float(meta.get("flash-prev-loss", float("inf")))
    thr = p.threshold
    loss = 0.0
    run = 0
    for e, batches in enumerate(_flash_passes(len(yt), cfg, rng)):
        _train_full(model, model.parameters(), xt, yt, batches, cfg.lr, cfg)
        run += 1
        val, _ = evaluate_model(model, xv, yv)
        model.train()
        gap = prev - val
        prev, loss = val, val
        if 0 < gap < thr / (e + 1):
            break
    meta["flash-prev-loss"] = float(prev) if np.isfinite(prev) else 1e9
    return {P.TRAIN_LOSS: float(loss), EPOCHS_RUN: run}


# ------------------------------------------------------------------------------- evaluation
@lru_cache(maxsize=16)
def general_test_set(scenario, concept: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The whole test pool relabelled (and transformed) as ``concept`` says, or None where the
    scenario has no test pool (tabular, mixtures)."""
    real = scenario.realisation
    pool = getattr(getattr(real, "source", None), "test_pool", None)
    if pool is None:
        return None
    c = real.concepts[concept]
    x = pool.get(np.arange(len(pool)), getattr(c, "angle", 0.0))
    noise = float(getattr(c, "noise_std", 0.0))
    if noise > 0:
        rng = np.random.default_rng([scenario.data_seed, concept, 0, 99])
        x = np.clip(x + rng.normal(0.0, noise, size=x.shape).astype(np.float32), 0.0, 1.0)
    y = pool.labels if c.perm is None else np.asarray(c.perm, np.int64)[pool.labels]
    return np.ascontiguousarray(x, np.float32), np.asarray(y, np.int64)


@torch.no_grad()
def _accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    if len(y) == 0:
        return float("nan"), float("nan")
    model.eval()
    dev = device_of(model)
    logits = torch.cat([model(as_tensor(x[i:i + 2048], device=dev)) for i in range(0, len(y), 2048)])
    yt = as_tensor(y, np.int64, dev)
    return float(F.cross_entropy(logits, yt)), float((logits.argmax(1) == yt).float().mean())


def _newcomer_classifier(client: StreamClient, config: dict, p: FamilyParams, model: nn.Module,
                         step: int) -> None:
    """A held-out client's personal classifier (it never trains, so it has none): the server's
    phi(0) trained on its adaptation split for ``newcomer-epochs``, the extractor frozen, as
    FedRep's new clients learn their head; used for this evaluation, never stored."""
    features, head = split_model(model)
    x, y = client.train_data(step)
    if len(y) == 0:
        return
    cfg = client.train_config(config)
    xt, yt = as_tensor(x, device=client.device), as_tensor(y, np.int64, client.device)
    with torch.no_grad():
        z = features(xt)
    batches = _epochs(len(yt), cfg, p.newcomer_epochs, client.rng(int(config[P.ROUND]), 8_001))
    _train_head(head, z, yt, batches, p.clf_lr, cfg)


def evaluate(client: StreamClient, config: dict, models: dict[int, list[np.ndarray]]):
    _, weights, algo, p = _begin(client, config, models, EVAL_KIND)
    step = int(config[P.STEP])
    model = client.fresh_model(0, weights)
    if algo in ("fedccfa", "fedrep"):
        _, head = split_model(model)
        clf = personal_classifier(client)
        if clf is not None:
            with torch.no_grad():
                head.weight.copy_(torch.from_numpy(clf[0]))
                head.bias.copy_(torch.from_numpy(clf[1]))
        elif config.get(NEWCOMER):
            _newcomer_classifier(client, config, p, model, step)
    elif algo == "fedbabu" and p.ft_epochs > 0:
        x, y = client.train_data(step)
        rng = client.rng(int(config[P.ROUND]), 8_000)
        cfg = client.train_config(config)
        model.train()
        _train_full(model, model.parameters(), as_tensor(x, device=client.device),
                    as_tensor(y, np.int64, client.device), _epochs(len(y), cfg, p.ft_epochs, rng),
                    p.ft_lr, cfg)
    x, y = client.eval_data(config)   # the current step's test split, or test-step / test-split
    loss, acc = _accuracy(model, x, y)
    metrics: dict[str, Any] = {P.LOSS: loss, P.NUM_EXAMPLES: int(len(y)), P.ACCURACY: acc}
    if (balanced := client.balanced_data(config)) is not None:   # the same personalised model
        metrics[P.BALANCED_ACCURACY] = _accuracy(model, *balanced)[1]
    scored_now = (int(config.get(P.TEST_STEP, step)) == step
                  and config.get(P.TEST_SPLIT, "test") == "test")
    gen = general_test_set(client.exp.scenario, client.concept(step)) if scored_now else None
    if gen is not None:   # the paper's generalised accuracy: of the current step only
        metrics[GEN_ACCURACY] = _accuracy(model, *gen)[1]
    return metrics, {}, {}


# the family steps its own optimizers (every phase; FedBABU fine-tunes before it scores): the
# replies say how many steps they took
HANDLERS = {TRAIN_KIND: counts_steps(train), EVAL_KIND: counts_steps(evaluate)}
