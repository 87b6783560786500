"""The class-balanced test sample of a (client, step) (``Scenario.balanced_test``): every class
equally often, the client's current concept (its label map and input shift), whatever its class
prior; drawn from its own stream, so no other draw changes."""

from __future__ import annotations

import numpy as np
import pytest

from fedcluster_app.core.data.scenarios import build_scenario


def nearest_mean(means: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The true class of each mixture input: the class whose mean is nearest."""
    return np.argmin(((x[:, None, :] - means[None]) ** 2).sum(-1), axis=1)


@pytest.mark.parametrize("name", ["mixture-prior", "digits-permute", "imagesegments-mix",
                                  "shifts-3"])
def test_every_class_equally_often_whatever_the_client_prior(name):
    s = build_scenario(name, seed=1, test_samples=57)
    for client in range(min(s.num_clients, 6)):
        for step in (1, s.num_steps):
            x, y = s.balanced_test(client, step)
            counts = np.bincount(y, minlength=s.num_classes)
            assert len(set(counts[counts > 0])) == 1, (client, step, counts)
            assert (counts > 0).sum() == s.num_classes           # every class of these pools
            assert len(y) >= 57 and len(x) == len(y)
            assert x.shape[1:] == s.input_shape
            # the client's own split follows its Dirichlet prior: not balanced
    own = np.bincount(build_scenario("digits-permute", seed=1).step_data(0, 1).y_test,
                      minlength=10)
    assert own.max() > 2 * max(own.min(), 1)


def test_the_sample_follows_the_clients_current_concept():
    # mixture-swap: the first half of the clients relabel y -> (y+1) % 4 from step 3 on
    s = build_scenario("mixture-swap", seed=0)
    means = s.realisation.source.means
    drifted, stayed = 0, s.num_clients - 1
    assert (s.concept(drifted, 1), s.concept(drifted, 4), s.concept(stayed, 4)) == (0, 1, 0)
    for client, step, shift in ((drifted, 1, 0), (drifted, 4, 1), (stayed, 4, 0)):
        x, y = s.balanced_test(client, step)
        truth = nearest_mean(means, x)
        assert np.mean((truth + shift) % 4 == y) > 0.9, (client, step)
        assert np.mean((truth + 1 - shift) % 4 == y) < 0.2
    # mixture-noise: the drifted clients' inputs carry N(0, 1) on top of the unit noise
    s = build_scenario("mixture-noise", seed=0)
    means = s.realisation.source.means
    for client, variance in ((0, 2.0), (s.num_clients - 1, 1.0)):
        x, y = s.balanced_test(client, s.num_steps)
        assert np.var(x - means[y]) == pytest.approx(variance, rel=0.15)


def test_its_own_stream_deterministic_and_no_other_draw_changes():
    a = build_scenario("digits-prior", seed=3)
    before = a.step_data(2, 4)
    xa, ya = a.balanced_test(2, 4)
    after = a.step_data(2, 4)
    assert np.array_equal(before.x_test, after.x_test)
    # a scenario built elsewhere that never drew a balanced sample has the same data
    b = build_scenario("digits-prior", seed=3, samples_per_step=a.samples_per_step + 1)
    b2 = build_scenario("digits-prior", seed=3, samples_per_step=a.samples_per_step + 1)
    assert np.array_equal(b.step_data(2, 4).y_test, a.step_data(2, 4).y_test)
    assert np.array_equal(b2.balanced_test(2, 4)[0], xa)
    assert np.array_equal(b2.balanced_test(2, 4)[1], ya)
    # another client or step: another sample; read-only, like step_data
    assert not np.array_equal(a.balanced_test(3, 4)[0], xa)
    assert not np.array_equal(a.balanced_test(2, 5)[0], xa)
    with pytest.raises(ValueError):
        xa[0] = 0


def test_a_scenario_of_decision_rules_has_none():
    s = build_scenario("stagger3", seed=0)
    assert s.has_balanced_test() is False
    with pytest.raises(ValueError, match="decision rules"):
        s.balanced_test(0, 1)
    assert build_scenario("mixture-swap", seed=0).has_balanced_test() is True
