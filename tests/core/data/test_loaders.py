"""Tests of the local torchvision loaders on tiny files written in torchvision's on-disk formats."""

from __future__ import annotations

import pickle
import struct
from pathlib import Path

import numpy as np
import pytest

from fedcluster_app.core.data import StepData, build_scenario, load_image_dataset

N_TRAIN, N_TEST = 30, 12


def _write_idx(path: Path, array: np.ndarray) -> None:
    """Uncompressed IDX (MNIST) file: magic 0x0000 08 <ndim>, big-endian sizes, uint8 data."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    with open(path, "wb") as f:
        f.write(struct.pack(">BBBB", 0, 0, 0x08, array.ndim))
        f.write(struct.pack(f">{array.ndim}I", *array.shape))
        f.write(array.tobytes())


def _images(rng: np.random.Generator, n: int, shape: tuple[int, ...]) -> np.ndarray:
    x = rng.integers(0, 256, size=(n, *shape), dtype=np.uint8)
    x[0] = 0
    x[1] = 255  # make sure both ends of the range occur
    return x


def _mnist_like(root: Path, folder: str, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    raw = root / folder / "raw"
    raw.mkdir(parents=True)
    data = {
        "train_x": _images(rng, N_TRAIN, (28, 28)),
        "train_y": np.arange(N_TRAIN) % 10,  # every class
        "test_x": _images(rng, N_TEST, (28, 28)),
        "test_y": np.arange(N_TEST) % 5,  # classes 0-4 only
    }
    _write_idx(raw / "train-images-idx3-ubyte", data["train_x"])
    _write_idx(raw / "train-labels-idx1-ubyte", data["train_y"])
    _write_idx(raw / "t10k-images-idx3-ubyte", data["test_x"])
    _write_idx(raw / "t10k-labels-idx1-ubyte", data["test_y"])
    return data


def _cifar_like(root: Path, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    xs, ys = [], []
    for i in range(1, 6):
        x = _images(rng, 4, (3, 32, 32))
        y = [(4 * (i - 1) + j) % 10 for j in range(4)]
        with open(folder / f"data_batch_{i}", "wb") as f:
            pickle.dump({"batch_label": f"batch {i}", "data": x.reshape(4, -1), "labels": y,
                         "filenames": [f"{i}_{j}.png" for j in range(4)]}, f)
        xs.append(x)
        ys += y
    xt = _images(rng, 6, (3, 32, 32))
    yt = [9, 8, 7, 6, 5, 4]
    with open(folder / "test_batch", "wb") as f:
        pickle.dump({"batch_label": "test", "data": xt.reshape(6, -1), "labels": yt}, f)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": ["airplane", "automobile", "bird", "cat", "deer", "dog",
                                     "frog", "horse", "ship", "truck"]}, f)
    return {"train_x": np.concatenate(xs), "train_y": np.array(ys), "test_x": xt,
            "test_y": np.array(yt)}


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("torchvision")
    files = {
        "mnist": _mnist_like(root, "MNIST", 1),
        "fashion-mnist": _mnist_like(root, "FashionMNIST", 2),
        "cifar10": _cifar_like(root, 3),
    }
    return root, files


@pytest.mark.parametrize("name, shape", [
    ("mnist", (1, 28, 28)), ("fashion-mnist", (1, 28, 28)), ("cifar10", (3, 32, 32)),
])
@pytest.mark.parametrize("train", [True, False])
def test_load_image_dataset(data_root, name, shape, train):
    root, files = data_root
    x, y = load_image_dataset(name, str(root), train=train)
    ref = files[name]["train_x" if train else "test_x"]
    ref_y = files[name]["train_y" if train else "test_y"]
    assert x.dtype == np.float32 and y.dtype == np.int64
    assert x.shape == (len(ref_y), *shape) and y.shape == (len(ref_y),)
    assert x.min() == 0.0 and x.max() == 1.0
    np.testing.assert_array_equal(y, ref_y)
    np.testing.assert_allclose(x, ref.reshape(x.shape).astype(np.float32) / 255.0, atol=1e-7)


def test_aliases(data_root):
    root, _ = data_root
    a, _ = load_image_dataset("fmnist", str(root), train=False)
    b, _ = load_image_dataset("fashion-mnist", str(root), train=False)
    np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="unknown image dataset"):
        load_image_dataset("svhn", str(root), train=True)


@pytest.mark.parametrize("name, expected", [
    ("mnist", "MNIST/raw"), ("fashion-mnist", "FashionMNIST/raw"),
    ("cifar10", "cifar-10-batches-py"),
])
def test_missing_directory_is_a_clear_error(tmp_path, name, expected):
    with pytest.raises(FileNotFoundError) as exc:
        load_image_dataset(name, str(tmp_path / "nowhere"), train=True)
    msg = str(exc.value)
    assert name in msg and expected in msg and str(tmp_path / "nowhere") in msg
    assert "Nothing is downloaded" in msg


def test_missing_file_is_named(tmp_path):
    _cifar_like(tmp_path, 0)
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").unlink()
    with pytest.raises(FileNotFoundError, match="data_batch_3"):
        load_image_dataset("cifar10", str(tmp_path), train=False)


def test_mnist_swap_scenario_on_tiny_files(data_root):
    # fewer samples than the 30 / 12 images of the files: drawn with replacement, as on MNIST
    root, files = data_root
    s = build_scenario("mnist-swap", data_dir=str(root), samples_per_step=24, test_samples=10)
    assert (s.input_shape, s.model, s.num_classes, s.num_concepts) == ((1, 28, 28), "cnn", 10, 4)
    train_imgs = files["mnist"]["train_x"].reshape(N_TRAIN, -1).astype(np.float32) / 255
    for k, t in ((0, 1), (0, 3), (4, 5)):
        d = s.step_data(k, t)
        assert isinstance(d, StepData)
        assert d.x_train.shape == (24, 1, 28, 28) and d.x_train.dtype == np.float32
        assert d.x_test.shape == (10, 1, 28, 28) and d.y_test.dtype == np.int64
        assert 0.0 <= d.x_train.min() and d.x_train.max() <= 1.0
        # the test pool holds classes 0-4 only; labels are relabelled by the swap concept
        perm = np.arange(10)
        if t >= 3:
            a, b = (1, 2) if k < 3 else (3, 4)
            perm[[a, b]] = [b, a]
        assert set(d.y_test.tolist()) <= set(perm[:5].tolist())
        flat = d.x_train.reshape(24, -1)
        idx = [int(np.flatnonzero((train_imgs == row).all(1))[0]) for row in flat]
        np.testing.assert_array_equal(d.y_train, perm[files["mnist"]["train_y"][idx]])
    static = build_scenario("mnist-static", data_dir=str(root), samples_per_step=24,
                            test_samples=10)
    np.testing.assert_array_equal(s.step_data(0, 3).x_train, static.step_data(0, 3).x_train)


def test_other_image_scenarios_on_tiny_files(data_root):
    root, _ = data_root
    rot = build_scenario("cifar10-rotate", data_dir=str(root), samples_per_step=8,
                         test_samples=4)
    static = build_scenario("cifar10-static", data_dir=str(root), samples_per_step=8,
                            test_samples=4)
    d, d0 = rot.step_data(0, 3), static.step_data(0, 3)
    assert d.x_train.shape == (8, 3, 32, 32)
    np.testing.assert_allclose(d.x_train, np.rot90(d0.x_train, 1, (2, 3)), atol=1e-6)
    noisy = build_scenario("fmnist-noise", data_dir=str(root), samples_per_step=8,
                           test_samples=4)
    assert noisy.step_data(0, 3).x_train.shape == (8, 1, 28, 28)


def test_scenario_with_missing_data_dir(tmp_path):
    with pytest.raises(FileNotFoundError, match="MNIST"):
        build_scenario("mnist-static", data_dir=str(tmp_path / "absent"))


def test_server_side_experiment_needs_no_data_files(tmp_path):
    """In a deployment the devices hold the images; the server builds only the metadata."""
    from fedcluster_app.core.config import default_run_config, merge_overrides
    from fedcluster_app.core.experiment import load_experiment

    rc = merge_overrides(default_run_config(), {"scenario": "mnist-swap", "data-dir": ""})
    with pytest.raises(ValueError, match="data-dir"):
        load_experiment(rc)                                  # a client must have its data
    exp = load_experiment(rc, server=True)
    assert exp.scenario.num_clients == 10 and exp.spec.input_shape == (1, 28, 28)
    with pytest.raises(RuntimeError, match="data live on the clients"):
        exp.scenario.step_data(0, 1)


class _Hostile:
    """A pickle that runs code as it loads (what a poisoned data file could do)."""

    def __reduce__(self):
        import os
        return (os.system, ("touch pwned-by-a-data-file",))


def test_a_cifar_batch_that_would_run_code_is_refused(tmp_path, monkeypatch):
    _cifar_like(tmp_path, 0)
    with open(tmp_path / "cifar-10-batches-py" / "data_batch_2", "wb") as f:
        pickle.dump({"data": _Hostile(), "labels": [0]}, f)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"data_batch_2|refused: the file asks to build "
                                         r"(posix|os)\.system"):
        load_image_dataset("cifar10", str(tmp_path), train=True)
    assert not (tmp_path / "pwned-by-a-data-file").exists()
