"""Arrow batches from the records a reading task polled: what every reader of ``format("controlmsg")``
builds its rows with (:mod:`controlmsg.spark.reading`). No I/O: a builder takes records (parallel lists,
:class:`~controlmsg.kafka.data_records.DataColumns`) and returns a batch and the bad records it set aside; what a
task then does with those is :mod:`controlmsg.spark.reading.bad_records`.

The columns a read can have are :mod:`controlmsg.spark.read_schema`; the ones a record gives by itself (topic,
timestamp, headers, watermark fields, key as text) are :mod:`controlmsg.spark.record_columns`. A declared
field takes each record's JSON member of its name: JSON types map directly (an integer field takes JSON
integers only: a fraction or ``true`` does not fit, where pyarrow alone would truncate ``2.5`` to ``2``; a
floating-point field takes any JSON number); timestamp and date fields take ISO-8601 strings, decimals
numbers or strings, binary fields base64 strings. A batch whose JSON fields are all strings, integers,
floating-point numbers or booleans is parsed by Arrow's JSON reader when that gives the same columns
(:func:`_flat_json` says when), else, and always to name a bad record, by orjson, one object per row.

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
from controlmsg.kafka.data_records import DataColumns, DataRecord
from controlmsg.spark.options import BadRecordMode, ReadOptions
from controlmsg.spark.read_schema import (
    META_CONTROL,
    META_KEY,
    META_OFFSET,
    META_PARTITION,
    META_WATERMARK,
    RECORD_COLUMNS,
    WATERMARK_FIELDS,
    Mark,
    is_raw_schema,
)
from controlmsg.spark.record_columns import check_record_column, keys_as_text, record_column, watermark_column

__all__ = [
    "Builder",
    "Built",
    "batch_builder",
    "tick_batch",
]

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
        if name in RECORD_COLUMNS and (raw or name.startswith("_")):
            check_record_column(name, arrow_schema.field(name).type, schema[name].dataType.simpleString())
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
    (epoch ms), every other field null, or its type's zero value when the schema declares it ``NOT NULL``
    (Spark fails a row with a null there; :func:`~controlmsg.spark.with_watermark` drops the row before any
    step of the user's sees it); a micro-batch's last task adds it after its records."""
    arrow_schema = _arrow_schema(schema)
    arrays = []
    for field in arrow_schema:
        if field.name == META_CONTROL:
            arrays.append(pa.array([True]))
        elif field.name == META_WATERMARK:
            arrays.append(pa.array([watermark], pa.int64()).cast(pa.timestamp("ms", tz="UTC")).cast(field.type))
        elif field.nullable:
            arrays.append(pa.nulls(1, field.type))
        else:
            arrays.append(pa.array([_zero(field.type)], field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)


def _zero(dtype: pa.DataType) -> Any:
    """A value of ``dtype`` for a ``NOT NULL`` field of a watermark row, as pyarrow takes it from Python."""
    if pa.types.is_struct(dtype):
        return {f.name: None if f.nullable else _zero(f.type) for f in dtype}
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype) or pa.types.is_map(dtype):
        return []
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
        return ""
    if pa.types.is_binary(dtype) or pa.types.is_large_binary(dtype):
        return b""
    if pa.types.is_boolean(dtype):
        return False
    if pa.types.is_decimal(dtype):
        return Decimal(0)
    if pa.types.is_timestamp(dtype) or pa.types.is_date(dtype) or pa.types.is_time(dtype):
        return pa.array([0], pa.int64()).cast(pa.int32() if dtype in (pa.date32(), pa.time32("s"), pa.time32("ms"))
                                              else pa.int64()).cast(dtype)[0].as_py()
    return 0


_FIT_ERRORS: Final = (pa.ArrowInvalid, pa.ArrowTypeError, ValueError, TypeError, ArithmeticError)
_HINT: Final = ("; to read past such records, set the option deadLetterTopic (they go there) or mode PERMISSIVE "
                "(their rows are kept)")


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
            texts = keys_as_text(records, bad, escape=False)
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
                out.append(watermark_column(field, marks, len(records)))
            else:
                out.append(record_column(field.name, field.type, records, topic, policy.strip_headers))
        return out

    return _settling(schema, policy, columns)


