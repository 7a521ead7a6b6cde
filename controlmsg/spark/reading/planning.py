"""Planning a read: which Spark task reads which partitions (and, in a stream or a plain topic, which
offsets). The drivers of :mod:`~controlmsg.spark.reading.batch_reader`,
:mod:`~controlmsg.spark.reading.stream_reader` and :mod:`~controlmsg.spark.reading.plain_readers` call it;
the input partitions it defines are what Spark sends to each task. No I/O.

Every reading task holds a core while it waits and costs a few tenths of a second of a core however
little it reads (a Python task, a consumer), so by default the partitions are grouped by the offsets they
hold at planning: one task per 200,000, at least 8 (or one per partition when there are fewer);
``partitionsPerTask`` and ``maxTasks`` group them as the user says (the jobs of ``spark_jobs`` set
``maxTasks`` to Spark's default parallelism, so that every task can run at once).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from typing import Any, Final, TypeVar

from confluent_kafka import OFFSET_BEGINNING
from pyspark.sql.datasource import InputPartition

from controlmsg.spark.options import ReadOptions
from controlmsg.spark.positions import PartitionRef

__all__ = [
    "MIN_TASKS",
    "RECORDS_PER_TASK",
    "PlainRanges",
    "StreamRange",
    "TopicPartitions",
    "plain_groups",
    "stream_groups",
    "task_groups",
]

RECORDS_PER_TASK: Final = 200_000
"""Offsets a reading task takes by default (about half a second of reading here, against a fixed cost per
task of 0.2-0.4 s)."""
MIN_TASKS: Final = 8
"""Reading tasks by default at least (or one per partition), whatever the size: a batch read planned
before its upstream wrote sees empty partitions, and its tasks should still share the work when it comes."""


class TopicPartitions(InputPartition):
    """One batch task's share of the topic: the partitions it reads to end of stream."""

    def __init__(self, partitions: Sequence[int]) -> None:
        super().__init__(tuple(partitions))
        self.partitions = tuple(partitions)


class StreamRange(InputPartition):
    """One micro-batch task's share: partitions with their ``[start, end)`` offsets, the bookkeeping at
    the micro-batch's start and the watermark at its end (``None``: undefined); ``tick``, when not
    ``None``, is the ``_watermark`` of the one watermark row this task adds after its records."""

    def __init__(self, ranges: Sequence[tuple[int, int, int]], bookkeeping: dict[str, Any],
                 end_watermark: int | None, tick: int | None = None) -> None:
        super().__init__(tuple(ranges))
        self.ranges = tuple(ranges)
        self.bookkeeping = bookkeeping
        self.end_watermark = end_watermark
        self.tick = tick


class PlainRanges(InputPartition):
    """One plain-topic task's share (:mod:`controlmsg.spark.reading.plain_readers`): partitions of one ``topic`` with
    their ``[start, end)`` offsets. A stream that makes a watermark (:mod:`controlmsg.spark.reading.plain_watermark`)
    sets ``watermark``, every row's ``_watermark`` (epoch ms; ``None``: undefined), and on one task ``tick``,
    the ``_watermark`` of the watermark row it adds after its records."""

    def __init__(self, topic: str, ranges: Sequence[tuple[int, int, int]], watermark: int | None = None,
                 tick: int | None = None) -> None:
        super().__init__((topic, tuple(ranges)))
        self.topic = topic
        self.ranges = tuple(ranges)
        self.watermark = watermark
        self.tick = tick


_Key = TypeVar("_Key", int, PartitionRef)


def task_groups(partitions: Sequence[_Key], opts: ReadOptions,
                sizes: Mapping[_Key, int] | None = None) -> list[list[_Key]]:
    """The reading tasks' shares of ``partitions``. With ``partitionsPerTask`` or ``maxTasks`` given: runs of
    ``partitionsPerTask`` (default 1) partitions, more per task when there would be more tasks than
    ``maxTasks``. With neither, and the ``sizes`` (offsets per partition) known: one task per
    :data:`RECORDS_PER_TASK` offsets, at least :data:`MIN_TASKS` (or one per partition when there are
    fewer), the partitions spread so that each task has about as many offsets, largest first. So a read's
    task count, and its fixed cost per task (a Python task, a consumer, a metadata request: about 0.2-0.4 s
    of a core here), follows the data rather than the partition count."""
    parts = list(partitions)
    if opts.partitions_per_task is None and opts.max_tasks is None and sizes is not None and parts:
        total = sum(sizes.get(p, 0) for p in parts)
        n = min(len(parts), max(MIN_TASKS, -(-total // RECORDS_PER_TASK)))
        tasks: list[tuple[int, int, int]] = [(0, 0, i) for i in range(n)]  # (offsets, partitions, index)
        shares: list[list[_Key]] = [[] for _ in range(n)]
        for p in sorted(parts, key=lambda q: -sizes.get(q, 0)):
            offsets, count, i = heapq.heappop(tasks)
            shares[i].append(p)
            heapq.heappush(tasks, (offsets + sizes.get(p, 0), count + 1, i))
        return sorted(sorted(share) for share in shares)
    step = opts.partitions_per_task or 1
    if opts.max_tasks is not None:
        step = max(step, -(-len(parts) // opts.max_tasks))
    return [parts[i:i + step] for i in range(0, len(parts), step)]


def stream_groups(begin: Mapping[int, int], stop: Mapping[int, int], opts: ReadOptions) -> list[list[int]]:
    """The reading tasks of a micro-batch from ``begin`` to ``stop``: the partitions that moved, grouped."""
    moved = [p for p in sorted(stop) if stop[p] != begin.get(p, OFFSET_BEGINNING)]
    return task_groups(moved, opts, {p: max(stop[p] - max(begin.get(p, 0), 0), 0) for p in moved})


def plain_groups(begin: Mapping[PartitionRef, int], stop: Mapping[PartitionRef, int],
                 opts: ReadOptions) -> list[tuple[str, list[int]]]:
    """The reading tasks of a plain read (:mod:`controlmsg.spark.reading.plain_readers`) from ``begin`` to ``stop``, per
    topic and partition: the partitions that have offsets to read, grouped as :func:`task_groups` groups
    them over every topic, each group then split by topic (a task reads one topic: at most one more task
    per topic, never more tasks than partitions)."""
    moved = [tp for tp in sorted(stop) if stop[tp] > begin.get(tp, 0)]
    out: list[tuple[str, list[int]]] = []
    for group in task_groups(moved, opts, {tp: stop[tp] - begin.get(tp, 0) for tp in moved}):
        for topic in sorted({t for t, _ in group}):
            out.append((topic, [p for t, p in group if t == topic]))
    return out

