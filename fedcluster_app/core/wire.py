"""The wire format between the clustered strategies and the ClientApp: one place for every key.

A message may carry several models, each an ``ArrayRecord`` under ``model.<id>``; the
``ConfigRecord`` ``config`` says what to do with them. Replies carry the trained models under
the same keys, a ``MetricRecord`` ``metrics`` with the client's logical id (Flower node ids
change between runs, so nothing long-lived is keyed on them) and per-model metrics under
``metrics.<id>``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from io import BytesIO
from typing import Any

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    Metadata,
    MetricRecord,
    RecordDict,
)
from flwr.app.constants import DEFAULT_TTL
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict
from flwr.supercore.date import now
from flwr.supercore.task_identity import TaskIdentity

# message types (query.* are custom actions handled by @app.query(...))
TRAIN = "train"
EVALUATE = "evaluate"
QUERY_INFO = "query.info"           # logical id, ground-truth concept, data sizes
QUERY_LOSSES = "query.losses"       # loss and accuracy of every model sent, on the training window
QUERY_HISTOGRAM = "query.histogram"  # label histogram of the training window
QUERY_STATE = "query.state"         # the client's context.state, for the server's checkpoint
QUERY_RESTORE = "query.restore"     # put a checkpointed context.state back (a resumed run)
STATE_PREFIX = "state."             # context.state records travel under state.<name>
#: a client's optimizer state of one model in its context.state: + stream id (a model id)
OPTIMIZER_PREFIX = "optimizer-state."

MODEL_PREFIX = "model."
EXTRA_PREFIX = "extra."        # other arrays of a reply (e.g. FedCCFA's classifier rows), by name
CONFIG = "config"
METRICS = "metrics"

# config keys the server sends
ROUND = "server-round"
STEP = "time-step"
TRAIN_IDS = "train-ids"        # models to train (default: every model in the message)
SELECT = "select"              # "min-loss": train only the lowest-loss model (IFCA); the
                               # FedDrift family also "min-error": the lowest 0-1 error
PERSONAL = "personal"          # train/evaluate the client's own model kept in context.state
MIXTURE = "mixture-weights"    # evaluate: predict with this weighted mixture of the models sent
DATA_STEPS = "data-steps"      # train/losses on these time steps' training data instead of the
                               # window; "data-steps.<model id>" sets it for one model
TEST_STEP = "test-step"        # evaluate on this step's data (e.g. FedDrift: the next step)
TEST_SPLIT = "test-split"      # evaluate on that step's "test" split (default) or "train" batch
MODEL_ID = "model-id"          # the model a job trains (a NumPyClient-style fit of one model)

# The run's shared training settings (``config.TrainConfig``) reach every client through the run
# config; a message may change only these for its round (key -> TrainConfig field), and a client
# refuses a message that sets any other (it would make one strategy's recipe differ silently).
TRAIN_LR = "lr"                # e.g. Adaptive-FedAvg's adapted learning rate
TRAIN_PROX_MU = "prox-mu"      # e.g. FedProx's mu where the run leaves it at 0
TRAIN_OVERRIDES = {TRAIN_LR: "lr", TRAIN_PROX_MU: "prox_mu"}

# metric keys clients reply with
CLIENT_ID = "client-id"
CONCEPT = "concept"            # ground truth; read only by metrics and the Oracle strategy
NUM_EXAMPLES = "num-examples"
TRAIN_LOSS = "train-loss"
CHOSEN = "chosen-model"
LOSSES = "losses"
ACCURACIES = "accuracies"
ACCURACY = "accuracy"
LOSS = "loss"
MODEL_IDS = "model-ids"
HISTOGRAM = "histogram"

PERSONAL_MODEL_ID = -1         # id under which a client's personal model is reported

# What a reply's metric holds, checked before a strategy reads it (core/messages.py): a
# "scalar", an "int" or a "unit" (a number in [0, 1]), or a list of them ("list", "int-list",
# "unit-list"). Families declare their own keys with declare_reply_metrics; undeclared keys
# only have to be finite numbers.
REPLY_METRICS: dict[str, str] = {
    CLIENT_ID: "int", CONCEPT: "int", STEP: "int", NUM_EXAMPLES: "int", CHOSEN: "int",
    TRAIN_LOSS: "scalar", ACCURACY: "unit", LOSS: "scalar",
    LOSSES: "list", ACCURACIES: "unit-list", MODEL_IDS: "int-list", HISTOGRAM: "int-list",
}
_METRIC_KINDS = ("scalar", "int", "unit", "list", "int-list", "unit-list")
# lists with one value per model: per id of the reply's model-ids, or per model sent without it
PER_MODEL_METRICS: set[str] = {LOSSES, ACCURACIES}


def declare_reply_metrics(per_model: tuple[str, ...] = (), **kinds: str) -> None:
    """Declare what reply metrics hold, by key (``"fd.counts": "int-list"``; keys with dots
    or dashes are passed as ``declare_reply_metrics(**{"fd.counts": "int-list"})``);
    ``per_model``: the list keys that hold one value per model."""
    PER_MODEL_METRICS.update(per_model)
    for key, kind in kinds.items():
        if kind not in _METRIC_KINDS:
            raise ValueError(f"reply metric {key!r}: kind must be one of {_METRIC_KINDS}, got {kind!r}")
        if REPLY_METRICS.get(key, kind) != kind:
            raise ValueError(f"reply metric {key!r} is already declared {REPLY_METRICS[key]!r}")
        REPLY_METRICS[key] = kind


# ------------------------------------------------------------------ arrays on the wire
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


def _new_array(dtype: str, shape: tuple[int, ...], data: bytes) -> Array:
    """``Array(dtype, shape, "numpy.ndarray", data)`` for arrays this package built itself:
    the same object (``tests/test_base_features.py`` compares them), without the argument checks of
    Flower's constructor, which cost ~10 us per array at several hundred arrays per round."""
    array = Array.__new__(Array)
    array.__dict__.update(_is_dirty=True, dtype=dtype, shape=shape, stype="numpy.ndarray",
                          data=data)
    return array


