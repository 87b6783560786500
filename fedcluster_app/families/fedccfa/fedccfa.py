"""FedCCFA and the personalised baselines it is compared with: FedRep, FedBABU, Flash.

FedCCFA: "Classifier Clustering and Feature Alignment for Federated Learning under Distributed
Concept Drift", Chen, Xue, Wang, Liu, Huang, NeurIPS 2024, https://arxiv.org/abs/2410.18478.
FedRep: "Exploiting Shared Representations for Personalized Federated Learning", Collins et
al., ICML 2021, https://arxiv.org/abs/2102.07078. FedBABU: "FedBABU: Toward Enhanced
Representation for Federated Image Classification", Oh, Kim, Yun, ICLR 2022,
https://arxiv.org/abs/2106.06042. Flash: "Flash: Concept Drift Adaptation in Federated
Learning", Panchal et al., ICML 2023, https://proceedings.mlr.press/v202/panchal23a.html.

Every client keeps a personal classifier phi_k (and, for FedCCFA, per-class feature anchors) in
its ``context.state``; the server averages only the feature extractors,

    theta(t+1) = sum_k n_k theta_k(t) / sum_k n_k          (the server's classifier stays phi(0)).

FedCCFA then clusters, for every class c, the sampled clients' *balanced* class-c classifier
rows: D = MADD over their cosine similarities (Eq. 4), DBSCAN(eps, min_samples) over D; inside
every cluster of >= 2 clients the class-c rows of the personal classifiers, and the class-c
anchors, are replaced by their uniform means. Singletons keep their own. Fewer than 3 usable
replies: no clustering that round (MADD needs 3). The extractor is trained with
CE + lambda * L_align, L_align the contrastive loss of the features to the anchors (Eq. 8) and
lambda = H(P_k(Y)) / gamma (Eq. 9). The results reach a client with its next message and are
applied to its personal state. The choices where the paper is silent: docs/fedccfa/README.md.

Everything runs over two message kinds of ``client.py``: ``train.fedccfa`` (the five client
steps, or a baseline's local training, chosen by ``ccfa-algo``) and ``query.fedccfa_eval``
(personalised ``accuracy`` on the client's own test split and generalised ``gen-accuracy`` on
the whole relabelled test pool). FedProx is the foundation's ``fedprox``, Adaptive-FedAvg with
the FedCCFA paper's per-round constants (docs/fedccfa/README.md, D20) its ``adaptive-fedavg-rounds``.
"""

from __future__ import annotations

from logging import INFO, WARNING
from typing import Any, ClassVar

import numpy as np
from flwr.common.logger import log

from fedcluster_app.core import wire as P
from fedcluster_app.core.config import ConfigError
from fedcluster_app.core.server.strategy import (
    ClusteredStrategy,
    RejectedReply,
    Reply,
    Task,
)
from fedcluster_app.families.fedccfa import catalogue
from fedcluster_app.families.fedccfa import wire as W
from fedcluster_app.families.fedccfa.classifiers import (
    dbscan_labels,
    drift_recovery,
    madd,
)


