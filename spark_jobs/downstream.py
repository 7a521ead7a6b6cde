"""The downstream side on Spark: an intermediate topic read as a DataFrame, each task to end of stream.

``spark.read.format("controlmsg")`` (a PySpark 4 Python data source, batch) turns the user records of
one run of an intermediate topic into a DataFrame. Each Spark task owns a group of the topic's
partitions and reads them with a :class:`~controlmsg.kafka.reader.ControlReader` (``read_committed``)
until end of stream holds for every one of them, so the DataFrame is complete exactly when every
upstream task of the run has ended on every partition; records after a partition's end are not read.

Options (case-insensitive):

``topic`` (required), ``runId`` (required: the run to follow; every task must follow the same run, so
it is not guessed), ``bootstrapServers`` (or ``kafka.bootstrap.servers``), ``kafka.<setting>`` (any
librdkafka consumer setting), ``timeout`` (seconds; default none), ``partitionsPerTask`` (default 1),
``batchRows`` (rows per Arrow batch, default 10000), ``maxTasks`` (at most this many read tasks: partitions
are grouped so that every task can run at once; :func:`read_intermediate` passes Spark's default
parallelism, because a task that waits for end of stream holds its core, and a second wave of tasks
would start reading only after the first had ended).

**Waiting.** A reader started before its upstream job waits: planning (the Spark action, not ``load()``)
waits for the topic to exist, without ever creating it, and each task waits for end of stream on its
partitions. With ``timeout``, planning fails with
:class:`~controlmsg.errors.TopicError` if the topic does not appear in time, and a task fails with
:class:`EndOfStreamTimeout` if its partitions have not all ended within ``timeout`` seconds of the task
attempt's start; the message names each partition not ended and the upstream tasks it still waits
for. The job's error carries the message of the task that failed (with several reader tasks, the first
to run out of attempts). Spark retries a timed-out task like any other, so the job fails after up to
``spark.task.maxFailures`` x ``timeout``. Every task holds a core while it waits, so an upstream job in
the same cluster needs cores of its own.

**Schema.** Without a schema the columns are ``partition int, offset long, key string, value string``
(the value being the record's JSON text). With ``.schema(ddl)`` the JSON value is parsed (orjson) and
each field of the schema is taken from the JSON object's member of that name (missing: null); fields
named ``_partition``, ``_offset`` and ``_key`` are the record's position and key instead. JSON types
map directly; timestamp and date fields take ISO-8601 strings (as Spark's ``to_json`` writes them),
decimals take numbers or strings (numbers pass through a float, so use strings, or read ``value`` and
``from_json``, for more than 15 digits), binary fields take base64 strings. A value that does not fit
its field fails the task with an error naming the field, topic and partition.
"""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

import orjson
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from controlmsg.core.bookkeeping import InputTracker, PartitionStatus
from controlmsg.errors import ControlMsgError, ReadError
from controlmsg.kafka.admin import wait_for_topic
from controlmsg.kafka.reader import ControlReader, DataRecord
from spark_jobs.progress import Progress

__all__ = [
    "RAW_SCHEMA",
    "ControlMsgDataSource",
    "EndOfStreamTimeout",
    "TopicPartitions",
    "read_intermediate",
    "waiting_for",
]

RAW_SCHEMA: Final = "partition int, offset long, key string, value string"
_RAW_NAMES: Final = ("partition", "offset", "key", "value")
_META_PARTITION: Final = "_partition"
_META_OFFSET: Final = "_offset"
_META_KEY: Final = "_key"
# consume() waits for a whole batch or its timeout: short polls keep a small or idle stream moving.
_POLL_S: Final = 0.1
# librdkafka stops fetching a partition for fetch.queue.backoff.ms (default 1 s) whenever its local queue
# is past queued.min.messages; a reader that drains fast then waits most of the time (measured: 135k
# records/s with the default, 370k with 10 ms, bare consume() on a 2-core machine).
_CONSUMER_DEFAULTS: Final = {"fetch.queue.backoff.ms": "10"}
_TASK_NAME: Final = re.compile(r"^(.*)-p(\d+)$")


