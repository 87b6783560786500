"""FlexCFL's label-shift test, and the -MIG baselines that add it to IFCA and FeSEM.

A warm client (one assigned at least once) has shifted when its training label counts moved
past the threshold since its reference, the counts at its last (re-)assignment:

    shift_distance(metric, counts_now, reference) > tau,
    tau = fraction x n_orig / C (``scipy_counts``, the paper's Eq. 9) | fraction (``tv``),

n_orig being the client's original training-set size. FlexCFL re-cold-starts a shifted client
(``flexcfl.py``); IFCA-MIG and FeSEM-MIG (the paper's Fig. 6) re-assign it at once by their own
rule (:class:`MigrationMixin`).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from flwr.serverapp import Grid

from fedcluster_app.core import wire as P
from fedcluster_app.families.flexcfl.grouping import shift_distance, shift_threshold


class ShiftCheck:
    """The label-shift test of one strategy (whose ``params`` are :class:`ShiftParams`) and what
    it remembers of every client."""

    def __init__(self, strategy) -> None:
        self.s = strategy
        self.ref_counts: dict[int, np.ndarray] = {}   # counts at the last (re-)assignment
        self.n_orig: dict[int, int] = {}              # original training-set sizes
        self.last_counts: dict[int, int] = {}         # training-set sizes last reported

    def note_sizes(self, cids: list[int] | None = None) -> None:
        """Remember each client's original training-set size (tau of the shift test)."""
        clients = self.s.clients
        for cid in clients if cids is None else cids:
            self.n_orig.setdefault(cid, clients[cid].num_examples)

    def label_counts(self, grid: Grid, cids: list[int]) -> dict[int, np.ndarray]:
        """Current training label counts (``query.histogram``: no model on the wire)."""
        if not cids:
            return {}
        replies = self.s.query(grid, P.QUERY_HISTOGRAM, cids)
        out = {}
        for cid, r in replies.items():
            counts = np.asarray(r.metrics.get(P.HISTOGRAM, []), dtype=np.int64)
            self.last_counts[cid] = int(counts.sum())
            out[cid] = counts
        return out

    def detect(self, counts: dict[int, np.ndarray], warm: list[int]) -> list[int]:
        """The warm clients whose counts moved past the threshold since their reference. A
        client without a usable reference gets one now and is not shifted."""
        shifted = []
        c_num = self.s.exp.scenario.num_classes
        p = self.s.params
        for cid in warm:
            now = counts.get(cid)
            if now is None:
                continue
            ref = self.ref_counts.get(cid)
            if ref is None or len(ref) != len(now):
                self.ref_counts[cid] = now
                continue
            tau = shift_threshold(p.shift_metric, p.shift_threshold,
                                  self.n_orig.get(cid, int(ref.sum())), c_num)
            if shift_distance(p.shift_metric, now, ref) > tau:
                shifted.append(cid)
        return shifted

    def state(self) -> dict[str, Any]:
        return {"ref_counts": {str(c): v.tolist() for c, v in self.ref_counts.items()},
                "n_orig": {str(c): v for c, v in self.n_orig.items()},
                "last_counts": {str(c): v for c, v in self.last_counts.items()}}

    def load_state(self, state: dict[str, Any]) -> None:
        self.ref_counts = {int(c): np.asarray(v, np.int64) for c, v in state["ref_counts"].items()}
        self.n_orig = {int(c): int(v) for c, v in state["n_orig"].items()}
        self.last_counts = {int(c): int(v) for c, v in state["last_counts"].items()}


class MigrationMixin:
    """IFCA-MIG / FeSEM-MIG: the baseline plus the shift test. Every round, before training,
    every warm client sends its label counts (``query.histogram``, no model); one whose counts
    moved past the threshold since its reference is re-assigned at once by the method's own
    rule (:meth:`reassign`), and its reference becomes its current counts. The reference is
    first set when the client is first assigned. Reported per round: ``shifted_clients``,
    ``shift_reassignments`` and ``migrations`` (re-assignments that changed the group)."""

    mig_keys: ClassVar[tuple[str, ...]] = ("shift_reassignments", "migrations")

    def __init__(self, experiment) -> None:
        super().__init__(experiment)  # type: ignore[call-arg]  (the baseline strategy's)
        self.shifts = ShiftCheck(self)
        self.mig_totals = dict.fromkeys(self.mig_keys, 0)
        self._mig_round = dict.fromkeys(self.mig_keys, 0)
        self._shifted: list[int] = []
        self._counts_now: dict[int, np.ndarray] = {}

    def on_start(self) -> None:
        super().on_start()  # type: ignore[misc]
        self.shifts.note_sizes()

    def on_new_client(self, cid: int) -> None:
        super().on_new_client(cid)  # type: ignore[misc]
        self.shifts.note_sizes([cid])

    def reassign(self, grid: Grid, cids: list[int]) -> list[int]:
        """Re-assign shifted clients by the method's own rule; returns those it placed."""
        raise NotImplementedError

    def _mig_count(self, what: str, n: int = 1) -> None:
        self._mig_round[what] += n
        self.mig_totals[what] += n

    def migrate(self, grid: Grid) -> None:
        """The shift test on the warm clients, then :meth:`reassign` of the shifted ones."""
        refs = self.shifts.ref_counts
        warm = sorted(c for c in refs if c in self.clients)
        cold_selected = [c for c in self.protocol.selected if c not in refs]
        self._counts_now = self.shifts.label_counts(grid, sorted(set(warm) | set(cold_selected)))
        shifted = self.shifts.detect(self._counts_now, warm)
        self._shifted = shifted
        if not shifted:
            return
        old = {c: self.clients[c].cluster for c in shifted}
        done = self.reassign(grid, shifted)
        for c in done:
            self.shifts.ref_counts[c] = self._counts_now[c]
        self._mig_count("shift_reassignments", len(done))
        self._mig_count("migrations", sum(1 for c in done if self.clients[c].cluster != old[c]))

    def set_reference(self, cids: list[int]) -> None:
        """A client's first assignment: its current counts become its reference."""
        for c in cids:
            if c not in self.shifts.ref_counts and c in self._counts_now:
                self.shifts.ref_counts[c] = self._counts_now[c]

    def round_metrics(self) -> dict[str, Any]:
        out = super().round_metrics()  # type: ignore[misc]
        out.update(self._mig_round)
        out["shifted_clients"] = self._shifted
        self._mig_round = dict.fromkeys(self.mig_keys, 0)
        self._shifted = []
        return out

    def summary_extra(self) -> dict[str, Any]:
        return {f"{k}_total": v for k, v in self.mig_totals.items()}

    def strategy_state(self) -> dict[str, Any]:
        return super().strategy_state() | self.shifts.state() | {  # type: ignore[misc]
            "mig_totals": self.mig_totals}

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        super().load_strategy_state(state)  # type: ignore[misc]
        self.shifts.load_state(state)
        self.mig_totals = {k: int(v) for k, v in state["mig_totals"].items()}
