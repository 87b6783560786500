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
falls back to calling ``choice``. ``tests/test_sampling.py`` checks the equality, state after
included, over random populations, sizes, seeds and leftover halves.
"""

from __future__ import annotations

import numpy as np


def choice_batches(rng: np.random.Generator, n: int, size: int, count: int) -> list[np.ndarray]:
    """``[rng.choice(n, size=size, replace=False) for _ in range(count)]``, same values, same
    generator state afterwards, in one compiled call."""
    bits = rng.bit_generator
    if (count <= 0 or type(bits) is not np.random.PCG64 or not 0 < size <= n < 2**31
            or (n > 10000 and size > n // 50)):
        return [rng.choice(n, size=size, replace=False) for _ in range(count)]
    start = bits.state
    leftover = int(start["uinteger"]) if start["has_uint32"] else -1
    out = np.empty((count, size), dtype=np.int64)
    # Floyd and the shuffle take one word per element (bar a rare rejection): 2 per element
    need = size * count + 64
    while True:
        raw = bits.random_raw(need)
        words, kept = _replay(raw, leftover, n, size, out)
        if words >= 0:
            break
        need *= 2                      # a long run of rejections: replay with more words
        bits.state = start
    # leave the generator where `count` choice calls leave it: `words` 32-bit words taken
    # from the raw outputs, the high half of the last one kept for the next call when odd
    bits.state = start
    if kept:                           # no word drawn at all (n = size = 1): as it was
        return list(out)
    bits.random_raw((words + 1) // 2)
    end = bits.state
    end["has_uint32"] = words % 2
    if words:                          # NumPy keeps the high half of the last output it split
        end["uinteger"] = int(raw[(words - 1) // 2]) >> 32
    bits.state = end
    return list(out)


def _replay(raw: np.ndarray, leftover: int, n: int, size: int, out: np.ndarray
            ) -> tuple[int, bool]:
    """Fill ``out`` (count x size); the words taken from ``raw`` (-1: not enough of them) and
    whether the leftover half is still unused."""
    words, unused = _compiled()(raw, np.int64(leftover), np.int64(n), np.int64(size), out)
    return int(words), bool(unused)


def _compiled():
    from fedcluster_app.core import compiled     # Numba, loaded on first use

    return compiled.replay