class EndOfStreamTimeout(ControlMsgError):
    """A reader's partitions did not all reach end of stream in time. The message names each partition
    still open and the upstream tasks it waits for; ``statuses`` holds the details."""

    def __init__(self, message: str, statuses: Sequence[PartitionStatus]) -> None:
        super().__init__(message)
        self.statuses = list(statuses)


class TopicPartitions(InputPartition):
    """One Spark task's share of the topic: the partitions it reads to end of stream."""

    def __init__(self, partitions: Sequence[int]) -> None:
        super().__init__(tuple(partitions))
        self.partitions = tuple(partitions)


@dataclass(frozen=True, slots=True)
class _ReadOptions:
    topic: str
    run_id: str
    config: tuple[tuple[str, str], ...]
    timeout: float | None
    partitions_per_task: int
    batch_rows: int
    max_tasks: int | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> _ReadOptions:
        opts = {k.lower(): v for k, v in options.items()}

        def need(key: str) -> str:
            value = opts.get(key.lower())
            if not value:
                raise ValueError(f"the controlmsg data source needs the option {key!r}")
            return value

        config = dict(_CONSUMER_DEFAULTS)
        config.update((k[len("kafka."):], v) for k, v in opts.items() if k.startswith("kafka."))
        if "bootstrapservers" in opts:
            config["bootstrap.servers"] = opts["bootstrapservers"]
        if "bootstrap.servers" not in config:
            raise ValueError("the controlmsg data source needs the option 'bootstrapServers'")
        timeout = float(opts["timeout"]) if opts.get("timeout") else None
        per_task = int(opts.get("partitionspertask", "1"))
        batch_rows = int(opts.get("batchrows", "10000"))
        if per_task < 1 or batch_rows < 1:
            raise ValueError("partitionsPerTask and batchRows must be at least 1")
        max_tasks = int(opts["maxtasks"]) if opts.get("maxtasks") else None
        if max_tasks is not None and max_tasks < 1:
            raise ValueError("maxTasks must be at least 1")
        return cls(need("topic"), need("runId"), tuple(sorted(config.items())), timeout, per_task, batch_rows,
                    max_tasks)


class ControlMsgDataSource(DataSource):
    """The ``controlmsg`` batch data source; see the module docstring for options and schema."""

    @classmethod
    def name(cls) -> str:
        return "controlmsg"

    def schema(self) -> str:
        return RAW_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return _BatchReader(_ReadOptions.parse(self.options), schema)


