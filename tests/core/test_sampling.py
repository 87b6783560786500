"""Minibatches drawn in one call equal NumPy's ``choice`` calls one by one, and leave the
generator where those calls leave it, so every seeded result keeps its meaning."""

from __future__ import annotations

import numpy as np
import pytest

from fedcluster_app.core import sampling
from fedcluster_app.core.config import TrainConfig
from fedcluster_app.core.sampling import choice_batches
from fedcluster_app.core.training import batch_indices


@pytest.fixture(autouse=True)
def replayed(monkeypatch):
    """Every call takes the compiled replay (a process's first calls call ``choice``)."""
    monkeypatch.setattr(sampling, "LOOP_FIRST_CALLS", 0)


def _pair(seed: int, halves: int) -> tuple[np.random.Generator, np.random.Generator]:
    """Two generators in the same state; ``halves`` 32-bit draws first (an odd number leaves
    half of a 64-bit output buffered, which the next draw must use first)."""
    a, b = np.random.default_rng([seed, 11]), np.random.default_rng([seed, 11])
    for g in (a, b):
        g.integers(0, 7, size=halves, dtype=np.uint32)
    return a, b


def _assert_same(n: int, size: int, count: int, seed: int, halves: int) -> None:
    expected_rng, rng = _pair(seed, halves)
    expected = [expected_rng.choice(n, size=size, replace=False) for _ in range(count)]
    got = choice_batches(rng, n, size, count)
    assert len(got) == count
    for e, g in zip(expected, got):
        assert g.dtype == e.dtype and np.array_equal(g, e), (n, size, count, seed, halves)
    assert rng.bit_generator.state == expected_rng.bit_generator.state
    # and the streams go on alike, for 32-bit and 64-bit draws
    assert rng.integers(0, 1000, dtype=np.uint32) == expected_rng.integers(0, 1000, dtype=np.uint32)
    assert np.array_equal(rng.random(3), expected_rng.random(3))


@pytest.mark.parametrize("halves", [0, 1, 2, 3])
def test_equals_choice_on_the_paper_protocol(halves):
    for seed in range(20):
        _assert_same(500, 50, 50, seed, halves)


def test_equals_choice_over_random_shapes():
    pick = np.random.default_rng(2026)
    for _ in range(600):
        n = int(pick.choice([1, 2, 3, 7, 64, 500, 4096, 9999, 10000, 10001, 60000,
                             int(pick.integers(1, 3000))]))
        size = int(pick.integers(1, min(n, 130) + 1))
        _assert_same(n, size, int(pick.integers(1, 9)), int(pick.integers(2**31)),
                     int(pick.integers(0, 3)))


def test_whole_population_and_single_draws():
    for n in (1, 2, 5, 50):
        for halves in (0, 1):
            _assert_same(n, n, 4, n, halves)     # size = n: Floyd's first range is [0, 0]
            _assert_same(n, 1, 4, n, halves)


def test_fallback_paths_still_equal_choice():
    """Outside the replayed path (NumPy's tail shuffle, another bit generator) it calls choice."""
    _assert_same(20000, 1000, 2, 3, 1)          # n > 10000 and size > n // 50
    a = np.random.Generator(np.random.Philox(5))
    b = np.random.Generator(np.random.Philox(5))
    assert all(np.array_equal(x, y) for x, y in
               zip([a.choice(100, size=10, replace=False) for _ in range(3)],
                   choice_batches(b, 100, 10, 3)))


def test_runs_out_of_words_and_replays_with_more(monkeypatch):
    """A buffer too small for the draws is noticed and the draw repeated with a larger one."""
    calls = []
    real = sampling._replay

    def small_first(raw, leftover, n, size, out):
        calls.append(len(raw))
        return real(raw[:3] if len(calls) == 1 else raw, leftover, n, size, out)

    monkeypatch.setattr(sampling, "_replay", small_first)
    _assert_same(500, 50, 5, 1, 1)
    assert len(calls) == 2 and calls[1] > calls[0]


def test_a_process_first_calls_choice_then_replays(monkeypatch):
    """The first calls of a process do not load the compiled replay; the draws are the same."""
    monkeypatch.setattr(sampling, "LOOP_FIRST_CALLS", 2)
    monkeypatch.setattr(sampling, "_CALLS", 0)
    kinds = [type(choice_batches(np.random.default_rng(k), 500, 50, 3)) for k in range(3)]
    assert kinds == [list, list, sampling.Minibatches]
    _assert_same(500, 50, 3, 5, 1)


