"""The columns of an Arrow batch that a record gives by itself, not by its JSON value: its topic, timestamp,
timestamp type and headers (:data:`~controlmsg.spark.read_schema.RECORD_COLUMNS`), its watermark fields, and
its key as text. No I/O; :mod:`controlmsg.spark.batches` builds the batches with them.
"""

from __future__ import annotations

from typing import Any, Final

import pyarrow as pa

from controlmsg.kafka.data_records import DataColumns
from controlmsg.kafka.writer import RESERVED_HEADER_PREFIX
from controlmsg.spark.read_schema import HEADERS_TYPE, META_CONTROL, META_WATERMARK, RECORD_COLUMNS, Mark

__all__ = ["check_record_column", "keys_as_text", "record_column", "watermark_column"]

_TIMESTAMP_TYPES: Final = {1: 0, 2: 1}
"""confluent-kafka's timestamp types (1 CreateTime, 2 LogAppendTime) as Kafka numbers them in
``format("kafka")``'s ``timestampType`` (0, 1; -1 none)."""


def check_record_column(name: str, dtype: pa.DataType, declared: str) -> None:
    """Raise ``ValueError`` when field ``name`` (a key of :data:`~controlmsg.spark.read_schema.RECORD_COLUMNS`),
    declared ``declared`` (Arrow type ``dtype``), cannot hold the record's column it names."""
    kind = RECORD_COLUMNS[name]
    fits = {
        "topic": pa.types.is_string(dtype),
        "timestamp": pa.types.is_timestamp(dtype),
        "timestampType": pa.types.is_integer(dtype),
        "headers": (pa.types.is_list(dtype) and pa.types.is_struct(dtype.value_type)
                    and [f.name for f in dtype.value_type] == ["key", "value"]
                    and pa.types.is_string(dtype.value_type.field("key").type)
                    and pa.types.is_binary(dtype.value_type.field("value").type)),
    }[kind]
    if not fits:
        want = {"topic": "string", "timestamp": "timestamp", "timestampType": "int",
                "headers": HEADERS_TYPE}[kind]
        raise ValueError(f"the field {name!r} is the record's {kind}: declare it {want}, not {declared}")


def record_column(name: str, dtype: pa.DataType, records: DataColumns, topic: str, strip: bool) -> pa.Array:
    """A record's topic, timestamp, timestampType or headers (field ``name``, a key of
    :data:`~controlmsg.spark.read_schema.RECORD_COLUMNS`) for every record. ``strip``: headers named with
    :data:`RESERVED_HEADER_PREFIX` (an envelope's own) are left out; a record with no other has null."""
    kind = RECORD_COLUMNS[name]
    n = len(records)
    if kind == "topic":
        return pa.array([topic] * n, pa.string()).cast(dtype)
    if kind == "headers":
        rows: list[list[dict[str, Any]] | None] = []
        for msg in records.messages:
            headers = msg.headers() if msg is not None else None
            if headers and strip:
                headers = [h for h in headers if not h[0].startswith(RESERVED_HEADER_PREFIX)]
            rows.append([{"key": k, "value": v} for k, v in headers] if headers else None)
        return pa.array(rows, dtype)
    stamps = [msg.timestamp() if msg is not None else (0, -1) for msg in records.messages]
    if kind == "timestampType":
        return pa.array([_TIMESTAMP_TYPES.get(kind_, -1) for kind_, _ in stamps], pa.int32()).cast(dtype)
    return (pa.array([ms if kind_ in _TIMESTAMP_TYPES else None for kind_, ms in stamps], pa.int64())
            .cast(pa.timestamp("ms", tz="UTC")).cast(dtype))


def watermark_column(field: pa.Field, marks: list[Mark] | None, n: int) -> pa.Array:
    """A data row's ``_control`` (false), or its ``_watermark`` / ``_partition_watermark`` from ``marks``
    (all null when the read fills no watermark)."""
    if field.name == META_CONTROL:
        return pa.repeat(False, n)
    if marks is None:
        return pa.nulls(n, field.type)
    which = 0 if field.name == META_WATERMARK else 1
    return pa.array([m[which] for m in marks], pa.int64()).cast(pa.timestamp("ms", tz="UTC")).cast(field.type)


def _all_utf8(chunks: list[bytes | None]) -> bool:
    """Whether every chunk (``None`` skipped) is UTF-8 text, as Python's strict decoder judges it, in one
    decode: pieces joined by an ASCII byte form valid UTF-8 exactly when every piece does."""
    try:
        b"\n".join(filter(None, chunks)).decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def keys_as_text(records: DataColumns, bad: dict[int, str], escape: bool) -> pa.Array | list[str | None]:
    """Keys as UTF-8 text: an Arrow string array when every key is UTF-8 (the usual case, without a Python
    object per key); otherwise a list in which a key that is not UTF-8 is entered as bad, and given with
    its bytes escaped (``\\xNN``) when ``escape``, else as null."""
    keys = records.keys
    if _all_utf8(keys):
        return pa.array(keys, pa.binary()).cast(pa.string())
    out: list[str | None] = []
    for i, key in enumerate(keys):
        if key is None:
            out.append(None)
            continue
        try:
            out.append(key.decode("utf-8"))
        except UnicodeDecodeError:
            bad.setdefault(i, "the key is not UTF-8 text; declare the key field as binary to read it as bytes")
            out.append(key.decode("utf-8", "backslashreplace") if escape else None)
    return out
