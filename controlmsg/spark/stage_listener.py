"""Every ``stageProgress driver`` stage of a classic session followed without a call: :func:`follow_stages`.

A ``writeStream.format("controlmsg")`` query with ``stageProgress driver`` needs its driver program to write
the stage's watermark and end of stream from the query's progress (:mod:`controlmsg.spark.stage`).
:func:`~controlmsg.spark.stage.await_stage` does that for a driver that calls it; a driver that waits the
way Spark programs do (``awaitTermination()``, ``spark.streams.awaitAnyTermination()``, a notebook cell
that returns) needs something that follows the query by itself. That is :class:`StageListener`, a
``StreamingQueryListener`` that :func:`follow_stages` adds to a classic session once;
:func:`~controlmsg.spark.session.register` (so :func:`~controlmsg.spark.spark_session`) and
:func:`~controlmsg.spark.with_watermark` call it. For each query that starts, it reads the sink and its
options from the query's plan in the driver's JVM; for a controlmsg sink with ``stageProgress driver`` it
claims the query's run (:func:`~controlmsg.spark.stage.claim_stage`), then writes the stage round of each
progress Spark reports (:func:`~controlmsg.spark.stage.write_stage_round`, written once whoever writes it,
so ``await_stage`` beside it changes nothing).

Spark delivers listener events after the fact, on its own thread: ``awaitTermination()`` returns before the
progress of the last micro-batch reaches the listener. So the rounds are written on a thread of their own,
in order, and a driver program that ends right after ``awaitTermination()`` waits at exit (``atexit``) until
every query it followed has had its last round written, up to :data:`EXIT_WAIT_S`, and then takes the listener
off the session (the JVM would otherwise call the gone Python with the last progress events). A round that fails (Kafka
unreachable) is said on stderr in one line, and the next progress writes a round that says all there is.

A driver started again after the query's last micro-batch (killed before that micro-batch's round was
written) runs nothing. Spark reports that trigger under the id of the micro-batch it would have run; the
round written from it is that of the last committed micro-batch (:func:`~controlmsg.spark.stage.round_batch`),
the end of stream when its input had ended. A query that ends with no progress at all gets the round of the
last micro-batch its checkpoint holds as committed (:func:`~controlmsg.spark.stage.checkpoint_progress`).
Such a query ends at once, so the listener takes hold of it in ``onQueryStarted``, which Spark calls on the
query's own thread before it runs anything.

Spark Connect: the client has no JVM to read a query's sink options from, so nothing is followed there; the
sink's first commit then fails the query in one line that names ``await_stage`` (never a silent stage).
"""

from __future__ import annotations

import atexit
import contextlib
import queue
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Final

import orjson
from pyspark.sql.streaming.listener import StreamingQueryListener

from controlmsg.spark.options import STAGE_PROGRESS_DRIVER

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["EXIT_WAIT_S", "StageListener", "follow_stages", "stop_following"]

EXIT_WAIT_S: Final = 60.0
"""How long a driver program that ends waits, at most, for the last rounds of the queries it followed."""
_SINK: Final = "controlmsg"
_PYTHON_TABLE: Final = ".PythonTable"  # the JVM's table of a Python data source, the sink of its streaming writes
_ATTR: Final = "_controlmsg_stage_listener"
_PLAN_TRIES: Final = 50
_PLAN_WAIT_S: Final = 0.1


def follow_stages(spark: SparkSession) -> StageListener | None:
    """Add a :class:`StageListener` to ``spark`` unless it has one (idempotent); returns it, or ``None`` on a
    Spark Connect session (see the module docstring)."""
    if getattr(spark, "_jvm", None) is None:
        return None
    found: StageListener | None = getattr(spark, _ATTR, None)
    if found is None:
        found = StageListener(spark)
        spark.streams.addListener(found)
        setattr(spark, _ATTR, found)
    return found


def stop_following(spark: SparkSession) -> None:
    """Remove ``spark``'s :class:`StageListener`, if any: its queries then need ``await_stage`` (or a
    ``StageFollower``), or their sink's first commit fails them."""
    found: StageListener | None = getattr(spark, _ATTR, None)
    if found is not None:
        spark.streams.removeListener(found)
        delattr(spark, _ATTR)
        found.close()