def test_batch_indices_draws_the_choice_minibatches():
    cfg = TrainConfig(local_steps=50, batch_size=50)
    got = batch_indices(300, cfg, np.random.default_rng(4))
    rng = np.random.default_rng(4)
    assert all(np.array_equal(g, rng.choice(300, size=50, replace=False)) for g in got)
    # fewer samples than a batch: the whole (shuffled) client each step
    assert all(sorted(b) == list(range(20)) for b in batch_indices(20, cfg, rng))


@pytest.mark.parametrize("hashed", [False, True], ids=["numpy-seedsequence", "compiled-hash"])
def test_seeded_generators_are_default_rngs_of_the_same_words(hashed, monkeypatch):
    """sampling.seeded(*words) is np.random.default_rng(list(words)): the same state and the
    same draws, for small words (its fast paths: NumPy's SeedSequence on a uint32 array, and
    once the compiled draws are loaded SeedSequence's hashing compiled) and for large or
    negative ones (the fallback)."""
    if hashed:
        from fedcluster_app.core import compiled_rng as compiled

        monkeypatch.setattr(sampling, "_compiled", compiled)
    else:
        monkeypatch.setattr(sampling, "_compiled", None)
    assert (type(sampling.seeded(1, 2).bit_generator.seed_seq) is sampling._HashedSeed) is hashed
    rng = np.random.default_rng(5)
    cases = [(0, 0, 0, 0), (0, 3, 517, 5 + 2**16), (2**32 - 1, 1, 2, 3), (2**32, 1), (2**40 + 7, 9, 1),
             (7,), (1, 2, 3, 4, 5, 6)]
    cases += [tuple(int(w) for w in rng.integers(0, 2**32, size=rng.integers(1, 6))) for _ in range(50)]
    for words in cases:
        ours, theirs = sampling.seeded(*words), np.random.default_rng(list(words))
        assert ours.bit_generator.state == theirs.bit_generator.state, words
        np.testing.assert_array_equal(ours.integers(0, 1000, 20), theirs.integers(0, 1000, 20))
    with pytest.raises(ValueError):
        sampling.seeded(-1, 2)
    with pytest.raises(ValueError):
        np.random.default_rng([-1, 2])


def _numpy_round_draws(words, n, cfg, bootstrap):
    """What a client's stream draws for one model's round, through NumPy's own calls."""
    rng = np.random.default_rng(list(words))
    rows = None
    if bootstrap:
        rows = np.repeat(np.arange(n), rng.poisson(1.0, size=n))
        rows = rows if len(rows) else np.arange(n)
    return rows, [rng.choice(n if rows is None else len(rows), size=min(cfg.batch_size,
                             n if rows is None else len(rows)), replace=False)
                  for _ in range(cfg.local_steps)]