def to_array(a: np.ndarray) -> Array:
    """``Array.from_numpy_ndarray`` without re-building the .npy header every time."""
    a = np.asarray(a)
    if a.dtype.hasobject:
        return Array.from_numpy_ndarray(a)      # Flower refuses these with its own message
    if not a.flags.c_contiguous:
        a = a.copy(order="C")
    return _new_array(_dtype_name(a.dtype), tuple(a.shape), _npy_header(a) + a.tobytes())


def to_numpy(array: Array) -> np.ndarray:
    """``Array.numpy()`` (a writable copy) without parsing the .npy header every time."""
    held = _held(array)
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
# payload, and unpacking hands back a copy. What gets serialised (context.state, checkpoints)
# always holds bytes, and the byte counts of the communication accounting stay the same.
_BY_REFERENCE = False
_HELD, _WIRE_BYTES = "_fedcluster_held", "_fedcluster_wire_bytes"


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
    if not _BY_REFERENCE or a.dtype.kind not in "biuf":
        return to_array(a)
    held = np.array(a, order="C", copy=True)
    array = _new_array(_dtype_name(held.dtype), tuple(held.shape), b"")
    array.__dict__[_HELD] = held
    array.__dict__[_WIRE_BYTES] = len(_npy_header(held)) + held.nbytes
    return array


def _held(array: Array) -> np.ndarray | None:
    return None if array.data else array.__dict__.get(_HELD)


def _filled(cls: type, items) -> Any:
    """An empty Flower record (or RecordDict) of type ``cls`` with ``items`` put straight into
    its storage, without the per-item checks of its ``__setitem__``: the caller has checked
    them (``tests/test_base_features.py`` compares the results with Flower's own)."""
    record = cls()
    record.__dict__["_data"].update(items)
    return record


_INDEX_KEYS = tuple(str(i) for i in range(64))


def _array_record(arrays: list[Array]) -> ArrayRecord:
    """``ArrayRecord`` holding ``arrays`` under "0", "1", ...: what setting them one by one
    builds, without re-checking the keys and the arrays this package made itself (a check per
    array, hundreds per round)."""
    keys = _INDEX_KEYS if len(arrays) <= len(_INDEX_KEYS) else map(str, range(len(arrays)))
    record = _filled(ArrayRecord, zip(keys, arrays))
    record.__dict__["_is_dirty"] = True
    return record


