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
a machine with network access produces exactly this layout.
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


def _local_cifar10_class():
    from torchvision.datasets import CIFAR10

    class LocalCIFAR10(CIFAR10):
        """CIFAR10 that checks that its files exist instead of checking their md5 sums.

        torchvision's CIFAR10 compares every batch file (and ``batches.meta``) with the md5 sum of
        the official archive and refuses anything else as "not found or corrupted". That rejects
        legitimate local copies that are not byte-identical to the archive: a subset, a re-pickled
        copy, or the tiny files the tests write. The checksum only protects a download, and we never
        download, so existence is what we check; malformed contents still fail when unpickled.
        """

        def _check_integrity(self) -> bool:
            folder = os.path.join(self.root, self.base_folder)
            return all(os.path.isfile(os.path.join(folder, f)) for f, _ in
                       self.train_list + self.test_list)

        def _load_meta(self) -> None:
            path = os.path.join(self.root, self.base_folder, self.meta["filename"])
            if not os.path.isfile(path):
                raise FileNotFoundError(f"CIFAR-10 metadata file {path!r} not found")
            with open(path, "rb") as f:
                data = pickle.load(f, encoding="latin1")
            self.classes = data[self.meta["key"]]
            self.class_to_idx = {c: i for i, c in enumerate(self.classes)}

    return LocalCIFAR10


@lru_cache(maxsize=6)
def _load_cached(name: str, root: str, train: bool) -> tuple[np.ndarray, np.ndarray]:
    path = Path(root)
    _check_files(name, path)
    try:
        if name == "cifar10":
            ds = _local_cifar10_class()(root=root, train=train, download=False)
            x = np.ascontiguousarray(np.asarray(ds.data, dtype=np.uint8).transpose(0, 3, 1, 2))
            y = np.asarray(ds.targets, dtype=np.int64)
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
