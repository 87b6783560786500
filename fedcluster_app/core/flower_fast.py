"""Shortcuts through Flower's private fields (the fast path), behind one switch: ``FAST_PATH``.

Flower's arrays, records and messages check every argument and value as they are built, and its
accessors copy what they hand out (``content.array_records`` builds a type-checked dict at every
access): several checks per value, a dozen values per record, several records per message, two
messages per client and round. For what this package builds itself (values of plain Python types,
arrays it encoded, records it filled) the checks cannot fail, and on the paper's tiny models
they cost more than the training. The functions here build the very objects Flower's public API
builds (``tests/core/test_flower_fast.py`` compares them) by filling the private fields of flwr
1.41's classes (``__dict__``, a record's ``_data``, a message's ``_metadata``) directly, and read
a record's storage in place. Anything they are not sure of (a NumPy scalar, a mixed list, a
message type not seen yet) still goes through Flower's constructor and its checks.

``FAST_PATH`` is the one switch: with it False every function here goes through Flower's public
API instead, and messages and their arrays stay the same (``tests/core/test_flower_fast.py`` builds
them both ways); ``fast_path(False)`` turns it off for a block. No other module of the package
touches Flower's private fields for speed: they call these functions.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
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
from flwr.supercore.date import now
from flwr.supercore.task_identity import TaskIdentity

#: the switch: True, the shortcuts below; False, Flower's public API everywhere
FAST_PATH = True


@contextmanager
def fast_path(enabled: bool) -> Iterator[None]:
    """``FAST_PATH = enabled`` for the block (e.g. a test comparing both ways)."""
    global FAST_PATH
    before, FAST_PATH = FAST_PATH, enabled
    try:
        yield
    finally:
        FAST_PATH = before


# ------------------------------------------------------------------ arrays
def new_array(dtype: str, shape: tuple[int, ...], data: bytes) -> Array:
    """``Array(dtype, shape, "numpy.ndarray", data)`` for arrays this package built itself:
    the same object, without the argument checks of Flower's constructor, which cost ~10 us
    per array at several hundred arrays per round."""
    if not FAST_PATH:
        return Array(dtype, shape, "numpy.ndarray", data)
    array = Array.__new__(Array)
    array.__dict__.update(_is_dirty=True, dtype=dtype, shape=shape, stype="numpy.ndarray",
                          data=data)
    return array


# In one process (the in-process engine, ``codec.by_reference``) an array need not become .npy
# bytes and back: it is held as a private copy beside an empty payload, with the byte count its
# bytes would have had (the communication accounting stays the same). Only on the fast path:
# on Flower's public API an Array holds bytes.
_HELD, _WIRE_BYTES = "_fedcluster_held", "_fedcluster_wire_bytes"


def held_array(held: np.ndarray, dtype: str, wire_bytes: int) -> Array | None:
    """An Array holding ``held`` (C-contiguous, the caller's own copy) by reference, or None
    off the fast path (the caller then sends bytes)."""
    if not FAST_PATH:
        return None
    array = Array.__new__(Array)    # new_array's Array and the two entries, in one update
    array.__dict__.update(_is_dirty=True, dtype=dtype, shape=tuple(held.shape),
                          stype="numpy.ndarray", data=b"", **{_HELD: held, _WIRE_BYTES: wire_bytes})
    return array


def held(array: Array) -> np.ndarray | None:
    """The array an Array of :func:`held_array` holds, or None (an Array of bytes)."""
    if not FAST_PATH:
        return None
    return None if array.data else array.__dict__.get(_HELD)


def wire_bytes(array: Array) -> int:
    """An Array's payload size: its bytes, or what they would be for a held array."""
    if not FAST_PATH:
        return len(array.data)
    return array.__dict__.get(_WIRE_BYTES, len(array.data))


# ------------------------------------------------------------------ records
def _filled(cls: type, items) -> Any:
    """An empty Flower record (or RecordDict) of type ``cls`` with ``items`` put straight into
    its storage, without the per-item checks of its ``__setitem__``: the caller has checked
    them."""
    record = cls()
    record.__dict__["_data"].update(items)
    return record


_INDEX_KEYS = tuple(str(i) for i in range(64))


def array_record(arrays: list[Array]) -> ArrayRecord:
    """``ArrayRecord`` holding ``arrays`` under "0", "1", ...: what setting them one by one
    builds, without re-checking the keys and the arrays this package made itself (a check per
    array, hundreds per round)."""
    keys = _INDEX_KEYS if len(arrays) <= len(_INDEX_KEYS) else map(str, range(len(arrays)))
    if not FAST_PATH:
        record = ArrayRecord()
        for key, array in zip(keys, arrays):
            record[key] = array
        return record
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
    if not FAST_PATH:
        return cls(values)
    for key, value in values.items():   # a plain loop: a dozen values per record, many records
        if type(key) is not str or (type(value) not in scalars
                                    and not _list_passes_on_sight(value, scalars)):
            return cls(values)
    return _filled(cls, values)


def metric_record(values: dict) -> MetricRecord:
    """``MetricRecord(values)``: the same record, checked by sight for plain Python values."""
    return _record(MetricRecord, values, _METRIC_SCALARS)


def config_record(values: dict) -> ConfigRecord:
    """``ConfigRecord(values)``: the same record, checked by sight for plain Python values."""
    return _record(ConfigRecord, values, _CONFIG_SCALARS)


_RECORD_TYPES = frozenset((ArrayRecord, MetricRecord, ConfigRecord))


def record_dict(records: dict[str, Any]) -> RecordDict:
    """``RecordDict(records)`` for records this package built (string keys, Flower records)."""
    if not FAST_PATH:
        return RecordDict(records)
    for key, record in records.items():
        if type(key) is not str or type(record) not in _RECORD_TYPES:
            return RecordDict(records)
    return _filled(RecordDict, records)


def data_of(record) -> dict:
    """The items of a Flower record (or RecordDict), to read: on the fast path the dict the
    record keeps them in (Flower's accessors wrap every read of it in a Python call;
    ``dict(record)`` is one per key); else, or for a mapping that is not a Flower record, a
    copy of its items."""
    if not FAST_PATH:
        return dict(record.items())
    data = getattr(record, "__dict__", {}).get("_data")
    return data if type(data) is dict else dict(record.items())


def records_of(content: RecordDict, kind: type) -> dict[str, Any]:
    """The records of one kind (``ArrayRecord``, ``MetricRecord``, ``ConfigRecord``) by name:
    what ``content.array_records`` (...) holds, without the type-checked copy Flower builds at
    every access of those properties (several per message, a measurable share of a round)."""
    return {key: record for key, record in data_of(content).items()
            if (type(record) is kind if type(record) in _RECORD_TYPES   # Flower's: on sight
                else isinstance(record, kind))}


# ------------------------------------------------------------------ messages
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
                group_id: str, ttl: float = DEFAULT_TTL) -> Message:
    """``Message(content=content, dst_node_id=dst_node_id, message_type=message_type,
    group_id=group_id, ttl=ttl)``: the same message."""
    if (not FAST_PATH or message_type not in _CHECKED_TYPES or type(content) is not RecordDict
            or type(dst_node_id) is not int or type(group_id) is not str):
        message = Message(content=content, dst_node_id=dst_node_id, message_type=message_type,
                          group_id=group_id, ttl=ttl)
        _CHECKED_TYPES.add(message_type)
        return message
    return _message({
        "_run_id": TaskIdentity.run_id, "_message_id": "", "_src_node_id": TaskIdentity.node_id,
        "_dst_node_id": dst_node_id, "_src_task_id": TaskIdentity.task_id, "_dst_task_id": None,
        "_reply_to_message_id": "", "_group_id": group_id, "_created_at": now().timestamp(),
        "_ttl": float(ttl), "_message_type": message_type, "_delivered_at": "",
    }, content)


def reply(content: RecordDict, reply_to: Message) -> Message:
    """``Message(content, reply_to=reply_to)``: the same message, its time to live what is left
    of the instruction's."""
    if not FAST_PATH or type(content) is not RecordDict:
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


def expired(message: Message) -> bool:
    """Whether ``message``'s time to live has run out (the SuperLink's rule: created_at + ttl
    is past), on this machine's clock."""
    meta = message.metadata
    return meta.created_at + meta.ttl <= now().timestamp()
