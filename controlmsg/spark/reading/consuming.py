"""How the readers of ``format("controlmsg")`` consume: the consumer's settings, the poll wait, and the one
loop of a reading task over the offset ranges its driver planned (a micro-batch of an intermediate
topic, :mod:`controlmsg.spark.reading.envelope_records`; a batch or a micro-batch of a plain topic,
:mod:`controlmsg.spark.reading.plain_records`).

The loop is the same for both: a consumer assigned at each range's start, polls, the planned end of
each partition, Arrow batches of ``batchRows`` rows (:mod:`controlmsg.spark.batches`), the bad records
set aside (:mod:`controlmsg.spark.reading.bad_records`). What a reader makes of the messages is its hook,
a :class:`RangeRecords`: the envelope reader keeps the run's user records with their watermark marks and
feeds control messages to the bookkeeping; the plain reader keeps every record as it is.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any, Final, Protocol

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from controlmsg.errors import ReadError
from controlmsg.kafka.data_records import DataColumns
from controlmsg.kafka.fetching import EOF_FETCH_WAIT_MS, consume_ready
from controlmsg.kafka.periodic_log import Progress
from controlmsg.kafka.refusals import check_client, mark_reached
from controlmsg.kafka.settings import for_client, worker_logging
from controlmsg.spark.batches import Builder
from controlmsg.spark.options import ReadOptions
from controlmsg.spark.read_schema import Mark
from controlmsg.spark.reading.bad_records import SetAside

__all__ = ["POLL_S", "RangeRecords", "consumer_conf", "read_ranges"]

# consume() waits for a whole batch or this: short polls keep a small stream moving, and a read of a few
# records ends when they are read, not a poll later (a batch read of 200 partitions, one task each, paid
# 0.1 s per task at 0.1). A full batch returns at once, so a large read is not slowed.
POLL_S: Final = 0.02
"""Seconds a reader's ``consume()`` waits for a full batch of messages."""

_IDLE: dict[tuple[Any, ...], tuple[dict[str, Any], Consumer]] = {}
"""The consumer a reading task of this process left, per settings: a Spark Python worker runs task after task
(``spark.python.worker.reuse``), and a task that takes it skips connecting, the metadata and the first fetch's
leader lookup (tenths of a second on a busy machine; a micro-batch's reading tasks paid it each time)."""


_LOST: Final = ("; the planned offsets were deleted (retention) before they were read: data loss. The option "
                "failOnDataLoss false skips them and reads on")


def consumer_conf(opts: ReadOptions, *, eof: bool) -> dict[str, Any]:
    """The settings of every consumer of the source's readers, drivers' and tasks': assigned partitions
    only (no group membership, no commits), ``read_committed``, a planned offset that is gone an error;
    ``eof``: end-of-partition events on. The user's ``kafka.*`` settings come last and win."""
    return for_client({
        "group.id": f"controlmsg-stream-{opts.topic}",  # never joins nor commits: assign() only
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "isolation.level": "read_committed",
        # A planned offset that is gone (retention) is data loss: fail, naming it, rather than skip; unless a
        # plain read's failOnDataLoss is false (controlmsg.spark.positions): then read on from the log start.
        "auto.offset.reset": "earliest" if opts.positions is not None and not opts.positions.fail_on_data_loss
        else "error",
        "enable.partition.eof": eof,
        # the end of a transactional range is an end-of-partition event, which an empty fetch brings
        **({"fetch.wait.max.ms": EOF_FETCH_WAIT_MS} if eof else {}),
        **dict(opts.config),
    }, "consumer")


class RangeRecords(Protocol):
    """A reader's hook into :func:`read_ranges`: what it makes of the messages of its planned ranges.
    It keeps the records that become rows, with their marks, until :func:`read_ranges` drains them into a
    batch."""

    def take(self, messages: list[Any]) -> int:
        """Called once per poll that returned messages of the planned ranges, with those messages (never an
        error, none at or past its partition's planned end), in offset order on each partition. Returns how
        many rows are kept and not yet drained. May raise a :class:`~controlmsg.errors.ControlMsgError`
        (a control message that breaks the protocol), which fails the task."""
        ...

    def drain(self) -> tuple[DataColumns, list[Mark] | None]:
        """The rows kept since the last drain, in the order taken, and each one's :data:`Mark` (``None``
        when the schema has no watermark field): the arguments of the batch builder. Starts anew."""
        ...


