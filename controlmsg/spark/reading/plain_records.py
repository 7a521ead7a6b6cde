"""What a task of a plain topic's read makes of the records it reads (in a Spark Python worker): the planned
``[start, end)`` offsets of some partitions of one topic read with the loop of
:mod:`controlmsg.spark.reading.consuming`, whose hook here is :class:`PlainRecords` (every record a row, as it
is)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any, Final, cast

import pyarrow as pa
from confluent_kafka import Message
from pyspark.sql.types import StructType

from controlmsg.kafka.data_records import DataColumns
from controlmsg.spark.batches import batch_builder, tick_batch
from controlmsg.spark.options import ReadOptions
from controlmsg.spark.read_schema import Mark
from controlmsg.spark.reading.consuming import read_ranges
from controlmsg.spark.reading.planning import PlainRanges

__all__ = ["PlainRecords", "read_plain_ranges"]

# The messages a reader's hook takes are never errors, so each has a partition and an offset (the stubs
# allow None for an error's).
_PARTITION: Final = cast("Callable[[Any], int]", Message.partition)
_OFFSET: Final = cast("Callable[[Any], int]", Message.offset)
_KEY: Final = Message.key
_VALUE: Final = Message.value


def read_plain_ranges(opts: ReadOptions, schema: StructType, part: PlainRanges) -> Iterator[pa.RecordBatch]:
    """Read the ``[start, end)`` offsets of some partitions of one topic of a plain read into Arrow batches
    of ``schema`` (runs in a worker): :func:`~controlmsg.spark.reading.consuming.read_ranges` with every record
    kept as it is. End-of-partition events are on: the last offsets may be transaction markers or aborted
    records, which ``read_committed`` does not deliver."""
    task_opts = dataclasses.replace(opts, topic=part.topic)
    build, marked = batch_builder(schema, task_opts)
    if part.ranges:
        mark: Mark | None = (part.watermark, None) if marked else None
        yield from read_ranges(task_opts, build, part.ranges, PlainRecords(mark), eof=True)
    if part.tick is not None:
        yield tick_batch(schema, part.tick)


class PlainRecords:
    """The plain reader's :class:`~controlmsg.spark.reading.consuming.RangeRecords`: every record is a row, its
    value the whole payload (a record without one: empty bytes). ``mark``: every row's ``_watermark`` and
    ``_partition_watermark`` (a stream read for ``with_watermark``: the watermark in force when its
    micro-batch began, and null; :mod:`controlmsg.spark.reading.plain_watermark`); ``None``: the schema has
    no watermark field."""

    def __init__(self, mark: Mark | None = None) -> None:
        self._rows = DataColumns()
        self._mark = mark

    def take(self, messages: list[Any]) -> int:
        rows = self._rows
        # Whole columns at once: map() over the messages' C methods, no Python call per record.
        rows.partitions.extend(map(_PARTITION, messages))
        rows.offsets.extend(map(_OFFSET, messages))
        rows.keys.extend(map(_KEY, messages))
        rows.payloads.extend([value or b"" for value in map(_VALUE, messages)])
        rows.messages.extend(messages)
        return len(rows)

    def drain(self) -> tuple[DataColumns, list[Mark] | None]:
        rows, self._rows = self._rows, DataColumns()
        return rows, None if self._mark is None else [self._mark] * len(rows)
