"""The compiled MLP trainer (``core/client/compiled_mlp.py`` behind ``core/client/kernels.py``): NumPy's sums,
PyTorch's training, for any number of classes and both optimizers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedcluster_app.core.client import compiled_mlp as compiled
from fedcluster_app.core.config import TrainConfig
from fedcluster_app.core.client.kernels import numpy_train, numpy_train_many
from fedcluster_app.core.models import ModelSpec, build_model, get_weights, set_weights
from fedcluster_app.core.training import batch_indices, local_train


@pytest.mark.parametrize("n", [1, 2, 7, 8, 9, 16, 23, 128, 129, 200, 257, 1000, 4099])
def test_class_sums_are_numpys(n):
    """Softmax normalisers over 8 classes or more are summed in NumPy's pairwise order."""
    a = np.random.default_rng(n).random((4, n))
    for i in range(4):
        assert compiled._pairwise(a, i, n) == np.add.reduce(a[i])


@pytest.mark.parametrize("classes,hidden,opt", [(2, 4, "adam"), (3, 6, "sgd"), (7, 16, "adam"),
                                                (10, 32, "sgd")])
def test_trainer_matches_torch_for_any_number_of_classes(classes, hidden, opt):
    spec = ModelSpec("mlp", (5,), classes, hidden)
    model = build_model(spec, 0)
    w0 = get_weights(model)
    rng = np.random.default_rng(classes)
    x = rng.random((400, 5)).astype(np.float32)
    y = (x @ rng.normal(size=5) * classes % classes).astype(np.int64) % classes
    for steps in (25, 0):                                 # 0: one epoch, a partial last batch
        cfg = TrainConfig(optimizer=opt, lr=0.01, weight_decay=1e-3, local_steps=steps,
                          batch_size=48, momentum=0.5 if opt == "sgd" else 0.0)
        set_weights(model, w0)
        torch_loss = local_train(model, x, y, cfg, np.random.default_rng(1))
        fast, fast_loss = numpy_train(w0, x, y, cfg, np.random.default_rng(1))
        assert fast_loss == pytest.approx(torch_loss, rel=1e-5)
        for a, b in zip(get_weights(model), fast):
            np.testing.assert_allclose(a, b, atol=2e-5)


def test_each_job_trains_as_if_alone_exactly():
    """The loop runs each stacked job on its own rows: a job's result does not depend on its
    batch mates, to the last bit."""
    cfg = TrainConfig(optimizer="adam", lr=0.01, weight_decay=1e-3, local_steps=15, batch_size=20)
    rng = np.random.default_rng(7)
    jobs = []
    for k in range(4):
        w = [rng.normal(size=(4, 2)), rng.normal(size=4), rng.normal(size=(2, 4)), rng.normal(size=2)]
        x = rng.random((60 + 10 * k, 2))
        y = (x[:, 0] > x[:, 1]).astype(np.int64)
        jobs.append((w, x, y, batch_indices(len(y), cfg, np.random.default_rng(k))))
    together = numpy_train_many(jobs, cfg)
    for job, (weights, loss) in zip(jobs, together):
        (alone, alone_loss), = numpy_train_many([job], cfg)
        assert loss == alone_loss
        assert all(np.array_equal(a, b) for a, b in zip(alone, weights))


def _libm_exp(a: np.ndarray) -> np.ndarray:
    """libm's exp of every element (``math.exp`` calls it), what the compiled trainer calls.
    NumPy's ``np.exp`` is the same function on processors without AVX-512; on those with it,
    NumPy runs its own vectorised exp, which can differ in the last bit."""
    return np.array([math.exp(v) for v in a.ravel()]).reshape(a.shape)


@pytest.mark.parametrize("classes", [2, 3])
def test_shifted_exp_is_libms_exp_of_the_differences(classes):
    """exp(score - max) per sample: with two classes the larger class's exp(+0) is skipped;
    ties, infinities and NaN give what libm's exp gives."""
    rng = np.random.default_rng(classes)
    p = rng.normal(size=(classes, 400)) * 30
    p[:, :40] = p[0, :40]                                      # ties
    specials = [np.inf, -np.inf, np.nan, 0.0, -0.0]
    for j in range(40, 140):
        p[rng.integers(classes), j] = specials[j % len(specials)]
    top = np.maximum.reduce(p, axis=0)                         # NaN wins, as in the trainer
    with np.errstate(invalid="ignore"):                        # inf - inf
        want = _libm_exp(p - top)                              # differences <= 0 or NaN
    got = p.copy()
    compiled._shifted_exp(got, top, classes, p.shape[1])
    np.testing.assert_array_equal(got, want)                   # equal, NaN where NaN
    assert np.array_equal(np.signbit(got), np.signbit(want))


def _gradients_one_entry_at_a_time(delta, inputs, n, g, gb):
    """The layer gradients summed as the BLAS product and NumPy did: every entry its own
    running sum, one sample after the other."""
    rows, cols = g.shape
    for r in range(rows):
        for c in range(cols):
            g[r, c] = 0.0
        gb[r] = delta[r, 0]
    for i in range(n):
        for r in range(rows):
            for c in range(cols):
                g[r, c] = compiled._fma(delta[r, i], inputs[c, i], g[r, c])
            if i > 0:
                gb[r] = gb[r] + delta[r, i]


