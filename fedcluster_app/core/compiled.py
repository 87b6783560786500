"""The project's compiled loops (Numba), imported only where they run, so that importing the
package (and ``fedcluster list``) does not load Numba. Compiled once per machine and cached on
disk beside this file.

* ``seed_state``: the generator state NumPy's ``SeedSequence`` makes of a few 32-bit words
  (``core/sampling.py``, ``seeded``);
* ``pcg64``, ``next_raw``, ``fresh_draws``: NumPy's PCG64 generator, and what a fresh one
  draws for a round's training (a bootstrap's Poisson counts, the minibatches;
  ``core/sampling.py``, ``fresh_draws``);
* ``replay``: NumPy's ``Generator.choice(n, size, replace=False)`` (bounded draws, Floyd's
  algorithm, the Fisher-Yates shuffle) on a generator's raw 64-bit outputs (``core/sampling.py``);
* ``train_mlp``: the local training of stacked one-hidden-layer MLPs (``core/kernels.py``);
* ``squared_distances``: the squared norm of a model's update (``core/strategy.py``,
  ``SentModel``);
* ``nearest_l1``: Fielding's full k-means assignment pass on sparse label vectors
  (``families/fielding/clustering.py``).

Each states NumPy's arithmetic operation by operation, so that they give the numbers NumPy
gives: the same draws; for the MLP, the same IEEE operations in the same order (products summed
with fused multiply-adds one term after the other, as OpenBLAS's double-precision kernels do;
NumPy's orders for sums over an axis; libm's ``exp`` and ``log``). libm's are NumPy's own on
processors without AVX-512; on those with it NumPy runs vectorised ``exp`` and ``log`` of its
own, which can differ in the last bit, and the compiled trainer still gives libm's numbers.
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


# ------------------------------------------------------------------ one-hidden-layer MLP training
@intrinsic
def _fma(typingctx, a, b, c):
    """a * b + c rounded once (the fused multiply-add BLAS kernels accumulate products with)."""
    def codegen(context, builder, signature, args):
        d = ir.DoubleType()
        fn = builder.module.declare_intrinsic("llvm.fma", [d], ir.FunctionType(d, [d, d, d]))
        return builder.call(fn, args)
    return types.float64(types.float64, types.float64, types.float64), codegen


@numba.njit(cache=True, nogil=True, inline="always")
def _maximum(a, b):
    """``np.maximum``: NaN wins."""
    return a if (a >= b or a != a) else b


@numba.njit(cache=True, nogil=True)
def _pairwise_block(p, i, lo, n):
    """NumPy's pairwise sum of ``p[i, lo:lo + n]`` for n <= 128: one term after the other below
    8, else eight running partial sums."""
    if n < 8:
        s = 0.0
        for c in range(lo, lo + n):
            s = s + p[i, c]
        return s
    r = np.empty(8)
    for j in range(8):
        r[j] = p[i, lo + j]
    c = 8
    while c < n - n % 8:
        for j in range(8):
            r[j] = r[j] + p[i, lo + c + j]
        c += 8
    s = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
    while c < n:
        s = s + p[i, lo + c]
        c += 1
    return s


@numba.njit(cache=True, nogil=True)
def _pairwise(p, i, n):
    """NumPy's pairwise sum of ``p[i, :n]``: blocks of at most 128, beyond that the two halves
    (the first a multiple of 8) summed apart and added. Written with its own stack, as Numba's
    disk cache does not hold recursive functions."""
    if n <= 128:
        return _pairwise_block(p, i, 0, n)
    los = np.empty(64, dtype=np.int64)
    ns = np.empty(64, dtype=np.int64)
    left = np.empty(64)
    right_pending = np.zeros(64, dtype=np.bool_)   # the left half is summed, the right is next
    top = 0
    los[0], ns[0] = 0, n
    while True:
        lo, m = los[top], ns[top]
        if m > 128:                                 # split: the left half goes first
            half = m // 2
            half -= half % 8
            los[top + 1], ns[top + 1] = lo, half
            right_pending[top + 1] = False
            top += 1
            continue
        value = _pairwise_block(p, i, lo, m)
        while True:                                 # hand the value to the frames above
            top -= 1
            if top < 0:
                return value
            if not right_pending[top]:
                left[top] = value
                right_pending[top] = True
                half = ns[top] // 2
                half -= half % 8
                los[top + 1], ns[top + 1] = los[top] + half, ns[top] - half
                right_pending[top + 1] = False
                top += 1
                break
            value = left[top] + value


@numba.njit(cache=True, nogil=True)
def _row_sum(p, i, C):
    """``p[i].sum()`` over the classes as the kernel's NumPy form added them: one after the
    other below 8 classes, NumPy's pairwise sum from 8 on."""
    if C < 8:
        s = p[i, 0]
        for c in range(1, C):
            s = s + p[i, c]
        return s
    return _pairwise(p, i, C)


