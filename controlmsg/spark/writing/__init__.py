"""Writing a DataFrame to an intermediate topic: the batch and stream writers of ``controlmsg``.

**Tasks write records; the driver is the one upstream task.** Each Spark write task writes its rows,
keyed by the ``key`` column, in ONE Kafka transaction with a commit marker (see
:mod:`controlmsg.kafka.markers`; a batch write with the option ``commitRows`` commits as it goes, in several,
see :mod:`controlmsg.spark.writing.chunks`) and reports what it wrote; its records carry its name
(:func:`~controlmsg.core.naming.task_name`: ``<job>-<runId>-p<partition id>``) in the ``controlmsg-task``
header, but it writes no control message. The driver, once every task of the write (or micro-batch) has
committed, is the **one upstream task of the protocol** (``taskName``
:func:`~controlmsg.core.naming.driver_task_name`, ``<job>-<runId>-driver``; ``taskCount`` 1): it writes one
control message to every partition in one transaction with a marker of its own. So a round is O(partitions)
messages, whatever the number of write tasks, and readers keep one task per partition. It speaks for the
tasks: every task's records are committed, so on every partition before the round, when it writes it.

* batch (``df.write``): the end of stream. No intermediate watermarks: a reader ends only at the end of
  stream, whether each task's records became visible at once when it committed or chunk by chunk.
* stream (``df.writeStream``), after every micro-batch: one watermark. When the query
  has an event-time watermark (``with_watermark``, or Spark's own ``withWatermark``), it is **the stage's
  watermark**: Spark's watermark in force in that micro-batch, read from the query's offset log, so a
  stage over a controlmsg stream carries its input's reconciled watermark onward. The offset log is read
  on the driver's local file system only: a ``checkpointLocation`` elsewhere (``hdfs:``, ``s3a:``...) or
  none is refused when the query starts, unless the option ``stageProgress`` is ``eventTime``, the weaker
  rule below with no end by itself (:mod:`controlmsg.spark.query_log` says why). Otherwise it is the
  largest ``eventTime`` written so far minus ``allowedLateness`` (Spark's own rule for ``withWatermark``:
  event time is compared across partitions, because partition *i* of one micro-batch has nothing to do
  with partition *i* of the next). The number of writer partitions may change from one micro-batch to the
  next: they are not upstream tasks of the protocol. The stream **ends by itself** when its input did: in
  the first micro-batch after which every source of the query is a controlmsg stream that has ended (or a
  plain topic read with ``availableNowEnds``, :mod:`controlmsg.spark.reading.plain_readers`) and, for a query that keeps
  state, whose watermark is the end of time, i.e. after the micro-batch in which Spark emitted the last
  windows (a stateless stage, such as an ingest that parses and keys a plain topic, ends with its input).
  :func:`end_stream` ends it by hand (a source that never ends, a query stopped for good).

A run that an earlier version of this writer started (one control message per write task per partition,
its marker without ``"upstream": "driver"``) goes on as the next generation of the run (docs/PROTOCOL.md,
"Generations"): the driver's transactional id is the same, so its init fences the earlier rounds, and the
driver's first round replaces the old task set on every partition.

**Exactly once.** Every attempt of a task uses the same transactional id; initialising transactions
fences older attempts and finishes their transactions, then the task reads its marker: if an attempt
already committed this write (a batch write) or this micro-batch (a stream, the marker holds the batch
id), it writes nothing and reports the committed figures. The driver's control round is guarded the same
way, so a replayed micro-batch (a query restarted from its checkpoint) writes nothing twice. A marker of
another streaming query (another ``queryId``) is refused: a new query needs a new ``runId``.

Record values are the row as a JSON object: every column, nulls kept, timestamps as ISO-8601 in UTC
(``...Z``), dates as ``YYYY-MM-DD``, decimals as exact JSON numbers, binary as base64, structs, arrays and
maps as JSON objects and arrays. Keys are the ``key`` column as a string (null without ``key``).
With the option ``value`` (a string or binary column) a record's payload is that column's bytes as they
are instead, serialized by Spark itself (``to_json(struct(*))``, ``to_avro``...) as for ``format("kafka")``:
no Python object per row (the other columns serve ``key`` and ``eventTime`` and are not written). A null in
it fails the task, naming the row. A column ``headers`` of ``format("kafka")``'s type
(``array<struct<key:string,value:binary>>``, value string taken too) is each record's headers, sent after
controlmsg's own (``controlmsg-run`` first, which readers look at) and left out of the JSON value; a header
whose name starts ``controlmsg-`` fails the task in one line, so that no row can pass for another run or
task (a ``headers`` column of any other type is a field of the value, as before).

The modules, by job: the driver's plan of a write, its columns checked and the topic created
(:mod:`~controlmsg.spark.writing.plan`); the driver's commit of a write or of a micro-batch, the writer Spark
calls (:mod:`~controlmsg.spark.writing.batch_writer`, :mod:`~controlmsg.spark.writing.stream_writer`); a
write task, what it sends and reports (:mod:`~controlmsg.spark.writing.task`, with flat rows made JSON in Arrow,
:mod:`~controlmsg.spark.writing.arrow_json`, and a batch write that commits as it goes,
:mod:`~controlmsg.spark.writing.chunks`); and the run-control API, what the driver committed and the end of a
stream by hand (:mod:`~controlmsg.spark.writing.run_control`: :func:`run_status`, :func:`end_stream`).

This package imports its modules (and pyspark) only when one of its names is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from controlmsg.lazy import lazy_getattr

if TYPE_CHECKING:
    from controlmsg.spark.writing.batch_writer import BatchWriter
    from controlmsg.spark.writing.run_control import end_stream, run_status, upstream_of
    from controlmsg.spark.writing.stream_writer import StreamWriter
    from controlmsg.spark.writing.task import TaskCommit

__all__ = ["BatchWriter", "StreamWriter", "TaskCommit", "end_stream", "run_status", "upstream_of"]

_WHERE = {
    "BatchWriter": "controlmsg.spark.writing.batch_writer",
    "StreamWriter": "controlmsg.spark.writing.stream_writer",
    "TaskCommit": "controlmsg.spark.writing.task",
    "end_stream": "controlmsg.spark.writing.run_control",
    "run_status": "controlmsg.spark.writing.run_control",
    "upstream_of": "controlmsg.spark.writing.run_control",
}

__getattr__ = lazy_getattr(__name__, _WHERE)
