"""The local training of stacked one-hidden-layer MLPs in compiled code (Numba), giving NumPy's
numbers bit for bit: ``train_mlp`` and its loss ``mean_losses`` (``core/client/kernels.py``).

It states NumPy's arithmetic operation by operation: the same IEEE operations in the same order
(products summed with fused multiply-adds one term after the other, as OpenBLAS's
double-precision kernels do; NumPy's orders for sums over an axis, ``_pairwise``; libm's ``exp``
and ``log``). libm's are NumPy's own on processors without AVX-512; on those with it NumPy runs
vectorised ``exp`` and ``log`` of its own, which can differ in the last bit, and the compiled
trainer still gives libm's numbers (``tests/core/client/test_compiled.py``).

Also here, on the same pairwise sum: ``squared_distances``, the squared norm of a model's update
(``core/server/strategy.py``, ``SentModel``, which uses it once this module is loaded, i.e. where the
trainer runs). One module for both: Numba's disk cache tracks only the file a cached function is
defined in, so a loop and the helpers it inlines stay in one file.

Imported only where it runs (``kernels.py`` loads it on first use), so that importing the package
does not load Numba; compiled once per machine and cached on disk beside this file.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic


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