@numba.njit(cache=True, nogil=True, inline="always")
def _layer_forward(inputs, w, b, n, out):
    """A layer's pre-activations for the first n samples, sample-major: out[r, i] = the sum
    over c of inputs[c, i] w[r, c] (fused multiply-adds one term after the other, as the BLAS
    product did), then + b[r] (NumPy's separate add)."""
    rows, cols = w.shape
    for r in range(rows):
        for i in range(n):
            out[r, i] = 0.0
        for c in range(cols):
            wc = w[r, c]
            for i in range(n):
                out[r, i] = _fma(inputs[c, i], wc, out[r, i])
        br = b[r]
        for i in range(n):
            out[r, i] = out[r, i] + br


@numba.njit(cache=True, nogil=True, inline="always")
def _layer_gradients(delta, inputs, n, g, gb):
    """A layer's weight gradient g = delta inputs^T over the first n samples (each entry's
    products summed one sample after the other with fused multiply-adds, every entry its own
    running sum, as the BLAS product did) and its bias gradient gb = delta summed over the
    samples (one after the other, as NumPy sums over that axis).

    Each entry's running sum is a chain of n dependent fused multiply-adds; four entries'
    chains are kept in registers side by side (a group's last entries repeat its last one when
    fewer are left), so the processor overlaps them. One entry after the other, each sum
    stored back to memory every sample, took the trainer 1.33x longer (bit for bit the same)."""
    rows, cols = g.shape
    E = rows * cols
    for e in range(0, E, 4):
        e1, e2, e3 = min(e + 1, E - 1), min(e + 2, E - 1), min(e + 3, E - 1)
        r0, c0 = e // cols, e % cols
        r1, c1 = e1 // cols, e1 % cols
        r2, c2 = e2 // cols, e2 % cols
        r3, c3 = e3 // cols, e3 % cols
        a0 = a1 = a2 = a3 = 0.0
        for i in range(n):
            a0 = _fma(delta[r0, i], inputs[c0, i], a0)
            a1 = _fma(delta[r1, i], inputs[c1, i], a1)
            a2 = _fma(delta[r2, i], inputs[c2, i], a2)
            a3 = _fma(delta[r3, i], inputs[c3, i], a3)
        g[r3, c3] = a3
        g[r2, c2] = a2
        g[r1, c1] = a1
        g[r0, c0] = a0
    for r in range(rows):
        s = delta[r, 0]
        for i in range(1, n):
            s = s + delta[r, i]
        gb[r] = s


@numba.njit(cache=True, nogil=True, inline="always")
def _shifted_exp(p, top, C, n):
    """p[c, i] = exp(p[c, i] - top[i]) for the first n samples (libm's ``exp``: NumPy's on
    processors without AVX-512, module docstring).
    With two classes one call per sample: ``top`` is the larger score, so that class's
    difference is +0 and exp(+0) = 1 exactly (the exp calls were a third of the trainer)."""
    if C == 2:
        for i in range(n):
            o = p[0, i] - top[i]
            q = p[1, i] - top[i]
            if o != 0.0 and q != 0.0:          # only with a NaN or an infinity
                p[0, i] = np.exp(o)
                p[1, i] = np.exp(q)
                continue
            first = o == 0.0                   # selects, not branches: which class is the
            e = np.exp(q if first else o)      # larger is random
            p[0, i] = 1.0 if first else e
            p[1, i] = e if first else 1.0
        return
    for c in range(C):
        for i in range(n):
            p[c, i] = np.exp(p[c, i] - top[i])


