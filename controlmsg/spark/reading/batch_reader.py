"""The batch reader of an intermediate topic.

**Batch** (``spark.read``): each Spark task owns a group of the topic's partitions and reads them with a
:class:`~controlmsg.kafka.reader.ControlReader` (``read_committed``) until end of stream holds for every
one of them, so the DataFrame is complete exactly when every upstream task of the run has ended on every
partition; records after a partition's end are not read. Planning waits for the topic (never creating
it); with ``timeout`` a task fails with :class:`~controlmsg.spark.reading.timeouts.EndOfStreamTimeout` naming each
partition not ended and the upstream tasks it still waits for. The partitions are grouped into tasks by the offsets they
hold at planning, or as ``partitionsPerTask`` and ``maxTasks`` say (:mod:`controlmsg.spark.reading.planning`).
A consumer starts at an explicit offset, not at the logical beginning (see
:func:`~controlmsg.kafka.reader.start_offset`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from controlmsg.errors import ControlMsgError
from controlmsg.kafka.admin import offset_spans, wait_for_topic
from controlmsg.kafka.data_records import DataColumns
from controlmsg.kafka.periodic_log import Progress
from controlmsg.kafka.reader import ControlReader
from controlmsg.kafka.refusals import mark_reached
from controlmsg.kafka.settings import worker_logging
from controlmsg.spark.batches import batch_builder
from controlmsg.spark.options import ReadOptions
from controlmsg.spark.read_schema import WATERMARK_FIELDS
from controlmsg.spark.reading.bad_records import SetAside, check_dead_letters
from controlmsg.spark.reading.consuming import POLL_S
from controlmsg.spark.reading.planning import TopicPartitions, task_groups
from controlmsg.spark.reading.timeouts import timeout_error

__all__ = ["BatchReader"]


class BatchReader(DataSourceReader):
    """``spark.read.format("controlmsg")``: see the module docstring and :mod:`controlmsg.spark.reading`."""

    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        for name in WATERMARK_FIELDS:
            if name in schema.fieldNames():
                raise ValueError(f"the field '{name}' is filled by readStream only; a batch read ends at end of "
                                 "stream, where every window can close")
        batch_builder(schema, options)  # refuse a schema that cannot be built, at planning time
        self.opts = options
        self.schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        """Runs at planning time: waits for the topic (up to ``timeout``), checks that the dead-letter
        topic exists (if any), then groups the partitions."""
        opts = self.opts
        count = wait_for_topic(dict(opts.config), opts.topic, opts.timeout)
        check_dead_letters(opts)
        sizes = None
        if opts.partitions_per_task is None and opts.max_tasks is None:
            try:
                sizes = offset_spans(dict(opts.config), opts.topic, count, opts.timeout or 30.0)
            except ControlMsgError:
                sizes = None  # one task per partition, as with partitionsPerTask 1
        return [TopicPartitions(group) for group in task_groups(range(count), opts, sizes)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, TopicPartitions)
        return _read_to_end(self.opts, self.schema, list(partition.partitions))


def _read_to_end(opts: ReadOptions, schema: StructType, partitions: list[int]) -> Iterator[pa.RecordBatch]:
    """Read ``partitions`` to end of stream, yielding Arrow batches of ``schema`` (runs in a worker)."""
    worker_logging()
    mark_reached(dict(opts.config))  # planned with the cluster's answers: see consuming.read_ranges
    started = time.monotonic()
    deadline = None if opts.timeout is None else started + opts.timeout
    build, _ = batch_builder(schema, opts)
    reader = ControlReader(
        dict(opts.config),
        opts.topic,
        partitions=partitions,
        run_id=opts.run_id,
        stop_at_end=True,
        batch_size=max(opts.batch_rows, 1000),
        topic_timeout=opts.timeout if opts.timeout is not None else 30.0,
    )
    progress = Progress(f"reader {opts.topic} partitions {partitions}")
    aside = SetAside(opts, progress)
    try:
        pending = DataColumns()
        tracker = reader.tracker
        records = 0
        while not tracker.is_ended:
            if progress.due():
                progress.log(f"{records} records, watermark {_mark(tracker.emitted_watermark)}, "
                             f"{len(tracker.ended_partitions)} of {len(partitions)} partitions ended")
            wait = POLL_S
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
                if wait <= 0:
                    raise timeout_error(opts, tracker, partitions)
            before = len(pending)
            reader.poll_columns(pending, wait)  # the events are in the tracker
            records += len(pending) - before
            if len(pending) >= opts.batch_rows:
                batch = aside.take(build(pending, opts.topic, None))
                if batch is not None:
                    yield batch
                pending = DataColumns()
        if pending:
            batch = aside.take(build(pending, opts.topic, None))
            if batch is not None:
                yield batch
        aside.finish()
    finally:
        aside.close()
        reader.close()


def _mark(ts: int | None) -> str:
    return "undefined" if ts is None else str(ts)
