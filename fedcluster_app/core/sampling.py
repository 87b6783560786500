"""Many minibatches in one call: the draws of ``rng.choice(n, size, replace=False)`` repeated.

A round of FedDrift's protocol draws 50 minibatches per client and model with
``Generator.choice``; each call costs ~17 us of Python and argument handling around a few
hundred nanoseconds of arithmetic, which made the draws the largest cost of a round (KUE draws
5,000 per round). :func:`choice_batches` returns exactly what ``count`` such calls return and
leaves the generator in exactly the state they leave it, so every seeded result stays as it
was: it takes the generator's raw 64-bit outputs in bulk and replays NumPy's own algorithm on
them in compiled code (Numba):

* each draw is ``random_bounded_uint64(0, j)``: Lemire's multiply-shift on one 32-bit word
  (the low half of a 64-bit output first, then its high half; a half left over from an
  earlier call is used first), with Lemire's rejection step;
* without replacement by Floyd's algorithm (value ``j`` when the draw was taken already),
  then shuffled by Fisher-Yates, whose draws are the same bounded draws.

This is NumPy's path for ``n <= 10000`` or ``size <= n // 50`` with the default ``PCG64`` bit
generator; anything else (another bit generator, the tail-shuffle path of large ``size``)
falls back to calling ``choice``. ``tests/core/test_sampling.py`` checks the equality, state after
included, over random populations, sizes, seeds and leftover halves.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.random.bit_generator import ISeedSequence


#: the first calls of a process draw with ``choice`` itself: loading the compiled replay costs
#: about a second, which a process that trains once (a deployment's ClientApp process per
#: message) would pay for a few milliseconds of draws; both give the same minibatches
LOOP_FIRST_CALLS = 20
_CALLS = 0
#: the compiled draws (``compiled_rng``) once loaded, a module global: an import statement per
#: call costs ~2%
_compiled = None


def use_compiled_draws(module: object = None) -> None:
    """Load the compiled draws now (``compiled_rng``, else loaded on first use), or give the
    draws ``module`` in their place: an object with ``compiled_rng``'s ``seed_state``,
    ``fresh_draws`` and ``replay`` (``benchmarks/feddrift_grid.py`` passes timed wrappers of
    them, to clock the compiled arithmetic). The numbers drawn stay NumPy's either way."""
    global _compiled
    if module is None:
        from fedcluster_app.core import compiled_rng as module
    _compiled = module


def seeded(*words: int) -> np.random.Generator:
    """``np.random.default_rng(list(words))``, the same generator in the same state. Words in
    [0, 2**32) are the 32-bit words SeedSequence makes of them, so they go in as one uint32
    array, skipping ~9 us of default_rng's argument handling (a KUE round makes 100); once
    the compiled draws are loaded, up to 4 such words are hashed there (SeedSequence's own
    hashing costs ~14 us of the ~19 us a generator takes)."""
    if all(0 <= w < 2**32 for w in words):
        if _compiled is not None and len(words) <= 4:
            state = np.empty(4, dtype=np.uint64)
            _compiled.seed_state(np.array(words, dtype=np.uint64), state)
            return np.random.Generator(np.random.PCG64(_HashedSeed(state)))
        seq = np.random.SeedSequence(np.array(words, dtype=np.uint32))
        return np.random.Generator(np.random.PCG64(seq))
    return np.random.default_rng(list(words))


class _HashedSeed(ISeedSequence):
    """A seed sequence whose PCG64 state words are already hashed (``compiled_rng.seed_state``)."""

    __slots__ = ("state",)

    def __init__(self, state: np.ndarray) -> None:
        self.state = state

    def generate_state(self, n_words: int, dtype=np.uint32) -> np.ndarray:
        if n_words != 4 or np.dtype(dtype) != np.uint64:   # PCG64 asks for exactly this
            raise ValueError("only PCG64's 4 64-bit words are hashed")
        return self.state


