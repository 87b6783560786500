"""NumPy's random generator replayed in compiled code (Numba), bit for bit: what a client's
fresh generator draws for a round's training, in one call (``core/sampling.py``).

* ``seed_state``: the generator state NumPy's ``SeedSequence`` makes of a few 32-bit words
  (``sampling.seeded``);
* ``pcg64``, ``next_raw``, ``fresh_draws``: NumPy's PCG64 generator, and what a fresh one draws
  for a round's training (a bootstrap's Poisson counts, the minibatches; ``sampling.fresh_draws``);
* ``replay``: NumPy's ``Generator.choice(n, size, replace=False)`` (bounded draws, Floyd's
  algorithm, the Fisher-Yates shuffle) on a generator's raw 64-bit outputs.

Each states NumPy's arithmetic operation by operation, so that it gives the draws NumPy gives
(``tests/core/test_sampling.py`` compares them). Imported only where it runs (``sampling.py`` loads
it on first use), so that importing the package does not load Numba; compiled once per machine
and cached on disk beside this file.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

u64 = np.uint64
_U32 = 0xFFFFFFFF


@numba.njit(cache=True, nogil=True)
def word(raw, cursor):
    """The next 32-bit word (``next_uint32``), or 2**32 when ``raw`` is used up."""
    if cursor[1] >= 0:                       # a half left over from before
        value = u64(cursor[1])
        cursor[1] = -1
        return value
    k = cursor[0]
    if k >= 2 * raw.shape[0]:
        return u64(1) << u64(32)
    cursor[0] = k + 1
    w = raw[k >> 1]
    return (w & u64(_U32)) if (k & 1) == 0 else (w >> u64(32))


@numba.njit(cache=True, nogil=True)
def bounded(raw, cursor, j):
    """``random_bounded_uint64(0, j)`` for 0 < j < 2**32 - 1: Lemire's multiply-shift on one
    word, with its rejection step (rarely reached); -1 when ``raw`` is used up."""
    end = u64(1) << u64(32)
    excl = u64(j + 1)
    w = word(raw, cursor)
    if w == end:
        return -1
    m = w * excl
    low = m & u64(_U32)
    if low < excl:
        threshold = (u64(_U32) - u64(j)) % excl
        while low < threshold:
            w = word(raw, cursor)
            if w == end:
                return -1
            m = w * excl
            low = m & u64(_U32)
    return np.int64(m >> u64(32))


@numba.njit(cache=True, nogil=True)
def replay(raw, leftover, n, size, out):
    cursor = np.array([0, leftover], dtype=np.int64)
    taken = np.zeros(n, dtype=np.bool_)
    for b in range(out.shape[0]):
        row = out[b]
        for j in range(n - size, n):            # Floyd
            val = 0                              # j = 0, a range of one: no word drawn
            if j > 0:
                val = bounded(raw, cursor, j)
                if val < 0:
                    return -1, False
            if taken[val]:
                val = j
            taken[val] = True
            row[j - (n - size)] = val
        for k in range(size):
            taken[row[k]] = False
        for i in range(size - 1, 0, -1):        # Fisher-Yates
            k = bounded(raw, cursor, i)
            if k < 0:
                return -1, False
            tmp = row[k]
            row[k] = row[i]
            row[i] = tmp
    return cursor[0], cursor[1] >= 0


_U32_MASK = u64(_U32)


@numba.njit(cache=True, nogil=True, inline="always")
def _hashmix(value, hash_const):
    """SeedSequence's hashmix: the mixed value and the next hash constant (uint32 arithmetic)."""
    value = value ^ hash_const[0]
    hash_const[0] = (hash_const[0] * hash_const[1]) & _U32_MASK
    value = (value * hash_const[0]) & _U32_MASK
    return value ^ (value >> u64(16))


@numba.njit(cache=True, nogil=True)
def seed_state(words, out):
    """``SeedSequence(words).generate_state(4, np.uint64)`` into ``out`` for at most 4 words
    below 2**32 (pool of 4, no spawn key): NumPy's mixing of the entropy into the pool, then
    the pool hashed into 8 32-bit words, paired little end first."""
    mix_l, mix_r = u64(0xca01f9dd), u64(0x4973f715)
    hash_const = np.array([u64(0x43b0d7e5), u64(0x931e8875)])
    pool = np.zeros(4, dtype=np.uint64)
    for i in range(4):
        pool[i] = _hashmix(u64(words[i]) if i < words.shape[0] else u64(0), hash_const)
    for src in range(4):
        for dst in range(4):
            if src != dst:
                r = (mix_l * pool[dst] - mix_r * _hashmix(pool[src], hash_const)) & _U32_MASK
                pool[dst] = r ^ (r >> u64(16))
    hash_const[0], hash_const[1] = u64(0x8b51f9dd), u64(0x58f38ded)
    for i in range(4):
        low = _hashmix(pool[(2 * i) % 4], hash_const)
        out[i] = low | (_hashmix(pool[(2 * i + 1) % 4], hash_const) << u64(32))


