"""Tables with one column per feature (``csv:``, ``parquet:``, ``hf-disk:`` datasets and a
DataFrame a ``module:callable`` returns) and the run-config keys that name their columns.

The rules (README, "Your own dataset"):

* ``label-column``: the column of the class labels; ``""`` = the one column named ``label``,
  ``labels``, ``y``, ``target``, ``class`` or ``fine_label`` (any case), else the one column of
  Hugging Face's ``ClassLabel`` type;
* ``feature-columns``: comma-separated column names, ``"a,b,c"``; ``""`` = every column other
  than the label and partition columns, each one feature holding a number or a boolean. A column
  that holds an image or an array per row (Hugging Face ``Image``, lists) is the whole input
  instead: the one such column (the one named ``image``, ``img``, ``x``, ``pixels``,
  ``features``, ``inputs`` or ``input`` where there are several);
* ``partition-column``: a column naming the user or device a row belongs to; each distinct value
  is one client's rows (``sources.py`` splits and orders them).

Files are read with pandas (``read_csv``, ``read_parquet`` through pyarrow) and Hugging Face
``datasets``; nothing is converted by hand. Every error names the dataset, the key and the
columns that exist (with the closest one for a misspelt name).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedcluster_app.core.user_text import read_value, suggest

__all__ = ["INPUT_COLUMNS", "LABEL_COLUMNS", "ReadOptions", "Table", "closest", "column_names",
           "dataset_args", "frame_table", "read_csv", "read_hf", "read_parquet"]

#: column names recognised by role when the run config names none
INPUT_COLUMNS = ("image", "img", "x", "pixels", "features", "inputs", "input")
LABEL_COLUMNS = ("label", "labels", "y", "target", "class", "fine_label")
_PANDAS_INDEX = "__index_level_"   # Dataset.from_pandas keeps a non-default index as a column


@dataclass(frozen=True)
class ReadOptions:
    """How to read a user's dataset: the run-config keys ``label-column``, ``feature-columns``,
    ``partition-column``, ``dataset-args`` and ``remap-labels`` (canonical, hashable)."""

    label_column: str = ""
    feature_columns: tuple[str, ...] = ()
    partition_column: str = ""
    dataset_args: tuple[tuple[str, object], ...] = ()
    remap_labels: bool = False

    @property
    def names_columns(self) -> bool:
        return bool(self.label_column or self.feature_columns or self.partition_column)


@dataclass
class Table:
    """What a table gives a dataset: inputs, raw labels (any type, checked by ``sources.py``)
    and, with ``partition-column``, each row's raw partition value."""

    x: np.ndarray
    y: np.ndarray
    groups: np.ndarray | None = None
    label: str = ""          # the label column's name


def column_names(value: object) -> tuple[str, ...]:
    """``feature-columns``: ``"a, b,c"`` -> ``("a", "b", "c")``; ``""`` -> ``()``."""
    text = str(value).strip()
    if not text:
        return ()
    names = tuple(n.strip() for n in text.split(","))
    if not all(names):
        raise ValueError(f"feature-columns = {text!r} has an empty name; expected column names "
                         f"separated by commas, e.g. \"sepal_length,sepal_width\"")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"feature-columns = {text!r} names {twice} twice; expected each column "
                         f"once")
    return names


def dataset_args(value: object) -> tuple[tuple[str, object], ...]:
    """``dataset-args``: ``"path=data/iris.csv,rows=100"`` -> ``(("path", "data/iris.csv"),
    ("rows", 100))``. Values are read as ``--set`` reads them (TOML numbers, booleans and
    quoted strings; anything else is a string); a piece without ``=`` continues the value
    before it, so ``"cols=a,b"`` gives ``cols = "a,b"``."""
    text = str(value).strip()
    if not text:
        return ()
    pieces: list[str] = []
    for part in text.split(","):
        if "=" in part or not pieces:
            pieces.append(part)
        else:
            pieces[-1] += "," + part
    out: dict[str, object] = {}
    for piece in pieces:
        key, sep, raw = (p.strip() for p in piece.partition("="))
        if not sep or not key.isidentifier():
            raise ValueError(f"dataset-args = {text!r}: {piece.strip()!r} is not key=value with "
                             f"a Python name as key; expected comma-separated pairs such as "
                             f"\"path=data/iris.csv,rows=100\"")
        if key in out:
            raise ValueError(f"dataset-args = {text!r} sets {key!r} twice")
        out[key] = read_value(raw)   # as --set reads a value
    return tuple(out.items())


