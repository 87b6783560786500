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
``csv:PATH``                a CSV file (a header row of column names, one row per sample; read with
                            ``pandas.read_csv``), one column per feature
``parquet:PATH``            a Parquet file (``pandas.read_parquet`` through pyarrow), the same
``hf-disk:PATH``            a Hugging Face / Flower Datasets dataset written by ``save_to_disk``: a
                            ``Dataset``, or a ``DatasetDict`` with ``train`` (and optionally
                            ``test``), read offline with ``datasets.load_from_disk``; one column
                            per feature, or one column of images or arrays
``package.module:callable`` imported and called with the keyword arguments of ``dataset-args``
                            and ``seed=<data seed>`` if it has a ``seed`` parameter; it returns
                            ``(x, y)``, ``(x, y, x_test, y_test)``, a torch ``Dataset`` of
                            ``(x, y)`` pairs or a pandas ``DataFrame`` (a table, as ``csv:``)
``river:<Table>``           a classification table bundled inside River's wheel (``RIVER_TABLES``);
                            features in River's key order, labels mapped to ``0..C-1`` in sorted
                            order. Never a remote River dataset
==========================  ========================================================================

Rules:

* the columns of a table (``csv:``, ``parquet:``, ``hf-disk:``, a DataFrame) are chosen by the
  run-config keys ``label-column``, ``feature-columns`` and ``partition-column``
  (``tables.py``); the other forms have no columns and refuse these keys;
* without a test split, the data are split stratified by class: a fraction ``test_fraction`` of
  every class goes to test, drawn from the data seed. With ``partition-column`` each distinct
  value's rows are split on their own (a random ``test_fraction`` of them, at least one row on
  each side), so that every client has rows to train and to test on;
* a source without a single row is refused, naming it;
* inputs with 3 or 4 dimensions are images, stored ``(N, C, H, W)``: ``(N, H, W)`` gets one
  channel; a 4-d array whose last axis has 1, 3 or 4 entries and whose second axis has more is
  channels-last ``(N, H, W, C)`` and is transposed. Integer images (``uint8``, values 0..255) are
  scaled to ``[0, 1]`` by 255 when drawn; float images are used as given (scale them to ``[0, 1]``);
* inputs with 1 or 2 dimensions are flat features, standardised with the mean and standard
  deviation of the train split (a constant feature keeps std 1);
* labels are the classes ``0..C-1``, every one occurring (River tables: their distinct labels
  in sorted order); anything else is refused, or renumbered with ``remap-labels = true``
  (``labels.py``).

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

from fedcluster_app.core.data.labels import class_codes
from fedcluster_app.core.data.tables import (
    INPUT_COLUMNS,
    LABEL_COLUMNS,
    ReadOptions,
    Table,
    closest,
    frame_table,
    read_csv,
    read_hf,
    read_parquet,
)

__all__ = [
    "FILE_KINDS",
    "INPUT_COLUMNS",
    "LABEL_COLUMNS",
    "RIVER_TABLES",
    "TABLE_KINDS",
    "ReadOptions",
    "UserData",
    "is_node_spec",
    "load_user_data",
    "parse_dataset_spec",
    "read_raw",
    "spec_is_readable",
]

KEY = "dataset"  # the run-config key named in every error
#: spec prefixes that name a local file or folder (what a SuperNode's data-dir may hold)
FILE_KINDS = ("npz", "imagefolder", "hf-disk", "csv", "parquet")
#: the file kinds that are tables, whose columns label-column & co. name
TABLE_KINDS = ("csv", "parquet", "hf-disk")
#: the classification tables River ships inside its wheel (read from its package directory)
RIVER_TABLES = ("Bananas", "ImageSegments", "Phishing", "Shuttle")
TAG_POOL_SPLIT = 11  # as generators.TAG_POOL_SPLIT: default_rng([seed, 0, 0, 11]) splits pools


