"""FedCCFA's named drift patterns on the digits (docs/fedccfa/README.md, "Drift patterns"): the
builders of the scenarios ``catalogue.py`` registers.

``digits-swap`` (sudden: every group swaps at the drift step) and ``digits-static`` (no drift)
come with the built-in image families; this module adds ``digits-swap-incremental`` (G1 swaps
1<->2 at the drift step, G2 3<->4 one step later, G3 5<->6 two steps later) and
``digits-swap-recurring`` (every group swaps at the drift step and swaps back, i.e. returns to
the original labels, half-way through the remaining steps). Both are ``digits-swap`` with the
matching ``drift-pattern``; the same patterns work on ``mnist-swap``, ``fmnist-swap`` and
``cifar10-swap`` through the run-config key ``drift-pattern``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fedcluster_app.core.data.drift import ClassRealisation
from fedcluster_app.core.data.scenarios import Scenario, build_scenario


def build_digits_swap(pattern: str, **kwargs) -> Scenario:
    """``digits-swap-<pattern>``: ``digits-swap`` with that ``drift-pattern``, fixed."""
    given = str(kwargs.get("drift_pattern", "") or "").strip().lower()
    if given and given not in (pattern, "reoccurring" if pattern == "recurring" else pattern):
        raise ValueError(f"scenario digits-swap-{pattern} fixes drift-pattern = {pattern!r}; "
                         f"got {given!r} (use digits-swap with drift-pattern instead)")
    return build_scenario("digits-swap", **{**kwargs, "drift_pattern": pattern})


# --------------------------------------------------------------------------- the paper's partition

MIN_TRAIN_PER_CLASS = 5   # docs/fedccfa/README.md D4: every client holds >= 5 training samples per class
MIN_TEST_PER_CLASS = 2    # ... and >= 2 test samples of every class in its personalised split


class MinPerClassRealisation(ClassRealisation):
    """A :class:`ClassRealisation` whose every (client, step) sample holds at least ``k`` items
    of every class (5 for training, 2 for testing), the rest drawn from the client's Dirichlet
    prior: the paper's partition (docs/fedccfa/README.md, D4) on a stream. With fewer than ``k x C``
    samples it falls back to the plain prior draw."""

    def __init__(self, base: ClassRealisation, k_train: int = MIN_TRAIN_PER_CLASS,
                 k_test: int = MIN_TEST_PER_CLASS) -> None:
        super().__init__(base.source, base.concepts, base.priors)
        self.k_train, self.k_test = int(k_train), int(k_test)

    def draw_labels(self, concept, n, rng, *, client, train):
        k = self.k_train if train else self.k_test
        present = np.flatnonzero(self.source.present(train))
        if k <= 0 or n < k * len(present):
            return super().draw_labels(concept, n, rng, client=client, train=train)
        p = self.class_prior(concept, client, train)
        y_true = np.concatenate([np.repeat(present, k),
                                 rng.choice(self.num_classes, size=n - k * len(present), p=p)])
        y_true = y_true[rng.permutation(n)].astype(np.int64)
        return y_true


def build_digits_ccfa(**kwargs) -> Scenario:
    """``digits-swap`` (any drift-pattern, default sudden) with the paper's 5-per-class minimum
    (docs/fedccfa/README.md, D4)."""
    pattern = str(kwargs.get("drift_pattern", "") or "sudden")
    base = build_scenario("digits-swap", **{**kwargs, "drift_pattern": pattern})
    # digits-swap's resolved arguments, renamed, with the ones given as given (the
    # drift-pattern "" among them): rebuilt through build_scenario("digits-ccfa", ...)
    spec = dataclasses.replace(base.spec, name="digits-ccfa",
                               **{"drift_pattern": "", **kwargs})
    return Scenario(
        name="digits-ccfa",
        description=base.description.replace("scikit-learn 8x8 digits", "digits-ccfa"),
        matrix=base.concept_matrix(),
        realisation_factory=lambda: MinPerClassRealisation(base.realisation),
        num_classes=base.num_classes, input_shape=base.input_shape, model=base.model,
        hidden=base.hidden, data_seed=base.data_seed, samples_per_step=base.samples_per_step,
        test_samples=base.test_samples, drift_pattern=base.drift_pattern,
        drift_step=base.drift_step, dirichlet_alpha=base.dirichlet_alpha,
        concept_labels=list(base.concept_labels),
        spec=spec,
    )
