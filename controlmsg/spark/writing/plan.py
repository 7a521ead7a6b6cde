"""The driver's plan of a ``controlmsg`` write (:mod:`controlmsg.spark.writing`): the options' columns checked
against the DataFrame's schema, the topic created when missing, and what every write task needs of it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from pyspark.sql.types import (
    BinaryType,
    DateType,
    NumericType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from controlmsg.kafka.admin import create_topic, partition_count
from controlmsg.spark.options import WriteOptions

__all__ = ["HEADERS_COLUMN", "WritePlan", "plan_write"]


@dataclass(frozen=True, slots=True)
class WritePlan:
    """Everything a write task needs, fixed on the driver and pickled with the writer."""

    opts: WriteOptions
    partitions: int
    key_index: int | None
    event_time_index: int | None
    value_index: int | None = None
    """The column whose bytes are each record's payload (option ``value``); ``None``: the row as JSON."""
    headers_index: int | None = None
    """The column ``headers`` (``array<struct<key string, value binary>>``, as ``format("kafka")`` writes
    it): each row's record headers, after controlmsg's own; not part of the JSON value."""


def plan_write(opts: WriteOptions, schema: StructType) -> WritePlan:
    """Check the columns against ``schema``, create the topic when missing; returns the plan."""
    names = schema.fieldNames()
    key_index = event_index = value_index = None
    if opts.value is not None:
        if opts.value not in names:
            raise ValueError(f"option 'value': no column {opts.value!r} (columns: {', '.join(names)})")
        value_index = names.index(opts.value)
        dtype = schema[opts.value].dataType
        if not isinstance(dtype, StringType | BinaryType):
            raise ValueError(f"option 'value': column {opts.value!r} must be a string or binary column (the "
                             f"payload as the downstream's serde reads it, e.g. to_json(struct(*))), not "
                             f"{dtype.simpleString()}")
    if opts.key is not None:
        if opts.key not in names:
            raise ValueError(f"option 'key': no column {opts.key!r} (columns: {', '.join(names)})")
        key_index = names.index(opts.key)
    if opts.event_time is not None:
        if opts.event_time not in names:
            raise ValueError(f"option 'eventTime': no column {opts.event_time!r} (columns: {', '.join(names)})")
        event_index = names.index(opts.event_time)
        dtype = schema[opts.event_time].dataType
        if not isinstance(dtype, TimestampType | TimestampNTZType | DateType | NumericType):
            raise ValueError(f"option 'eventTime': column {opts.event_time!r} must be a timestamp, a date or epoch "
                             f"milliseconds (a number), not {dtype.simpleString()}")
    headers_index = _headers_column(schema)
    if not names or names == [HEADERS_COLUMN]:
        raise ValueError("a record value needs at least one column")
    config = dict(opts.config)
    have = partition_count(config, opts.topic, opts.timeout)
    if have is None:
        create_topic(config, opts.topic, opts.partitions, replication_factor=opts.replication_factor,
                     topic_config=dict(opts.topic_config), timeout=opts.timeout)
        have = opts.partitions
    return WritePlan(opts, have, key_index, event_index, value_index, headers_index)


HEADERS_COLUMN: Final = "headers"
_HEADERS_TYPE: Final = "array<struct<key:string,value:binary>>"


def _headers_column(schema: StructType) -> int | None:
    """The index of the column ``headers`` when it is an array of ``key``/``value`` structs (record
    headers, as ``format("kafka")`` takes them); ``None`` when there is none, or it is of another type (then
    it is an ordinary field of the JSON value, as before). A key that is not a string, or a value that is
    not binary or a string, is refused."""
    from pyspark.sql.types import ArrayType

    if HEADERS_COLUMN not in schema.fieldNames():
        return None
    dtype = schema[HEADERS_COLUMN].dataType
    if not (isinstance(dtype, ArrayType) and isinstance(dtype.elementType, StructType)
            and dtype.elementType.fieldNames() == ["key", "value"]):
        return None
    element = dtype.elementType
    if not isinstance(element["key"].dataType, StringType) or not isinstance(element["value"].dataType,
                                                                               BinaryType | StringType):
        raise ValueError(f"column 'headers' (record headers) must be {_HEADERS_TYPE} (value binary or string), "
                         f"not {dtype.simpleString()}")
    return schema.fieldNames().index(HEADERS_COLUMN)