def closest(name: str, valid: list[str]) -> str:
    """`` (did you mean 'x'?)`` for the column (or parameter) closest to ``name``, case ignored
    ('Species' for 'species'), or nothing: ``config.suggest`` with a lower cutoff, as column
    names are often short."""
    return suggest(name, valid, cutoff=0.5)


# ------------------------------------------------------------------------------ which columns


def pick_columns(columns: list[str], arrays: set[str], class_labels: set[str],
                 opts: ReadOptions, where: str) -> tuple[str, list[str], str]:
    """``(label, features, partition)`` of a table with ``columns``; ``arrays`` hold an image or
    an array per row, ``class_labels`` are of ``ClassLabel`` type (module docstring)."""
    def known(key: str, name: str) -> str:
        if name not in columns:
            raise ValueError(f"{key} = {name!r}: {where} has no such column"
                             f"{closest(name, columns)}; its columns are {columns}")
        return name

    part = known("partition-column", opts.partition_column) if opts.partition_column else ""
    if opts.label_column:
        label = known("label-column", opts.label_column)
    else:
        named = [c for c in columns if c.lower() in LABEL_COLUMNS and c != part]
        found = named or [c for c in columns if c in class_labels and c != part]
        if len(found) != 1:
            problem = (f"several candidates {found}" if found else "no column is named one of "
                       + ", ".join(LABEL_COLUMNS))
            raise ValueError(f"{where}: cannot tell the label column: {problem}; the columns are "
                             f"{columns}. Name it with the run-config key label-column")
        label = found[0]
    if label == part:
        raise ValueError(f"label-column and partition-column both name {label!r} in {where}; "
                         f"expected two different columns")
    if opts.feature_columns:
        features = [known("feature-columns", c) for c in opts.feature_columns]
        for c in features:
            if c in (label, part):
                role = "label" if c == label else "partition"
                raise ValueError(f"feature-columns names {c!r}, the {role} column of {where}; "
                                 f"expected input columns only")
        return label, features, part
    others = [c for c in columns if c not in (label, part) and not c.startswith(_PANDAS_INDEX)]
    if not others:
        raise ValueError(f"{where}: no column is left for the inputs once the label column "
                         f"{label!r}{' and partition column ' + repr(part) if part else ''} are "
                         f"taken; the columns are {columns}")
    whole = [c for c in others if c in arrays]
    if not whole:
        return label, others, part          # one column per feature
    named = [c for c in whole if c.lower() in INPUT_COLUMNS]
    found = named or whole
    if len(found) != 1:
        raise ValueError(f"{where}: cannot tell the input column: several candidates {found}; "
                         f"the columns are {columns}. Name it with the run-config key "
                         f"feature-columns (or keep one input column named one of "
                         f"{', '.join(INPUT_COLUMNS)})")
    return label, found, part


# ------------------------------------------------------------------------------------ values


def frame_table(df, opts: ReadOptions, where: str) -> Table:
    """The table of a pandas DataFrame: its picked columns as arrays."""
    columns = [str(c) for c in df.columns]
    df = df.set_axis(columns, axis=1)
    if len(df) == 0:
        raise ValueError(f"{where}: holds no samples (columns {columns} but no rows); expected "
                         f"at least one row")
    arrays = {c for c in columns if _holds_arrays(df[c])}
    label, features, part = pick_columns(columns, arrays, set(), opts, where)
    return _table(df, label, features, part, arrays, where)


def _table(df, label: str, features: list[str], part: str, arrays: set[str], where: str,
           x_column=None) -> Table:
    """The picked columns of ``df`` as arrays; ``x_column(name)`` reads a column of images or
    arrays (Hugging Face's own reader), else such a column is read from the frame."""
    if len(features) == 1 and features[0] in arrays:
        x = x_column(features[0]) if x_column else _stack(df[features[0]], features[0], where)
    else:
        bad = [c for c in features if c in arrays]
        if bad:
            raise ValueError(f"{where}: column {bad[0]!r} holds an array per row; with several "
                             f"feature columns each must hold one number per row (name the "
                             f"array column alone in feature-columns)")
        x = np.column_stack([_numbers(df[c], c, where) for c in features])
    y = _present(df[label], f"label column {label!r}", where)
    groups = _present(df[part], f"partition column {part!r}", where) if part else None
    return Table(x, y, groups, label)


def _holds_arrays(series) -> bool:
    if series.dtype != object:
        return False
    first = series.dropna()
    return len(first) > 0 and isinstance(first.iloc[0], (list, tuple, np.ndarray, dict))


