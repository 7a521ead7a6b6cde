"""Arrow batches from the records a reading task polled: what every reader of ``format("controlmsg")``
builds its rows with (:mod:`controlmsg.spark.reading`). No I/O: a builder takes records (parallel lists,
:class:`~controlmsg.kafka.reader.DataColumns`) and returns a batch and the bad records it set aside; what a
task then does with those is :mod:`controlmsg.spark.reading.bad_records`.

**Schema.** Without a schema the columns are ``format("kafka")``'s (:data:`RAW_SCHEMA`): ``key binary,
value binary, topic string, partition int, offset long, timestamp timestamp, timestampType int``, and
``headers array<struct<key:string,value:binary>>`` with option ``includeHeaders``. A declared schema of
those columns only, with ``value`` declared binary or one of ``topic``, ``partition``, ``offset``,
``timestampType``, ``headers`` (:func:`is_raw_schema`; ``key`` and ``value`` may be string, read as UTF-8
text) reads records as they are too, e.g. ``partition int, offset long, key string, value string``, the
schema-less columns before issue 30; in a stream, with the watermark fields too (``value binary,
_watermark timestamp, _control boolean``: Avro or Protobuf payloads decoded after the read). Any other
``.schema(ddl)`` parses the JSON value and takes each field from the JSON object's member of that name
(missing: null); ``_partition``, ``_offset``, ``_key`` (string or binary),
``_topic``, ``_timestamp``, ``_timestampType`` and ``_headers`` are the record's own. ``headers`` of an
intermediate topic leaves out controlmsg's own headers (``controlmsg-run``, ``controlmsg-task``; a record
with no other has null), a plain topic's has them all. In a stream, ``_watermark`` (timestamp) is the
reconciled watermark of the topic in force when the record was read: the watermark at the start of the
micro-batch, advanced by the control messages read before the record on its own partition, and never above
the watermark at the micro-batch's end; null until every upstream task has reported on every partition;
``_partition_watermark`` (timestamp) is the watermark of the record's own partition there (the minimum over
the upstream tasks on that partition alone), which depends only on what the partition holds before the
record, so that every query over the topic finds the same records behind it. With a boolean
``_control`` too, a micro-batch in which the watermark moved or the stream ended also has one watermark
row (``_control`` true, every other field null; see :mod:`controlmsg.spark.event_time`). JSON types map
directly (an integer field takes JSON integers only: a fraction or ``true`` does not fit, where pyarrow
alone would truncate ``2.5`` to ``2``; a floating-point field takes any JSON number); timestamp and date
fields take ISO-8601 strings, decimals numbers or strings, binary fields base64 strings.

A record that does not fit is **bad**; option ``mode`` says what its batch becomes (see
:mod:`controlmsg.spark.reading.bad_records` for the modes as a user sees them): FAILFAST raises
:class:`~controlmsg.errors.ReadError`, DROPMALFORMED leaves its row out, PERMISSIVE keeps the row (the
fields that do not fit null) and puts the value in the corrupt-record column.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from itertools import repeat
from typing import Any, Final

import orjson
import pyarrow as pa
from pyspark.sql.types import StructType

from controlmsg.errors import ReadError
from controlmsg.kafka.reader import DataColumns, DataRecord
from controlmsg.kafka.writer import RESERVED_HEADER_PREFIX
from controlmsg.spark.options import BadRecordMode, ReadOptions

__all__ = [
    "HEADERS_TYPE",
    "META_CONTROL",
    "META_PARTITION_WATERMARK",
    "META_WATERMARK",
    "RAW_SCHEMA",
    "WATERMARK_FIELDS",
    "Builder",
    "Built",
    "Mark",
    "batch_builder",
    "is_raw_schema",
    "raw_schema",
    "tick_batch",
]

RAW_SCHEMA: Final = ("key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
                     "timestampType int")
"""The columns of a read without ``.schema(...)``: those of ``format("kafka")``, in its order and types."""
HEADERS_TYPE: Final = "array<struct<key:string,value:binary>>"
"""The type of the ``headers`` column (read with ``includeHeaders``, written by a writer), as in ``format("kafka")``."""
_CONNECTOR_NAMES: Final = ("key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers")
_RECORD_ONLY: Final = frozenset({"topic", "partition", "offset", "timestampType", "headers"})
"""Connector columns that are unlikely JSON field names: a schema of connector columns with ``value`` and one
of these reads the records as they are (see :func:`is_raw_schema`)."""
_META_PARTITION: Final = "_partition"
_META_OFFSET: Final = "_offset"
_META_KEY: Final = "_key"
_META_TOPIC: Final = "_topic"
_META_TIMESTAMP: Final = "_timestamp"
_META_TIMESTAMP_TYPE: Final = "_timestampType"
_META_HEADERS: Final = "_headers"
_RECORD_COLUMNS: Final = {"topic": "topic", "timestamp": "timestamp", "timestampType": "timestampType",
                          "headers": "headers", _META_TOPIC: "topic", _META_TIMESTAMP: "timestamp",
                          _META_TIMESTAMP_TYPE: "timestampType", _META_HEADERS: "headers"}
"""The columns of a record's topic, timestamp and headers, in a raw schema and (``_``-prefixed) in a JSON one."""
_TIMESTAMP_TYPES: Final = {1: 0, 2: 1}
"""confluent-kafka's timestamp types (1 CreateTime, 2 LogAppendTime) as Kafka numbers them in
``format("kafka")``'s ``timestampType`` (0, 1; -1 none)."""