@pytest.mark.parametrize("rows,cols", [(2, 4), (4, 2), (3, 5), (1, 1), (7, 3)])
def test_layer_gradients_keep_each_entrys_order(rows, cols):
    """Four entries' sums side by side, in registers, are the same numbers, to the last bit,
    as each entry summed alone (also when the entries are not a multiple of four)."""
    import numba

    reference = numba.njit(_gradients_one_entry_at_a_time)
    rng = np.random.default_rng(rows * 10 + cols)
    for n in (1, 5, 50):
        delta, inputs = rng.normal(size=(rows, 60)), rng.normal(size=(cols, 60))
        g, gb = np.empty((rows, cols)), np.empty(rows)
        g_ref, gb_ref = np.empty((rows, cols)), np.empty(rows)
        compiled._layer_gradients(delta, inputs, n, g, gb)
        reference(delta, inputs, n, g_ref, gb_ref)
        assert np.array_equal(g, g_ref) and np.array_equal(gb, gb_ref)


def test_update_norm_is_the_same_number_compiled():
    """The compiled update norm (strategy.SentModel, once the compiled trainer is loaded) equals
    update_norm's NumPy form to the last bit: arrays of any size (NumPy's pairwise sums from 8
    on), float16/32/64, int arrays skipped, empty arrays, and a norm against zeros (the
    model's own scale)."""
    import math
    import sys

    from fedcluster_app.core.server.updates import SentModel, update_norm

    rng = np.random.default_rng(0)
    assert "fedcluster_app.core.client.compiled_mlp" in sys.modules      # imported above
    for k in range(600):
        shapes = [tuple(rng.integers(0 if k % 11 == 0 else 1, 12, size=rng.integers(0, 3)))
                  for _ in range(rng.integers(1, 6))] + ([(300, 7)] if k % 50 == 0 else [])
        dtype = (np.float32, np.float64, np.float16)[k % 3]
        w, s = ([(rng.normal(size=shape) * 10 ** rng.uniform(-3, 3)).astype(dtype)
                 for shape in shapes] for _ in range(2))
        if k % 7 == 0:
            w.append(np.arange(3))
            s.append(np.arange(5, 8))
        sent = SentModel(s, tuple(a.shape for a in s), tuple(a.dtype for a in s))
        if all(type(a) is np.ndarray for a in s):              # (a 0-d draw is a NumPy scalar)
            assert sent.flat is not None                       # the compiled sums, not NumPy's
        assert sent.update_norm(w) == update_norm(w, s)
        size = math.sqrt(sum(a.size for a in s if a.dtype.kind == "f") or 1)
        assert sent.scale == max(1.0, update_norm(s, [0.0] * len(s)) / size)


def test_sent_model_norms_are_update_norms(monkeypatch):
    """The exchange's cached form of the update check (strategy.SentModel) gives update_norm's
    number for replies of the run's shapes and dtypes, falls back to it for a model of other
    dtypes or shapes, and computes the scale as the check did (RMS weight, at least 1)."""
    import math
    import sys

    from fedcluster_app.core.server.updates import SentModel, update_norm

    rng = np.random.default_rng(1)
    shapes = ((4, 2), (4,), (2, 4), (2,), (3,))
    dtypes = (np.dtype(np.float32),) * 4 + (np.dtype(np.int64),)

    def model(scale, dt=dtypes, sh=shapes):
        return [(rng.normal(size=s) * scale).astype(d) for s, d in zip(sh, dt)]

    for scale in (1e-3, 1.0, 1e3):
        assert "fedcluster_app.core.client.compiled_mlp" in sys.modules      # the compiled norm first
        sent = model(scale)
        cached = SentModel(sent, shapes, dtypes)
        assert cached.flat is not None
        size = math.sqrt(8 + 4 + 8 + 2)
        assert cached.size == size
        assert cached.scale == max(1.0, update_norm(sent, [0.0] * 5) / size)
        replies = [model(scale * f) for f in (0.5, 1.0, 2.0) for _ in range(30)]
        assert [cached.update_norm(w) for w in replies] == [update_norm(w, sent) for w in replies]
        monkeypatch.delitem(sys.modules, "fedcluster_app.core.client.compiled_mlp")   # a deployed server
        assert [cached.update_norm(w) for w in replies] == [update_norm(w, sent) for w in replies]
        assert SentModel(sent, shapes, dtypes).scale == cached.scale
        monkeypatch.undo()
    other = model(1.0, dt=(np.dtype(np.float64),) * 5)       # not the run's dtypes
    assert SentModel(other, shapes, dtypes).flat is None
    reply = model(1.0, dt=(np.dtype(np.float64),) * 5)
    assert SentModel(other, shapes, dtypes).update_norm(reply) == update_norm(reply, other)
    assert SentModel(sent, shapes[:4], dtypes).flat is None    # not the run's shapes
