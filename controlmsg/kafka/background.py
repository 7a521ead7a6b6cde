"""Work a Spark task hands off so as not to wait for it: one daemon thread per process runs it in order.

A write task's last Kafka step that nothing depends on is the destruction of its producer
(:meth:`~controlmsg.kafka.writer.ControlWriter.destroy`): its transaction is committed, and librdkafka
takes tens of milliseconds (more on a loaded machine) to end the client's threads. Run here, it overlaps
the next task's work; confluent-kafka releases the GIL while it waits. Only what may be lost with the
process belongs here: a Python worker that exits (Spark ends idle workers with ``os._exit``) drops what
is still queued, and at a normal interpreter exit the queue is drained first (``atexit``), so that no
client is left to the interpreter's teardown.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
from collections.abc import Callable

__all__ = ["run_later"]

_LOG = logging.getLogger(__name__)
_QUEUE: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
_lock = threading.Lock()
_thread: threading.Thread | None = None
_pid: int | None = None
_MAX_PENDING = 8
"""Actions queued at most: beyond, the caller runs its action itself (each pending destruction holds a
client's threads and connections; tasks shorter than a destruction must not pile them up)."""


def _serve() -> None:
    while (action := _QUEUE.get()) is not None:
        try:
            action()
        except Exception:  # nothing waits for it: log, never lose the thread
            _LOG.exception("background action %r failed", action)


def _drain() -> None:
    """At interpreter exit: run what is queued, then end the thread."""
    thread = _thread
    if thread is not None and thread.is_alive() and _pid == os.getpid():
        _QUEUE.put(None)
        thread.join()


def run_later(action: Callable[[], None]) -> None:
    """Run ``action`` on this process's background thread (started on first use, again in a forked child),
    after the actions queued before it, and return at once; or, with :data:`_MAX_PENDING` actions waiting
    already, run it here and return when it is done. An exception it raises is logged, not raised."""
    global _thread, _pid
    with _lock:
        if _thread is None or _pid != os.getpid() or not _thread.is_alive():
            if _pid is None:
                atexit.register(_drain)
            _pid = os.getpid()
            _thread = threading.Thread(target=_serve, name="controlmsg-background", daemon=True)
            _thread.start()
        if _QUEUE.qsize() < _MAX_PENDING:
            _QUEUE.put(action)
            return
    try:
        action()
    except Exception:
        _LOG.exception("action %r failed", action)