# Flower's MetricRecord and ConfigRecord check every value as it is set (several records of a
# dozen keys per message). A value of exactly a Python scalar type Flower takes, or a list of
# items of one such type, passes those checks on sight; anything else (NumPy scalars, mixed
# lists, a wrong type) goes through Flower's constructor and gets its check and its error.
_METRIC_SCALARS = frozenset((int, float))
_CONFIG_SCALARS = frozenset((int, float, str, bytes, bool))


def _list_passes_on_sight(value: Any, scalars: frozenset) -> bool:
    if type(value) is not list:
        return False
    if not value:
        return True
    first = type(value[0])
    return first in scalars and all(type(v) is first for v in value)


def _record(cls: type, values: dict, scalars: frozenset):
    for key, value in values.items():   # a plain loop: a dozen values per record, many records
        if type(key) is not str or (type(value) not in scalars
                                    and not _list_passes_on_sight(value, scalars)):
            return cls(values)
    return _filled(cls, values)


def metric_record(values: dict) -> MetricRecord:
    """``MetricRecord(values)``: the same record (``tests/test_base_features.py``), checked
    by sight for plain Python values."""
    return _record(MetricRecord, values, _METRIC_SCALARS)


def config_record(values: dict) -> ConfigRecord:
    """``ConfigRecord(values)``: the same record, checked by sight for plain Python values."""
    return _record(ConfigRecord, values, _CONFIG_SCALARS)


_RECORD_TYPES = frozenset((ArrayRecord, MetricRecord, ConfigRecord))


def record_dict(records: dict[str, Any]) -> RecordDict:
    """``RecordDict(records)`` for records this package built (string keys, Flower records)."""
    for key, record in records.items():
        if type(key) is not str or type(record) not in _RECORD_TYPES:
            return RecordDict(records)
    return _filled(RecordDict, records)


# Flower's Message constructor checks the types of all its arguments and the message type at
# every message, two per client and round (27 us of a FedDrift client round's ~600 us). The
# two messages this package sends most are built here as Flower builds them, with the same
# metadata, without those checks: the content is a RecordDict this package built, and a
# message type is checked by Flower's constructor the first time it is seen.
_CHECKED_TYPES: set[str] = set()


def _message(metadata: dict, content: RecordDict) -> Message:
    meta = Metadata.__new__(Metadata)
    meta.__dict__.update(metadata)
    message = Message.__new__(Message)
    message.__dict__.update(_metadata=meta, _content=content, _error=None)
    return message


def instruction(content: RecordDict, dst_node_id: int, message_type: str,
                group_id: str) -> Message:
    """``Message(content=content, dst_node_id=dst_node_id, message_type=message_type,
    group_id=group_id)``: the same message (``tests/test_base_features.py``)."""
    if (message_type not in _CHECKED_TYPES or type(content) is not RecordDict
            or type(dst_node_id) is not int or type(group_id) is not str):
        message = Message(content=content, dst_node_id=dst_node_id, message_type=message_type,
                          group_id=group_id)
        _CHECKED_TYPES.add(message_type)
        return message
    return _message({
        "_run_id": TaskIdentity.run_id, "_message_id": "", "_src_node_id": TaskIdentity.node_id,
        "_dst_node_id": dst_node_id, "_src_task_id": TaskIdentity.task_id, "_dst_task_id": None,
        "_reply_to_message_id": "", "_group_id": group_id, "_created_at": now().timestamp(),
        "_ttl": DEFAULT_TTL, "_message_type": message_type, "_delivered_at": "",
    }, content)


def reply(content: RecordDict, reply_to: Message) -> Message:
    """``Message(content, reply_to=reply_to)``: the same message (``tests/test_base_features.py``),
    its time to live what is left of the instruction's."""
    if type(content) is not RecordDict:
        return Message(content, reply_to=reply_to)
    source = reply_to.metadata.__dict__
    current = now().timestamp()
    return _message({
        "_run_id": source["_run_id"], "_message_id": "", "_src_node_id": source["_dst_node_id"],
        "_dst_node_id": source["_src_node_id"], "_src_task_id": source["_dst_task_id"],
        "_dst_task_id": source["_src_task_id"], "_reply_to_message_id": source["_message_id"],
        "_group_id": source["_group_id"], "_created_at": current,
        "_ttl": source["_created_at"] + source["_ttl"] - current,
        "_message_type": source["_message_type"], "_delivered_at": "",
    }, content)


