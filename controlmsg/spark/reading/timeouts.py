"""What a reader of an intermediate topic raises when its end of stream does not come within ``timeout``:
:class:`EndOfStreamTimeout`, naming each partition still open and the upstream tasks it waits for."""

from __future__ import annotations

from collections.abc import Sequence

from controlmsg.core.bookkeeping import InputTracker
from controlmsg.core.events import PartitionStatus
from controlmsg.core.progress import expected_task_names, waiting_for
from controlmsg.errors import ControlMsgError
from controlmsg.spark.options import ReadOptions

__all__ = ["EndOfStreamTimeout", "timeout_error"]


class EndOfStreamTimeout(ControlMsgError):
    """A reader's partitions did not all reach end of stream in time. The message names each partition
    still open and the upstream tasks it waits for; ``statuses`` holds the details."""

    def __init__(self, message: str, statuses: Sequence[PartitionStatus]) -> None:
        super().__init__(message)
        self.statuses = list(statuses)


def timeout_error(opts: ReadOptions, tracker: InputTracker, partitions: list[int]) -> EndOfStreamTimeout:
    statuses = [s for s in tracker.statuses() if not s.is_ended]
    expected = expected_task_names(tracker)
    lines = [f"partition {s.partition}: {waiting_for(s, expected)}" for s in statuses]
    message = (
        f"topic {opts.topic!r} run {opts.run_id!r}: end of stream not reached within {opts.timeout:g} s on "
        f"partitions {[s.partition for s in statuses]} (this reader reads {partitions}); " + "; ".join(lines)
    )
    return EndOfStreamTimeout(message, statuses)
