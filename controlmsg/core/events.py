"""What the bookkeeping (:class:`~controlmsg.core.bookkeeping.InputTracker`) reports: the events it returns,
its counters of the control messages that changed nothing, and what one partition knows. Pure: values only;
the rules that decide them are :mod:`controlmsg.core.bookkeeping`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "Counters",
    "Event",
    "PartitionEnded",
    "PartitionStatus",
    "StreamEnded",
    "WatermarkAdvanced",
]


@dataclass(frozen=True, slots=True)
class WatermarkAdvanced:
    """The consumer's watermark strictly increased to ``timestamp`` (finite)."""

    timestamp: int


@dataclass(frozen=True, slots=True)
class PartitionEnded:
    """End of stream now holds for ``partition``: every upstream task has ended on it."""

    partition: int


@dataclass(frozen=True, slots=True)
class StreamEnded:
    """End of stream holds for every partition the consumer owns."""


Event = WatermarkAdvanced | PartitionEnded | StreamEnded


@dataclass(slots=True)
class Counters:
    """Control messages that were valid but changed nothing, by why."""

    stale_run: int = 0
    regressions: int = 0
    duplicate_eos: int = 0
    after_end: int = 0
    applied: int = 0
    stale_generation: int = 0


@dataclass(frozen=True, slots=True)
class PartitionStatus:
    """What one partition knows, for inspection and for timeout messages."""

    partition: int
    task_count: int | None
    watermarks: Mapping[str, int]
    ended_tasks: frozenset[str]
    watermark: int | None
    """``WM(p)``: ``None`` while undefined, :data:`~controlmsg.core.messages.MAX_TIMESTAMP` once every task
    ended."""
    idle_tasks: frozenset[str] = frozenset()
    """Open tasks whose latest watermark here says idle."""
    generation: int = 0
    """The generation of upstream tasks this partition follows; ``task_count`` is that generation's."""

    @property
    def is_ended(self) -> bool:
        return self.task_count is not None and len(self.ended_tasks) >= self.task_count

    @property
    def reported_tasks(self) -> frozenset[str]:
        return frozenset(self.watermarks) | self.ended_tasks

    @property
    def open_tasks(self) -> list[str]:
        """Tasks that reported here but still owe an end of stream, sorted."""
        return sorted(set(self.watermarks) - self.ended_tasks)

    @property
    def unheard_tasks(self) -> int | None:
        """How many tasks have not reported at all here (``None``: task count not known yet)."""
        if self.task_count is None:
            return None
        return self.task_count - len(self.reported_tasks)

    @property
    def holding_task(self) -> tuple[str, int] | None:
        """The task that holds ``WM(p)`` back, with its watermark: the open task with the lowest watermark,
        among the tasks that are not idle when there are any."""
        open_marks = [(ts, t) for t, ts in self.watermarks.items() if t not in self.ended_tasks]
        active = [(ts, t) for ts, t in open_marks if t not in self.idle_tasks]
        if not open_marks:
            return None
        ts, task = min(active or open_marks)
        return task, ts

