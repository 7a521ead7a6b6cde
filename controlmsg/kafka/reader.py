"""The downstream side: read an intermediate topic, feed the bookkeeping, yield data and events.

:class:`ControlReader` assigns itself partitions of one topic (never joins a consumer group: its position
lives in its checkpoint; with ``group_id`` it also reports that position to a group, for lag tools), consumes
in batches, decodes every record, feeds control messages to an
:class:`~controlmsg.core.bookkeeping.InputTracker` and returns, in order,
:class:`~controlmsg.kafka.data_records.DataRecord` items (or :class:`~controlmsg.kafka.data_records.DataColumns`)
and the tracker's events.

Bad records (undecodable, unknown version, protocol violations) either stop the reader with the
located error (the default) or, with ``dead_letter_topic``, are written there unchanged with the reason
and their origin in headers (:mod:`controlmsg.kafka.deadletter`: the one dead-letter format), counted,
and skipped. Nothing is dropped without a trace.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Mapping
from enum import Enum
from typing import Any, Final, Literal, cast

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, TopicPartition

from controlmsg.core.bookkeeping import InputTracker
from controlmsg.core.codec import decode
from controlmsg.core.events import Event
from controlmsg.core.messages import MessageType
from controlmsg.errors import CheckpointError, DecodeError, Location, ProtocolError, ReadError
from controlmsg.kafka.admin import wait_for_topic
from controlmsg.kafka.checkpoint import Checkpoint, FileCheckpointStore
from controlmsg.kafka.data_records import (
    DataColumns,
    DataRecord,
    own_run_tag,
    same_run,
    tagged_payload,
    whole_batch,
)
from controlmsg.kafka.deadletter import (
    HEADER_DLQ_OFFSET,
    HEADER_DLQ_PARTITION,
    HEADER_DLQ_REASON,
    HEADER_DLQ_TOPIC,
    DeadLetters,
    check_dead_letter_topic,
)
from controlmsg.kafka.fetching import EOF_FETCH_WAIT_MS, consume_ready
from controlmsg.kafka.group_offsets import GroupProgress
from controlmsg.kafka.refusals import check_client
from controlmsg.kafka.retry import ConsumerErrors
from controlmsg.kafka.settings import flag, for_client
from controlmsg.kafka.writer import HEADER_RUN

__all__ = [
    "HEADER_DLQ_OFFSET",
    "HEADER_DLQ_PARTITION",
    "HEADER_DLQ_REASON",
    "HEADER_DLQ_TOPIC",
    "ControlReader",
    "Item",
    "start_offset",
]

_PARTITION_EOF: Final = KafkaError._PARTITION_EOF
_USER_BYTE: Final = 0
_RUN_BYTE: Final = int(MessageType.USER_MESSAGE_OF_RUN)
_OFFSET: Final[Any] = Message.offset
_NEXT: Final = (1).__add__  # an offset's next


class _Bad(Enum):
    CUT_SHORT = "cut short"  # _of_run's answer for a bad record


_CUT_SHORT: Final = _Bad.CUT_SHORT
_TO_EARLIEST: Final = frozenset({"earliest", "smallest", "beginning"})


def start_offset(offset: int, reset: object) -> int:
    """Where to assign a partition whose position is ``offset`` under ``auto.offset.reset`` ``reset``:
    offset 0 for :data:`OFFSET_BEGINNING` when the reset goes to the earliest offset, else ``offset``.

    librdkafka looks a logical offset up before it fetches, a wait per consumer that a read to end of stream
    of a few records is mostly made of, once per reading task (docs/PERFORMANCE.md, "The reader's start and
    fetch"). Offset 0 is at or below the log start, and below it the reset policy takes the
    consumer to the log start: the same place as the beginning."""
    if offset == OFFSET_BEGINNING and str(reset).lower() in _TO_EARLIEST:
        return 0
    return offset


Item = DataRecord | Event


# poll() builds DataRecords by setting their slots directly: the frozen dataclass's generated __init__ goes
# through object.__setattr__ once per field, which costs more than all the rest of poll()'s per-record work.
# The result is the same object (DataRecord has no __post_init__; poll() sets every slot, defaulted or not).
_new_record: Final = object.__new__
_set_partition: Final = cast(Any, DataRecord).partition.__set__
_set_offset: Final = cast(Any, DataRecord).offset.__set__
_set_key: Final = cast(Any, DataRecord).key.__set__
_set_payload: Final = cast(Any, DataRecord).payload.__set__
_set_message: Final = cast(Any, DataRecord).message.__set__


class ControlReader:
    """Reads one topic's envelope stream for one consumer.

    ``config``: librdkafka consumer settings, passed through (``bootstrap.servers`` required; defaults
    added: a private ``group.id``, no auto commit, ``isolation.level=read_committed``).
    ``partitions``: the partitions this consumer owns (default: all of the topic's).
    ``run_id``: the run to follow (default: the run of the first control message). When given, user
    records that name another run, in their envelope (wire format 2) or in their ``controlmsg-run``
    header (format 1), are skipped and counted too.
    ``checkpoint``: a store to resume from (if it holds a checkpoint) and to save to with
    :meth:`save_checkpoint`. ``resume_from``: a checkpoint kept elsewhere (e.g. in a Kafka state topic)
    to resume from instead of the store's. ``dead_letter_topic``: where bad records go instead of stopping the reader.
    ``stop_at_end``: stop taking records from a batch right after the stream ends, so the checkpoint
    stands exactly at end of stream. ``start_offsets``: where to start reading (partition -> absolute
    offset) instead of the beginning, without a checkpoint to resume (a ``ValueError`` with one); the
    bookkeeping then knows only the control messages from there on. ``group_id``: a consumer group to
    report progress to, for lag tools (:meth:`report_progress`; :meth:`save_checkpoint` calls it): the
    reader's position stays in its checkpoint, and nothing reads from that group.

    With ``enable.partition.eof`` true in ``config``, :attr:`partitions_at_end` collects the partitions
    whose end (the last committed offset when reached) the reader has reached at least once.

    Opening blocks until the topic exists (up to ``topic_timeout`` s, else
    :class:`~controlmsg.errors.TopicError`). Not thread-safe. Use as a context manager or call
    :meth:`close`.
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        topic: str,
        *,
        partitions: list[int] | None = None,
        run_id: str | None = None,
        checkpoint: FileCheckpointStore | None = None,
        resume_from: Checkpoint | None = None,
        dead_letter_topic: str | None = None,
        batch_size: int = 2000,
        stop_at_end: bool = True,
        topic_timeout: float = 30.0,
        start_offsets: Mapping[int, int] | None = None,
        group_id: str | None = None,
    ) -> None:
        self.topic = topic
        self.batch_size = batch_size
        self.stop_at_end = stop_at_end
        self._store = checkpoint
        self._filter_run = (HEADER_RUN, run_id.encode()) if run_id is not None else None
        self._own_tag = own_run_tag(run_id)
        self.skipped_other_run = 0
        self._error: ProtocolError | None = None
        self._errors = ConsumerErrors()
        count = wait_for_topic(config, topic, topic_timeout)
        owned = sorted(partitions) if partitions is not None else list(range(count))
        if not owned or owned[0] < 0 or owned[-1] >= count:
            raise ValueError(f"partitions {owned} do not fit topic {topic!r} with {count} partitions")

        saved = resume_from if resume_from is not None else checkpoint.load() if checkpoint is not None else None
        self.partitions_at_end: set[int] = set()
        if saved is not None and start_offsets is not None:
            raise ValueError(f"start offsets given for topic {topic!r}, and a checkpoint to resume: give one")
        if saved is not None:
            if saved.topic != topic or sorted(saved.offsets) != owned:
                source = str(checkpoint.path) if checkpoint is not None and resume_from is None else "checkpoint"
                raise CheckpointError(
                    f"{source}: checkpoint is for topic {saved.topic!r} "
                    f"partitions {sorted(saved.offsets)}, not topic {topic!r} partitions {owned}"
                )
            self.tracker = InputTracker.restore(saved.bookkeeping, run_id)
            self.tracker.topic = topic
            self._positions = dict(saved.offsets)
        else:
            self.tracker = InputTracker(owned, run_id, topic)
            self._positions = {p: OFFSET_BEGINNING for p in owned}
            if start_offsets is not None:
                self._positions.update((p, o) for p, o in start_offsets.items() if p in self._positions)

        conf: dict[str, Any] = {
            "group.id": f"controlmsg-reader-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            # librdkafka's default (1 s) stalls fetching whenever its local queue fills (docs/PERFORMANCE.md).
            "fetch.queue.backoff.ms": 10,
            **({"fetch.wait.max.ms": EOF_FETCH_WAIT_MS} if flag(config, "enable.partition.eof") else {}),
            **for_client(config, "consumer"),
        }
        self._consumer = Consumer(conf)
        self._conf = conf
        reset = conf.get("auto.offset.reset")
        self._consumer.assign([TopicPartition(topic, p, start_offset(o, reset)) for p, o in self._positions.items()])
        self._group = GroupProgress(config, group_id) if group_id is not None else None
        self._dlq: DeadLetters | None = None
        if dead_letter_topic is not None:
            # Fail before reading anything if bad records would have nowhere to go.
            check_dead_letter_topic(config, dead_letter_topic, topic_timeout)
            self._dlq = DeadLetters(config, dead_letter_topic)

    # ------------------------------------------------------------------ reading

    @property
    def positions(self) -> dict[int, int]:
        """Next offset to read per owned partition (negative: from the beginning)."""
        return dict(self._positions)

    def poll(self, timeout: float = 1.0) -> list[Item]:
        """Consume one batch, waiting up to ``timeout`` s for the first record. Returns its items in
        order (possibly none).

        On a bad record without a dead-letter topic, returns the items before it and raises the located
        :class:`~controlmsg.errors.ProtocolError` on the next call (the position stays at the bad
        record, so a checkpoint saved in between resumes there). Raises
        :class:`~controlmsg.errors.ReadError` when Kafka reports an error.
        """
        msgs = self._consume(timeout)
        items: list[Item] = []
        append = items.append
        positions = self._positions
        filter_run = self._filter_run
        new, record_type, user_byte, run_byte = _new_record, DataRecord, _USER_BYTE, _RUN_BYTE
        set_partition, set_offset, set_key, set_payload, set_message = (
            _set_partition, _set_offset, _set_key, _set_payload, _set_message)
        for msg in msgs:
            if msg.error() is not None:
                self._check_error(msg)  # raises, or passes an end-of-partition event
                continue
            p = msg.partition()
            off = msg.offset()
            value = msg.value()
            if value and value[0] == user_byte:
                if filter_run is not None and not same_run(msg.headers(), filter_run):
                    self.skipped_other_run += 1
                else:
                    record = new(record_type)  # DataRecord(p, off, msg.key(), value[1:]), faster
                    set_partition(record, p)
                    set_offset(record, off)
                    set_key(record, msg.key())
                    set_payload(record, value[1:])
                    set_message(record, msg)
                    append(record)
                positions[p] = off + 1
                continue
            if value and value[0] == run_byte and (payload := self._of_run(value)) is not _CUT_SHORT:
                if payload is None:
                    self.skipped_other_run += 1
                else:
                    append(DataRecord(p, off, msg.key(), payload, msg))
                positions[p] = off + 1
                continue
            if not self._control(msg, p, off, value, items):
                return items
            if self.stop_at_end and self.tracker.is_ended:
                break
        return items

    def _consume(self, timeout: float) -> list[Any]:
        """The next messages for :meth:`poll` and :meth:`poll_columns` (none once a bad record stopped the
        reader, or after end of stream with ``stop_at_end``). Raises what they document."""
        if self._error is not None:
            raise self._error
        if self.stop_at_end and self.tracker.is_ended:
            return []
        try:
            # confluent-kafka's Message offsets are Optional; records read are never None
            msgs = consume_ready(self._consumer, self.batch_size, timeout)
        except KafkaException as exc:
            raise ReadError(f"reading topic {self.topic!r} failed: {exc.args[0]}") from exc
        if not msgs:
            check_client(self._conf)  # a cluster that refuses this consumer (controlmsg.kafka.refusals)
        return msgs

    def _check_error(self, msg: Any) -> None:
        """A message that carries an error: end of a partition passes, so does an error the consumer
        recovers from by itself while it has not lasted (:class:`~controlmsg.kafka.retry.ConsumerErrors`:
        a leader that has not heard of a new topic yet, a leader that died); anything else raises
        :class:`~controlmsg.errors.ReadError` naming the partition."""
        err = msg.error()
        if err.code() == _PARTITION_EOF:
            self.partitions_at_end.add(msg.partition())
        elif not self._errors.passes(err, msg.partition()):
            raise ReadError(f"reading topic {self.topic!r} partition {msg.partition()} failed: {err.str()}")

    def poll_columns(self, into: DataColumns, timeout: float = 1.0) -> list[Event]:
        """:meth:`poll`, with the user messages appended to ``into`` (no :class:`DataRecord` per record)
        and the events returned. The same records, skips, positions and errors as :meth:`poll`; what it
        does not give is the order of user messages relative to the events (read them as "the data of
        this batch, and the events it caused")."""
        msgs = self._consume(timeout)
        events: list[Event] = []
        positions = self._positions
        filter_run = self._filter_run
        own = self._own_tag
        whole = whole_batch(msgs, own, filter_run) if msgs else None
        if whole is not None:  # the usual batch, every message a record of the run: taken column by column
            partitions = into.take_batch(msgs, *whole)
            positions.update(zip(partitions, map(_NEXT, map(_OFFSET, msgs)), strict=True))  # each partition's last
            return events
        user_byte, run_byte = _USER_BYTE, _RUN_BYTE
        own_end = len(own) if own is not None else 0
        add_partition, add_offset, add_key, add_payload, add_message = (
            into.partitions.append, into.offsets.append, into.keys.append, into.payloads.append,
            into.messages.append)
        for msg in msgs:
            if msg.error() is not None:
                self._check_error(msg)  # raises, or passes an end-of-partition event
                continue
            p = msg.partition()
            off = msg.offset()
            value = msg.value()
            if value and value[0] == user_byte:
                # same_run(), with its usual answer (no headers, or the run header first) decided inline.
                if (filter_run is not None and (headers := msg.headers()) and headers[0] != filter_run
                        and not same_run(headers, filter_run)):
                    self.skipped_other_run += 1
                else:
                    add_partition(p)
                    add_offset(off)
                    add_key(msg.key())
                    add_payload(value[1:])
                    add_message(msg)
                positions[p] = off + 1
                continue
            if value and value[0] == run_byte and (
                    (payload := value[own_end:] if own is not None and value.startswith(own) else self._of_run(value))
                    is not _CUT_SHORT):
                if payload is None:
                    self.skipped_other_run += 1
                else:
                    add_partition(p)
                    add_offset(off)
                    add_key(msg.key())
                    add_payload(payload)
                    add_message(msg)
                positions[p] = off + 1
                continue
            if not self._control(msg, p, off, value, events):
                return events
            if self.stop_at_end and self.tracker.is_ended:
                break
        return events

    def _of_run(self, value: bytes) -> bytes | Literal[_Bad.CUT_SHORT] | None:
        """A user message that names its run (wire format 2): its payload when it is of the followed run
        (or of any, when none was given), ``None`` when of another run, :data:`_CUT_SHORT` when it is cut
        short, for :meth:`_control` to refuse as every bad record."""
        try:
            return tagged_payload(value, self._own_tag)
        except DecodeError:
            return _CUT_SHORT

    def _control(self, msg: Any, p: int, off: int, value: bytes | None, out: list[Any]) -> bool:
        """Feed a record that is not a user message to the bookkeeping, its events to ``out``; a bad one
        to the dead-letter topic, or (without one) keep its error for the next call and return False."""
        try:
            decoded = decode(value)
            assert not isinstance(decoded, bytes)
            events = self.tracker.on_control(p, decoded, off)
        except ProtocolError as exc:
            located = exc.at(Location(self.topic, p, off))
            if self._dlq is None:
                self._error = located
                return False
            self._dead_letter(msg, located)
            self._positions[p] = off + 1
            return True
        self._positions[p] = off + 1
        out.extend(events)
        return True

    @property
    def dead_lettered(self) -> int:
        """Bad records the dead-letter topic has acknowledged (so far as :meth:`save_checkpoint` flushed)."""
        return self._dlq.delivered if self._dlq is not None else 0

    def _dead_letter(self, msg: Any, error: ProtocolError) -> None:
        assert self._dlq is not None
        where = Location(self.topic, msg.partition(), msg.offset())
        self._dlq.send(msg.value(), msg.key(), msg.headers(), error.reason, where)

    def read_until_end(self, timeout: float | None = None, poll_timeout: float = 0.5) -> Iterator[Item]:
        """Yield items until the stream ends (the last item is :class:`StreamEnded`). With ``timeout``,
        returns silently when it passes first; check :attr:`tracker`'s ``is_ended`` to tell which."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.tracker.is_ended:
            if deadline is not None and time.monotonic() >= deadline:
                return
            yield from self.poll(poll_timeout)

    # ------------------------------------------------------------------ checkpoints

    def lag(self) -> int | None:
        """The most offsets this reader is behind on any of its partitions: each partition's end offset as
        librdkafka last fetched it (no request is made) minus the next offset to read, 0 on a partition whose
        end of stream was read. ``None`` while no partition has been fetched. A partition read to its end can
        show 1: the commit marker of the transaction that wrote its last record, which no reader is given."""
        ended = self.tracker.ended_partitions
        behind: list[int] = []
        for p, position in self._positions.items():
            if p in ended:
                behind.append(0)
                continue
            try:
                low, high = self._consumer.get_watermark_offsets(TopicPartition(self.topic, p), cached=True)
            except KafkaException:
                continue
            if high >= 0:
                behind.append(max(high - (position if position >= 0 else max(low, 0)), 0))
        return max(behind) if behind else None

    def checkpoint(self) -> Checkpoint:
        """The current position and bookkeeping, as one consistent checkpoint."""
        return Checkpoint(self.topic, dict(self._positions), self.tracker.snapshot())

    def consumed_offsets(self) -> dict[int, int]:
        """Per owned partition read from, the offset this reader is done up to, as lag tools count it. That is
        the next offset to read, moved past what no reader is given: the transaction markers and aborted
        records librdkafka skipped after the last record taken (its own position), and, on a partition whose
        end of stream was read, everything up to the partition's end as last fetched (what other runs write
        there is never read), as :meth:`lag` counts 0 there. After a bad record stopped the reader, only the
        next offset to read (librdkafka's position may stand past records of its batch never taken).
        Partitions not read from yet are left out."""
        ended = self.tracker.ended_partitions
        skipped: dict[int, int] = {}
        if self._error is None:
            owned = [TopicPartition(self.topic, p) for p in self._positions]
            skipped = {tp.partition: tp.offset for tp in self._consumer.position(owned)}
        done: dict[int, int] = {}
        for p, position in self._positions.items():
            if position < 0:
                continue
            position = max(position, skipped.get(p, -1))
            if p in ended:
                try:
                    _, high = self._consumer.get_watermark_offsets(TopicPartition(self.topic, p), cached=True)
                except KafkaException:
                    high = -1
                position = max(position, high)
            done[p] = position
        return done

    def report_progress(self) -> None:
        """With ``group_id``: commit :meth:`consumed_offsets` to that consumer group (when they changed), for
        ``kafka-consumer-groups``, Burrow and the lag exporters. Call it once what was read is durable (after
        a checkpoint). Without a group, nothing. Raises :class:`~controlmsg.errors.ControlMsgError` naming
        the group when the broker refuses (a group that live consumers use, no authorization)."""
        if self._group is not None:
            self._group.commit({(self.topic, p): o for p, o in self.consumed_offsets().items()})

    def save_checkpoint(self) -> None:
        """Make dead-lettered records durable, then save :meth:`checkpoint` to the store (if any), then
        :meth:`report_progress`. Call it after the items returned so far have been handled. Raises
        DeliveryError/CheckpointError, and what :meth:`report_progress` raises."""
        if self._dlq is not None:
            self._dlq.flush(self.topic)
        if self._store is not None:
            self._store.save(self.checkpoint())
        self.report_progress()

    def close(self) -> None:
        """Leave the topic. Does not save a checkpoint."""
        if self._dlq is not None:
            self._dlq.close()
        if self._group is not None:
            self._group.close()
        self._consumer.close()

    def __enter__(self) -> ControlReader:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.close()

