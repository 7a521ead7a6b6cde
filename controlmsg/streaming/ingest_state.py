"""The state of one streaming ingest task, and what it commits. Pure: no I/O; time, the committed offsets
and the records read are passed in, and the caller (:func:`controlmsg.streaming.ingest.run_ingest_task`)
does the reading, the writing and the committing.

What a task keeps is per source partition (its position, the largest event time read from it, when it last
gave a record) and task-wide (its last watermark, whether that said idle, whether it wrote its end of
stream, its counters). :meth:`IngestState.metadata` is what each commit stores in the offset metadata of
each source partition, and :meth:`IngestState.restore` folds it back at a start: the task's own state
when the layout and generation are the same, only each partition's largest event time when an older
generation committed it (docs/PROTOCOL.md, "Generations"). :meth:`IngestState.watermark` decides the
watermark a commit writes, idle or not (docs/PROTOCOL.md, "Idle upstream tasks"); :class:`TokenBucket`
paces the reading (``max_rate``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

import orjson

from controlmsg.core.messages import MIN_TIMESTAMP
from controlmsg.core.watermarks import WatermarkPolicy
from controlmsg.errors import CheckpointError

__all__ = ["CommittedOffset", "IngestState", "PartitionTurns", "TokenBucket", "all_quiet", "ended_partitions",
           "task_progress"]


class CommittedOffset(Protocol):
    """What :meth:`IngestState.restore` reads of a committed offset (confluent-kafka's ``TopicPartition``)."""

    @property
    def partition(self) -> int: ...

    @property
    def offset(self) -> int: ...

    @property
    def metadata(self) -> str | None: ...


@dataclass
class IngestState:
    """An ingest task's state between two commits. ``positions``: per source partition, the offset of the
    next record to read; ``max_event``: the largest event time read from it; ``last_seen``: when it last
    gave a record (the caller's clock, not committed); ``idle``: the last watermark the task wrote said
    idle; the counters count over the run, across restarts."""

    positions: dict[int, int] = field(default_factory=dict)
    max_event: dict[int, int] = field(default_factory=dict)
    last_seen: dict[int, float] = field(default_factory=dict)
    last_mark: int | None = None
    idle: bool = False
    ended: bool = False
    records: int = 0
    rejected: int = 0
    commits: int = 0
    idle_periods: int = 0

    @classmethod
    def restore(cls, committed: Sequence[CommittedOffset], *, source_topic: str, source_partitions: Sequence[int],
                run_id: str, task_index: int, task_count: int, generation: int) -> IngestState:
        """The state the last commits left, from the committed offset of each of the task's source
        partitions (``offset`` < 0: none committed; it starts at 0). ``ended``: every partition's state says
        the task wrote its end. A partition committed by an older generation gives only its largest event
        time (and the task has not ended). Raises :class:`CheckpointError` for a partition committed by a
        newer generation, or by this one with another task layout."""
        state = cls(ended=bool(committed))
        counts = {"records": 0, "rejects": 0, "commits": 0, "idlePeriods": 0}  # over the run, across restarts
        for tp in committed:
            state.positions[tp.partition] = tp.offset if tp.offset >= 0 else 0
            meta = orjson.loads(tp.metadata) if tp.metadata else {}
            if tp.offset >= 0 and int(meta.get("generation", 0)) != generation:
                if int(meta.get("generation", 0)) > generation:
                    raise CheckpointError(
                        f"source partition {tp.partition} of {source_topic!r} was committed by generation "
                        f"{meta['generation']} of run {run_id!r}, newer than this task's {generation}: another "
                        "start of this run rescaled it (is one still running?)")
                if meta.get("maxEvent") is not None:  # an older layout: only the partition's own state counts
                    state.max_event[tp.partition] = meta["maxEvent"]
                state.ended = False
                continue
            layout = (meta.get("taskCount", task_count), meta.get("partitions", sorted(source_partitions)))
            if layout != (task_count, sorted(source_partitions)):
                raise CheckpointError(
                    f"ingest task {task_index} of run {run_id!r} committed its state as task {task_index} of "
                    f"{layout[0]} over source partitions {layout[1]}, not of {task_count} over "
                    f"{sorted(source_partitions)}: the task layout is part of the checkpoint (same --tasks, "
                    "or a new run)")
            if meta.get("maxEvent") is not None:
                state.max_event[tp.partition] = meta["maxEvent"]
            if meta.get("lastMark") is not None:
                state.last_mark = meta["lastMark"] if state.last_mark is None else max(state.last_mark,
                                                                                       meta["lastMark"])
            state.idle = state.idle or bool(meta.get("idle"))
            state.ended = state.ended and bool(meta.get("ended"))
            for name in counts:  # the same task-wide values are in every partition's metadata
                counts[name] = max(counts[name], int(meta.get(name, 0)))
        state.records, state.rejected, state.commits, state.idle_periods = (
            counts[n] for n in ("records", "rejects", "commits", "idlePeriods"))
        return state

    def read(self, partition: int, offset: int, now: float) -> int | None:
        """The record at ``offset`` of ``partition`` was read at ``now``. Returns the watermark to write again,
        without the idle flag, before anything of it when the task was idle (it counts again from this
        record on; the promise stays what it was), else ``None``."""
        self.positions[partition] = offset + 1
        self.last_seen[partition] = now
        if not self.idle:
            return None
        self.idle = False
        return MIN_TIMESTAMP if self.last_mark is None else self.last_mark

    def saw_event(self, partition: int, event_ms: int) -> None:
        """A record of ``partition`` with event time ``event_ms`` goes to the output."""
        if event_ms > self.max_event.get(partition, event_ms - 1):
            self.max_event[partition] = event_ms

    def quiet(self, now: float, idle_timeout_s: float) -> list[int]:
        """The source partitions that have given no record for ``idle_timeout_s`` at ``now``, in position
        order: idle if their position is also at their end (which the caller asks of the cluster)."""
        return [p for p in self.positions if now - self.last_seen[p] >= idle_timeout_s]

    def watermark(self, policy: WatermarkPolicy, until: Mapping[int, int] | None, idle: set[int],
                  done: bool) -> tuple[int, bool] | None:
        """The watermark a commit writes, with its idle flag, or ``None``: :meth:`WatermarkPolicy.watermark_for`
        of :func:`task_progress` when that rose; else, once every partition left is ``idle`` (and the input
        has not ended, ``done``), the last watermark again as idle (counted in ``idle_periods``)."""
        progress = task_progress(self.positions, self.max_event, until, idle)
        if progress is not None:
            mark = policy.watermark_for(progress)
            if self.last_mark is None or mark > self.last_mark:
                self.last_mark = mark
                self.idle = False
                return mark, False
        elif not self.idle and not done and idle and all_quiet(self.positions, until, idle):
            self.idle = True
            self.idle_periods += 1
            return (MIN_TIMESTAMP if self.last_mark is None else self.last_mark), True
        return None

    def metadata(self, partition: int, task_count: int, generation: int) -> str:
        """The offset metadata of ``partition`` in the next commit (which it counts): everything
        :meth:`restore` reads back."""
        return orjson.dumps(
            {"maxEvent": self.max_event.get(partition), "lastMark": self.last_mark, "idle": self.idle,
             "ended": self.ended, "records": self.records, "rejects": self.rejected, "commits": self.commits + 1,
             "taskCount": task_count, "partitions": sorted(self.positions), "idlePeriods": self.idle_periods,
             "generation": generation}).decode()


_ROUNDING = 1e-9
"""Credit this close below a whole record counts as the record: a refill exactly one record's time after the
last one earns 0.999999999999998 of it in floating point, and would ask for a sleep of 2e-15 s."""


class TokenBucket:
    """``max_rate``: at most ``rate`` records a second, a bucket holding at most 0.1 s of them (at least
    one). Time is passed in."""

    def __init__(self, rate: float, now: float) -> None:
        self.rate = rate
        self.credit = 0.0
        self.credited_at = now

    def refill(self, now: float) -> float | None:
        """Add the credit earned since the last refill. Returns how long to sleep before a record may be
        read (then refill again), or ``None``: :meth:`batch` records may be read now."""
        self.credit = min(max(1.0, self.rate / 10), self.credit + (now - self.credited_at) * self.rate)
        self.credited_at = now
        return (1 - self.credit) / self.rate if self.credit < 1 - _ROUNDING else None

    def batch(self, limit: int) -> int:
        """How many records to ask for at most: ``limit``, or fewer when the credit holds fewer (at least one
        after :meth:`refill` returned ``None``)."""
        return min(limit, int(self.credit + _ROUNDING))

    def take(self, count: int) -> None:
        """``count`` records were read."""
        self.credit -= count


T = TypeVar("T")


class PartitionTurns(Generic[T]):
    """Records read from several partitions, handed out in turns, so that a task's partitions advance together.

    librdkafka hands a consumer its records in the order the broker's fetch responses carry them: a whole
    record batch (up to ``max.partition.fetch.bytes``, 1 MB) of one partition, then one of the next. A
    backlog written in large batches therefore comes one partition at a time, and the task's watermark
    (the minimum over its partitions, :func:`task_progress`) stays where the partitions not yet reached are
    until the others are read to their end: windows close late, and the window state holds the backlog. A
    paced task (``max_rate``) reads such a backlog one partition for minutes. Here the records read are
    queued per partition and :meth:`take` hands them out in turns, an equal share from each partition that
    has any, in each partition's order. Nothing is dropped: what is not taken stays queued, and the offsets
    a task commits are those of the records it took (:attr:`IngestState.positions`), so the queued ones are
    read again after a restart.

    ``limit`` bounds what is queued: :meth:`room` is 0 once it holds that many, and the caller reads no more
    until records were taken; a backlog whose first partition alone holds more than ``limit`` records is
    then handed out in librdkafka's order. Pure: no I/O."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, not {limit}")
        self.limit = limit
        self.size = 0
        self._queues: dict[int, deque[T]] = {}
        self._turns: deque[int] = deque()  # the partitions that hold records, next turn first

    def add(self, records: Iterable[tuple[int, T]]) -> None:
        """Queue ``(partition, record)`` pairs, each partition's in the order given."""
        for partition, record in records:
            queue = self._queues.get(partition)
            if queue is None:
                queue = self._queues[partition] = deque()
            if not queue:
                self._turns.append(partition)
            queue.append(record)
            self.size += 1

    def room(self) -> int:
        """How many more records may be queued now."""
        return max(0, self.limit - self.size)

    def take(self, count: int) -> list[T]:
        """Up to ``count`` records, in rounds: in each, every partition that holds records gives an equal share
        of what is still asked for (at least one), starting with the one whose turn is next; a partition left
        with records takes its next turn after the others."""
        out: list[T] = []
        while len(out) < count and self._turns:
            share = max(1, (count - len(out)) // len(self._turns))  # one round: a turn for each partition
            for _ in range(len(self._turns)):
                if len(out) == count:
                    break
                partition = self._turns.popleft()
                queue = self._queues[partition]
                for _ in range(min(share, len(queue), count - len(out))):
                    out.append(queue.popleft())
                if queue:
                    self._turns.append(partition)
        self.size -= len(out)
        return out


def task_progress(positions: Mapping[int, int], max_event: Mapping[int, int],
                  until: Mapping[int, int] | None, idle: set[int]) -> int | None:
    """The event time this task has passed: the minimum over its source partitions of the largest event
    time read from each, since one partition may be read far ahead of another. A partition that reached
    its end (``until``) or is idle no longer holds it back; one that has yielded nothing yet (and is not
    idle) keeps it undefined. ``None`` also when every partition left is idle: the task is idle."""
    marks = []
    for p, pos in positions.items():
        if (until is not None and pos >= until.get(p, 0)) or p in idle:
            continue
        if p not in max_event:
            return None
        marks.append(max_event[p])
    if marks:
        return min(marks)
    if idle - ended_partitions(positions, until):  # every partition left is idle
        return None
    return max(max_event.values(), default=None)


def ended_partitions(positions: Mapping[int, int], until: Mapping[int, int] | None) -> set[int]:
    """The source partitions whose position reached their end (``until``; none without one)."""
    return set() if until is None else {p for p, pos in positions.items() if pos >= until.get(p, 0)}


def all_quiet(positions: Mapping[int, int], until: Mapping[int, int] | None, idle: set[int]) -> bool:
    """Every source partition of the task has ended or is idle."""
    return all(p in idle for p in set(positions) - ended_partitions(positions, until))