@dataclass(frozen=True)
class UserData:
    """A loaded dataset: read-only train/test arrays and what the scenario needs to know.

    ``x_*`` are ``(N, C, H, W)`` images (values in ``[0, max_value]``, e.g. ``uint8`` with
    ``max_value`` 255) or ``(N, F)`` ``float32`` standardised features; ``y_*`` are ``int64``.
    With ``partition-column``, ``groups_*`` give each row's value as an index into
    ``group_names`` (the distinct values, sorted). ``label_note`` says how ``remap-labels``
    renumbered the labels (``""``: they were kept); the run logs it once.
    """

    spec: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    image: bool
    max_value: float = 1.0
    groups_train: np.ndarray | None = None
    groups_test: np.ndarray | None = None
    group_names: tuple[str, ...] = ()
    label_note: str = ""
    #: flat features: the train split's per-feature mean and standard deviation that
    #: standardised both splits (``(raw - mean) / std``); None for images
    feature_mean: np.ndarray | None = None
    feature_std: np.ndarray | None = None
    #: after ``remap-labels``: class ``i``'s label as the data wrote it (``()``: the labels
    #: were the class numbers)
    class_names: tuple = ()

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self.x_train.shape[1:])

    def preprocessing(self) -> dict:
        """How a raw input (as the source holds it) becomes what the model sees: the same
        rule the run's data went through (``core.data.preprocessing``)."""
        from fedcluster_app.core.data.preprocessing import scaling, standardisation

        if self.image:
            return scaling(self.max_value)
        return standardisation(self.feature_mean, self.feature_std)


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
        f"{KEY}: {text!r} is not a dataset spec; expected npz:PATH, csv:PATH, parquet:PATH, "
        f"imagefolder:PATH, hf-disk:PATH, river:<Table> (one of {', '.join(RIVER_TABLES)}) or "
        f"package.module:callable")


def is_node_spec(value: object) -> bool:
    """True for the file specs (``npz:``, ``csv:``, ... : a SuperNode's own data file)."""
    kind, sep, _ = str(value).strip().partition(":")
    return bool(sep) and kind.strip().lower() in FILE_KINDS


def spec_is_readable(spec: str) -> bool:
    """Whether this process can read ``spec`` without trying: its file exists (modules and River
    tables count as readable)."""
    kind, ref = parse_dataset_spec(spec)
    return os.path.exists(ref) if kind in FILE_KINDS else True


# ----------------------------------------------------------------------------------- loading


def load_user_data(spec: str, seed: int = 0, test_fraction: float = 0.25,
                   read: ReadOptions = ReadOptions(), num_classes: int = 0) -> UserData:
    """Load ``spec`` (module docstring), split and scale it; cached per process.

    ``read`` holds the run-config keys that say how to read it (columns, a callable's
    arguments, ``remap-labels``); ``num_classes`` is the run config's (0 = from the data).

    Raises:
        FileNotFoundError: the path does not exist.
        ValueError: an unreadable or empty file, a bad shape, bad labels, a column that does
            not exist, or a callable that returns something else than documented; the message
            names ``dataset`` and the path.
    """
    kind, ref = parse_dataset_spec(spec)
    test_fraction = float(test_fraction)
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test-fraction must be in (0, 1), got {test_fraction}")
    seed = int(seed)
    return _load_cached(kind, ref, seed if kind == "module" else 0, seed, test_fraction, read,
                        int(num_classes))


@dataclass
class _Raw:
    """A source as it holds its data: inputs, labels (any type), the optional test split,
    the number of classes it declares (0 = none) and each row's partition value."""

    x: np.ndarray
    y: np.ndarray
    x_test: np.ndarray | None = None
    y_test: np.ndarray | None = None
    num_classes: int = 0
    groups: np.ndarray | None = None
    groups_test: np.ndarray | None = None
    label_name: str = "y"

    @classmethod
    def of_tables(cls, train: Table, test: Table | None = None) -> _Raw:
        name = f"label column {train.label!r}"
        if test is None:
            return cls(train.x, train.y, groups=train.groups, label_name=name)
        return cls(train.x, train.y, test.x, test.y, groups=train.groups,
                   groups_test=test.groups, label_name=name)