def raw_schema(include_headers: bool) -> str:
    """The schema of a read without ``.schema(...)``: :data:`RAW_SCHEMA`, and ``headers`` with option
    ``includeHeaders``."""
    return f"{RAW_SCHEMA}, headers {HEADERS_TYPE}" if include_headers else RAW_SCHEMA


def is_raw_schema(names: list[str], *, binary_value: bool = False) -> bool:
    """Whether a schema with fields ``names`` reads records as they are (no JSON). Leaving out the watermark
    fields (:data:`WATERMARK_FIELDS`, which a raw read of a stream fills too): every field one of
    ``format("kafka")``'s columns, ``value`` among them, and either ``value`` declared binary
    (``binary_value``: JSON has no bytes, so a binary ``value`` next to the record's columns is the record's
    own) or at least one of ``topic``, ``partition``, ``offset``, ``timestampType``, ``headers`` (a schema of
    ``key``, ``value`` and ``timestamp`` alone, ``value`` not binary, is taken as JSON fields of those names).
    ``partition int, offset long, key string, value string``, the raw columns before the connector's, is one;
    so is ``value binary, _watermark timestamp, _control boolean``, a stream of Avro or Protobuf payloads with
    its watermark (decoded after the read with ``from_avro`` / ``from_protobuf``)."""
    own = [name for name in names if name not in WATERMARK_FIELDS]
    return (bool(own) and set(own) <= set(_CONNECTOR_NAMES) and "value" in own
            and (binary_value or bool(_RECORD_ONLY & set(own))))


META_WATERMARK: Final = "_watermark"
META_CONTROL: Final = "_control"
META_PARTITION_WATERMARK: Final = "_partition_watermark"
WATERMARK_FIELDS: Final = (META_WATERMARK, META_PARTITION_WATERMARK, META_CONTROL)
"""The fields only a stream of an intermediate topic fills (its watermark); the other reads refuse them."""


Mark = tuple["int | None", "int | None"]
"""A record's ``_watermark`` and ``_partition_watermark`` in epoch ms (``None``: undefined)."""
Built = tuple[pa.RecordBatch, "list[tuple[DataRecord, str]]"]
"""A batch, and the bad records set aside while building it (with their reasons, in reading order)."""
Builder = Callable[[DataColumns, str, "list[Mark] | None"], Built]
"""Builds a batch from records (parallel lists, no object per record) and their watermark values."""


