"""NumPy arrays on the wire, and what a message carries (the array codec).

* arrays <-> Flower ``Array``s (:func:`to_array`, :func:`to_numpy`): the .npy bytes
  ``Array.from_numpy_ndarray`` writes, with the header built and parsed once per (dtype,
  shape); inside one process (:func:`by_reference`) a message's arrays are held as private
  copies instead of bytes;
* lists of arrays <-> ``ArrayRecord``s (:func:`pack_arrays`, :func:`pack_message_arrays`,
  :func:`unpack_arrays`) and their payload sizes (:func:`nbytes`, :func:`record_nbytes`: what the
  communication accounting counts);
* a message's content under the keys of ``core/wire.py``: an instruction's
  (:func:`build_content`), a reply's (:func:`reply_content`), the models and extras in one
  (:func:`unpack_models`, :func:`unpack_extras`), a client's context.state as bytes for the
  server's checkpoint (:func:`encode_state`, :func:`decode_state`).

Records and messages are built through ``core/flower_fast.py`` (Flower's objects without its
per-value checks, behind one switch).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from io import BytesIO
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, RecordDict
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict

from fedcluster_app.core import flower_fast
from fedcluster_app.core.wire import (
    CONFIG,
    EXTRA_PREFIX,
    METRICS,
    MODEL_PREFIX,
    STATE_PREFIX,
    model_metrics_key,
)

# ------------------------------------------------------------------ arrays
# Flower's Array.numpy() / Array.from_numpy_ndarray() go through np.load / np.save, which parse
# and build the .npy header (with ast.literal_eval) for every array: on the paper's tiny MLPs
# that costs more than the training. The same .npy bytes are built and read here with the
# header cached per (dtype, shape), so any Flower runtime still decodes them with np.load.
_HEADERS: dict[tuple[str, tuple[int, ...]], bytes] = {}      # (dtype.str, shape) -> header
_LAYOUTS: dict[bytes, tuple[np.dtype, tuple[int, ...], str]] = {}  # header -> layout
_CACHE_LIMIT = 4096


def _npy_header(a: np.ndarray) -> bytes:
    key = (a.dtype.str, a.shape)
    header = _HEADERS.get(key)
    if header is None:
        buf = BytesIO()
        np.lib.format.write_array_header_1_0(buf, np.lib.format.header_data_from_array_1_0(a))
        header = buf.getvalue()
        if len(_HEADERS) < _CACHE_LIMIT:
            _HEADERS[key] = header
    return header


def _dtype_name(dtype: np.dtype) -> str:
    """``str(dtype)``, cached: NumPy builds that string in Python, a noticeable cost at a few
    dozen arrays per message."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype)
    return name


_DTYPE_NAMES: dict[np.dtype, str] = {}


def to_array(a: np.ndarray) -> Array:
    """``Array.from_numpy_ndarray`` without re-building the .npy header every time."""
    a = np.asarray(a)
    if a.dtype.hasobject:
        return Array.from_numpy_ndarray(a)      # Flower refuses these with its own message
    if not a.flags.c_contiguous:
        a = a.copy(order="C")
    return flower_fast.new_array(_dtype_name(a.dtype), tuple(a.shape),
                                 _npy_header(a) + a.tobytes())


def to_numpy(array: Array) -> np.ndarray:
    """``Array.numpy()`` (a writable copy) without parsing the .npy header every time."""
    held = flower_fast.held(array)
    if held is not None:
        return held.copy()
    data = array.data
    if array.stype != "numpy.ndarray" or data[:6] != b"\x93NUMPY":
        return array.numpy()
    end = 10 if data[6] == 1 else 12
    start = end + int.from_bytes(data[8:end], "little")
    layout = _LAYOUTS.get(data[:start])
    if layout is None:
        buf = BytesIO(data)
        version = np.lib.format.read_magic(buf)
        read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                else np.lib.format.read_array_header_2_0)
        shape, fortran, dtype = read(buf)
        if dtype.hasobject:
            return array.numpy()
        layout = (dtype, shape, "F" if fortran else "C")
        if len(_LAYOUTS) < _CACHE_LIMIT:
            _LAYOUTS[data[:start]] = layout
    dtype, shape, order = layout
    if str(dtype) != array.dtype or shape != tuple(array.shape):
        raise ValueError(f"the array's data hold {dtype}{list(shape)}; its record says "
                         f"{array.dtype}{list(array.shape)}")
    count = int(np.prod(shape, dtype=np.int64))
    flat = np.frombuffer(data, dtype=dtype, count=count, offset=start)
    return flat.reshape(shape, order=order).copy(order="K")


# In one process (the in-process engine) a message's arrays need not become .npy bytes and back:
# under ``by_reference()`` the arrays of messages are held as private copies beside an empty
# payload (``flower_fast.held_array``), and unpacking hands back a copy. What gets serialised
# (context.state, checkpoints) always holds bytes, and the byte counts of the communication
# accounting stay the same.
_BY_REFERENCE = False