class Minibatches(Sequence):
    """The minibatches (rows of ``array``, count x size) as a sequence of index arrays; a
    trainer that takes them all at once reads ``array`` instead of stacking them again. The
    rows are made as they are read: the stacked kernel never reads them, and making all 50 of
    a draw up front cost a KUE round 2.6%."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, i):
        return list(self.array[i]) if isinstance(i, slice) else self.array[i]

    def __iter__(self):
        return iter(self.array)


def batch_sizes(batches: list[np.ndarray]) -> tuple[int, ...]:
    """The size of every minibatch (what decides whether jobs can train in one program)."""
    if isinstance(batches, Minibatches):
        return (batches.array.shape[1],) * batches.array.shape[0]
    return tuple(len(b) for b in batches)


def total_rows(batches: list[np.ndarray]) -> int:
    """How many rows the minibatches hold together."""
    if isinstance(batches, Minibatches):
        return batches.array.size
    return sum(map(len, batches))


def choice_batches(rng: np.random.Generator, n: int, size: int, count: int) -> list[np.ndarray]:
    """``[rng.choice(n, size=size, replace=False) for _ in range(count)]``, same values, same
    generator state afterwards, in one compiled call."""
    global _CALLS
    _CALLS += 1
    bits = rng.bit_generator
    if (count <= 0 or type(bits) is not np.random.PCG64 or not 0 < size <= n < 2**31
            or (n > 10000 and size > n // 50) or _CALLS <= LOOP_FIRST_CALLS):
        return [rng.choice(n, size=size, replace=False) for _ in range(count)]
    start = bits.state
    leftover = int(start["uinteger"]) if start["has_uint32"] else -1
    out = np.empty((count, size), dtype=np.int64)
    # one word per bounded draw: Floyd's (none for a range of one) and the shuffle's, bar
    # Lemire's rare rejections; the raw outputs are drawn as needed, so the generator ends
    # where the calls leave it
    words = count * (size - (size == n) + size - 1) - (leftover >= 0)
    raw = bits.random_raw(max(0, (words + 1) // 2))
    while True:
        words, kept = _replay(raw, leftover, n, size, out)
        if words >= 0:
            break
        raw = np.concatenate([raw, bits.random_raw(max(8, len(raw) // 8))])   # rejections
    if kept:                           # no word drawn at all (n = size = 1): as it was
        return Minibatches(out)
    if words < 2 * len(raw):           # more drawn than used: as many as the calls draw
        bits.state = start
        bits.random_raw((words + 1) // 2)
    end = bits.state
    end["has_uint32"] = words % 2      # the high half of the last output kept for the next call
    if words:                          # NumPy keeps that half even once it is used
        end["uinteger"] = int(raw[(words - 1) // 2]) >> 32
    bits.state = end
    return Minibatches(out)


def bootstrap_rows(rng: np.random.Generator, n: int) -> np.ndarray:
    """A bootstrap sample of n rows: row i taken ``Poisson(1)`` times (online bagging); all n
    rows when no row is taken."""
    rows = np.repeat(np.arange(n), rng.poisson(1.0, size=n))
    return rows if len(rows) else np.arange(n)


def fresh_draws(words: Sequence[int], n: int, size: int, count: int, bootstrap: bool
                ) -> tuple[np.ndarray | None, Minibatches] | None:
    """What a fresh generator ``rng = seeded(*words)`` draws: with ``bootstrap``, the rows
    ``bootstrap_rows(rng, n)`` (else None and all n rows), then ``choice_batches(rng, m,
    min(size, m), count)`` over those m rows; computed in one compiled call, generator
    included (a KUE round makes 100 such draws; ``benchmarks/bench_draws.py`` times one both
    ways: 88 us through NumPy's calls, 40 us so). None where that call does not apply (the
    compiled draws not loaded yet, other words, no draw, NumPy's tail-shuffle path): the
    caller then draws through ``seeded``, with the same result."""
    if (_compiled is None or count <= 0 or size <= 0 or not 0 < n < 2**31 or len(words) > 4
            or not all(0 <= w < 2**32 for w in words)):
        return None
    rows, out = _compiled.fresh_draws(np.array(words, dtype=np.uint64), n, bootstrap, size,
                                      count)
    if out.shape[0] != count:
        return None
    return (rows if bootstrap else None), Minibatches(out)


def _replay(raw: np.ndarray, leftover: int, n: int, size: int, out: np.ndarray
            ) -> tuple[int, bool]:
    """Fill ``out`` (count x size); the words taken from ``raw`` (-1: not enough of them) and
    whether the leftover half is still unused."""
    if _compiled is None:     # Numba, loaded on first use
        use_compiled_draws()
    words, unused = _compiled.replay(raw, np.int64(leftover), np.int64(n), np.int64(size), out)
    return int(words), bool(unused)