@lru_cache(maxsize=8)
def _load_cached(kind: str, ref: str, read_seed: int, seed: int, test_fraction: float,
                 read: ReadOptions, num_classes: int) -> UserData:
    where = f"{KEY} {kind}:{ref}" if kind != "module" else f"{KEY} {ref}"
    if read.names_columns and kind not in (*TABLE_KINDS, "module"):
        raise ValueError(f"label-column, feature-columns and partition-column name the columns "
                         f"of a table (csv:, parquet:, hf-disk: or a DataFrame a callable "
                         f"returns); {where} has none (leave them \"\")")
    if read.dataset_args and kind != "module":
        raise ValueError(f"dataset-args are the keyword arguments of a package.module:callable "
                         f"dataset; {where} is a file (leave dataset-args \"\")")
    raw = _read(kind, ref, read_seed, read, where)
    if len(raw.y) == 0 or len(np.asarray(raw.x)) == 0:
        raise ValueError(f"{where}: holds no samples ({len(np.asarray(raw.x))} inputs, "
                         f"{len(raw.y)} labels); expected at least one row")
    x = _inputs(raw.x, where, "x")
    parts = [(_label_shape(raw.y, len(x), where, raw.label_name), raw.label_name)]
    if raw.x_test is not None:
        x_te = _inputs(raw.x_test, where, "x_test")
        test_name = raw.label_name + (" (test split)" if raw.label_name != "y" else "_test")
        parts.append((_label_shape(raw.y_test, len(x_te), where, test_name), test_name))
        if x_te.shape[1:] != x.shape[1:]:
            raise ValueError(f"{where}: test inputs have shape {x_te.shape[1:]} but train inputs "
                             f"{x.shape[1:]}; expected the same shape")
    codes, c, note, class_names = class_codes(parts, where, read.remap_labels, num_classes,
                                              raw.num_classes)
    y = codes[0]
    g = g_te = None
    names: tuple[str, ...] = ()
    if raw.groups is not None:
        g, g_te, names = _group_index(raw, where, read.partition_column)
    if raw.x_test is None:
        rng = np.random.default_rng([seed, 0, 0, TAG_POOL_SPLIT])
        tr, te = (_group_split(g, names, test_fraction, rng, where, read.partition_column)
                  if g is not None else _stratified(y, test_fraction, rng))
        x, y, x_te, y_te = x[tr], y[tr], x[te], y[te]
        if g is not None:
            g, g_te = g[tr], g[te]
    else:
        y_te = codes[1]
    if c < 2:
        raise ValueError(f"{where}: found only class 0; expected labels of at least 2 classes")
    image = x.ndim == 4
    max_value = 1.0
    mean = std = None
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
        for a in (mean, std):
            a.setflags(write=False)
    arrays = [np.ascontiguousarray(a) for a in (x, y, x_te, y_te)]
    groups = [np.ascontiguousarray(a, dtype=np.int64) for a in (g, g_te)] if g is not None \
        else [None, None]
    for a in [*arrays, *groups]:
        if a is not None:
            a.setflags(write=False)
    return UserData(f"{kind}:{ref}" if kind != "module" else ref, *arrays, num_classes=int(c),
                    image=image, max_value=max_value, groups_train=groups[0],
                    groups_test=groups[1], group_names=names, label_note=note,
                    feature_mean=mean, feature_std=std, class_names=class_names)


def _stratified(y: np.ndarray, test_fraction: float, rng: np.random.Generator):
    from fedcluster_app.core.data.generators import stratified_split

    return stratified_split(y, test_fraction, rng)


def _group_index(raw: _Raw, where: str, column: str
                 ) -> tuple[np.ndarray, np.ndarray | None, tuple[str, ...]]:
    """Each row's partition value as an index into the sorted distinct values of the train
    rows (and the test rows', which must be among them and cover every value)."""
    values = np.unique(raw.groups)
    g = np.searchsorted(values, raw.groups).astype(np.int64)
    names = tuple(str(v.item() if isinstance(v, np.generic) else v) for v in values)
    if raw.groups_test is None:
        return g, None, names
    pos = np.clip(np.searchsorted(values, raw.groups_test), 0, len(values) - 1)
    foreign = raw.groups_test[values[pos] != raw.groups_test]
    if len(foreign):
        raise ValueError(f"{where}: partition column {column!r} of the test split holds values "
                         f"the train split lacks, such as {foreign[0]!r}; expected every test "
                         f"row to belong to a client of the train split")
    g_te = pos.astype(np.int64)
    untested = sorted(set(range(len(values))) - set(g_te.tolist()))
    if untested:
        raise ValueError(f"{where}: partition column {column!r}: the values "
                         f"{[names[i] for i in untested[:5]]} have no rows in the test split; "
                         f"expected test rows for every client")
    return g, g_te, names