@numba.njit(cache=True, nogil=True, error_model="numpy")
def train_mlp(flat, X, Y, start, rows, sizes, dims, adam, momentum, wd, lr, c1, c2,
              first_momentum, m, v, vmax, picked):
    """Train M stacked MLPs (rows of ``flat``: w1 (h, d), b1 (h), w2 (C, h), b2 (C), raveled)
    for ``len(sizes)`` minibatch steps, in place.

    Row k trains on X[start[k] + rows[k, s, i]], Y[...] for i < ``sizes[s]`` at step s (X: all
    jobs' data, one after the other, float64); cross-entropy averaged over the minibatch; then
    Adam with amsgrad and L2
    weight decay as ``torch.optim.Adam`` (``c1[s, k]`` = lr / (1 - beta1^t), ``c2[s, k]`` =
    1 / sqrt(1 - beta2^t) for row k at step s), SGD with momentum (``first_momentum[k]``: the
    row's buffer starts as its first gradient), or plain SGD. ``m``, ``v``, ``vmax`` are the
    optimizer's buffers (continued and left in place); ``picked[s, k, i]`` receives p(y | x)
    of sample i of step s, from which the caller takes the loss."""
    d, h, C = dims[0], dims[1], dims[2]
    M = flat.shape[0]
    o_b1 = h * d
    o_w2 = o_b1 + h
    o_b2 = o_w2 + C * h
    P = flat.shape[1]
    B = rows.shape[2]
    # sample-major buffers (feature x sample): the loops over a minibatch's samples run
    # innermost and vectorise; every element still sees the same operations in the same order
    xT = np.empty((d, B))
    y = np.empty(B, dtype=np.int64)
    z1 = np.empty((h, B))
    a1 = np.empty((h, B))
    p = np.empty((C, B))
    d1 = np.empty((h, B))
    top = np.empty(B)
    total = np.empty(B)
    col = np.empty((B, C))                      # a sample's class scores, for sums over >= 8
    grad = np.empty(P)
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    for k in range(M):
        w = flat[k]
        w1 = w[:o_b1].reshape((h, d))
        b1 = w[o_b1:o_w2]
        w2 = w[o_w2:o_b2].reshape((C, h))
        b2 = w[o_b2:]
        g1 = grad[:o_b1].reshape((h, d))
        gb1 = grad[o_b1:o_w2]
        g2 = grad[o_w2:o_b2].reshape((C, h))
        gb2 = grad[o_b2:]
        t = 0
        for s in range(sizes.shape[0]):
            n = sizes[s]
            if n == 0:
                continue
            t += 1
            for i in range(n):
                r = start[k] + rows[k, s, i]
                y[i] = Y[r]
                for q in range(d):
                    xT[q, i] = X[r, q]
            # forward: z1 = x w1^T + b1, a1 = relu(z1), p = softmax(a1 w2^T + b2)
            _layer_forward(xT, w1, b1, n, z1)
            for j in range(h):
                for i in range(n):
                    a1[j, i] = _maximum(z1[j, i], 0.0)
            _layer_forward(a1, w2, b2, n, p)
            for i in range(n):
                top[i] = p[0, i]
            for c in range(1, C):
                for i in range(n):
                    top[i] = _maximum(top[i], p[c, i])
            _shifted_exp(p, top, C, n)
            if C < 8:                           # one class after the other, as NumPy's chain
                for i in range(n):
                    total[i] = p[0, i]
                for c in range(1, C):
                    for i in range(n):
                        total[i] = total[i] + p[c, i]
            else:
                for i in range(n):
                    for c in range(C):
                        col[i, c] = p[c, i]
                    total[i] = _pairwise(col, i, C)
            for c in range(C):
                for i in range(n):
                    p[c, i] = p[c, i] / total[i]
            for i in range(n):
                picked[s, k, i] = p[y[i], i]
                p[y[i], i] = p[y[i], i] - 1.0
            for c in range(C):
                for i in range(n):
                    p[c, i] = p[c, i] / n
            # backward: gradients of the mean cross-entropy (products summed over the
            # samples one after the other, every (row, column) its own running sum)
            _layer_gradients(p, a1, n, g2, gb2)
            for j in range(h):
                for i in range(n):
                    d1[j, i] = 0.0
                for c in range(C):
                    wc = w2[c, j]
                    for i in range(n):
                        d1[j, i] = _fma(p[c, i], wc, d1[j, i])
                for i in range(n):
                    d1[j, i] = d1[j, i] * (1.0 if z1[j, i] > 0 else 0.0)
            _layer_gradients(d1, xT, n, g1, gb1)
            # the optimizer step, element by element as torch.optim does it
            if wd != 0.0:
                for e in range(P):
                    grad[e] = grad[e] + w[e] * wd
            if adam:
                a, b = c1[s, k], c2[s, k]
                for e in range(P):
                    g = grad[e]
                    m[k, e] = m[k, e] * beta1 + g * (1 - beta1)
                    v[k, e] = v[k, e] * beta2 + (g * g) * (1 - beta2)
                    vmax[k, e] = _maximum(vmax[k, e], v[k, e])
                    w[e] = w[e] - (m[k, e] / (np.sqrt(vmax[k, e]) * b + eps)) * a
            elif momentum != 0.0:
                for e in range(P):
                    if t == 1 and first_momentum[k]:
                        m[k, e] = grad[e]
                    else:
                        m[k, e] = m[k, e] * momentum + grad[e]
                    w[e] = w[e] - m[k, e] * lr
            else:
                for e in range(P):
                    w[e] = w[e] - grad[e] * lr