def _arrow_schema(schema: StructType) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def batch_builder(schema: StructType, opts: ReadOptions) -> tuple[Builder, bool]:
    """The batch builder for ``schema`` and whether the schema has a field of :data:`WATERMARK_FIELDS`
    (then the builder takes each record's :data:`Mark`). Raises ``ValueError`` for a schema the
    bad-record options cannot work with: the readers call it at planning time to refuse such a schema
    before any task runs. The builder raises :class:`~controlmsg.errors.ReadError` under FAILFAST for the
    first bad record of a batch, and when the records fit one by one but not together."""
    arrow_schema = _arrow_schema(schema)
    names = schema.fieldNames()
    raw = is_raw_schema(names, binary_value="value" in names and pa.types.is_binary(arrow_schema.field("value").type))
    for name in names:
        if name in _RECORD_COLUMNS and (raw or name.startswith("_")):
            _check_record_column(name, arrow_schema.field(name).type, schema[name].dataType.simpleString())
    corrupt = opts.corrupt_column if opts.corrupt_column in names else None
    binary = False
    if corrupt is not None:
        ctype = arrow_schema.field(corrupt).type
        if not (pa.types.is_string(ctype) or pa.types.is_large_string(ctype) or pa.types.is_binary(ctype)):
            raise ValueError(f"the corrupt-record column {corrupt!r} must be of type string or binary, not "
                             f"{schema[corrupt].dataType.simpleString()}")
        binary = pa.types.is_binary(ctype)
    # Read as they are, a binary key and value never make a record bad (the columns without a schema).
    raw_text = raw and any(not pa.types.is_binary(arrow_schema.field(n).type) for n in ("key", "value") if n in names)
    if opts.mode is BadRecordMode.PERMISSIVE and (raw_text or (not raw and corrupt is None)):
        raise ValueError(
            "mode PERMISSIVE keeps a bad record's row and its value in the corrupt-record column, and nothing may "
            f"be lost: declare the column in the schema ('{opts.corrupt_column} string', or binary; see the option "
            "columnNameOfCorruptRecord)" + (" next to the JSON fields; or read key and value as binary (as without "
                                            "a schema) and no record is bad" if raw else ""))
    if META_CONTROL in names:
        if not pa.types.is_boolean(arrow_schema.field(META_CONTROL).type):
            raise ValueError(f"the field '{META_CONTROL}' marks the rows that carry only a watermark: declare it "
                             f"boolean, not {schema[META_CONTROL].dataType.simpleString()}")
        if META_WATERMARK not in names:
            raise ValueError(f"the field '{META_CONTROL}' marks rows that carry only a '{META_WATERMARK}': "
                             f"declare '{META_WATERMARK} timestamp' too")
    policy = _Policy(opts.mode, corrupt, binary, strip_headers=not opts.plain)
    marked = any(name in names for name in WATERMARK_FIELDS)
    return (_raw_builder if raw else _json_builder)(arrow_schema, policy), marked


