"""Per-partition bookkeeping of upstream tasks and its reconciliation. Pure: no I/O, no clock.

Everything that decides what a downstream consumer knows about its upstream lives here. The rules, for
one consumer that owns a set of partitions of one intermediate topic and follows one run:

* **Run.** Control messages of other runs are ignored and counted (``stale_run``). With no run given,
  the tracker follows the run of the first control message it sees.
* **Task count.** The first control message of a generation (below) fixes its ``taskCount``; a message
  of that generation that disagrees is a :class:`~controlmsg.errors.ProtocolViolation`. So is a
  partition hearing from more distinct tasks of its generation than ``taskCount``.
* **Generations** (rescaling; docs/PROTOCOL.md, "Generations"). Every control message belongs to a
  generation of the run's upstream tasks (0 if it says none). Each partition follows one generation: the
  first message of a higher one replaces the partition's tasks (their watermarks, ends and idleness) by
  that generation's, which have not reported yet, so ``WM(p)`` is undefined again until they all have;
  messages of a lower generation are ignored and counted (``stale_generation``). A partition that has
  ended stays ended (a later generation's messages count as ``after_end``).
* **End of stream of a partition**, ``EOS(p)``: the distinct tasks that sent END_OF_STREAM on ``p``
  number ``taskCount``. Duplicates count once.
* **Watermark of a partition**, ``WM(p)``: undefined until every task has reported on ``p`` (a watermark
  or its end of stream); then the minimum over tasks of each task's latest watermark, an ended task
  counting as :data:`~controlmsg.core.messages.MAX_TIMESTAMP` (+infinity). A task's watermark never goes
  back: a lower one is ignored and counted (``regressions``); one after the task's own end of stream is
  ignored and counted (``after_end``).
* **Idle tasks.** A task whose latest watermark on ``p`` says ``idle`` is left out of that minimum
  while some task is neither idle nor ended (it has no input, so it must not hold the others back);
  when every open task is idle, ``WM(p)`` is the minimum over them, as without idleness. An equal
  watermark that changes the idle flag is applied; a lower one is ignored whatever its flag. So
  ``WM(p)`` can go down when an idle task comes back; the consumer watermark below never does.
* **Consumer watermark**: the minimum of ``WM(p)`` over owned partitions, undefined while any is
  undefined. :class:`WatermarkAdvanced` is emitted only when it rises above the last one emitted, to a
  finite value.
* **Consumer end of stream**: :class:`PartitionEnded` once per partition, when ``EOS(p)`` first holds;
  :class:`StreamEnded` once, when it holds for every owned partition.

A message is checked completely before anything is changed, so a message that raises leaves the tracker
as it was (the caller may dead-letter it and go on). :meth:`InputTracker.snapshot` and
:meth:`InputTracker.restore` carry all of this across restarts, so a restored tracker never emits an
event the original had already emitted.

The events, counters and statuses it hands out are the values of :mod:`controlmsg.core.events`.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from controlmsg.core.events import Counters, Event, PartitionEnded, PartitionStatus, StreamEnded, WatermarkAdvanced
from controlmsg.core.messages import MAX_TIMESTAMP, ControlMessage, EndOfStreamMessage
from controlmsg.errors import CheckpointError, Location, ProtocolViolation

__all__ = [
    "InputTracker",
]

SNAPSHOT_FORMAT: Final = 1
"""What :meth:`InputTracker.snapshot` writes while every generation is 0 (what it always wrote)."""
SNAPSHOT_FORMAT_GENERATIONS: Final = 2
"""What it writes once a generation above 0 was heard of: an older reader refuses it instead of missing
the generations."""


@dataclass(slots=True)
class _Partition:
    """One partition's tasks, with what ``WM(p)`` needs kept up to date per message in O(log n) for n
    tasks (amortized), not recomputed over every task: a control message then costs the same for 10 and
    for 10,000 upstream tasks (``benchmarks/bench_bookkeeping.py``).

    ``reported`` counts the distinct tasks with a watermark or an end; ``open_count`` and
    ``active_count`` the tasks with a watermark and no end, and those of them not idle. The two heaps
    hold ``(watermark, task)`` of open tasks (all, and those not idle) and are lazy: an entry whose task
    has since moved, ended or changed idleness is dropped when it reaches the top. Change the task
    fields only through :meth:`mark`, :meth:`end`, :meth:`reset` and :meth:`rebuild`.
    """

    watermarks: dict[str, int] = field(default_factory=dict)
    ended: set[str] = field(default_factory=set)
    idle: set[str] = field(default_factory=set)  # tasks whose latest watermark says idle
    wm: int | None = None  # cached WM(p)
    generation: int = 0  # the generation whose tasks the fields above are about
    reported: int = 0
    open_count: int = 0
    active_count: int = 0
    open_heap: list[tuple[int, str]] = field(default_factory=list)
    active_heap: list[tuple[int, str]] = field(default_factory=list)

    def reset(self, generation: int) -> None:
        """Forget every task: a new generation's tasks take over the partition."""
        self.generation = generation
        self.watermarks.clear()
        self.ended.clear()
        self.idle.clear()
        self.wm = None
        self.rebuild()

    def mark(self, task: str, timestamp: int, idle: bool) -> None:
        """Task ``task`` (not ended) now has watermark ``timestamp`` and idleness ``idle``."""
        previous = self.watermarks.get(task)
        if previous is None:
            self.reported += 1
            self.open_count += 1
            self.active_count += not idle
        elif (task in self.idle) != idle:
            self.active_count += -1 if idle else 1
        self.watermarks[task] = timestamp
        if idle:
            self.idle.add(task)
        else:
            self.idle.discard(task)
            heapq.heappush(self.active_heap, (timestamp, task))
        heapq.heappush(self.open_heap, (timestamp, task))
        if len(self.open_heap) > 4 * self.open_count + 64:  # mostly stale entries: start afresh
            self._heapify()

    def end(self, task: str) -> None:
        """Task ``task`` (not ended) has ended."""
        if task in self.watermarks:
            self.open_count -= 1
            self.active_count -= task not in self.idle
        else:
            self.reported += 1
        self.ended.add(task)

    def rebuild(self) -> None:
        """Recount and rebuild the heaps from ``watermarks``, ``ended`` and ``idle`` (after a restore)."""
        self.reported = len(self.watermarks.keys() | self.ended)
        open_tasks = [t for t in self.watermarks if t not in self.ended]
        self.open_count = len(open_tasks)
        self.active_count = sum(t not in self.idle for t in open_tasks)
        self._heapify()

    def _heapify(self) -> None:
        self.open_heap = [(ts, t) for t, ts in self.watermarks.items() if t not in self.ended]
        self.active_heap = [(ts, t) for ts, t in self.open_heap if t not in self.idle]
        heapq.heapify(self.open_heap)
        heapq.heapify(self.active_heap)

    def watermark(self, task_count: int) -> int | None:
        """``WM(p)``: undefined until all ``task_count`` tasks reported; then the minimum over the open
        tasks that are not idle, or over all open tasks when every one is idle; an ended task counts as
        +infinity (+infinity too when every task has ended)."""
        if self.reported < task_count:
            return None
        if self.active_count:
            return self._top(self.active_heap, active=True)
        if self.open_count:
            return self._top(self.open_heap, active=False)
        return MAX_TIMESTAMP

    def _top(self, heap: list[tuple[int, str]], active: bool) -> int:
        marks, ended, idle = self.watermarks, self.ended, self.idle
        while True:
            ts, task = heap[0]  # not empty: every open (active) task has its current entry in it
            if marks.get(task) == ts and task not in ended and not (active and task in idle):
                return ts
            heapq.heappop(heap)