class _BatchReader(DataSourceReader):
    def __init__(self, options: _ReadOptions, schema: StructType) -> None:
        self.opts = options
        self.schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        """Runs at planning time: waits for the topic (up to ``timeout``), then groups its partitions."""
        opts = self.opts
        count = wait_for_topic(dict(opts.config), opts.topic, opts.timeout)
        step = opts.partitions_per_task
        if opts.max_tasks is not None:
            step = max(step, -(-count // opts.max_tasks))
        return [TopicPartitions(range(p, min(p + step, count))) for p in range(0, count, step)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, TopicPartitions)
        return _read_partitions(self.opts, self.schema, list(partition.partitions))


def _read_partitions(opts: _ReadOptions, schema: StructType, partitions: list[int]) -> Iterator[pa.RecordBatch]:
    """Read ``partitions`` to end of stream, yielding Arrow batches of ``schema`` (runs in a worker)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    started = time.monotonic()
    deadline = None if opts.timeout is None else started + opts.timeout
    arrow_schema = to_arrow_schema(schema)
    build = _raw_builder(arrow_schema) if tuple(schema.fieldNames()) == _RAW_NAMES else _json_builder(arrow_schema)
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
    try:
        pending: list[DataRecord] = []
        tracker = reader.tracker
        records = 0
        while not tracker.is_ended:
            if progress.due():
                progress.log(f"{records} records, watermark {_mark(tracker.emitted_watermark)}, "
                             f"{len(tracker.ended_partitions)} of {len(partitions)} partitions ended")
            wait = _POLL_S
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
                if wait <= 0:
                    raise _timeout_error(opts, tracker, partitions)
            for item in reader.poll(wait):
                if type(item) is DataRecord:
                    pending.append(item)
                    records += 1
            if len(pending) >= opts.batch_rows:
                yield build(pending, opts.topic)
                pending = []
        if pending:
            yield build(pending, opts.topic)
    finally:
        reader.close()


def _mark(ts: int | None) -> str:
    return "undefined" if ts is None else str(ts)


# ---------------------------------------------------------------------------------------------- timeouts


def _expected_names(tracker: InputTracker) -> set[str] | None:
    """All task names of the run, when they follow ``write_intermediate``'s ``<prefix>-p<i>`` pattern
    (one prefix, indexes below the task count); ``None`` when that cannot be told."""
    count = tracker.task_count
    if count is None:
        return None
    known: set[str] = set()
    for status in tracker.statuses():
        known |= status.reported_tasks
    prefixes = set()
    for name in known:
        match = _TASK_NAME.match(name)
        if match is None or int(match.group(2)) >= count:
            return None
        prefixes.add(match.group(1))
    if len(prefixes) != 1:
        return None
    (prefix,) = prefixes
    return {f"{prefix}-p{i}" for i in range(count)}


def waiting_for(status: PartitionStatus, expected: set[str] | None = None) -> str:
    """What partition ``status`` still waits for, in words: the upstream tasks that reported but have
    not ended, and those not heard from (by name when ``expected`` holds every task name)."""
    if status.task_count is None:
        return "no control message of the run yet (upstream task count unknown)"
    parts = []
    if status.open_tasks:
        parts.append("upstream tasks " + ", ".join(status.open_tasks) + " (reported, not ended)")
    unheard = status.unheard_tasks or 0
    if unheard:
        if expected is not None:
            names = sorted(expected - status.reported_tasks, key=_task_order)
            parts.append("upstream tasks " + ", ".join(names) + " (not heard from)")
        else:
            parts.append(f"{unheard} upstream task(s) not heard from")
    ended = f"{len(status.ended_tasks)} of {status.task_count} ended"
    return f"waiting for end of stream from {' and '.join(parts)}; {ended}"


def _task_order(name: str) -> tuple[str, int]:
    match = _TASK_NAME.match(name)
    return (match.group(1), int(match.group(2))) if match else (name, -1)


def _timeout_error(opts: _ReadOptions, tracker: InputTracker, partitions: list[int]) -> EndOfStreamTimeout:
    statuses = [s for s in tracker.statuses() if not s.is_ended]
    expected = _expected_names(tracker)
    lines = [f"partition {s.partition}: {waiting_for(s, expected)}" for s in statuses]
    message = (
        f"topic {opts.topic!r} run {opts.run_id!r}: end of stream not reached within {opts.timeout:g} s on "
        f"partitions {[s.partition for s in statuses]} (this task reads {partitions}); " + "; ".join(lines)
    )
    return EndOfStreamTimeout(message, statuses)


# ---------------------------------------------------------------------------------------------- batches


def _raw_builder(schema: pa.Schema) -> Any:
    key_type = schema.field("key").type
    value_type = schema.field("value").type

    def build(records: list[DataRecord], topic: str) -> pa.RecordBatch:
        try:
            keys = pa.array([r.key for r in records], pa.binary())
            values = pa.array([r.payload for r in records], pa.binary())
            arrays = [
                pa.array([r.partition for r in records], schema.field("partition").type),
                pa.array([r.offset for r in records], schema.field("offset").type),
                keys if key_type == pa.binary() else keys.cast(key_type),
                values if value_type == pa.binary() else values.cast(value_type),
            ]
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise ReadError(f"topic {topic!r} partitions {_parts(records)}: cannot make a batch: {exc}") from exc
        return pa.RecordBatch.from_arrays(arrays, schema=schema)

    return build


def _json_builder(schema: pa.Schema) -> Any:
    loads = orjson.loads

    def build(records: list[DataRecord], topic: str) -> pa.RecordBatch:
        try:
            objects = [loads(r.payload) for r in records]
        except orjson.JSONDecodeError:
            bad = next(r for r in records if not _is_json(r.payload))
            raise ReadError(
                f"topic {topic!r} partition {bad.partition} offset {bad.offset}: the value is not JSON"
            ) from None
        for obj, rec in zip(objects, records, strict=True):
            if type(obj) is not dict:
                raise ReadError(
                    f"topic {topic!r} partition {rec.partition} offset {rec.offset}: the value is a JSON "
                    f"{type(obj).__name__}, not an object"
                )
        arrays = []
        for field in schema:
            name = field.name
            if name == _META_PARTITION:
                values: list[Any] = [r.partition for r in records]
            elif name == _META_OFFSET:
                values = [r.offset for r in records]
            elif name == _META_KEY:
                values = [r.key for r in records]
                if not pa.types.is_binary(field.type):
                    values = [None if k is None else k.decode("utf-8", "replace") for k in values]
            else:
                values = [o.get(name) for o in objects]
            try:
                arrays.append(_to_arrow(values, field.type))
            except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError, TypeError, ArithmeticError) as exc:
                raise ReadError(
                    f"topic {topic!r} partitions {_parts(records)}: field {name!r} does not fit type "
                    f"{field.type}: {exc}"
                ) from exc
        return pa.RecordBatch.from_arrays(arrays, schema=schema)

    return build


def _to_arrow(values: list[Any], dtype: pa.DataType) -> pa.Array:
    if pa.types.is_timestamp(dtype) or pa.types.is_date(dtype) or pa.types.is_time(dtype):
        return pa.array(values, pa.string()).cast(dtype)
    if pa.types.is_decimal(dtype):
        return pa.array([None if v is None else Decimal(v if isinstance(v, str) else repr(v)) for v in values], dtype)
    if pa.types.is_binary(dtype) or pa.types.is_large_binary(dtype):
        return pa.array([None if v is None else base64.b64decode(v, validate=True) for v in values], dtype)
    return pa.array(values, dtype)


def _is_json(payload: bytes) -> bool:
    try:
        orjson.loads(payload)
    except orjson.JSONDecodeError:
        return False
    return True


def _parts(records: list[DataRecord]) -> list[int]:
    return sorted({r.partition for r in records})


# ---------------------------------------------------------------------------------------------- helper


def read_intermediate(
    spark: SparkSession,
    topic: str,
    *,
    bootstrap_servers: str,
    run_id: str,
    schema: str | StructType | None = None,
    timeout: float | None = None,
    partitions_per_task: int = 1,
    max_tasks: int | None = None,
    kafka_config: Mapping[str, str] | None = None,
) -> DataFrame:
    """The user records of run ``run_id`` of ``topic`` as a DataFrame, read to end of stream.

    A shorthand for ``spark.read.format("controlmsg")`` with these options (registering the data
    source first). Lazy like any read; the Spark action that uses it blocks until every partition has
    ended (or fails after ``timeout`` s, see the module docstring).
    """
    from spark_jobs.session import register_data_source

    register_data_source(spark)
    reader = (
        spark.read.format("controlmsg")
        .option("topic", topic)
        .option("bootstrapServers", bootstrap_servers)
        .option("runId", run_id)
        .option("partitionsPerTask", str(partitions_per_task))
        .option("maxTasks", str(max_tasks or spark.sparkContext.defaultParallelism))
    )
    if timeout is not None:
        reader = reader.option("timeout", str(timeout))
    for key, value in (kafka_config or {}).items():
        reader = reader.option(f"kafka.{key}", value)
    if schema is not None:
        reader = reader.schema(schema)
    return reader.load()
