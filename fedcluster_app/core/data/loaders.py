"""Loaders of real image datasets from a local directory, through ``torchvision.datasets``.

Nothing is ever downloaded (``download=False``): the files must already be where torchvision
keeps them under ``data_dir``:

============== ===================================================================================
name           files
============== ===================================================================================
mnist          ``<data_dir>/MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte`` (uncompressed)
fashion-mnist  ``<data_dir>/FashionMNIST/raw/`` with the same four file names
cifar10        ``<data_dir>/cifar-10-batches-py/`` with ``data_batch_1`` ... ``data_batch_5``,
               ``test_batch`` and ``batches.meta`` (the python pickles of the official archive)
============== ===================================================================================

``torchvision.datasets.MNIST(root, download=True)`` (and ``FashionMNIST``, ``CIFAR10``) run once on
a machine with network access produces exactly this layout. The CIFAR-10 batches are pickles: they
are read with an unpickler that builds nothing but data (dicts, lists, numbers, NumPy arrays), so a
hostile file in ``data_dir`` cannot run code.
"""

from __future__ import annotations

import os
import pickle
from functools import lru_cache
from pathlib import Path

import numpy as np

__all__ = ["IMAGE_DATASETS", "canonical_dataset_name", "load_image_dataset",
           "load_image_dataset_uint8"]

#: canonical name -> (torchvision class name, input shape)
IMAGE_DATASETS: dict[str, tuple[str, tuple[int, int, int]]] = {
    "mnist": ("MNIST", (1, 28, 28)),
    "fashion-mnist": ("FashionMNIST", (1, 28, 28)),
    "cifar10": ("CIFAR10", (3, 32, 32)),
}
_ALIASES = {
    "mnist": "mnist",
    "fashion-mnist": "fashion-mnist",
    "fashion_mnist": "fashion-mnist",
    "fashionmnist": "fashion-mnist",
    "fmnist": "fashion-mnist",
    "cifar10": "cifar10",
    "cifar-10": "cifar10",
    "cifar_10": "cifar10",
}
_MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
_CIFAR_DIR = "cifar-10-batches-py"
_CIFAR_FILES = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch", "batches.meta")


def canonical_dataset_name(name: str) -> str:
    """``"mnist"``, ``"fashion-mnist"`` or ``"cifar10"`` for any accepted spelling."""
    key = str(name).strip().lower()
    if key not in _ALIASES:
        raise ValueError(
            f"unknown image dataset {name!r}; valid names: {', '.join(sorted(IMAGE_DATASETS))}"
        )
    return _ALIASES[key]


def _expected(name: str, root: Path) -> tuple[Path, tuple[str, ...]]:
    if name == "cifar10":
        return root / _CIFAR_DIR, _CIFAR_FILES
    return root / IMAGE_DATASETS[name][0] / "raw", _MNIST_FILES


def _check_files(name: str, root: Path) -> None:
    """Raise a FileNotFoundError that says what is missing where, before torchvision's own
    (download-oriented) error message could."""
    folder, files = _expected(name, root)
    if name != "cifar10":
        # torchvision also accepts its legacy pre-processed tensors
        processed = root / IMAGE_DATASETS[name][0] / "processed"
        if (processed / "training.pt").is_file() and (processed / "test.pt").is_file():
            return
    missing = [f for f in files if not (folder / f).is_file()]
    if missing:
        where = "directory does not exist" if not folder.is_dir() else (
            "missing: " + ", ".join(missing))
        raise FileNotFoundError(
            f"{name}: expected the torchvision {name} files under {str(folder)!r} "
            f"({where}; needs: {', '.join(files)}). Nothing is downloaded at run time: copy the "
            f"dataset there (torchvision.datasets.{IMAGE_DATASETS[name][0]}(root, download=True) "
            "on a machine with network access creates this layout) and pass its root as data-dir."
        )


class _DataOnlyUnpickler(pickle.Unpickler):
    """Unpickles plain data only: dicts, lists, strings, numbers and NumPy arrays, which is all
    the CIFAR-10 batches hold. Any other global (a function a hostile file would call as it
    loads, such as ``os.system``) is refused, so a data file cannot run code."""

    ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"),
        ("copy_reg", "_reconstructor"), ("copyreg", "_reconstructor"),
        ("__builtin__", "object"), ("builtins", "object"),
    }

    def find_class(self, module: str, name: str):
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refused: the file asks to build {module}.{name}, which "
                                     "a data file never needs")