def _group_split(g: np.ndarray, names: tuple[str, ...], test_fraction: float,
                 rng: np.random.Generator, where: str, column: str
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Indices ``(train, test)``: of each partition value's rows a random ``test_fraction``
    goes to test, at least one row on each side."""
    sizes = np.bincount(g, minlength=len(names))
    lonely = [names[i] for i in np.flatnonzero(sizes < 2)]
    if lonely:
        raise ValueError(f"{where}: partition column {column!r}: {len(lonely)} values have a "
                         f"single row (such as {lonely[0]!r}); every client needs at least 2 "
                         f"rows, one to train on and one to test on (drop or merge them)")
    train, test = [], []
    for i in range(len(names)):
        rows = np.flatnonzero(g == i)
        rows = rows[rng.permutation(len(rows))]
        k = min(max(1, int(round(test_fraction * len(rows)))), len(rows) - 1)
        test.append(rows[:k])
        train.append(rows[k:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def read_raw(spec: str, read: ReadOptions | None = None, seed: int = 0
             ) -> tuple[np.ndarray, np.ndarray | None]:
    """The inputs and labels of ``spec`` as the source holds them, before anything a run does
    to them (no split, no standardisation, labels as written): both splits of a source that
    has two, train first. An ``npz:`` file may hold ``x`` alone (labels None): inputs to
    predict for."""
    kind, ref = parse_dataset_spec(spec)
    if kind == "npz" and os.path.exists(ref):
        arrays = _load_npz(ref, spec, "arrays x (and y)")
        if "x" not in arrays:
            raise ValueError(f"{spec}: has arrays {sorted(arrays)}, missing x")
        return _inputs(arrays["x"], spec, "x"), arrays.get("y")
    where = f"{kind}:{ref}" if kind != "module" else ref
    raw = _read(kind, ref, seed, read or ReadOptions(), where)
    x = _inputs(raw.x, where, "x")     # images get their channel axis as in training
    if raw.x_test is None:
        return x, np.asarray(raw.y)
    return (np.concatenate([x, _inputs(raw.x_test, where, "x_test")]),
            np.concatenate([np.asarray(raw.y), np.asarray(raw.y_test)]))


def _read(kind: str, ref: str, seed: int, read: ReadOptions, where: str) -> _Raw:
    """The source as it holds its data."""
    if kind == "river":
        return _read_river(ref)
    if kind == "module":
        return _read_module(ref, seed, read, where)
    if not os.path.exists(ref):
        raise FileNotFoundError(f"{KEY}: {kind}:{ref}: no such file or directory (expected "
                                f"{_EXPECTED[kind]}; nothing is downloaded)")
    if kind in TABLE_KINDS:
        if kind == "hf-disk":
            train, test = read_hf(ref, read, where)
        else:
            train, test = (read_csv if kind == "csv" else read_parquet)(ref, read, where), None
        return _Raw.of_tables(train, test)
    return {"npz": _read_npz, "imagefolder": _read_imagefolder}[kind](ref)


_EXPECTED = {
    "npz": "a .npz file with arrays x and y, optionally x_test and y_test",
    "csv": "a CSV file with a header row",
    "parquet": "a Parquet file",
    "imagefolder": "a folder of class sub-folders, or one with train/ and test/ such folders",
    "hf-disk": "a folder written by datasets' save_to_disk",
}


def _load_npz(path: str, where: str, expected: str) -> dict[str, np.ndarray]:
    """Every array of a .npz file (no pickles); a ValueError naming ``where`` if it is none."""
    try:
        with np.load(path, allow_pickle=False) as f:
            return {k: f[k] for k in f.files}
    except Exception as exc:
        raise ValueError(f"{where}: cannot read it as a .npz file ({type(exc).__name__}: {exc}); "
                         f"expected {expected}") from None


def _read_npz(path: str):
    where = f"{KEY} npz:{path}"
    arrays = _load_npz(path, where, _EXPECTED["npz"])
    missing = [k for k in ("x", "y") if k not in arrays]
    if missing:
        raise ValueError(f"{where}: has arrays {sorted(arrays)}, missing {missing}; expected "
                         f"{_EXPECTED['npz']}")
    if ("x_test" in arrays) != ("y_test" in arrays):
        raise ValueError(f"{where}: give both x_test and y_test, or neither (found "
                         f"{sorted(arrays)})")
    return _Raw(arrays["x"], arrays["y"], arrays.get("x_test"), arrays.get("y_test"))


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
        return _Raw(x, y, num_classes=len(classes))
    return _Raw(x[:n_train], y[:n_train], x[n_train:], y[n_train:], num_classes=len(classes))


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


def _read_module(path: str, seed: int, read: ReadOptions, where: str) -> _Raw:
    from fedcluster_app.core.plugins import import_object

    fn = import_object(path, KEY)
    if not callable(fn):
        raise ValueError(f"{KEY}: {path!r} is {type(fn).__name__}, not a callable")
    out = fn(**_call_arguments(fn, path, seed, read))
    expected = ("expected (x, y) arrays, (x, y, x_test, y_test), a torch Dataset of (x, y) "
                "pairs or a pandas DataFrame")
    if _is_data_frame(out):
        return _Raw.of_tables(frame_table(out, read, where))
    if read.names_columns:
        raise ValueError(f"label-column, feature-columns and partition-column name the columns "
                         f"of a table; {path} returned {type(out).__name__}, which has none "
                         f"(return a pandas DataFrame, or leave them \"\")")
    if isinstance(out, (tuple, list)):
        if len(out) == 2:
            return _Raw(np.asarray(out[0]), np.asarray(out[1]))
        if len(out) == 4:
            return _Raw(*(np.asarray(a) for a in out))
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
        return _Raw(np.stack(xs) if xs else np.zeros((0,)), np.asarray(ys))
    raise ValueError(f"{KEY}: {path} returned {type(out).__name__}; {expected}")


def _call_arguments(fn, path: str, seed: int, read: ReadOptions) -> dict[str, object]:
    """The keyword arguments of the dataset callable: ``dataset-args``, plus ``seed`` (the data
    seed) when it takes one; an argument it does not take, or a required one left out, is
    refused before it is called."""
    kwargs = dict(read.dataset_args)
    if "seed" in kwargs:
        raise ValueError(f"dataset-args sets seed; {path} gets the data seed itself (run-config "
                         f"key data-seed) when it has a seed parameter")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return kwargs
    params = signature.parameters
    if "seed" in params:
        kwargs["seed"] = seed
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        names = [n for n in params if n != "seed"]
        for key in kwargs:
            if key not in params:
                raise ValueError(f"dataset-args: {path} has no parameter {key!r}"
                                 f"{closest(key, names)}; its parameters are {names}")
    try:
        signature.bind(**kwargs)
    except TypeError as exc:
        raise ValueError(f"dataset-args: {path} cannot be called with {sorted(kwargs)}: {exc} "
                         f"(give its required parameters in dataset-args, e.g. "
                         f"\"path=data/iris.csv\")") from None
    return kwargs


def _is_data_frame(obj: object) -> bool:
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover - a dependency
        return False
    return isinstance(obj, pd.DataFrame)


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
    return _Raw(np.asarray(rows, dtype=np.float32), y, num_classes=len(classes))


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


def _label_shape(y: np.ndarray, n: int, where: str, name: str) -> np.ndarray:
    """One label per input, as a 1-d array (``labels.py`` checks the values)."""
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1 or len(y) != n:
        raise ValueError(f"{where}: {name} has shape {y.shape} for {n} inputs; expected ({n},) "
                         f"integer labels")
    return y
