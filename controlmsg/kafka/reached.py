"""Which clusters the Spark application this process serves has reached: memory shared by its Python workers.

:mod:`controlmsg.kafka.refusals` lets a refused connection or an unknown host fail a process's first contact
with a cluster after a short grace, but leaves them to the retries once the process has reached that
cluster (a broker that restarts refuses connections too). A Spark application runs the data source in
Python workers that the JVM starts as it needs them: planning a read, planning a write and running the
tasks happen in three kinds of worker (``pyspark.sql.worker.plan_data_source_read``,
``write_into_data_source``, ``pyspark.worker``), each a process of its own. So the first read of an
application that has written to a cluster for minutes plans in a process that has never reached it, and
a broker restart at that moment (a ``kill -9`` recovers its log for longer than the grace) failed the read
with "connection refused" (seen in CI, 2026-11-29: a backfill's window job planned while its only broker
restarted).

Here the workers of one Spark JVM share what they reached: a process whose parents up to the nearest
``java`` are Python (a PySpark worker and its daemon) belongs to that JVM's application, named by the
JVM's pid and start time (so a recycled pid is another application). :func:`remember` leaves an empty file
per ``bootstrap.servers`` in a directory of that application under the system's temporary directory, and
:func:`remembered` looks for it. Any other process (the CLI, a job's driver, a test) has no application,
remembers nothing across processes, and keeps the first-contact grace. The directories of applications
whose JVM has ended are removed when the next application makes its own. Linux only (``/proc``); elsewhere
no process has an application, which is the first-contact behaviour, not a silent loss.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Final

__all__ = ["application", "remember", "remembered"]

_log = logging.getLogger(__name__)

PROC = Path("/proc")
"""Where the processes' ``stat`` files are read (a test points it at a tree of its own)."""
_MAX_DEPTH: Final = 6
"""Parents looked through for the JVM: a worker, its daemon, the JVM (a few more for wrappers)."""


def _stat(proc: Path, pid: int) -> tuple[str, int, str] | None:
    """(command name, parent pid, start time in clock ticks) of ``pid`` from ``proc/<pid>/stat``, or
    ``None`` when it cannot be read (ended, or no ``/proc``)."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    name = text[text.index("(") + 1:text.rindex(")")]
    fields = text[text.rindex(")") + 2:].split()  # fields 3.. of proc(5): state, ppid, ..., starttime (22)
    return name, int(fields[1]), fields[19]


def application(pid: int | None = None) -> str | None:
    """``"<jvm pid>-<jvm start time>"`` of the Spark JVM whose Python worker process ``pid`` (default:
    this one) is, or ``None``: ``pid`` is no Python process started by a ``java`` through Python processes
    only. Read from :data:`PROC`."""
    return _application(PROC, os.getpid() if pid is None else pid)


@functools.cache
def _application(proc: Path, pid: int) -> str | None:
    current = _stat(proc, pid)
    if current is None or not current[0].startswith("python"):
        return None
    for _ in range(_MAX_DEPTH):
        parent = current[1]
        stat = _stat(proc, parent)
        if stat is None:
            return None
        if stat[0] == "java":
            return f"{parent}-{stat[2]}"
        if not stat[0].startswith("python"):
            return None
        current = stat
    return None


def _root() -> Path:
    return Path(tempfile.gettempdir()) / f"controlmsg-reached-{os.getuid()}"


def _marker(app: str, servers: str) -> Path:
    return _root() / app / hashlib.sha256(servers.encode()).hexdigest()[:24]


def remember(servers: str) -> None:
    """Note, for every worker of this process's Spark application, that ``servers`` answered. Nothing for
    a process of no application. A file that cannot be written is logged and costs only the grace."""
    app = application()
    if app is None:
        return
    marker = _marker(app, servers)
    try:
        if not marker.parent.is_dir():
            _prune()
            marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    except OSError as exc:
        _log.warning("cannot note in %s that %s answered (%s): another worker of this application that meets a "
                     "refused connection first will raise it after the grace", marker.parent, servers, exc)


def remembered(servers: str) -> bool:
    """Whether a worker of this process's Spark application noted that ``servers`` answered."""
    app = application()
    return app is not None and _marker(app, servers).exists()


def _prune() -> None:
    """Remove the directories of applications whose JVM has ended (its pid gone, or started at another
    time)."""
    root = _root()
    if not root.is_dir():
        return
    for entry in root.iterdir():
        pid, _, started = entry.name.partition("-")
        stat = _stat(PROC, int(pid)) if pid.isdigit() else None
        if stat is None or stat[0] != "java" or stat[2] != started:
            shutil.rmtree(entry, ignore_errors=True)