# ------------------------------------------------------------------ a fresh generator's draws
# NumPy's PCG64: a 128-bit LCG (state, odd increment), each output the XSL-RR of the new state.
# The generator is 4 uint64 words: state high, state low, increment high, increment low.
_MULT_HI, _MULT_LO = u64(2549297995355413924), u64(4865540595714422341)


@intrinsic
def _mulhi(typingctx, a, b):
    """The high 64 bits of the 128-bit product a * b (one machine multiply)."""
    def codegen(context, builder, signature, args):
        wide = ir.IntType(128)
        product = builder.mul(builder.zext(args[0], wide), builder.zext(args[1], wide))
        return builder.trunc(builder.lshr(product, ir.Constant(wide, 64)), ir.IntType(64))
    return types.uint64(types.uint64, types.uint64), codegen


@numba.njit(cache=True, nogil=True, inline="always")
def _step(g):
    """state = state * multiplier + increment (mod 2**128)."""
    hi, lo = g[0], g[1]
    new_lo = lo * _MULT_LO
    new_hi = _mulhi(lo, _MULT_LO) + hi * _MULT_LO + lo * _MULT_HI
    g[1] = new_lo + g[3]
    g[0] = new_hi + g[2] + (u64(1) if g[1] < new_lo else u64(0))


@numba.njit(cache=True, nogil=True, inline="always")
def next_raw(g):
    """``random_raw()``: step, then the XSL-RR output of the new state."""
    _step(g)
    x = g[0] ^ g[1]
    rot = g[0] >> u64(58)
    return (x >> rot) | (x << ((u64(64) - rot) & u64(63)))


@numba.njit(cache=True, nogil=True)
def pcg64(state, g):
    """The generator ``PCG64`` seeds from ``state`` (``SeedSequence.generate_state(4,
    np.uint64)``: initial state high/low, then the sequence high/low), into ``g``."""
    g[0], g[1] = u64(0), u64(0)
    g[2] = (state[2] << u64(1)) | (state[3] >> u64(63))
    g[3] = (state[3] << u64(1)) | u64(1)
    _step(g)
    low = g[1] + state[1]
    g[0] = g[0] + state[0] + (u64(1) if low < g[1] else u64(0))
    g[1] = low
    _step(g)


@numba.njit(cache=True, nogil=True)
def fresh_draws(words, n, bootstrap, batch, count):
    """What the generator ``default_rng(words)`` draws (at most 4 words below 2**32:
    ``seed_state``, then ``pcg64``), as NumPy computes it: with ``bootstrap``, ``counts =
    poisson(1.0, n)`` (NumPy's multiplication method for a mean below 10: uniforms
    (raw >> 11) / 2**53 multiplied until the product is at most exp(-1)) and the rows
    ``repeat(arange(n), counts)`` (all n when that is empty), else all n rows; then ``count``
    draws of ``choice(m, min(batch, m), replace=False)`` over those m rows (``replay``).
    Returns (the bootstrap's rows, the (count, size) minibatches); (rows, empty) when the
    minibatches take a path ``replay`` does not follow (the caller then draws them itself)."""
    state = np.empty(4, dtype=np.uint64)
    seed_state(words, state)
    g = np.empty(4, dtype=np.uint64)
    pcg64(state, g)
    if bootstrap:
        counts = np.empty(n, dtype=np.int64)
        limit = np.exp(-1.0)
        m = 0
        for i in range(n):
            x = 0
            prod = 1.0
            while True:
                prod = prod * (float(next_raw(g) >> u64(11)) * (1.0 / 9007199254740992.0))
                if prod > limit:
                    x += 1
                else:
                    break
            counts[i] = x
            m += x
        if m == 0:
            rows = np.arange(n)
            m = n
        else:
            rows = np.empty(m, dtype=np.int64)
            at = 0
            for i in range(n):
                for _ in range(counts[i]):
                    rows[at] = i
                    at += 1
    else:
        rows = np.empty(0, dtype=np.int64)      # all n rows: nothing to return
        m = n
    size = min(batch, m)
    if count <= 0 or size <= 0 or (m > 10000 and size > m // 50):
        return rows, np.empty((0, max(size, 0)), dtype=np.int64)
    out = np.empty((count, size), dtype=np.int64)
    needed = count * (size - (1 if size == m else 0) + size - 1)   # words, bar rejections
    raw = np.empty(max(1, (needed + 1) // 2), dtype=np.uint64)
    for i in range(raw.shape[0]):
        raw[i] = next_raw(g)
    while True:
        used, _ = replay(raw, np.int64(-1), np.int64(m), np.int64(size), out)
        if used >= 0:
            return rows, out
        more = np.empty(raw.shape[0] + max(8, raw.shape[0] // 8), dtype=np.uint64)  # rejections
        more[:raw.shape[0]] = raw
        for i in range(raw.shape[0], more.shape[0]):
            more[i] = next_raw(g)
        raw = more