def _expect_int(snapshot: Mapping[str, Any], key: str, minimum: int | None = None) -> int | None:
    """``snapshot[key]``, which must be ``None`` or an int (not a bool) ``>= minimum``."""
    value: Any = snapshot[key]
    if value is not None and (type(value) is not int or (minimum is not None and value < minimum)):
        raise CheckpointError(f"bookkeeping snapshot: {key} has an invalid value {value!r}")
    return value


class InputTracker:
    """Bookkeeping for one consumer of one intermediate topic.

    ``partitions`` are the partitions this consumer owns. ``run_id``: the run to follow, or ``None`` to
    follow the run of the first control message seen. ``topic`` only names the topic in errors.

    Not thread-safe; one tracker per consumer loop.
    """

    def __init__(self, partitions: Iterable[int], run_id: str | None = None, topic: str | None = None) -> None:
        parts = sorted(set(partitions))
        if not parts:
            raise ValueError("a tracker needs at least one partition")
        self.topic = topic
        self._run_id = run_id
        self._task_counts: dict[int, int] = {}  # generation -> its taskCount, fixed by its first message
        self._parts: dict[int, _Partition] = {p: _Partition() for p in parts}
        self._ended: set[int] = set()
        self._emitted: int | None = None
        self._stream_ended = False
        self.counters = Counters()

    # ---------------------------------------------------------------- queries

    @property
    def partitions(self) -> list[int]:
        return list(self._parts)

    @property
    def run_id(self) -> str | None:
        """The run followed: given, or adopted from the first control message (``None`` until then)."""
        return self._run_id

    @property
    def task_count(self) -> int | None:
        """The ``taskCount`` of the newest generation heard of (``None``: no control message yet)."""
        return self._task_counts[max(self._task_counts)] if self._task_counts else None

    @property
    def generation(self) -> int | None:
        """The newest generation heard of on any owned partition (``None``: no control message yet)."""
        return max(self._task_counts) if self._task_counts else None

    @property
    def watermark(self) -> int | None:
        """The consumer watermark now: ``None`` while undefined, ``MAX_TIMESTAMP`` when all ended."""
        marks = [part.wm for part in self._parts.values()]
        if any(m is None for m in marks):
            return None
        return min(m for m in marks if m is not None)

    @property
    def emitted_watermark(self) -> int | None:
        """The last watermark reported with :class:`WatermarkAdvanced` (``None``: none yet)."""
        return self._emitted

    @property
    def ended_partitions(self) -> frozenset[int]:
        return frozenset(self._ended)

    @property
    def is_ended(self) -> bool:
        """True once :class:`StreamEnded` has been emitted: every owned partition has ended."""
        return self._stream_ended

    def status(self, partition: int) -> PartitionStatus:
        part = self._parts[partition]
        return PartitionStatus(
            partition=partition,
            task_count=self._task_counts.get(part.generation),
            watermarks=dict(part.watermarks),
            ended_tasks=frozenset(part.ended),
            watermark=part.wm,
            idle_tasks=frozenset(part.idle - part.ended),
            generation=part.generation,
        )

    def statuses(self) -> list[PartitionStatus]:
        return [self.status(p) for p in self._parts]

    # ---------------------------------------------------------------- transitions

    def on_control(self, partition: int, message: ControlMessage, offset: int | None = None) -> list[Event]:
        """Apply one control message read at ``partition`` (and ``offset``, for errors only).

        Returns the events it causes, in order: at most one :class:`WatermarkAdvanced`, then
        :class:`PartitionEnded`, then :class:`StreamEnded`. Raises :class:`ProtocolViolation` (and changes
        nothing) when the message contradicts the run; ``KeyError`` for a partition not owned.
        """
        part = self._parts[partition]
        if self._run_id is not None and message.run_id != self._run_id:
            self.counters.stale_run += 1
            return []
        generation = message.generation
        if generation < part.generation:
            self.counters.stale_generation += 1
            return []
        newer = generation > part.generation
        task = message.task_name
        count = self._task_counts.get(generation)
        if count is not None and message.task_count != count:
            of = f"generation {generation} of run" if generation else "run"
            raise ProtocolViolation(
                f"task {task!r} says taskCount {message.task_count}, but {of} {message.run_id!r} "
                f"has taskCount {count}",
                Location(self.topic, partition, offset),
            )
        reported = 0 if newer else part.reported
        known = not newer and (task in part.watermarks or task in part.ended)
        if not known and reported >= message.task_count:
            raise ProtocolViolation(
                f"task {task!r} would be task number {reported + 1} on this "
                f"partition, but taskCount is {message.task_count}",
                Location(self.topic, partition, offset),
            )
        # Validated: from here on the message is applied.
        if self._run_id is None:
            self._run_id = message.run_id
        if partition in self._ended:  # nothing after the end, not even a new generation
            if isinstance(message, EndOfStreamMessage) and task in part.ended and not newer:
                self.counters.duplicate_eos += 1
            else:
                self.counters.after_end += 1
            return []
        if count is None:
            self._task_counts[generation] = message.task_count
        if newer:  # the generation's tasks replace the partition's: none has reported here yet
            part.reset(generation)
        if task in part.ended:
            if isinstance(message, EndOfStreamMessage):
                self.counters.duplicate_eos += 1
            else:
                self.counters.after_end += 1
            return []
        if isinstance(message, EndOfStreamMessage):
            part.end(task)
        else:
            previous = part.watermarks.get(task)
            if previous is not None and message.timestamp <= previous:
                if message.timestamp < previous:
                    self.counters.regressions += 1
                    return []
                if message.idle == (task in part.idle):
                    return []  # a repeat
            part.mark(task, message.timestamp, message.idle)
        self.counters.applied += 1
        return self._reconcile(partition, part)

    def _reconcile(self, partition: int, part: _Partition) -> list[Event]:
        count = self._task_counts[part.generation]
        part.wm = part.watermark(count)
        if part.wm is None:
            return []
        events: list[Event] = []
        wm = self.watermark
        # wm can be lower than the last emitted one after an idle task came back: then nothing is emitted.
        if wm is not None and wm < MAX_TIMESTAMP and (self._emitted is None or wm > self._emitted):
            self._emitted = wm
            events.append(WatermarkAdvanced(wm))
        if len(part.ended) >= count and partition not in self._ended:
            self._ended.add(partition)
            events.append(PartitionEnded(partition))
            if len(self._ended) == len(self._parts) and not self._stream_ended:
                self._stream_ended = True
                events.append(StreamEnded())
        return events

    # ---------------------------------------------------------------- checkpoints

    def snapshot(self) -> dict[str, Any]:
        """All bookkeeping as a JSON-compatible dict (keys are strings), for a checkpoint."""
        rescaled = any(self._task_counts.keys() - {0})
        partitions: dict[str, dict[str, Any]] = {}
        for p, part in self._parts.items():
            saved: dict[str, Any] = {"watermarks": dict(part.watermarks), "ended": sorted(part.ended),
                                     "idle": sorted(part.idle)}
            if rescaled:
                saved["generation"] = part.generation
            partitions[str(p)] = saved
        out: dict[str, Any] = {
            "format": SNAPSHOT_FORMAT_GENERATIONS if rescaled else SNAPSHOT_FORMAT,
            "topic": self.topic,
            "runId": self._run_id,
            "taskCount": self.task_count,
            "emittedWatermark": self._emitted,
            "streamEnded": self._stream_ended,
            "partitions": partitions,
            "counters": {
                "staleRun": self.counters.stale_run,
                "regressions": self.counters.regressions,
                "duplicateEos": self.counters.duplicate_eos,
                "afterEnd": self.counters.after_end,
                "applied": self.counters.applied,
                "staleGeneration": self.counters.stale_generation,
            },
        }
        if rescaled:
            out["taskCounts"] = {str(g): n for g, n in sorted(self._task_counts.items())}
        return out

    @classmethod
    def restore(cls, snapshot: Mapping[str, Any], run_id: str | None = None) -> InputTracker:
        """Rebuild a tracker from :meth:`snapshot`'s output.

        ``run_id``, if given, must agree with the snapshot's followed run. Raises :class:`CheckpointError`
        when the snapshot is malformed or of another format or run.
        """
        try:
            if snapshot["format"] not in (SNAPSHOT_FORMAT, SNAPSHOT_FORMAT_GENERATIONS):
                raise CheckpointError(f"bookkeeping snapshot format {snapshot['format']!r} is not supported")
            saved_run = snapshot["runId"]
            if run_id is not None and saved_run is not None and saved_run != run_id:
                raise CheckpointError(
                    f"checkpoint follows run {saved_run!r}, but run {run_id!r} was asked for"
                )
            parts = snapshot["partitions"]
            tracker = cls((int(p) for p in parts), run_id if run_id is not None else saved_run,
                          snapshot.get("topic"))
            count = _expect_int(snapshot, "taskCount", 1)
            if "taskCounts" in snapshot:
                tracker._task_counts = {int(g): int(n) for g, n in snapshot["taskCounts"].items()}
                if any(g < 0 or n < 1 for g, n in tracker._task_counts.items()):
                    raise CheckpointError(f"bookkeeping snapshot: invalid taskCounts {snapshot['taskCounts']!r}")
            elif count is not None:
                tracker._task_counts = {0: count}
            tracker._emitted = _expect_int(snapshot, "emittedWatermark")
            ended = snapshot["streamEnded"]
            if type(ended) is not bool:
                raise CheckpointError(f"bookkeeping snapshot: streamEnded must be true or false, got {ended!r}")
            tracker._stream_ended = ended
            if saved_run is not None and not isinstance(saved_run, str):
                raise CheckpointError(f"bookkeeping snapshot: runId must be a string, got {saved_run!r}")
            for p, saved in parts.items():
                part = tracker._parts[int(p)]
                part.watermarks = {str(t): int(ts) for t, ts in saved["watermarks"].items()}
                part.ended = {str(t) for t in saved["ended"]}
                part.idle = {str(t) for t in saved.get("idle", ())}  # absent in snapshots from before idleness
                part.generation = int(saved.get("generation", 0))
                part.rebuild()
                part_count = tracker._task_counts.get(part.generation)
                if part_count is not None:
                    part.wm = part.watermark(part_count)
                    if len(part.ended) >= part_count:
                        tracker._ended.add(int(p))
                elif part.watermarks or part.ended:
                    raise CheckpointError(f"bookkeeping snapshot: partition {p} follows generation "
                                          f"{part.generation}, whose taskCount is not saved")
            counters = snapshot.get("counters", {})
            tracker.counters = Counters(
                stale_run=int(counters.get("staleRun", 0)),
                regressions=int(counters.get("regressions", 0)),
                duplicate_eos=int(counters.get("duplicateEos", 0)),
                after_end=int(counters.get("afterEnd", 0)),
                applied=int(counters.get("applied", 0)),
                stale_generation=int(counters.get("staleGeneration", 0)),
            )
        except CheckpointError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CheckpointError(f"bookkeeping snapshot is malformed: {exc!r}") from exc
        return tracker