def read_ranges(opts: ReadOptions, build: Builder, ranges: Sequence[tuple[int, int, int]],
                records: RangeRecords, *, eof: bool) -> Iterator[pa.RecordBatch]:
    """Read the planned ``(partition, start, end)`` offset ranges (a range with ``start == end`` reads
    nothing) into Arrow batches made by ``build`` of what ``records`` keeps, at least ``batchRows`` rows
    each but the last; runs in a reading task. A partition is done at its last planned offset, at the first
    record past it, or, with ``eof`` (end-of-partition events on), at an end-of-partition event at or past
    its planned end: the last offsets of a plain topic may be transaction markers or aborted records,
    which ``read_committed`` does not deliver.

    Each batch's bad records are handled (:class:`~controlmsg.spark.reading.bad_records.SetAside`: logged,
    dead letters acknowledged) before the batch is yielded. Raises :class:`~controlmsg.errors.ReadError`
    when the consumer fails, or when the open partitions give no record for ``timeout`` (else 120) s
    before their planned end; the builder's and the hook's errors pass through. The consumer is closed
    when the generator ends or is closed, or, after a read of everything planned, kept for the next task of
this process with the same settings (:data:`_IDLE`)."""
    worker_logging()
    # The driver planned this task from the cluster's answers: a refused connection here is a broker that
    # restarts (a task started while it is down), left to the retries; only a refusal of the client itself
    # (authentication, TLS) fails at once (controlmsg.kafka.refusals).
    mark_reached(dict(opts.config))
    topic = opts.topic
    end = {p: stop for p, start, stop in ranges if start != stop}
    open_parts = set(end)
    key = (opts.config, topic, eof)
    held = _IDLE.pop(key, None)
    conf, consumer = held if held is not None else _new_consumer(opts, eof)
    consumer.assign([TopicPartition(topic, p, start) for p, start, stop in ranges if start != stop])
    reuse = False
    wait_s = opts.timeout if opts.timeout is not None else 120.0
    last_record = time.monotonic()
    aside = SetAside(opts, Progress(f"reader {topic} partitions {sorted(p for p, _, _ in ranges)}"))
    pending = 0
    try:
        while open_parts:
            try:
                msgs: list[Any] = consume_ready(consumer, max(opts.batch_rows, 1000), POLL_S)
            except KafkaException as exc:
                raise ReadError(f"reading topic {topic!r} failed: {exc.args[0]}") from exc
            if not msgs:
                check_client(conf)  # a cluster that refuses the consumer (controlmsg.kafka.refusals)
                if time.monotonic() - last_record > wait_s:
                    raise ReadError(f"topic {topic!r}: partitions {sorted(open_parts)} gave no record for {wait_s:g} "
                                    f"s before the planned offsets {({p: end[p] for p in open_parts})}")
            taken = []
            for msg in msgs:
                p = msg.partition()
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        if p in open_parts and msg.offset() >= end[p]:
                            open_parts.discard(p)
                        continue
                    raise ReadError(f"reading topic {topic!r} partition {p} failed: {err.str()}" + (
                        _LOST if err.code() == KafkaError._AUTO_OFFSET_RESET and opts.positions is not None else ""))
                if p not in open_parts:
                    continue
                last_record = time.monotonic()
                off = msg.offset()
                if off >= end[p]:
                    open_parts.discard(p)
                    continue
                if off == end[p] - 1:
                    open_parts.discard(p)
                taken.append(msg)
            if taken:
                pending = records.take(taken)
            if pending >= opts.batch_rows:
                rows, marks = records.drain()
                pending = 0
                batch = aside.take(build(rows, topic, marks))
                if batch is not None:
                    yield batch
        if pending:
            rows, marks = records.drain()
            batch = aside.take(build(rows, topic, marks))
            if batch is not None:
                yield batch
        aside.finish()
        reuse = True
    finally:
        aside.close()
        _release(key, conf, consumer, reuse)


def _new_consumer(opts: ReadOptions, eof: bool) -> tuple[dict[str, Any], Consumer]:
    conf = consumer_conf(opts, eof=eof)
    return conf, Consumer(conf)


def _release(key: tuple[Any, ...], conf: dict[str, Any], consumer: Consumer, reuse: bool) -> None:
    """Keep ``consumer``, unassigned, for the next task of this process with the same settings (a task that
    read all it planned), else close it. Unassigning drops what it fetched ahead; the next task assigns
    its own offsets."""
    if reuse and key not in _IDLE:
        try:
            consumer.unassign()
        except KafkaException:
            reuse = False
        else:
            _IDLE[key] = (conf, consumer)
            return
    consumer.close()