class StageListener(StreamingQueryListener):
    """Follows the ``stageProgress driver`` queries of one classic session (see the module docstring). Its
    callbacks only queue the event; one daemon thread writes the claims and rounds, in order."""

    def __init__(self, spark: SparkSession) -> None:
        self._spark = spark
        self._events: queue.Queue[tuple[str, str, Any]] = queue.Queue()
        self._followed: dict[str, dict[str, str]] = {}  # query id -> the sink's options
        self._written: dict[str, int] = {}  # query id -> the last micro-batch whose round is in
        self._open: set[str] = set()  # queries seen starting whose start or termination is not handled yet
        self._seen: set[str] = set()  # queries whose sink was looked at
        self._executions: dict[str, Any] = {}  # query id -> its StreamExecution in the JVM, taken at its start
        self._roots: dict[str, str] = {}  # query id -> its checkpoint location, for a followed query
        self._lock = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="controlmsg-stage-listener", daemon=True)
        self._thread.start()
        atexit.register(self._at_exit)

    def _at_exit(self) -> None:
        """The program ends: wait for the last rounds (:meth:`drain`), then take the listener off the session,
        so that the JVM, which still reports the queries' last progress as it shuts down, calls no Python
        that has gone (Spark would log each such call as an ERROR with a stack trace)."""
        self.drain(EXIT_WAIT_S)
        with contextlib.suppress(Exception):  # the session or its JVM is already stopped: nothing will call
            self._spark.streams.removeListener(self)

    def close(self, timeout: float = EXIT_WAIT_S) -> None:
        """Stop: the events queued before are still written, then the thread ends (waited for up to
        ``timeout`` seconds), and the ``atexit`` hook goes. For a listener already taken off the session."""
        atexit.unregister(self._at_exit)
        self._events.put(("closed", "", None))
        self._thread.join(timeout)

    def onQueryStarted(self, event: Any) -> None:
        # Spark calls this on the query's own thread before its first micro-batch, so the query is still in
        # the session's manager here: a query started again with nothing left to run ends at once, and would
        # be gone by the time the thread below looks for it.
        try:
            found = self._spark._jsparkSession.streams().get(str(event.id))
            if found is not None:
                self._executions[str(event.id)] = found.streamingQuery()
        except Exception:  # the thread looks it up again
            pass
        with self._lock:
            self._open.add(str(event.id))
        self._events.put(("started", str(event.id), str(event.runId)))

    def onQueryProgress(self, event: Any) -> None:
        self._events.put(("progress", str(event.progress.id), event.progress.json))

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        self._events.put(("terminated", str(event.id), event.exception))

    def drain(self, timeout: float) -> bool:
        """Wait until every query this listener saw start that has terminated in the JVM has had its
        termination heard here (after its last progress) and, when followed, its last round written, or
        ``timeout`` seconds; returns whether all were. The ``atexit`` hook; queries still running are not
        waited for beyond ``timeout`` (the JVM ends with the program)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._open:
                left = deadline - time.monotonic()
                if left <= 0 or not self._any_terminated():
                    return not self._open
                self._lock.wait(min(left, 0.2))
        return True

    def _any_terminated(self) -> bool:
        """Whether a query still open here has terminated in the JVM (its last events are on their way)."""
        for query_id in list(self._open):
            try:  # the JVM's manager: PySpark's get() wraps a missing query instead of returning None
                if self._spark._jsparkSession.streams().get(query_id) is None:
                    return True
            except Exception:  # the JVM is going away: nothing more will come
                return False
        return False

    def _run(self) -> None:
        while True:
            kind, query_id, detail = self._events.get()
            if kind == "closed":
                return
            try:
                self._handle(kind, query_id, detail)
            except Exception as exc:  # one line; the next progress writes a round that says all there is
                print(f"controlmsg: stage {self._followed.get(query_id, {}).get('topic', query_id)!r}: the "
                      f"{kind} event of query {query_id} was not written: {type(exc).__name__}: {exc}",
                      file=sys.stderr)
            finally:
                if kind == "terminated":  # every query's: the JVM has nothing more of it to call Python with
                    with self._lock:
                        self._open.discard(query_id)
                        self._lock.notify_all()

    def _handle(self, kind: str, query_id: str, detail: Any) -> None:
        from controlmsg.spark.stage import (
            checkpoint_progress,
            claim_stage,
            round_batch,
            stage_status,
            write_stage_round,
        )

        if kind == "started":
            self._seen.add(query_id)
            try:
                opts = self._sink_options(query_id)
            finally:
                execution = self._executions.pop(query_id, None)
            if opts is not None and opts.get("stageProgress", "").lower() == STAGE_PROGRESS_DRIVER:
                self._followed[query_id] = opts
                if execution is not None:
                    self._roots[query_id] = str(execution.resolvedCheckpointRoot())
                claim_stage(opts, str(detail))
            return
        if kind == "progress" and query_id not in self._seen:  # started before this listener was added
            self._handle("started", query_id, orjson.loads(detail)["runId"])
        opts = self._followed.get(query_id)
        if opts is None:
            return
        if kind == "progress":
            progress = orjson.loads(detail)
            if round_batch(progress) > self._written.get(query_id, -1):
                self._written[query_id] = round_batch(progress)
                write_stage_round(opts, progress)
            return
        self._followed.pop(query_id, None)
        root = self._roots.pop(query_id, None)
        if detail is None and query_id not in self._written and not (stage_status(opts) or {}).get("ended"):
            # A driver started again after the last micro-batch: that micro-batch's round, from the checkpoint.
            progress = None if root is None else checkpoint_progress(self._spark._jsparkSession, root, query_id)
            if progress is None or not write_stage_round(opts, progress).get("ended"):
                print(f"controlmsg: stage {opts.get('topic')!r}: query {query_id} ended without running a "
                      "micro-batch, and its checkpoint holds " + ("none committed" if progress is None else
                      f"micro-batch {round_batch(progress)}, after which its input had not ended") + ", so its "
                      "stream has not ended; if its input has, end the stream with "
                      "controlmsg.spark.end_stream(options)", file=sys.stderr)
        self._written.pop(query_id, None)

    def _sink_options(self, query_id: str) -> dict[str, str] | None:
        """The options of the query's ``format("controlmsg")`` sink, read from its plan in the JVM; ``None``
        for another sink, or a query gone before its plan could be read."""
        for _ in range(_PLAN_TRIES):
            execution = self._executions.get(query_id)
            if execution is None:
                found = self._spark._jsparkSession.streams().get(query_id)
                if found is None:
                    return None
                execution = found.streamingQuery()
            sink = execution.sink()
            if not str(sink.getClass().getName()).endswith(_PYTHON_TABLE) or str(sink.name()) != _SINK:
                return None
            try:
                return _scala_map(execution.logicalPlan().writeOptions())
            except Exception:  # the plan is not made yet: try again shortly
                time.sleep(_PLAN_WAIT_S)
        return None


def _scala_map(options: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    entries = options.iterator()
    while entries.hasNext():
        entry = entries.next()
        out[str(entry._1())] = str(entry._2())
    return out
