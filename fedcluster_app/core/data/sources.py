"""A user's own dataset, named by the run-config key ``dataset``, as train/test arrays.

The ``dataset-*`` scenarios (and the River table families, ``imagesegments-*``, ...) draw their
(client, step) samples from these arrays exactly as the image pools do. Accepted forms:

==========================  ========================================================================
``npz:PATH``                a NumPy ``.npz`` with arrays ``x`` and ``y`` (optionally ``x_test`` and
                            ``y_test``)
``imagefolder:PATH``        torchvision's ``ImageFolder`` layout (one sub-folder per class, classes
                            numbered in sorted folder order, its image extensions): PATH holds
                            ``train/`` and ``test/`` folders, or is itself the one folder to split.
                            All images must have the same size; they are read as grayscale when
                            every image is, as RGB otherwise (read with PIL, without importing
                            torch)
``hf-disk:PATH``            a Hugging Face / Flower Datasets dataset written by ``save_to_disk``: a
                            ``Dataset``, or a ``DatasetDict`` with ``train`` (and optionally
                            ``test``), read offline with ``datasets.load_from_disk``. The input and
                            label columns are found by name (``INPUT_COLUMNS``, ``LABEL_COLUMNS``)
``package.module:callable`` imported and called, with ``seed=<data seed>`` if it has a ``seed``
                            parameter and with no argument otherwise; it returns ``(x, y)``,
                            ``(x, y, x_test, y_test)`` or a torch ``Dataset`` of ``(x, y)`` pairs
``river:<Table>``           a classification table bundled inside River's wheel (``RIVER_TABLES``);
                            features in River's key order, labels mapped to ``0..C-1`` in sorted
                            order. Never a remote River dataset
==========================  ========================================================================

Rules:

* without a test split, the data are split stratified by class: a fraction ``test_fraction`` of
  every class goes to test, drawn from the data seed;
* inputs with 3 or 4 dimensions are images, stored ``(N, C, H, W)``: ``(N, H, W)`` gets one
  channel; a 4-d array whose last axis has 1, 3 or 4 entries and whose second axis has more is
  channels-last ``(N, H, W, C)`` and is transposed. Integer images (``uint8``, values 0..255) are
  scaled to ``[0, 1]`` by 255 when drawn; float images are used as given (scale them to ``[0, 1]``);
* inputs with 1 or 2 dimensions are flat features, standardised with the mean and standard
  deviation of the train split (a constant feature keeps std 1);
* labels are integers in ``[0, C)``, ``C`` = the largest label + 1 (River tables: the number of
  distinct labels). Strings, negatives and non-integral floats are refused.

Everything is read from local files (nothing is downloaded) and cached per process; the arrays
are read-only. Errors name the run-config key ``dataset``, the path and what was expected.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

__all__ = [
    "FILE_KINDS",
    "INPUT_COLUMNS",
    "LABEL_COLUMNS",
    "RIVER_TABLES",
    "UserData",
    "is_node_spec",
    "load_user_data",
    "parse_dataset_spec",
    "spec_is_readable",
]

KEY = "dataset"  # the run-config key named in every error
#: spec prefixes that name a local file or folder (what a SuperNode's data-dir may hold)
FILE_KINDS = ("npz", "imagefolder", "hf-disk")
#: the classification tables River ships inside its wheel (read from its package directory)
RIVER_TABLES = ("Bananas", "ImageSegments", "Phishing", "Shuttle")
#: column names recognised in an hf-disk dataset, by role
INPUT_COLUMNS = ("image", "img", "x", "pixels", "features", "inputs", "input")
LABEL_COLUMNS = ("label", "labels", "y", "target", "class", "fine_label")
TAG_POOL_SPLIT = 11  # as generators.TAG_POOL_SPLIT: default_rng([seed, 0, 0, 11]) splits pools


@dataclass(frozen=True)
class UserData:
    """A loaded dataset: read-only train/test arrays and what the scenario needs to know.

    ``x_*`` are ``(N, C, H, W)`` images (values in ``[0, max_value]``, e.g. ``uint8`` with
    ``max_value`` 255) or ``(N, F)`` ``float32`` standardised features; ``y_*`` are ``int64``.
    """

    spec: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    image: bool
    max_value: float = 1.0

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self.x_train.shape[1:])


# ------------------------------------------------------------------------------------ specs


def parse_dataset_spec(spec: str) -> tuple[str, str]:
    """``(kind, ref)``: kind in ``FILE_KINDS``, ``"river"`` or ``"module"``; a file's ref is its
    absolute path."""
    from fedcluster_app.core.plugins import is_import_path

    text = str(spec).strip()
    kind, sep, ref = text.partition(":")
    kind = kind.strip().lower()
    if sep and kind in FILE_KINDS:
        ref = ref.strip()
        if not ref:
            raise ValueError(f"{KEY}: {text!r} names no path after '{kind}:'")
        return kind, os.path.abspath(os.path.expanduser(ref))
    if sep and kind == "river":
        return "river", _river_name(ref.strip())
    if is_import_path(text):
        return "module", text
    raise ValueError(
        f"{KEY}: {text!r} is not a dataset spec; expected npz:PATH, imagefolder:PATH, "
        f"hf-disk:PATH, river:<Table> (one of {', '.join(RIVER_TABLES)}) or "
        f"package.module:callable")


def is_node_spec(value: object) -> bool:
    """True for ``npz:``/``imagefolder:``/``hf-disk:`` specs (a SuperNode's own data file)."""
    kind, sep, _ = str(value).strip().partition(":")
    return bool(sep) and kind.strip().lower() in FILE_KINDS


def spec_is_readable(spec: str) -> bool:
    """Whether this process can read ``spec`` without trying: its file exists (modules and River
    tables count as readable)."""
    kind, ref = parse_dataset_spec(spec)
    return os.path.exists(ref) if kind in FILE_KINDS else True


# ----------------------------------------------------------------------------------- loading


def load_user_data(spec: str, seed: int = 0, test_fraction: float = 0.25) -> UserData:
    """Load ``spec`` (module docstring), split and scale it; cached per process.

    Raises:
        FileNotFoundError: the path does not exist.
        ValueError: an unreadable file, a bad shape, bad labels, or a callable that returns
            something else than documented; the message names ``dataset`` and the path.
    """
    kind, ref = parse_dataset_spec(spec)
    test_fraction = float(test_fraction)
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test-fraction must be in (0, 1), got {test_fraction}")
    seed = int(seed)
    return _load_cached(kind, ref, seed if kind == "module" else 0, seed, test_fraction)


@lru_cache(maxsize=8)
def _load_cached(kind: str, ref: str, read_seed: int, seed: int, test_fraction: float
                 ) -> UserData:
    where = f"{KEY} {kind}:{ref}" if kind != "module" else f"{KEY} {ref}"
    x, y, x_te, y_te, num_classes = _read(kind, ref, read_seed)
    x = _inputs(x, where, "x")
    y = _labels(y, len(x), where, "y")
    if x_te is None:
        from fedcluster_app.core.data.generators import stratified_split

        rng = np.random.default_rng([seed, 0, 0, TAG_POOL_SPLIT])
        tr, te = stratified_split(y, test_fraction, rng)
        x, y, x_te, y_te = x[tr], y[tr], x[te], y[te]
    else:
        x_te = _inputs(x_te, where, "x_test")
        y_te = _labels(y_te, len(x_te), where, "y_test")
        if x_te.shape[1:] != x.shape[1:]:
            raise ValueError(f"{where}: test inputs have shape {x_te.shape[1:]} but train inputs "
                             f"{x.shape[1:]}; expected the same shape")
    if len(y) == 0:
        raise ValueError(f"{where}: the train split is empty; expected at least one sample")
    c = num_classes or int(max(y.max(), y_te.max() if len(y_te) else 0)) + 1
    if c < 2:
        raise ValueError(f"{where}: found only class 0; expected labels of at least 2 classes")
    image = x.ndim == 4
    max_value = 1.0
    if image:
        if np.issubdtype(x.dtype, np.integer):
            for a, name in ((x, "x"), (x_te, "x_test")):
                if a.size and (a.min() < 0 or a.max() > 255):
                    raise ValueError(f"{where}: integer images ({name}) must hold values 0..255, "
                                     f"found {a.min()}..{a.max()}")
            x, x_te, max_value = x.astype(np.uint8), x_te.astype(np.uint8), 255.0
        else:
            x, x_te = x.astype(np.float32), x_te.astype(np.float32)
    else:
        x, x_te = x.astype(np.float32), x_te.astype(np.float32)
        mean = x.mean(axis=0)
        std = x.std(axis=0)
        std[~(std > 1e-12)] = 1.0
        x, x_te = (x - mean) / std, (x_te - mean) / std
    arrays = [np.ascontiguousarray(a) for a in (x, y, x_te, y_te)]
    for a in arrays:
        a.setflags(write=False)
    return UserData(f"{kind}:{ref}" if kind != "module" else ref, *arrays, num_classes=int(c),
                    image=image, max_value=max_value)


def _read(kind: str, ref: str, seed: int):
    """``(x, y, x_test | None, y_test | None, num_classes | 0)`` as the source holds them."""
    if kind == "river":
        return _read_river(ref)
    if kind == "module":
        return _read_module(ref, seed)
    if not os.path.exists(ref):
        raise FileNotFoundError(f"{KEY}: {kind}:{ref}: no such file or directory (expected "
                                f"{_EXPECTED[kind]}; nothing is downloaded)")
    reader = {"npz": _read_npz, "imagefolder": _read_imagefolder, "hf-disk": _read_hf}[kind]
    return reader(ref)


_EXPECTED = {
    "npz": "a .npz file with arrays x and y, optionally x_test and y_test",
    "imagefolder": "a folder of class sub-folders, or one with train/ and test/ such folders",
    "hf-disk": "a folder written by datasets' save_to_disk",
}


def _read_npz(path: str):
    where = f"{KEY} npz:{path}"
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
    except Exception as exc:
        raise ValueError(f"{where}: cannot read it as a .npz file ({type(exc).__name__}: {exc}); "
                         f"expected {_EXPECTED['npz']}") from exc
    missing = [k for k in ("x", "y") if k not in arrays]
    if missing:
        raise ValueError(f"{where}: has arrays {sorted(arrays)}, missing {missing}; expected "
                         f"{_EXPECTED['npz']}")
    if ("x_test" in arrays) != ("y_test" in arrays):
        raise ValueError(f"{where}: give both x_test and y_test, or neither (found "
                         f"{sorted(arrays)})")
    return arrays["x"], arrays["y"], arrays.get("x_test"), arrays.get("y_test"), 0


def _read_imagefolder(path: str):
    where = f"{KEY} imagefolder:{path}"
    root = Path(path)
    if not root.is_dir():
        raise ValueError(f"{where}: is not a directory; expected {_EXPECTED['imagefolder']}")
    split = (root / "train").is_dir() and (root / "test").is_dir()
    train_dir = root / "train" if split else root
    classes = sorted(e.name for e in os.scandir(train_dir) if e.is_dir())
    if not classes:
        raise ValueError(f"{where}: {str(train_dir)!r} has no class folders; expected "
                         f"{_EXPECTED['imagefolder']}")
    class_to_idx = {c: i for i, c in enumerate(classes)}
    samples = _folder_samples(train_dir, class_to_idx)
    if not samples:
        raise ValueError(f"{where}: no images ({', '.join(IMG_EXTENSIONS)}) in the class folders "
                         f"of {str(train_dir)!r}")
    n_train = len(samples)
    if split:
        test_dir = root / "test"
        foreign = sorted(e.name for e in os.scandir(test_dir)
                         if e.is_dir() and e.name not in class_to_idx)
        if foreign:
            raise ValueError(f"{where}: test/ has class folders {foreign} that train/ lacks; "
                             f"expected the classes {classes}")
        samples += _folder_samples(test_dir, class_to_idx)
    from PIL import Image

    images, size, first = [], None, ""
    for file, _ in samples:
        try:
            with Image.open(file) as im:
                im.load()
                images.append(im.copy())
        except Exception as exc:
            raise ValueError(f"{where}: cannot read image {file!r} ({exc})") from exc
        if size is None:
            size, first = images[-1].size, file
        elif images[-1].size != size:
            raise ValueError(f"{where}: image {file!r} is {images[-1].size[0]}x"
                             f"{images[-1].size[1]} but {first!r} is {size[0]}x{size[1]}; "
                             f"expected all images to have the same size (resize them first)")
    gray = all(im.mode in ("L", "1") for im in images)
    arrays = [np.asarray(im.convert("L" if gray else "RGB"), dtype=np.uint8) for im in images]
    x = np.stack(arrays)
    x = x[:, None] if gray else x.transpose(0, 3, 1, 2)
    y = np.asarray([label for _, label in samples], dtype=np.int64)
    if not split:
        return x, y, None, None, len(classes)
    return x[:n_train], y[:n_train], x[n_train:], y[n_train:], len(classes)


#: torchvision's ImageFolder extensions
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def _folder_samples(folder: Path, class_to_idx: dict[str, int]) -> list[tuple[str, int]]:
    """``(file, class)`` of every image under ``folder/<class>/`` (recursively, sorted), as
    ImageFolder lists them."""
    out = []
    for name, idx in sorted(class_to_idx.items(), key=lambda kv: kv[1]):
        target = folder / name
        if not target.is_dir():
            continue
        for dirpath, _, files in sorted(os.walk(target, followlinks=True)):
            for f in sorted(files):
                if f.lower().endswith(IMG_EXTENSIONS):
                    out.append((os.path.join(dirpath, f), idx))
    return out


def _read_hf(path: str):
    where = f"{KEY} hf-disk:{path}"
    import datasets

    try:
        obj = datasets.load_from_disk(path)
    except Exception as exc:
        raise ValueError(f"{where}: cannot read it with datasets.load_from_disk "
                         f"({type(exc).__name__}: {exc}); expected {_EXPECTED['hf-disk']}"
                         ) from exc
    if isinstance(obj, datasets.DatasetDict):
        if "train" not in obj:
            raise ValueError(f"{where}: the DatasetDict has splits {sorted(obj)}; expected a "
                             f"'train' split (and optionally 'test')")
        train, test = obj["train"], obj.get("test")
    else:
        train, test = obj, None
    x_col, y_col = _hf_columns(train, where)
    x, y = _hf_arrays(train, x_col, y_col, where)
    if test is None:
        return x, y, None, None, 0
    for col in (x_col, y_col):
        if col not in test.column_names:
            raise ValueError(f"{where}: the test split lacks column {col!r} (it has "
                             f"{test.column_names})")
    return (x, y, *_hf_arrays(test, x_col, y_col, where), 0)


def _hf_columns(ds, where: str) -> tuple[str, str]:
    from datasets import ClassLabel, Image

    cols = list(ds.column_names)
    lower = {c.lower(): c for c in cols}

    def pick(names: tuple[str, ...], role: str, fallback: list[str]) -> str:
        found = [lower[n] for n in names if n in lower]
        if len(found) == 1:
            return found[0]
        if not found and len(fallback) == 1:
            return fallback[0]
        problem = "several candidates " + str(found) if found else "no column named like one of "\
            + ", ".join(names)
        raise ValueError(f"{where}: cannot tell the {role} column: {problem}; the columns are "
                         f"{cols}. Keep one {role} column named one of {', '.join(names)}")

    feats = ds.features
    images = [c for c in cols if isinstance(feats[c], Image)]
    labels = [c for c in cols if isinstance(feats[c], ClassLabel)]
    return pick(INPUT_COLUMNS, "input", images), pick(LABEL_COLUMNS, "label", labels)


def _hf_arrays(ds, x_col: str, y_col: str, where: str) -> tuple[np.ndarray, np.ndarray]:
    values = [np.asarray(v) for v in ds[x_col]]
    shapes = {v.shape for v in values}
    if len(shapes) > 1:
        raise ValueError(f"{where}: column {x_col!r} holds inputs of different shapes "
                         f"{sorted(shapes)[:3]}; expected one shape")
    x = np.stack(values) if values else np.zeros((0,))
    return x, np.asarray(list(ds[y_col]))


def _read_module(path: str, seed: int):
    from fedcluster_app.core.plugins import import_object

    fn = import_object(path, KEY)
    if not callable(fn):
        raise ValueError(f"{KEY}: {path!r} is {type(fn).__name__}, not a callable")
    try:
        takes_seed = "seed" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        takes_seed = False
    out = fn(seed=seed) if takes_seed else fn()
    expected = ("expected (x, y) arrays, (x, y, x_test, y_test) or a torch Dataset of (x, y) "
                "pairs")
    if isinstance(out, (tuple, list)):
        if len(out) == 2:
            return np.asarray(out[0]), np.asarray(out[1]), None, None, 0
        if len(out) == 4:
            return (*(np.asarray(a) for a in out), 0)
        raise ValueError(f"{KEY}: {path} returned a sequence of {len(out)} items; {expected}")
    if hasattr(out, "__getitem__") and hasattr(out, "__len__") and _is_torch_dataset(out):
        xs, ys = [], []
        for i in range(len(out)):
            item = out[i]
            if not (isinstance(item, (tuple, list)) and len(item) == 2):
                raise ValueError(f"{KEY}: {path} returned a Dataset whose item {i} is not an "
                                 f"(x, y) pair; {expected}")
            xs.append(np.asarray(item[0]))
            ys.append(np.asarray(item[1]))
        if len({a.shape for a in xs}) > 1:
            raise ValueError(f"{KEY}: {path} returned a Dataset with inputs of different shapes; "
                             f"expected one shape")
        return np.stack(xs) if xs else np.zeros((0,)), np.asarray(ys), None, None, 0
    raise ValueError(f"{KEY}: {path} returned {type(out).__name__}; {expected}")


def _is_torch_dataset(obj: object) -> bool:
    try:
        from torch.utils.data import Dataset
    except ImportError:  # pragma: no cover - torch is a dependency
        return False
    return isinstance(obj, Dataset)


def _river_name(name: str) -> str:
    for table in RIVER_TABLES:
        if table.lower() == name.lower():
            return table
    raise ValueError(f"{KEY}: river:{name} is not a classification table bundled with River; "
                     f"expected one of {', '.join(RIVER_TABLES)}")


def _read_river(name: str):
    from river import datasets as rd
    from river.datasets import base

    table = getattr(rd, name)()
    if isinstance(table, base.RemoteDataset) or not os.path.isfile(table.path):
        raise ValueError(f"{KEY}: river:{name} is not a file inside River's package; only bundled "
                         f"tables are read (nothing is downloaded)")
    rows, labels = [], []
    keys: list[str] | None = None
    for features, label in table:
        if keys is None:
            keys = list(features)
        rows.append([float(features[k]) for k in keys])
        labels.append(label)
    classes = sorted(set(labels))
    index = {c: i for i, c in enumerate(classes)}
    y = np.asarray([index[v] for v in labels], dtype=np.int64)
    return np.asarray(rows, dtype=np.float32), y, None, None, len(classes)


# ------------------------------------------------------------------------------- validation


def _inputs(x: np.ndarray, where: str, name: str) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype.kind not in "biuf":
        raise ValueError(f"{where}: {name} has dtype {x.dtype}; expected numbers")
    if x.ndim == 1:
        x = x[:, None]
    elif x.ndim == 3:
        x = x[:, None]
    elif x.ndim == 4:
        if x.shape[3] in (1, 3, 4) and x.shape[1] not in (1, 3, 4):
            x = x.transpose(0, 3, 1, 2)  # channels-last
    elif x.ndim != 2:
        raise ValueError(f"{where}: {name} has shape {x.shape}; expected (N, F) features or "
                         f"(N, H, W), (N, C, H, W), (N, H, W, C) images")
    if x.dtype.kind == "f" and not np.all(np.isfinite(x)):
        raise ValueError(f"{where}: {name} holds NaN or infinite values; expected finite numbers")
    return x


def _labels(y: np.ndarray, n: int, where: str, name: str) -> np.ndarray:
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1 or len(y) != n:
        raise ValueError(f"{where}: {name} has shape {y.shape} for {n} inputs; expected ({n},) "
                         f"integer labels")
    if y.dtype.kind == "b":
        return y.astype(np.int64)
    if y.dtype.kind not in "iuf":
        example = y[0].item() if len(y) else ""
        raise ValueError(f"{where}: {name} holds {y.dtype} labels such as {example!r}; expected "
                         f"integers 0..C-1 (map class names to integers first)")
    if y.dtype.kind == "f":
        if not (np.all(np.isfinite(y)) and np.all(y == np.round(y))):
            bad = y[~(np.isfinite(y) & (y == np.round(y)))][0].item()
            raise ValueError(f"{where}: {name} holds the non-integral label {bad!r}; expected "
                             f"integers 0..C-1")
    if len(y) and y.min() < 0:
        raise ValueError(f"{where}: {name} holds the negative label {y.min().item()}; expected integers "
                         f"0..C-1")
    return y.astype(np.int64)