def _read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One batch of the CIFAR-10 python version: ``(N, 3, 32, 32)`` uint8 images and labels."""
    try:
        with path.open("rb") as fh:
            entry = _DataOnlyUnpickler(fh, encoding="latin1").load()
    except pickle.UnpicklingError as exc:
        raise ValueError(f"{path}: {exc}") from None
    if not isinstance(entry, dict) or "data" not in entry:
        raise ValueError(f"{path.name} is not a CIFAR-10 batch (a dict with 'data' and 'labels')")
    labels = entry.get("labels", entry.get("fine_labels"))
    x = np.asarray(entry["data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
    return x, np.asarray(labels, dtype=np.int64)


def _load_cifar10(folder: Path, train: bool) -> tuple[np.ndarray, np.ndarray]:
    names = [f"data_batch_{i}" for i in range(1, 6)] if train else ["test_batch"]
    parts = [_read_cifar_batch(folder / n) for n in names]
    return (np.ascontiguousarray(np.concatenate([p[0] for p in parts])),
            np.concatenate([p[1] for p in parts]))


@lru_cache(maxsize=6)
def _load_cached(name: str, root: str, train: bool) -> tuple[np.ndarray, np.ndarray]:
    path = Path(root)
    _check_files(name, path)
    try:
        if name == "cifar10":   # read here, not by torchvision: nothing but data is unpickled
            x, y = _load_cifar10(path / _CIFAR_DIR, train)
        else:
            import torchvision.datasets as tvd

            cls = getattr(tvd, IMAGE_DATASETS[name][0])
            ds = cls(root=root, train=train, download=False)
            x = np.ascontiguousarray(ds.data.numpy().astype(np.uint8)[:, None, :, :])
            y = ds.targets.numpy().astype(np.int64)
    except FileNotFoundError:
        raise
    except Exception as exc:  # corrupt or foreign files: say which dataset and where
        folder, _ = _expected(name, path)
        raise ValueError(f"{name}: could not read the files under {str(folder)!r}: {exc}") from exc
    if x.shape[1:] != IMAGE_DATASETS[name][1]:
        raise ValueError(
            f"{name}: images under {root!r} have shape {x.shape[1:]}, expected "
            f"{IMAGE_DATASETS[name][1]}"
        )
    if len(x) != len(y):
        raise ValueError(f"{name}: {len(x)} images but {len(y)} labels under {root!r}")
    if len(y) and (y.min() < 0 or y.max() > 9):
        raise ValueError(f"{name}: labels under {root!r} must be in 0..9")
    x.setflags(write=False)
    y.setflags(write=False)
    return x, y


def load_image_dataset_uint8(name: str, data_dir: str, train: bool
                             ) -> tuple[np.ndarray, np.ndarray]:
    """Like :func:`load_image_dataset` but the images stay ``uint8`` (0..255); the arrays are
    cached and read-only."""
    canonical = canonical_dataset_name(name)
    if not str(data_dir).strip():
        raise ValueError(f"{canonical}: data_dir is empty; give the directory holding the dataset")
    root = os.path.abspath(os.path.expanduser(str(data_dir)))
    return _load_cached(canonical, root, bool(train))


def load_image_dataset(name: str, data_dir: str, train: bool) -> tuple[np.ndarray, np.ndarray]:
    """Load a local torchvision dataset: ``name`` in ``{"mnist", "fashion-mnist", "cifar10"}``
    (also ``"fmnist"``, ``"cifar-10"``), the train or test split.

    Returns ``(x, y)``: ``x`` ``float32`` of shape ``(N, C, H, W)`` in ``[0, 1]``, ``y`` ``int64``.

    Raises:
        FileNotFoundError: a directory or file is missing (the message names the dataset and the
            expected path, and says that nothing is downloaded).
        ValueError: unknown name, empty ``data_dir``, or files that cannot be parsed.
    """
    x, y = load_image_dataset_uint8(name, data_dir, train)
    return x.astype(np.float32) / np.float32(255.0), y.copy()