def _json_builder(schema: pa.Schema, policy: _Policy) -> Builder:
    loads = orjson.loads
    escape_keys = policy.mode is BadRecordMode.PERMISSIVE
    get = dict.get

    def columns(records: DataColumns, topic: str, marks: list[Mark] | None,
                bad: dict[int, str]) -> list[pa.Array | None]:
        payloads = records.payloads
        # Every JSON field made by Arrow's parser when the batch allows it (no Python object per row), else orjson.
        parsed = _flat_json(payloads, [f for f in schema if _from_json(f.name, policy, marks)])
        objects = _objects(payloads, loads, bad) if parsed is None else []
        arrays: list[pa.Array | None] = []
        for field in schema:
            name = field.name
            if parsed is not None and name in parsed:
                arrays.append(parsed[name])
                continue
            if name == policy.corrupt:
                arrays.append(None)
                continue
            if name == META_PARTITION:
                values: list[Any] = records.partitions
            elif name == META_OFFSET:
                values = records.offsets
            elif name == META_KEY:
                if pa.types.is_binary(field.type):
                    arrays.append(pa.array(records.keys, field.type))
                    continue
                texts = keys_as_text(records, bad, escape_keys)
                if isinstance(texts, pa.Array):
                    if pa.types.is_string(field.type):
                        arrays.append(texts)
                        continue
                    texts = texts.to_pylist()
                values = texts
            elif name in RECORD_COLUMNS and name.startswith("_"):
                arrays.append(record_column(name, field.type, records, topic, policy.strip_headers))
                continue
            elif name == META_CONTROL or (name in WATERMARK_FIELDS and marks is not None):
                arrays.append(watermark_column(field, marks, len(records)))
                continue
            else:
                values = list(map(get, objects, repeat(name)))
                if not field.nullable and None in values:
                    for i in (i for i, value in enumerate(values) if value is None):
                        bad.setdefault(i, f"field {name!r} is missing or null, and the schema says NOT NULL")
            arrays.append(_column(values, field, records, topic, bad))
        return arrays

    return _settling(schema, policy, columns)


def _from_json(name: str, policy: _Policy, marks: list[Mark] | None) -> bool:
    """Whether :func:`_json_builder` takes field ``name`` from each record's JSON object (not a column of
    the record, of the watermark or of corrupt records)."""
    return not (name == policy.corrupt or name in (META_PARTITION, META_OFFSET, META_KEY, META_CONTROL)
                or (name in RECORD_COLUMNS and name.startswith("_"))
                or (name in WATERMARK_FIELDS and marks is not None))


def _objects(payloads: list[bytes], loads: Callable[[bytes], Any], bad: dict[int, str]) -> list[Any]:
    """Each payload as a JSON object, orjson's; a payload that is not JSON, or not an object, is entered in
    ``bad`` with the reason and stands as an object without fields."""
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
    return objects


def _flat_type(dtype: pa.DataType) -> bool:
    return bool(pa.types.is_string(dtype) or pa.types.is_integer(dtype) or pa.types.is_floating(dtype)
            or pa.types.is_boolean(dtype))


def _flat_json(payloads: list[bytes], fields: list[pa.Field]) -> dict[str, pa.Array] | None:
    """The ``fields`` of every payload, parsed by Arrow's JSON reader in one pass without a Python object
    per row, when that gives exactly what the orjson path gives; else ``None`` (the caller takes that path,
    which also names each bad record). So only fields of strings, integers, floating-point numbers and
    booleans, and only a batch in which every payload is one JSON object on one line that Arrow reads
    without an error, whose NOT NULL fields are all there, whose numbers are finite (Arrow takes
    ``NaN`` and ``Infinity``, which are not JSON) and whose strings are valid UTF-8 (Arrow does not check).
    A value of another kind than its field's (a string for an integer, a fraction for an integer, ``true``
    for a number), a key twice in one object: Arrow refuses, and the orjson path decides."""
    if not fields or not payloads or not all(_flat_type(f.type) for f in fields) or b"" in payloads:
        return None
    joined = b"\n".join(payloads)
    if joined.count(b"\n") != len(payloads) - 1:
        return None  # a payload over several lines
    import pyarrow.compute as pc
    import pyarrow.json as pj

    try:
        table = pj.read_json(pa.BufferReader(joined), read_options=pj.ReadOptions(
            use_threads=False, block_size=max(len(joined) + 1, 1 << 20)), parse_options=pj.ParseOptions(
            explicit_schema=pa.schema(fields), unexpected_field_behavior="ignore"))
        if table.num_rows != len(payloads):
            return None  # a blank payload, or two objects on one line
        out: dict[str, pa.Array] = {}
        for field in fields:
            column = table.column(field.name).combine_chunks()
            if not field.nullable and column.null_count:
                return None
            if pa.types.is_floating(field.type) and pc.all(pc.is_finite(column)).as_py() is False:
                return None
            if pa.types.is_string(field.type):
                column.validate(full=True)  # raises ArrowInvalid for a string that is not UTF-8
            out[field.name] = column
    except pa.ArrowException:
        return None
    return out


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