def pack_arrays(arrays: list[np.ndarray]) -> ArrayRecord:
    """Arrays as a record of .npy bytes (for context.state and anything serialised)."""
    return _array_record([to_array(a) for a in arrays])


def pack_message_arrays(arrays: list[np.ndarray]) -> ArrayRecord:
    """Arrays for a message: by reference inside one process (``by_reference``), else bytes."""
    return _array_record([_message_array(a) for a in arrays])


def unpack_arrays(record: ArrayRecord) -> list[np.ndarray]:
    return [to_numpy(array) for array in data_of(record).values()]


def pack_models(models: dict[int, list[np.ndarray]]) -> dict[str, ArrayRecord]:
    return {f"{MODEL_PREFIX}{mid}": pack_message_arrays(arrays) for mid, arrays in models.items()}


def data_of(record) -> dict:
    """The dict a Flower record (or RecordDict) keeps its items in, to read: Flower's accessors
    wrap every read of it in a Python call (``dict(record)`` is one per key); a mapping that
    is not a Flower record gives a copy of its items."""
    data = getattr(record, "__dict__", {}).get("_data")
    return data if type(data) is dict else dict(record.items())


def records_of(content: RecordDict, kind: type) -> dict[str, Any]:
    """The records of one kind (``ArrayRecord``, ``MetricRecord``, ``ConfigRecord``) by name:
    what ``content.array_records`` (...) holds, without the type-checked copy Flower builds at
    every access of those properties (several per message, a measurable share of a round)."""
    return {key: record for key, record in data_of(content).items()
            if (type(record) is kind if type(record) in _RECORD_TYPES   # Flower's: on sight
                else isinstance(record, kind))}


def unpack_models(content: RecordDict) -> dict[int, list[np.ndarray]]:
    return {
        int(key[len(MODEL_PREFIX):]): unpack_arrays(record)
        for key, record in records_of(content, ArrayRecord).items()
        if key.startswith(MODEL_PREFIX)
    }


def unpack_extras(content: RecordDict) -> dict[str, list[np.ndarray]]:
    return {
        key[len(EXTRA_PREFIX):]: unpack_arrays(record)
        for key, record in records_of(content, ArrayRecord).items()
        if key.startswith(EXTRA_PREFIX)
    }


def encode_state(content: RecordDict) -> bytes:
    """A client's context.state records (the ``state.<name>`` ones of a reply) as bytes."""
    state = RecordDict({k: v for k, v in content.items() if k.startswith(STATE_PREFIX)})
    return recorddict_to_proto(state).SerializeToString()


def decode_state(blob: bytes) -> RecordDict:
    proto = ProtoRecordDict()
    proto.ParseFromString(blob)
    return recorddict_from_proto(proto)


def model_metrics_key(mid: int) -> str:
    return f"{METRICS}.{mid}"


def build_content(
    models: dict[int, ArrayRecord] | None = None,
    config: dict | None = None,
) -> RecordDict:
    """An instruction message's content; ``models`` are already packed (once per round, since
    the same cluster model goes to many clients)."""
    records = {f"{MODEL_PREFIX}{mid}": rec for mid, rec in (models or {}).items()}
    records[CONFIG] = config_record(config or {})
    return record_dict(records)


def reply_content(
    metrics: dict,
    models: dict[int, list[np.ndarray]] | None = None,
    model_metrics: dict[int, dict] | None = None,
    extras: dict[str, list[np.ndarray]] | None = None,
) -> RecordDict:
    records: dict[str, Any] = pack_models(models or {})
    for name, arrays in (extras or {}).items():
        records[f"{EXTRA_PREFIX}{name}"] = pack_message_arrays(arrays)
    records[METRICS] = metric_record(metrics)
    for mid, values in (model_metrics or {}).items():
        records[model_metrics_key(mid)] = metric_record(values)
    return record_dict(records)


def nbytes(content: RecordDict) -> int:
    """Payload size of a message's arrays (what the communication accounting counts)."""
    return sum(map(record_nbytes, records_of(content, ArrayRecord).values()))


def record_nbytes(record: ArrayRecord) -> int:
    """Payload size of one record's arrays."""
    return sum(array.__dict__.get(_WIRE_BYTES, len(array.data))
               for array in data_of(record).values())