@numba.njit(cache=True, nogil=True, error_model="numpy")
def mean_losses(picked, sizes):
    """Each row's training loss from ``train_mlp``'s ``picked``: the mean over steps of the
    step's mean cross-entropy, -log p(y | x), in NumPy's order: a step's mean sums its samples
    pairwise; the steps' means are added one after the other, or pairwise for a single row
    (NumPy then reduces one contiguous axis)."""
    steps, M = picked.shape[0], picked.shape[1]
    out = np.zeros(M)
    logs = np.empty((1, picked.shape[2]))
    means = np.empty((1, steps))
    for k in range(M):
        used = 0
        for s in range(steps):
            n = sizes[s]
            if n == 0:
                continue
            for i in range(n):
                logs[0, i] = np.log(picked[s, k, i])
            means[0, used] = _pairwise(logs, 0, n) / n
            used += 1
        if used == 0:
            continue
        if M == 1:
            total = _pairwise(means, 0, used)
        else:
            total = means[0, 0]
            for s in range(1, used):
                total = total + means[0, s]
        out[k] = -(total / used)
    return out


@numba.njit(cache=True, nogil=True)
def squared_distances(a, b, sizes):
    """The sum over segments (``sizes``: the lengths of the arrays concatenated in the float64
    ``a`` and ``b``) of ``np.add.reduce((a - b) ** 2)`` over the segment, the segments' sums
    added one after the other: ``strategy.update_norm``'s squared norm, the same number
    (``strategy.SentModel`` calls it)."""
    buf = np.empty((1, max(sizes.max(), 1)))
    total = 0.0
    lo = 0
    for e in range(sizes.shape[0]):
        n = sizes[e]
        for i in range(n):
            d = a[lo + i] - b[lo + i]
            buf[0, i] = d * d
        total = total + (_pairwise(buf, 0, n) if n > 0 else 0.0)
        lo += n
    return total


@numba.njit(cache=True, nogil=True, error_model="numpy")
def nearest_l1(cols, vals, xnorm, centers, cnorm, eps, labels, upper, lower):
    """Fielding's full assignment pass for non-negative sparse rows and R restarts of K
    non-negative centers (``centers``: R x K x d, ``cnorm``: R x K), into ``labels``,
    ``upper``, ``lower`` (R x N). The rows come slot by slot (``cols``, ``vals``: L x N, a
    row's j-th stored entry in slot j, padded with column 0, value 0), so that every loop runs
    over the N rows (vectorised).

    The distance is |x - c|_1 = (sum_{y in supp x} min(x_y, c_y)) * -2 + |x|_1 + |c|_1, the
    minima added slot after slot, as ``_L1Entries.to_pairs`` adds them (the same numbers, bit
    for bit; a padding slot adds +0). Then ``_argmin0``'s choice: the minimum plus ``eps`` is
    the upper bound, the label the lowest k >= 1 within it (else 0); ``lower`` is the nearest
    other center (inf for K = 1), as ``_exclude`` + ``_min0``. One pass per restart, without
    the R x K x N distance array."""
    L, n = cols.shape
    R, K, _ = centers.shape
    dist = np.empty((K, n))
    for r in range(R):
        for k in range(K):
            c, row = centers[r, k], dist[k]
            for i in range(n):
                a, b = c[cols[0, i]], vals[0, i]
                row[i] = a if a < b else b
            for t in range(1, L):
                for i in range(n):
                    a, b = c[cols[t, i]], vals[t, i]
                    row[i] += a if a < b else b
            for i in range(n):
                row[i] = (row[i] * -2.0 + xnorm[i]) + cnorm[r, k]
        bound, lab, other = upper[r], labels[r], lower[r]
        bound[:] = dist[0]
        for k in range(1, K):
            for i in range(n):
                bound[i] = min(bound[i], dist[k, i])
        if eps != 0.0:
            for i in range(n):
                bound[i] += eps
        lab[:] = 0
        for k in range(K - 1, 0, -1):
            for i in range(n):
                if dist[k, i] <= bound[i]:
                    lab[i] = k
        other[:] = np.inf
        for k in range(K):
            for i in range(n):
                if k != lab[i] and dist[k, i] < other[i]:
                    other[i] = dist[k, i]