def tick_batch(schema: StructType, watermark: int) -> pa.RecordBatch:
    """One watermark row of ``schema`` (which has ``_control``): ``_control`` true, ``_watermark`` set
    (epoch ms), every other field null; a micro-batch's last task adds it after its records."""
    arrow_schema = _arrow_schema(schema)
    arrays = []
    for field in arrow_schema:
        if field.name == META_CONTROL:
            arrays.append(pa.array([True]))
        elif field.name == META_WATERMARK:
            arrays.append(pa.array([watermark], pa.int64()).cast(pa.timestamp("ms", tz="UTC")).cast(field.type))
        else:
            arrays.append(pa.nulls(1, field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)


_FIT_ERRORS: Final = (pa.ArrowInvalid, pa.ArrowTypeError, ValueError, TypeError, ArithmeticError)
_HINT: Final = ("; to read past such records, set the option deadLetterTopic (they go there) or mode PERMISSIVE "
                "(their rows are kept)")


def _check_record_column(name: str, dtype: pa.DataType, declared: str) -> None:
    kind = _RECORD_COLUMNS[name]
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


def _record_column(name: str, dtype: pa.DataType, records: DataColumns, topic: str, strip: bool) -> pa.Array:
    """A record's topic, timestamp, timestampType or headers (field ``name``, a key of
    :data:`_RECORD_COLUMNS`) for every record. ``strip``: headers named with
    :data:`RESERVED_HEADER_PREFIX` (an envelope's own) are left out; a record with no other has null."""
    kind = _RECORD_COLUMNS[name]
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


@dataclass(frozen=True, slots=True)
class _Policy:
    """How a builder treats bad records: ``mode``, and the corrupt-record column when the schema has it;
    ``strip_headers``: the ``headers`` column leaves controlmsg's own out (an intermediate topic)."""

    mode: BadRecordMode
    corrupt: str | None
    corrupt_binary: bool
    strip_headers: bool = False


Columns = Callable[[DataColumns, str, "list[Mark] | None", dict[int, str]], "list[pa.Array | None]"]
"""Builds a batch's columns from its records (and ``_watermark`` values), entering each bad record's index
and reason in the dict; ``None`` stands for the corrupt-record column, which the builder fills."""


def _settling(schema: pa.Schema, policy: _Policy, columns: Columns) -> Builder:
    """A builder that applies ``policy`` to what ``columns`` found bad.

    FAILFAST raises :class:`ReadError` for the first bad record of the batch (in reading order), naming
    topic, partition, offset and reason. DROPMALFORMED builds the batch from the good records only.
    PERMISSIVE keeps every row (``columns`` has nulled what could not be read) and puts the value of each
    bad record in the corrupt-record column. The records set aside (all but FAILFAST) are returned with
    their reasons, in reading order."""

    def build(records: DataColumns, topic: str, marks: list[Mark] | None) -> Built:
        bad: dict[int, str] = {}
        arrays = columns(records, topic, marks, bad)
        if bad:
            first = min(bad)
            if policy.mode is BadRecordMode.FAILFAST:
                raise ReadError(f"topic {topic!r} partition {records.partitions[first]} offset "
                                f"{records.offsets[first]}: {bad[first]}{_HINT}")
            aside = [(records.record(i), bad[i]) for i in sorted(bad)]
            if policy.mode is BadRecordMode.DROPMALFORMED:
                keep = [i for i in range(len(records)) if i not in bad]
                batch, again = build(records.select(keep), topic,
                                     None if marks is None else [marks[i] for i in keep])
                if again:  # a record good on its own but not with the others: no way to tell which to drop
                    raise ReadError(f"topic {topic!r} partitions {_parts(records)}: cannot make a batch of the "
                                    f"records that fit the schema: {again[0][1]}")
                return batch, aside
        else:
            aside = []
        if policy.corrupt is not None:  # the schema has the column: null but for the bad records' values
            ctype = schema.field(policy.corrupt).type
            payloads = records.payloads
            corrupt = (pa.array([_raw_value(payloads[i], policy.corrupt_binary) if i in bad else None
                                 for i in range(len(records))], pa.binary() if policy.corrupt_binary else pa.string())
                       .cast(ctype) if bad else pa.nulls(len(records), ctype))
            arrays = [corrupt if a is None else a for a in arrays]
        return pa.RecordBatch.from_arrays(arrays, schema=schema), aside

    return build


def _raw_value(payload: bytes, binary: bool) -> bytes | str:
    """A bad record's value for the corrupt-record column: the user serde's bytes as they are (binary
    column), or as UTF-8 text with every byte that is not UTF-8 written ``\\xNN`` (string column)."""
    return payload if binary else payload.decode("utf-8", "backslashreplace")


def _all_utf8(chunks: list[bytes | None]) -> bool:
    """Whether every chunk (``None`` skipped) is UTF-8 text, as Python's strict decoder judges it, in one
    decode: pieces joined by an ASCII byte form valid UTF-8 exactly when every piece does."""
    try:
        b"\n".join(filter(None, chunks)).decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _keys_as_text(records: DataColumns, bad: dict[int, str], escape: bool) -> pa.Array | list[str | None]:
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


def _raw_builder(schema: pa.Schema, policy: _Policy) -> Builder:
    names = schema.names
    key_type = schema.field("key").type if "key" in names else pa.binary()
    value_type = schema.field("value").type

    def columns(records: DataColumns, topic: str, marks: list[Mark] | None,
                bad: dict[int, str]) -> list[pa.Array | None]:
        keys: pa.Array | None = None
        if "key" not in names:
            pass
        elif pa.types.is_binary(key_type):
            keys = pa.array(records.keys, pa.binary())
        else:
            texts = _keys_as_text(records, bad, escape=False)
            keys = (texts if isinstance(texts, pa.Array) else pa.array(texts, pa.string())).cast(key_type)
        values = pa.array(records.payloads, pa.binary())
        if not pa.types.is_binary(value_type):
            try:
                values = values.cast(value_type)
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                decoded: list[str | None] = []
                for i, payload in enumerate(records.payloads):
                    try:
                        decoded.append(payload.decode("utf-8"))
                    except UnicodeDecodeError:
                        bad.setdefault(i, "the value is not UTF-8 text; declare the value field as binary to "
                                          "read it as bytes")
                        decoded.append(None)
                values = pa.array(decoded, pa.string()).cast(value_type)
        out: list[pa.Array | None] = []
        for field in schema:
            if field.name == "key":
                out.append(keys)
            elif field.name == "value":
                out.append(values)
            elif field.name == "partition":
                out.append(pa.array(records.partitions, field.type))
            elif field.name == "offset":
                out.append(pa.array(records.offsets, field.type))
            elif field.name in WATERMARK_FIELDS:
                out.append(_watermark_column(field, marks, len(records)))
            else:
                out.append(_record_column(field.name, field.type, records, topic, policy.strip_headers))
        return out

    return _settling(schema, policy, columns)


def _watermark_column(field: pa.Field, marks: list[Mark] | None, n: int) -> pa.Array:
    """A data row's ``_control`` (false), or its ``_watermark`` / ``_partition_watermark`` from ``marks``
    (all null when the read fills no watermark)."""
    if field.name == META_CONTROL:
        return pa.repeat(False, n)
    if marks is None:
        return pa.nulls(n, field.type)
    which = 0 if field.name == META_WATERMARK else 1
    return pa.array([m[which] for m in marks], pa.int64()).cast(pa.timestamp("ms", tz="UTC")).cast(field.type)


def _json_builder(schema: pa.Schema, policy: _Policy) -> Builder:
    loads = orjson.loads
    escape_keys = policy.mode is BadRecordMode.PERMISSIVE
    get = dict.get

    def columns(records: DataColumns, topic: str, marks: list[Mark] | None,
                bad: dict[int, str]) -> list[pa.Array | None]:
        payloads = records.payloads
        try:
            objects = list(map(loads, payloads))
        except orjson.JSONDecodeError:
            objects = [_loads_or_none(payload) for payload in payloads]
            for i, obj in enumerate(objects):
                if obj is _NOT_JSON:
                    bad[i] = "the value is not JSON"
        if objects and set(map(type, objects)) != {dict}:
            for i, obj in enumerate(objects):
                if type(obj) is not dict:
                    if i not in bad:
                        bad[i] = f"the value is a JSON {type(obj).__name__}, not an object"
                    objects[i] = _NO_FIELDS
        arrays: list[pa.Array | None] = []
        for field in schema:
            name = field.name
            if name == policy.corrupt:
                arrays.append(None)
                continue
            if name == _META_PARTITION:
                values: list[Any] = records.partitions
            elif name == _META_OFFSET:
                values = records.offsets
            elif name == _META_KEY:
                if pa.types.is_binary(field.type):
                    arrays.append(pa.array(records.keys, field.type))
                    continue
                texts = _keys_as_text(records, bad, escape_keys)
                if isinstance(texts, pa.Array):
                    if pa.types.is_string(field.type):
                        arrays.append(texts)
                        continue
                    texts = texts.to_pylist()
                values = texts
            elif name in _RECORD_COLUMNS and name.startswith("_"):
                arrays.append(_record_column(name, field.type, records, topic, policy.strip_headers))
                continue
            elif name == META_CONTROL or (name in WATERMARK_FIELDS and marks is not None):
                arrays.append(_watermark_column(field, marks, len(records)))
                continue
            else:
                values = list(map(get, objects, repeat(name)))
                if not field.nullable and None in values:
                    for i in (i for i, value in enumerate(values) if value is None):
                        bad.setdefault(i, f"field {name!r} is missing or null, and the schema says NOT NULL")
            arrays.append(_column(values, field, records, topic, bad))
        return arrays

    return _settling(schema, policy, columns)


_NOT_JSON: Final = object()
_NO_FIELDS: Final[dict[str, Any]] = {}


def _loads_or_none(payload: bytes) -> Any:
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError:
        return _NOT_JSON


def _column(values: list[Any], field: pa.Field, records: DataColumns, topic: str,
            bad: dict[int, str]) -> pa.Array:
    """``values`` as an Arrow array of ``field``'s type. When some do not fit, each of them is entered in
    ``bad`` with the reason and made null. Raises :class:`ReadError` when the column does not fit while
    every value fits on its own."""
    try:
        return _to_arrow(values, field.type)
    except _FIT_ERRORS as exc:
        misfits = []
        for i, value in enumerate(values):
            if value is None:
                continue
            try:
                _to_arrow([value], field.type)
            except _FIT_ERRORS as one:
                misfits.append(i)
                bad.setdefault(i, f"field {field.name!r} does not fit type {field.type}: {one}")
        if not misfits:
            raise ReadError(f"topic {topic!r} partitions {_parts(records)}: field {field.name!r} does not fit type "
                            f"{field.type}: {exc}") from exc
        values = list(values)  # may be the records' own column (_partition, _offset)
        for i in misfits:
            values[i] = None
        return _to_arrow(values, field.type)


_NONE: Final = type(None)
_INTEGERS: Final = frozenset({int, _NONE})
_NUMBERS: Final = frozenset({int, float, _NONE})
_JSON_KINDS: Final = {float: "a number with a fraction or an exponent", bool: "true or false", str: "a string",
                      list: "an array", dict: "an object"}


def _check_numbers(values: list[Any], dtype: pa.DataType) -> None:
    """Raise ``TypeError`` when a value of an integer or floating-point field is not a JSON number of
    that kind. pyarrow would take them: a fraction into an integer type truncated (2.5 as 2), true as 1."""
    integer = pa.types.is_integer(dtype)
    kinds = set(map(type, values)) - (_INTEGERS if integer else _NUMBERS)
    if kinds:
        wrong = sorted(_JSON_KINDS.get(kind, kind.__name__) for kind in kinds)
        raise TypeError(f"a value is {' or '.join(wrong)}, not {'an integer' if integer else 'a number'}")


def _to_arrow(values: list[Any], dtype: pa.DataType) -> pa.Array:
    if pa.types.is_integer(dtype) or pa.types.is_floating(dtype):
        _check_numbers(values, dtype)
        return pa.array(values, dtype)
    if pa.types.is_timestamp(dtype) or pa.types.is_date(dtype) or pa.types.is_time(dtype):
        return pa.array(values, pa.string()).cast(dtype)
    if pa.types.is_decimal(dtype):
        return pa.array([None if v is None else Decimal(v if isinstance(v, str) else repr(v)) for v in values], dtype)
    if pa.types.is_binary(dtype) or pa.types.is_large_binary(dtype):
        return pa.array([None if v is None else base64.b64decode(v, validate=True) for v in values], dtype)
    return pa.array(values, dtype)


def _parts(records: DataColumns) -> list[int]:
    return sorted(set(records.partitions))
