"""Reading a topic into Spark: the readers of ``format("controlmsg")``, a module each job, as Spark's Kafka
connector gives the batch, the micro-batch stream and the offsets a file each.

An **intermediate topic** (the controlmsg envelope, the default) is read to its run's end of stream: the
batch reader (:mod:`~controlmsg.spark.reading.batch_reader`), the stream reader that plans each micro-batch
on the driver (:mod:`~controlmsg.spark.reading.stream_reader`), and what a micro-batch's task makes of the
records it reads (:mod:`~controlmsg.spark.reading.envelope_records`); a read whose end of stream does not come
within ``timeout`` fails with :class:`EndOfStreamTimeout` (:mod:`~controlmsg.spark.reading.timeouts`). A
**plain topic** (option ``envelope none``): its two readers (:mod:`~controlmsg.spark.reading.plain_readers`),
the offsets they look up on the cluster (:mod:`~controlmsg.spark.reading.plain_offsets`) and what a task
makes of its records (:mod:`~controlmsg.spark.reading.plain_records`).

The columns a record becomes (``.schema(ddl)``, ``_partition``, ``_offset``, ``_key``, ``_watermark``,
``_partition_watermark``, ``_control``) are :mod:`controlmsg.spark.read_schema`, the Arrow batches of them
:mod:`controlmsg.spark.batches`; what becomes of the records that do not fit (option ``mode``,
``deadLetterTopic``) is :mod:`controlmsg.spark.reading.bad_records`; how the partitions are grouped into tasks
is :mod:`controlmsg.spark.reading.planning`; a task reads its planned offsets with the loop of
:mod:`controlmsg.spark.reading.consuming`, and a hook of its reader's. What a stream reader reports in every
``StreamingQueryProgress`` is :mod:`controlmsg.spark.reading.source_metrics`.

This package imports its modules (and pyspark) only when one of its names is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from controlmsg.lazy import lazy_getattr

if TYPE_CHECKING:
    from controlmsg.spark.reading.batch_reader import BatchReader
    from controlmsg.spark.reading.plain_offsets import DataLoss
    from controlmsg.spark.reading.plain_readers import PlainBatchReader, PlainStreamReader
    from controlmsg.spark.reading.stream_reader import StreamReader
    from controlmsg.spark.reading.timeouts import EndOfStreamTimeout

__all__ = ["BatchReader", "DataLoss", "EndOfStreamTimeout", "PlainBatchReader", "PlainStreamReader", "StreamReader"]

_WHERE = {
    "BatchReader": "controlmsg.spark.reading.batch_reader",
    "StreamReader": "controlmsg.spark.reading.stream_reader",
    "EndOfStreamTimeout": "controlmsg.spark.reading.timeouts",
    "PlainBatchReader": "controlmsg.spark.reading.plain_readers",
    "PlainStreamReader": "controlmsg.spark.reading.plain_readers",
    "DataLoss": "controlmsg.spark.reading.plain_offsets",
}

__getattr__ = lazy_getattr(__name__, _WHERE)
