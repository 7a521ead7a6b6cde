"""The columns a read of ``format("controlmsg")`` can have, and which schemas read records as they are. Pure
Python (no pyarrow, no pyspark); the Arrow batches of those columns are :mod:`controlmsg.spark.batches`.

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
record, so that every query over the topic finds the same records behind it. A plain topic's stream read with
``maxOutOfOrderness`` fills ``_watermark`` with its watermark per partition in force when the micro-batch
began, and ``_partition_watermark`` with null (:mod:`controlmsg.spark.reading.plain_watermark`). With a boolean
``_control`` too, a micro-batch in which the watermark moved or the stream ended also has one watermark
row (``_control`` true, every other field null; see :mod:`controlmsg.spark.event_time`). How a JSON value
fills a field of its type is :mod:`controlmsg.spark.batches`.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "HEADERS_TYPE",
    "META_CONTROL",
    "META_PARTITION_WATERMARK",
    "META_WATERMARK",
    "RAW_SCHEMA",
    "WATERMARK_FIELDS",
    "Mark",
    "is_raw_schema",
    "raw_schema",
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
META_PARTITION: Final = "_partition"
META_OFFSET: Final = "_offset"
META_KEY: Final = "_key"
_META_TOPIC: Final = "_topic"
_META_TIMESTAMP: Final = "_timestamp"
_META_TIMESTAMP_TYPE: Final = "_timestampType"
_META_HEADERS: Final = "_headers"
RECORD_COLUMNS: Final = {"topic": "topic", "timestamp": "timestamp", "timestampType": "timestampType",
                         "headers": "headers", _META_TOPIC: "topic", _META_TIMESTAMP: "timestamp",
                         _META_TIMESTAMP_TYPE: "timestampType", _META_HEADERS: "headers"}
"""The columns of a record's topic, timestamp and headers, in a raw schema and (``_``-prefixed) in a JSON one."""


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
"""The fields only a stream fills (its watermark): an intermediate topic's, or a plain topic's read with
``maxOutOfOrderness`` (:mod:`controlmsg.spark.reading.plain_watermark`); the other reads refuse them."""


Mark = tuple["int | None", "int | None"]
"""A record's ``_watermark`` and ``_partition_watermark`` in epoch ms (``None``: undefined)."""