@pytest.mark.parametrize("compiled_loaded", [False, True], ids=["numpy", "compiled"])
def test_round_draws_equal_a_fresh_generators_numpy_calls(compiled_loaded, monkeypatch):
    """training.round_draws (a fresh generator, a bootstrap sample, the minibatches) gives
    NumPy's rows and minibatches exactly: through NumPy before the compiled draws are loaded,
    and in one compiled call (its own PCG64, Poisson counts and replayed choice) after."""
    from fedcluster_app.core import compiled_rng as compiled
    from fedcluster_app.core.training import round_draws

    monkeypatch.setattr(sampling, "_compiled", compiled if compiled_loaded else None)
    pick = np.random.default_rng(7)
    cases = [((0, 3, 517, 5 + 2**16), 500, 50, 50, True), ((1, 2), 1, 50, 3, True),
             ((2**32 - 1, 0), 2, 2, 4, False), ((9,), 40, 50, 5, True),   # a batch above m
             ((4, 4, 4, 4), 20000, 1000, 2, False)]                      # NumPy's tail shuffle
    for _ in range(150):
        words = tuple(int(w) for w in pick.integers(0, 2**32, size=pick.integers(1, 5)))
        cases.append((words, int(pick.integers(1, 3000)), int(pick.integers(1, 130)),
                      int(pick.integers(1, 60)), bool(pick.integers(0, 2))))
    for words, n, batch, steps, bootstrap in cases:
        cfg = TrainConfig(local_steps=steps, batch_size=batch)
        rows, batches = round_draws(words, n, cfg, bootstrap)
        want_rows, want = _numpy_round_draws(words, n, cfg, bootstrap)
        assert (rows is None) == (want_rows is None)
        if rows is not None:
            assert rows.dtype == want_rows.dtype and np.array_equal(rows, want_rows), words
        assert len(batches) == len(want)
        for got, exp in zip(batches, want):
            assert got.dtype == exp.dtype and np.array_equal(got, exp), (words, n, batch, steps)
        # and the generator itself, raw output by raw output
        if compiled_loaded and len(words) <= 4:
            state = np.random.SeedSequence(list(words)).generate_state(4, np.uint64)
            g = np.empty(4, dtype=np.uint64)
            compiled.pcg64(state, g)
            bits = np.random.default_rng(list(words)).bit_generator
            assert (int(g[0]) << 64 | int(g[1])) == bits.state["state"]["state"]
            assert (int(g[2]) << 64 | int(g[3])) == bits.state["state"]["inc"]


def test_the_draws_call_the_compiled_module_they_are_given(monkeypatch):
    """use_compiled_draws(module): the draws call that module's functions (a benchmark's timed
    wrappers of compiled_rng's), and draw the same numbers; without one it loads compiled_rng."""
    from fedcluster_app.core import compiled_rng
    from fedcluster_app.core.training import round_draws

    monkeypatch.setattr(sampling, "_compiled", None)     # restored after the test
    calls = []

    class Timed:
        def __getattr__(self, name):
            def call(*args):
                calls.append(name)
                return getattr(compiled_rng, name)(*args)
            return call

    sampling.use_compiled_draws(Timed())
    cfg = TrainConfig(local_steps=5, batch_size=8)
    rows, batches = round_draws((1, 2, 3), 300, cfg, bootstrap=True)
    want_rows, want = _numpy_round_draws((1, 2, 3), 300, cfg, True)
    assert np.array_equal(rows, want_rows) and all(map(np.array_equal, batches, want))
    assert calls == ["fresh_draws"]
    sampling.seeded(4, 5)
    assert calls == ["fresh_draws", "seed_state"]
    sampling.use_compiled_draws()
    assert sampling._compiled is compiled_rng


def test_round_draws_in_epochs_and_without_data_go_through_numpy():
    """Whole epochs (local-steps = 0) and an empty client draw as before."""
    from fedcluster_app.core.training import round_draws

    cfg = TrainConfig(local_steps=0, local_epochs=2, batch_size=8)
    rows, batches = round_draws((1, 2, 3), 30, cfg, bootstrap=True)
    rng = np.random.default_rng([1, 2, 3])
    want = np.repeat(np.arange(30), rng.poisson(1.0, size=30))
    assert np.array_equal(rows, want)
    assert all(np.array_equal(b, w) for b, w in zip(batches, batch_indices(len(want), cfg, rng)))
    assert len(round_draws((1,), 0, TrainConfig(local_steps=5), False)[1]) == 5


def test_round_draws_redraw_after_lemire_rejections(monkeypatch):
    """Over 2**26 rows about 1 bounded draw in 130 is rejected and redrawn, so the compiled
    call needs more words than it first made: it makes them and still equals NumPy."""
    from fedcluster_app.core import compiled_rng as compiled
    from fedcluster_app.core.training import round_draws

    monkeypatch.setattr(sampling, "_compiled", compiled)
    n, cfg = 2**26, TrainConfig(local_steps=200, batch_size=2)
    rows, batches = round_draws((3, 1), n, cfg)
    rng = np.random.default_rng([3, 1])
    want = [rng.choice(n, size=2, replace=False) for _ in range(200)]
    assert rows is None and all(np.array_equal(b, w) for b, w in zip(batches, want))
    plain = np.random.default_rng([3, 1])
    plain.bit_generator.random_raw(300)     # 3 words per draw of 2, without rejections
    assert plain.bit_generator.state != rng.bit_generator.state   # rejections drew more words
