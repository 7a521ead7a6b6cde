"""Log lines from inside tasks at a steady interval: the progress a reader, a writer or a long-running task
reports, for both engines (the Spark data source and the streaming runtime) and the jobs.

A task (or a job's loop) logs ``HH:MM:SS <who>: <what>`` to stderr at most every :data:`INTERVAL_S`
seconds; a consumer of an intermediate topic says what its upstream did (:meth:`Progress.upstream`, in the
words of :func:`controlmsg.core.progress.progress_line`, which is pure: this module adds the clocks and the
writing). In local mode a worker's stderr is its job's, so the lines land in the job's log (and the
pipeline echoes them); on a cluster they are in the executor's stderr log.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from controlmsg.core.bookkeeping import InputTracker

__all__ = ["INTERVAL_S", "Progress"]

INTERVAL_S: Final = 5.0


class Progress:
    """``if progress.due(): progress.log(...)``: cheap to ask on a hot path (one clock read)."""

    def __init__(self, who: str, interval: float = INTERVAL_S) -> None:
        self.who = who
        self.interval = interval
        self._next = time.monotonic() + interval
        self._counted: tuple[float, int] | None = None

    def due(self) -> bool:
        return time.monotonic() >= self._next

    def rate(self, count: int) -> float | None:
        """Per second since the previous call, of a count that only grows (``None`` on the first call, or
        when no time passed). Call it once per line logged."""
        now = time.monotonic()
        previous, self._counted = self._counted, (now, count)
        if previous is None or now <= previous[0]:
            return None
        return (count - previous[1]) / (now - previous[0])

    def log(self, what: str) -> None:
        self._next = time.monotonic() + self.interval
        print(f"{time.strftime('%H:%M:%S')} {self.who}: {what}", file=sys.stderr, flush=True)

    def upstream(self, tracker: InputTracker, records: int, detail: str = "") -> None:
        """Log :func:`~controlmsg.core.progress.progress_line` for ``tracker`` and ``records`` read so far
        (with their rate since the previous line), then ``detail`` when given."""
        from controlmsg.core.progress import progress_line, upstream_progress

        line = progress_line(upstream_progress(tracker), now_ms=int(time.time() * 1000), records=records,
                             rate=self.rate(records))
        self.log(f"{line}, {detail}" if detail else line)
