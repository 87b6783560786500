"""The compiled MLP trainer (``core/compiled.py`` behind ``core/kernels.py``): NumPy's sums,
PyTorch's training, for any number of classes and both optimizers."""

from __future__ import annotations

import numpy as np
import pytest

from fedcluster_app.core import compiled
from fedcluster_app.core.config import TrainConfig
from fedcluster_app.core.kernels import numpy_train, numpy_train_many
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