class _GeneralisedEval(ClusteredStrategy):
    """Shared machinery: one global model (id 0), train.fedccfa / query.fedccfa_eval messages,
    per-client pending server results, generalised accuracy in metrics.jsonl."""

    message_kinds: ClassVar[dict[str, str]] = {P.TRAIN: W.TRAIN_KIND, P.EVALUATE: W.EVAL_KIND}
    algo: ClassVar[str] = ""
    needs_split_model = True   # client.py trains the extractor and the classifier apart

    def __init__(self, experiment) -> None:
        super().__init__(experiment)
        if self.cfg.train.optimizer_state != "round":
            # the clients' training phases (client.py) build their optimizers afresh each round
            raise ConfigError(f"{self.name} trains in phases with a fresh optimizer each: "
                              f"optimizer-state must be 'round', got "
                              f"{self.cfg.train.optimizer_state!r}")
        if self.cfg.train.prox_mu > 0:
            raise ConfigError(f"{self.name}'s clients train without a proximal term: prox-mu "
                              f"must be 0, got {self.cfg.train.prox_mu}")
        self.pending: dict[int, dict[str, Any]] = {}
        self.gen_history: list[float | None] = []
        self._gen: dict[int, float] = {}
        self._extras: dict[int, list[np.ndarray]] = {}
        self._rejected_rows: list[int] = []
        self._ages: list[int] = []

    def client_config(self, cid: int) -> dict[str, Any]:
        """What every message to ``cid`` carries: the algorithm, its hyper-parameters and the
        server's pending results of the client's last training."""
        return {W.ALGO: self.algo, **self.params.to_message(W.PARAMS), **self.pending.get(cid, {})}

    # ---------------------------------------------------------------- hooks
    def on_start(self) -> None:
        mid = self.new_model()
        for cid in self.clients:
            self.assign(cid, mid)

    def on_new_client(self, cid: int) -> None:
        self.assign(cid, min(self.models))

    @property
    def gid(self) -> int:
        return min(self.models)

    def plan_train(self, step: int) -> dict[int, Task]:
        self._extras, self._rejected_rows, self._ages = {}, [], []
        return {cid: Task(models=[self.gid], config=self.client_config(cid))
                for cid in self.sample(sorted(self.clients), self.cfg.fraction_train)}

    def eval_task(self, cid: int) -> Task | None:
        return Task(models=[self.gid], config=self.client_config(cid))

    def global_eval_task(self, cid: int) -> Task | None:
        """A held-out client (it never trains) is scored as a newcomer through the family's
        evaluate handler: FedCCFA and FedRep first learn its personal classifier on its
        adaptation split over the global extractor (``NEWCOMER``: FedRep's new clients),
        FedBABU fine-tunes as on every evaluation, Flash predicts with the global model."""
        return Task(models=[self.gid], config={**self.client_config(cid), W.NEWCOMER: True})

    def check_reply(self, kind: str, reply: Reply) -> None:
        """FedCCFA's classifier/anchor record (``extra.ccfa``) is checked on its own: a bad
        record rejects that client's rows (logged), not its extractor."""
        # the generalised accuracy is the participants' (a held-out client's is not its kind)
        if (kind == W.EVAL_KIND and W.GEN_ACCURACY in reply.metrics
                and reply.cid not in self.holdouts):
            self._gen[reply.cid] = float(reply.metrics[W.GEN_ACCURACY])
        if kind != W.TRAIN_KIND:
            return
        if W.PERSONAL_AGE in reply.metrics:
            self._ages.append(int(reply.metrics[W.PERSONAL_AGE]))
        if W.EXTRA not in reply.extras:
            return
        try:
            self._extras[reply.cid] = self.check_extra(reply.extras[W.EXTRA])
        except (ValueError, TypeError) as ex:
            self._rejected_rows.append(reply.cid)
            log(WARNING, "round %d: client %d: classifier rows and anchors rejected this round: %s",
                self.round, reply.cid, ex)

    def check_extra(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        c, d = self.shapes[-2]
        want = [(c, d), (c,), (c, d), (c,), (c, d), (c,)]
        names = ["balanced W", "balanced b", "personal W", "personal b", "anchors", "anchor mask"]
        if len(arrays) != len(want):
            raise RejectedReply(f"expected {len(want)} arrays ({', '.join(names)}), got {len(arrays)}")
        for a, shape, name in zip(arrays, want, names):
            if tuple(a.shape) != shape:
                raise RejectedReply(f"{name} has shape {tuple(a.shape)}, expected {shape}")
            if not np.isfinite(a).all():
                raise RejectedReply(f"{name} contains non-finite values")
        if not np.isin(arrays[5], (0.0, 1.0)).all():
            raise RejectedReply("anchor mask must hold only 0 and 1")
        return [np.asarray(a, np.float64) for a in arrays]

    def on_train_replies(self, step: int, replies: list[Reply]) -> None:
        self.average_extractor(replies)

    def average_extractor(self, replies: list[Reply]) -> None:
        """theta(t+1) = sample-weighted mean of the extractors (Eq. 10); classifier stays phi(0)."""
        items = self.collect_updates(replies).get(self.gid, [])
        if not items or sum(w for _, w in items) <= 0:
            return
        new = self.aggregate(items)
        new[-2:] = [a.copy() for a in self.models[self.gid][-2:]]
        self.models[self.gid] = new

    # ---------------------------------------------------------------- metrics and state
    def round_metrics(self) -> dict[str, Any]:
        gen = float(np.mean(list(self._gen.values()))) if self._gen else None
        self.gen_history.append(gen)
        out: dict[str, Any] = {"generalized_accuracy": gen}
        if self._ages:   # rounds the personal classifiers have been trained in a row (min, max)
            out["personal_age"] = [min(self._ages), max(self._ages)]
        if self._gen and len(self._gen) <= 200:
            out["client_generalized_accuracy"] = {str(c): round(a, 5) for c, a in self._gen.items()}
        self._gen = {}
        return out

    def summary_extra(self) -> dict[str, Any]:
        vals = [v for v in self.gen_history if v is not None]
        out: dict[str, Any] = {
            "final_generalized_accuracy": vals[-1] if vals else None,
            "mean_generalized_accuracy": float(np.mean(vals)) if vals else None,
        }
        events = self.exp.scenario.drift_events()
        if events and vals:
            first = (events[0][0] - 1) * self.cfg.rounds_per_step   # index of the first drift round
            out["drift"] = drift_recovery(self.gen_history, first)
        return out

    def strategy_state(self) -> dict[str, Any]:
        return {"pending": {str(c): p for c, p in self.pending.items()},
                "gen_history": self.gen_history}

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        self.pending = {int(c): p for c, p in state["pending"].items()}
        self.gen_history = list(state["gen_history"])


class FedCCFA(_GeneralisedEval):
    name, description, Params = catalogue.FEDCCFA.class_attributes()
    algo = "fedccfa"

    def __init__(self, experiment) -> None:
        super().__init__(experiment)
        self.signature: dict[int, list[int]] = {}      # cid -> its cluster index per class
        self._sig_ids: dict[tuple[int, ...], int] = {}
        self._partition: dict[int, list[list[int]]] = {}
        self._class_ari: list[float | None] = []
        self._lam: list[float] = []

    def client_config(self, cid: int) -> dict[str, Any]:
        cfg = super().client_config(cid)
        for key in ("eps", "min-samples", "anchors"):
            cfg.pop(f"ccfa-{key}", None)   # server-side only
        return cfg

    def on_train_replies(self, step: int, replies: list[Reply]) -> None:
        self.average_extractor(replies)
        self._lam = [float(r.metrics.get(W.LAMBDA, 0.0)) for r in replies]
        ok = [r.cid for r in replies if r.cid in self._extras]
        for r in replies:
            self.pending.pop(r.cid, None)
        self._partition, self._class_ari = {}, []
        results: dict[int, dict[str, list]] = {
            cid: {"classes": [], "rows": [], "anchor_classes": [], "anchors": []} for cid in ok}
        num_classes = self.shapes[-2][0]
        if len(ok) < 3:
            if ok:
                log(INFO, "round %d: only %d usable replies, no clustering (MADD needs 3)",
                    self.round, len(ok))
            for cid in ok:
                self.signature[cid] = list(range(num_classes))   # singleton everywhere
        else:
            labels_by_class = []
            for c in range(num_classes):
                ex = [self._extras[k] for k in ok]
                v = np.stack([np.concatenate([e[0][c], [e[1][c]]]) for e in ex])
                labels = dbscan_labels(madd(v), self.params.eps,
                                        self.params.min_samples)
                labels_by_class.append(labels)
                self._partition[c] = [[ok[i] for i in np.flatnonzero(labels == lab)]
                                      for lab in range(int(labels.max()) + 1)]
                for lab in range(int(labels.max()) + 1):
                    idx = np.flatnonzero(labels == lab)
                    if len(idx) < 2:
                        continue                                   # singleton keeps its own
                    row = np.mean([np.concatenate([ex[i][2][c], [ex[i][3][c]]]) for i in idx], 0)
                    have = [i for i in idx if ex[i][5][c] > 0]
                    anchor = np.mean([ex[i][4][c] for i in have], 0) if have else None
                    for i in idx:
                        res = results[ok[i]]
                        res["classes"].append(c)
                        res["rows"].extend(float(x) for x in row)
                        if anchor is not None and self.params.anchors == "clustered":
                            res["anchor_classes"].append(c)
                            res["anchors"].extend(float(x) for x in anchor)
                if self.params.anchors == "global":
                    have = [i for i in range(len(ok)) if ex[i][5][c] > 0]
                    if have:
                        anchor = np.mean([ex[i][4][c] for i in have], 0)
                        for i in range(len(ok)):
                            results[ok[i]]["anchor_classes"].append(c)
                            results[ok[i]]["anchors"].extend(float(x) for x in anchor)
            for i, cid in enumerate(ok):
                self.signature[cid] = [int(lab[i]) for lab in labels_by_class]
            self._class_ari = self._ari_per_class(step, ok, labels_by_class)
        for cid, res in results.items():
            p: dict[str, Any] = {W.PENDING_ROUND: self.round}
            if res["classes"]:
                p[W.PENDING_CLASSES] = res["classes"]
                p[W.PENDING_ROWS] = res["rows"]
            if res["anchor_classes"]:
                p[W.PENDING_ANCHOR_CLASSES] = res["anchor_classes"]
                p[W.PENDING_ANCHORS] = res["anchors"]
            self.pending[cid] = p

    # ---------------------------------------------------------------- ground-truth metrics
    def _class_meaning(self, concept: int, c: int) -> int:
        """Which true class label c stands for under ``concept`` (metrics only)."""
        try:
            perm = self.exp.scenario.realisation.concepts[concept].perm
        except Exception:   # no realisation on this machine: fall back to the concept id
            return concept * 1000 + c
        if perm is None:
            return c
        return int(list(perm).index(c))

    def _ari_per_class(self, step: int, ok: list[int], labels_by_class) -> list[float | None]:
        from sklearn.metrics import adjusted_rand_score

        truth = [self.truth.get(cid, {}).get(step) for cid in ok]
        if any(t is None for t in truth):
            return []
        return [float(adjusted_rand_score([self._class_meaning(t, c) for t in truth], labels))
                for c, labels in enumerate(labels_by_class)]

    def cluster_label(self, cid: int) -> int | None:
        """For the ARI only: the tuple of the client's class-level clusters (its assignment,
        the model it trains and is scored with, is the global one of every client)."""
        sig = self.signature.get(cid)
        if sig is None:
            return None
        return self._sig_ids.setdefault(tuple(sig), len(self._sig_ids))

    def round_metrics(self) -> dict[str, Any]:
        out = super().round_metrics()
        if self._partition:
            out["clusters_per_class"] = [len(self._partition[c]) for c in sorted(self._partition)]
            if len(self.clients) <= 50:
                out["class_partitions"] = {str(c): p for c, p in self._partition.items()}
        if self._class_ari:
            out["class_ari"] = [round(a, 4) for a in self._class_ari]
        out["rows_rejected"] = list(self._rejected_rows)
        if self._lam:
            out["mean_align_weight"] = float(np.mean(self._lam))
        return out

    def strategy_state(self) -> dict[str, Any]:
        return {**super().strategy_state(),
                "signature": {str(c): s for c, s in self.signature.items()}}

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        super().load_strategy_state(state)
        self.signature = {int(c): list(s) for c, s in state["signature"].items()}


class FedRep(_GeneralisedEval):
    name, description, Params = catalogue.FEDREP.class_attributes()
    algo = "fedrep"


class FedBABU(_GeneralisedEval):
    name, description, Params = catalogue.FEDBABU.class_attributes()
    algo = "fedbabu"


class Flash(_GeneralisedEval):
    name, description, Params = catalogue.FLASH.class_attributes()
    algo = "flash"
    needs_split_model = False   # its clients train the whole model (client.py, _train_flash)

    def __init__(self, experiment) -> None:
        super().__init__(experiment)
        self.m: list[np.ndarray] | None = None
        self.v: list[np.ndarray] | None = None
        self.delta: list[np.ndarray] | None = None

    def on_train_replies(self, step: int, replies: list[Reply]) -> None:
        items = self.collect_updates(replies).get(self.gid, [])
        if not items or sum(w for _, w in items) <= 0:
            return
        w = [a.astype(np.float64) for a in self.models[self.gid]]
        avg = self.aggregate(items)
        delta = [a.astype(np.float64) - b for a, b in zip(avg, w)]
        p = self.params
        b1, b2, tau, eta = p.beta1, p.beta2, p.tau, p.eta_g
        if self.m is None:
            self.m = [np.zeros_like(a) for a in w]
            self.v = [np.full_like(a, tau ** 2) for a in w]
            self.delta = [np.zeros_like(a) for a in w]
        new = []
        for i, d in enumerate(delta):
            self.m[i] = b1 * self.m[i] + (1 - b1) * d
            v_old = self.v[i]
            self.v[i] = b2 * v_old + (1 - b2) * d * d
            b3 = np.abs(v_old) / (np.abs(d * d - self.v[i]) + np.abs(v_old))
            self.delta[i] = b3 * self.delta[i] + (1 - b3) * (d * d - self.v[i])
            new.append((w[i] + eta * self.m[i] / (np.sqrt(self.v[i]) - self.delta[i] + tau))
                       .astype(np.float32))
        self.models[self.gid] = new

    def strategy_state(self) -> dict[str, Any]:
        st = super().strategy_state()
        if self.m is not None:
            st["opt"] = {k: [a.tolist() for a in getattr(self, k)] for k in ("m", "v", "delta")}
        return st

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        super().load_strategy_state(state)
        if "opt" in state:
            for k in ("m", "v", "delta"):
                setattr(self, k, [np.asarray(a, np.float64) for a in state["opt"][k]])

