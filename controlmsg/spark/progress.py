"""Progress lines from inside Spark tasks (readers, writers), at a steady interval.

A task logs ``HH:MM:SS <who>: <what>`` to stderr at most every :data:`INTERVAL_S` seconds. In local mode
a worker's stderr is its job's, so the lines land in the job's log (and the pipeline echoes them); on a
cluster they are in the executor's stderr log.
"""

from __future__ import annotations

import sys
import time
from typing import Final

__all__ = ["INTERVAL_S", "Progress"]

INTERVAL_S: Final = 5.0


class Progress:
    """``if progress.due(): progress.log(...)``: cheap to ask on a hot path (one clock read)."""

    def __init__(self, who: str, interval: float = INTERVAL_S) -> None:
        self.who = who
        self.interval = interval
        self._next = time.monotonic() + interval

    def due(self) -> bool:
        return time.monotonic() >= self._next

    def log(self, what: str) -> None:
        self._next = time.monotonic() + self.interval
        print(f"{time.strftime('%H:%M:%S')} {self.who}: {what}", file=sys.stderr, flush=True)
