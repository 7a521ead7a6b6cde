"""What a running consumer can say about its upstream, in one line a person reads. Pure: the caller gives
the clock.

:func:`upstream_progress` condenses an :class:`~controlmsg.core.bookkeeping.InputTracker` into an
:class:`UpstreamProgress`: the reconciled watermark, which upstream task holds it back (and on which
partition), how many upstream tasks have ended everywhere, and how many were never heard of.
:func:`progress_line` adds a record count and rate and the watermark's lag behind the wall clock::

    4,210 records (812/s), watermark 2026-01-01T00:14:00Z (lag 3.2 s), held back by ingest-r1-1 at
    2026-01-01T00:14:00Z on partition 2, 1 of 2 upstream tasks ended

A bounded replay of old events shows a large lag: it is the distance of event time to now, not a delay
of the pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from controlmsg.core.bookkeeping import InputTracker
from controlmsg.core.events import PartitionStatus
from controlmsg.core.messages import MAX_TIMESTAMP, MIN_TIMESTAMP
from controlmsg.core.naming import parse_task_name

__all__ = [
    "UpstreamProgress",
    "expected_task_names",
    "format_duration",
    "format_timestamp",
    "progress_line",
    "upstream_progress",
    "waiting_for",
]


@dataclass(frozen=True, slots=True)
class UpstreamProgress:
    """A tracker's state, summed up over the partitions it owns."""

    watermark: int | None
    """The last reconciled watermark emitted (``None``: none yet)."""
    holding_task: str | None
    """The upstream task whose watermark is the lowest that counts, on :attr:`holding_partition`
    (``None`` when no task holds it back: all ended, or none reported yet)."""
    holding_partition: int | None
    holding_watermark: int | None
    ended_tasks: int
    """Upstream tasks whose end of stream arrived on every owned partition."""
    task_count: int | None
    """Upstream tasks of the run (``None`` until a control message of the run arrived)."""
    unheard: int
    """Upstream tasks not heard of on some owned partition (what keeps the watermark undefined)."""
    unheard_partition: int | None
    """A partition where :attr:`unheard` tasks are missing (the first one), ``None`` when there is none."""
    ended: bool
    """End of stream on every owned partition."""


def upstream_progress(tracker: InputTracker) -> UpstreamProgress:
    """Sum up ``tracker``. The holding task is the one holding back the partition with the lowest
    partition watermark, as :attr:`PartitionStatus.holding_task` says for that partition."""
    statuses = tracker.statuses()
    holding: tuple[int, int, str] | None = None  # (watermark, partition, task)
    unheard, unheard_partition = 0, None
    for status in statuses:
        missing = status.unheard_tasks
        if missing and missing > unheard:
            unheard, unheard_partition = missing, status.partition
        held = status.holding_task
        if held is not None and not status.is_ended:
            task, ts = held
            if holding is None or (ts, status.partition) < holding[:2]:
                holding = (ts, status.partition, task)
    count = tracker.task_count
    if count is None or not statuses:
        ended_everywhere = 0
    else:
        ended_sets = [status.ended_tasks for status in statuses]
        ended_everywhere = len(frozenset.intersection(*ended_sets))
    return UpstreamProgress(
        watermark=tracker.emitted_watermark,
        holding_task=None if holding is None else holding[2],
        holding_partition=None if holding is None else holding[1],
        holding_watermark=None if holding is None else holding[0],
        ended_tasks=ended_everywhere,
        task_count=count,
        unheard=unheard,
        unheard_partition=unheard_partition,
        ended=tracker.is_ended,
    )


def format_timestamp(ts: int | None) -> str:
    """Epoch ms as ISO-8601 UTC to the second (``-`` for none, ``+inf``/``-inf`` for the bounds)."""
    if ts is None:
        return "-"
    if ts >= MAX_TIMESTAMP:
        return "+inf"
    if ts <= MIN_TIMESTAMP:
        return "-inf"
    try:
        return datetime.fromtimestamp(ts / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, OSError, ValueError):
        return f"{ts} ms"


def format_duration(seconds: float) -> str:
    """``0.4 s``, ``12 s``, ``3 min 20 s``, ``5 h 02 min``, ``12 d 4 h``: two units at most."""
    if seconds < 0:
        return "-" + format_duration(-seconds)
    if seconds < 10:
        return f"{seconds:.1f} s"
    whole = int(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    if whole < 86400:
        return f"{whole // 3600} h {whole % 3600 // 60:02d} min"
    return f"{whole // 86400} d {whole % 86400 // 3600} h"


def progress_line(progress: UpstreamProgress, *, now_ms: int, records: int, rate: float | None) -> str:
    """One line: ``records`` so far (and ``rate`` per second, when known), the watermark and its lag
    behind ``now_ms`` (the wall clock, given by the caller), what holds it back, and the upstream tasks
    ended. Names only what is known: before any control message it says the watermark is undefined."""
    parts = [f"{records:,} records" + (f" ({rate:,.0f}/s)" if rate is not None else "")]
    mark = progress.watermark
    if progress.ended:
        parts.append("end of stream from every upstream task")
        return ", ".join(parts)
    if mark is None or mark <= MIN_TIMESTAMP:
        parts.append("no watermark yet")
    else:
        parts.append(f"watermark {format_timestamp(mark)} (lag {format_duration((now_ms - mark) / 1000)})")
    if progress.unheard and progress.unheard_partition is not None:
        parts.append(f"waiting to hear from {progress.unheard} upstream task(s) on partition "
                     f"{progress.unheard_partition}")
    elif progress.holding_task is not None:
        parts.append(f"held back by {progress.holding_task} at {format_timestamp(progress.holding_watermark)} "
                     f"on partition {progress.holding_partition}")
    if progress.task_count is not None:
        parts.append(f"{progress.ended_tasks} of {progress.task_count} upstream tasks ended")
    return ", ".join(parts)


def expected_task_names(tracker: InputTracker) -> set[str] | None:
    """All task names of the run, when they follow :func:`~controlmsg.core.naming.task_name`'s pattern
    (one prefix, indexes below the task count); ``None`` when that cannot be told."""
    count = tracker.task_count
    if count is None:
        return None
    known: set[str] = set()
    for status in tracker.statuses():
        known |= status.reported_tasks
    prefixes = set()
    for name in known:
        parsed = parse_task_name(name)
        if parsed is None or parsed[1] >= count:
            return None
        prefixes.add(parsed[0])
    if len(prefixes) != 1:
        return None
    (prefix,) = prefixes
    return {f"{prefix}-p{i}" for i in range(count)}


def waiting_for(status: PartitionStatus, expected: set[str] | None = None) -> str:
    """What partition ``status`` still waits for, in words: the upstream tasks that reported but have not
    ended, and those not heard from (by name when ``expected`` holds every task name, see
    :func:`expected_task_names`). The one wording of a partition's wait: the CLI's ``consume`` and
    ``inspect`` and the data source's timeout all say it so."""
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
    parsed = parse_task_name(name)
    return parsed if parsed is not None else (name, -1)