@contextmanager
def by_reference() -> Iterator[None]:
    global _BY_REFERENCE
    before, _BY_REFERENCE = _BY_REFERENCE, True
    try:
        yield
    finally:
        _BY_REFERENCE = before


def _message_array(a: np.ndarray) -> Array:
    a = np.asarray(a)
    if _BY_REFERENCE and a.dtype.kind in "biuf":
        held = np.array(a, order="C", copy=True)
        key = (held.dtype, held.shape)
        layout = _HELD_LAYOUTS.get(key)
        if layout is None:
            layout = (_dtype_name(held.dtype), len(_npy_header(held)))
            if len(_HELD_LAYOUTS) < _CACHE_LIMIT:
                _HELD_LAYOUTS[key] = layout
        array = flower_fast.held_array(held, layout[0], layout[1] + held.nbytes)
        if array is not None:
            return array
    return to_array(a)


# (dtype, shape) -> (dtype name, .npy header length) of a held array: one look-up where the
# name and the header cost two (hundreds of thousands of arrays in a KUE run)
_HELD_LAYOUTS: dict[tuple[np.dtype, tuple[int, ...]], tuple[str, int]] = {}


def pack_arrays(arrays: list[np.ndarray]) -> ArrayRecord:
    """Arrays as a record of .npy bytes (for context.state and anything serialised)."""
    return flower_fast.array_record([to_array(a) for a in arrays])


def pack_message_arrays(arrays: list[np.ndarray]) -> ArrayRecord:
    """Arrays for a message: by reference inside one process (``by_reference``), else bytes."""
    return flower_fast.array_record([_message_array(a) for a in arrays])


def unpack_arrays(record: ArrayRecord) -> list[np.ndarray]:
    return [to_numpy(array) for array in flower_fast.data_of(record).values()]


def nbytes(content: RecordDict) -> int:
    """Payload size of a message's arrays (what the communication accounting counts)."""
    return sum(map(record_nbytes, flower_fast.records_of(content, ArrayRecord).values()))


def record_nbytes(record: ArrayRecord) -> int:
    """Payload size of one record's arrays."""
    return sum(map(flower_fast.wire_bytes, flower_fast.data_of(record).values()))


# ------------------------------------------------------------------ a message's content
def pack_models(models: dict[int, list[np.ndarray]]) -> dict[str, ArrayRecord]:
    return {f"{MODEL_PREFIX}{mid}": pack_message_arrays(arrays) for mid, arrays in models.items()}


def unpack_models(content: RecordDict) -> dict[int, list[np.ndarray]]:
    return {
        int(key[len(MODEL_PREFIX):]): unpack_arrays(record)
        for key, record in flower_fast.records_of(content, ArrayRecord).items()
        if key.startswith(MODEL_PREFIX)
    }


def unpack_extras(content: RecordDict) -> dict[str, list[np.ndarray]]:
    return {
        key[len(EXTRA_PREFIX):]: unpack_arrays(record)
        for key, record in flower_fast.records_of(content, ArrayRecord).items()
        if key.startswith(EXTRA_PREFIX)
    }


def build_content(
    models: dict[int, ArrayRecord] | None = None,
    config: dict | None = None,
) -> RecordDict:
    """An instruction message's content; ``models`` are already packed (once per round, since
    the same cluster model goes to many clients)."""
    records = {f"{MODEL_PREFIX}{mid}": rec for mid, rec in (models or {}).items()}
    records[CONFIG] = flower_fast.config_record(config or {})
    return flower_fast.record_dict(records)


def reply_content(
    metrics: dict,
    models: dict[int, list[np.ndarray]] | None = None,
    model_metrics: dict[int, dict] | None = None,
    extras: dict[str, list[np.ndarray]] | None = None,
) -> RecordDict:
    records: dict[str, Any] = pack_models(models or {})
    for name, arrays in (extras or {}).items():
        records[f"{EXTRA_PREFIX}{name}"] = pack_message_arrays(arrays)
    records[METRICS] = flower_fast.metric_record(metrics)
    for mid, values in (model_metrics or {}).items():
        records[model_metrics_key(mid)] = flower_fast.metric_record(values)
    return flower_fast.record_dict(records)


def encode_state(content: RecordDict) -> bytes:
    """A client's context.state records (the ``state.<name>`` ones of a reply) as bytes."""
    state = RecordDict({k: v for k, v in content.items() if k.startswith(STATE_PREFIX)})
    return recorddict_to_proto(state).SerializeToString()


def decode_state(blob: bytes) -> RecordDict:
    proto = ProtoRecordDict()
    proto.ParseFromString(blob)
    return recorddict_from_proto(proto)