def _stack(series, name: str, where: str) -> np.ndarray:
    values = [np.asarray(v) for v in series]
    shapes = {v.shape for v in values}
    if len(shapes) > 1:
        raise ValueError(f"{where}: column {name!r} holds inputs of different shapes "
                         f"{sorted(shapes)[:3]}; expected one shape")
    return np.stack(values) if values else np.zeros((0,))


def _missing(series) -> np.ndarray:
    import pandas as pd

    return np.asarray(pd.isna(series), dtype=bool)


def _present(series, what: str, where: str) -> np.ndarray:
    """The column's values; refused when any is missing (naming how many and the first row)."""
    gone = _missing(series)
    if gone.any():
        raise ValueError(f"{where}: {what} has {int(gone.sum())} missing values (the first in "
                         f"row {int(np.flatnonzero(gone)[0])}); expected a value in every row")
    values = series.to_numpy()
    return values.astype(str) if values.dtype == object else values   # text: sorted as text


def _numbers(series, name: str, where: str) -> np.ndarray:
    from pandas.api.types import is_bool_dtype, is_numeric_dtype

    if not (is_numeric_dtype(series) or is_bool_dtype(series)):
        example = series.dropna().iloc[0] if series.notna().any() else None
        raise ValueError(f"{where}: feature column {name!r} holds {series.dtype} values such as "
                         f"{example!r}; expected numbers (one column per feature): encode it as "
                         f"numbers, or leave it out by naming the feature columns in "
                         f"feature-columns")
    gone = _missing(series)
    if gone.any():
        raise ValueError(f"{where}: feature column {name!r} has {int(gone.sum())} missing values "
                         f"(the first in row {int(np.flatnonzero(gone)[0])}); expected a number "
                         f"in every row (fill or drop them first)")
    return series.to_numpy(dtype=np.float64)


# ------------------------------------------------------------------------------------- files


def read_csv(path: str, opts: ReadOptions, where: str) -> Table:
    """A CSV file (any compression pandas infers from the name); the separator is a comma, or
    the one Python's csv sniffer finds when the header has no comma."""
    import pandas as pd

    try:
        df = pd.read_csv(path)
        if df.shape[1] == 1 and "," not in str(df.columns[0]):
            df = pd.read_csv(path, sep=None, engine="python")
    except pd.errors.EmptyDataError:
        raise ValueError(f"{where}: the file is empty; expected a header row of column names "
                         f"and one row per sample") from None
    except Exception as exc:
        raise ValueError(f"{where}: cannot read it as CSV ({type(exc).__name__}: {exc})") from exc
    return frame_table(df, opts, where)


def read_parquet(path: str, opts: ReadOptions, where: str) -> Table:
    import pandas as pd

    try:
        df = pd.read_parquet(path)
    except Exception as exc:
        raise ValueError(f"{where}: cannot read it as Parquet ({type(exc).__name__}: {exc})"
                         ) from exc
    return frame_table(df, opts, where)


def read_hf(path: str, opts: ReadOptions, where: str) -> tuple[Table, Table | None]:
    """A dataset written by ``save_to_disk``: a ``Dataset``, or a ``DatasetDict`` with ``train``
    (and optionally ``test``); the train and test tables."""
    import datasets

    try:
        obj = datasets.load_from_disk(path)
    except Exception as exc:
        raise ValueError(f"{where}: cannot read it with datasets.load_from_disk "
                         f"({type(exc).__name__}: {exc}); expected a folder written by datasets' "
                         f"save_to_disk") from exc
    if isinstance(obj, datasets.DatasetDict):
        if "train" not in obj:
            raise ValueError(f"{where}: the DatasetDict has splits {sorted(obj)}; expected a "
                             f"'train' split (and optionally 'test')")
        train, test = obj["train"], obj.get("test")
    else:
        train, test = obj, None
    columns = list(train.column_names)
    feats = train.features
    arrays = {c for c in columns
              if not isinstance(feats[c], (datasets.Value, datasets.ClassLabel))}
    class_labels = {c for c in columns if isinstance(feats[c], datasets.ClassLabel)}
    label, features, part = pick_columns(columns, arrays, class_labels, opts, where)
    wanted = [label, *features, *([part] if part else [])]

    def table(ds) -> Table:
        missing = [c for c in wanted if c not in ds.column_names]
        if missing:
            raise ValueError(f"{where}: the test split lacks column {missing[0]!r} (it has "
                             f"{ds.column_names})")
        scalars = [c for c in wanted if c not in arrays]
        df = ds.select_columns(scalars).to_pandas()
        return _table(df, label, features, part, arrays, where,
                      x_column=lambda name: _stack(ds[name], name, where))

    return table(train), (table(test) if test is not None else None)
