"""controlmsg's metrics of a classic session's streaming queries on a Prometheus endpoint, in one line:
:func:`serve_metrics`.

Spark gives a Python source no metrics map, so what a ``controlmsg`` stream reader reports (its lag, its
upstream tasks, the task holding the watermark back) is in each ``StreamingQueryProgress`` only
(:mod:`controlmsg.spark.reading.source_metrics`). :func:`serve_metrics` adds a :class:`MetricsListener` to
the session, which turns every progress into the samples of :mod:`controlmsg.metrics.samples`
(:func:`progress_samples`, pure), and serves them on an HTTP port of the driver. Labels: ``query`` (the
query's name, else its id) and ``topic``. Each ``with_watermark`` observation's late rows add up in
``controlmsg_late_records_total`` (label ``observation``: its ``metrics_name``).

A query's last samples stay after it terminates (its end of stream, its final lag), until the session's
process ends: a scrape after a bounded query sees how it ended.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import sys
import threading
from collections.abc import Callable, Hashable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

import orjson
from pyspark.sql.streaming.listener import StreamingQueryListener

from controlmsg.metrics.board import Board, prometheus_client_module
from controlmsg.metrics.samples import LATE_RECORDS, QUERY_WATERMARK, Sample, labels_of, source_samples

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from controlmsg.metrics.server import MetricsServer

__all__ = ["MetricsListener", "late_rows", "progress_samples", "query_label", "serve_metrics", "stop_metrics"]

_ATTR: Final = "_controlmsg_metrics"


def query_label(progress: Mapping[str, Any]) -> str:
    """The ``query`` label of a progress: the query's name, else its id (name your queries)."""
    return str(progress.get("name") or progress.get("id"))


def progress_samples(progress: Mapping[str, Any]) -> dict[Hashable, list[Sample]]:
    """The gauges of one ``StreamingQueryProgress`` (a parsed ``event.progress.json``, or an entry of
    ``query.recentProgress``), by group: one group per ``controlmsg`` source (``("source", query, topic)``:
    :func:`~controlmsg.metrics.samples.source_samples` of its ``source_metrics``), and one for Spark's
    event-time watermark of the query (``("query", query)``: absent for a query without a watermark). A
    progress whose trigger asked no source for its latest offsets gives no source group (the last one
    stays)."""
    from controlmsg.spark.reading.source_metrics import source_metrics

    query = query_label(progress)
    out: dict[Hashable, list[Sample]] = {
        ("source", query, topic): source_samples(metrics, labels_of(query=query, topic=topic))
        for topic, metrics in source_metrics(progress).items()}
    mark = (progress.get("eventTime") or {}).get("watermark")
    if mark:
        try:
            at = datetime.fromisoformat(str(mark)).timestamp()
        except ValueError:
            pass
        else:
            out[("query", query)] = [Sample(QUERY_WATERMARK, labels_of(query=query), at)]
    return out


def late_rows(progress: Mapping[str, Any]) -> dict[str, int]:
    """The late rows of one micro-batch, by observation (``with_watermark``'s ``metrics_name``): each observed
    metric of the progress that has ``late_rows``."""
    from controlmsg.spark.event_time import observed_counts

    out: dict[str, int] = {}
    for name in progress.get("observedMetrics") or {}:
        counts = observed_counts(progress, str(name))
        if counts is not None and "late_rows" in counts:
            out[str(name)] = counts["late_rows"]
    return out


class MetricsListener(StreamingQueryListener):
    """Puts each progress of the session's queries on ``board`` (:func:`progress_samples`, and the late rows
    added up per query and observation). Runs on Spark's listener thread: a progress it cannot read is said
    on stderr in one line and skipped."""

    def __init__(self, board: Board) -> None:
        self.board = board
        self._late: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def onQueryProgress(self, event: Any) -> None:
        try:
            self.take(orjson.loads(event.progress.json))
        except Exception as exc:  # the listener bus goes on; the next progress says all there is
            print(f"controlmsg: metrics: a progress of query {getattr(event.progress, 'id', '?')} was not read: "
                  f"{type(exc).__name__}: {exc}", file=sys.stderr)

    def take(self, progress: Mapping[str, Any]) -> None:
        """Put one parsed progress on the board."""
        for group, samples in progress_samples(progress).items():
            self.board.put(group, samples)
        query = query_label(progress)
        with self._lock:
            for name, count in late_rows(progress).items():
                total = self._late[(query, name)] = self._late.get((query, name), 0) + count
                self.board.put(("late", query, name),
                               [Sample(LATE_RECORDS, labels_of(query=query, observation=name), total)])

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass


def serve_metrics(spark: SparkSession, port: int, host: str = "0.0.0.0") -> MetricsServer:
    """Serve controlmsg's metrics of every streaming query of the classic session ``spark`` on
    ``http://<host>:<port>/metrics``, in Prometheus' text format, from now until the driver ends (see the module
    docstring; the names: docs/OPERATIONS.md, "Metrics"). ``port`` 0 takes a free port (the returned server's
    ``port``). Returns at once; the server runs on a daemon thread.

    Idempotent per session: a second call returns the endpoint already serving, when ``port`` is 0 or its
    port. Raises ``ModuleNotFoundError`` in one line without prometheus-client (``pip install
    'controlmsg[metrics]'``), ``ValueError`` on a Spark Connect session (a listener runs on the Connect server,
    not here: read ``source_metrics(query.lastProgress)`` there) or when the session already serves on another
    port, ``OSError`` when the port cannot be had."""
    from controlmsg.metrics.server import serve

    prometheus_client_module()
    if getattr(spark, "_jvm", None) is None:
        raise ValueError("serve_metrics needs a classic session: on Spark Connect a listener runs on the server; "
                         "read controlmsg.spark.source_metrics(query.lastProgress) in the client instead")
    found: tuple[MetricsServer, MetricsListener, Callable[[], None]] | None = getattr(spark, _ATTR, None)
    if found is not None:
        if port in (0, found[0].port):
            return found[0]
        raise ValueError(f"this session already serves controlmsg's metrics on port {found[0].port}, not {port}")
    board = Board()
    server = serve(board, port, host)
    listener = MetricsListener(board)
    try:
        spark.streams.addListener(listener)
    except BaseException:
        server.close()
        raise
    hook = functools.partial(_leave, spark, listener)  # this session's own: stop_metrics takes only it off
    setattr(spark, _ATTR, (server, listener, hook))
    atexit.register(hook)
    return server


def _leave(spark: SparkSession, listener: MetricsListener) -> None:
    """At the program's end: the listener off the session, so that the JVM, which still reports the queries'
    last progress as it shuts down, calls no Python that has gone (Spark logs each such call as an ERROR)."""
    with contextlib.suppress(Exception):  # the session or its JVM is already stopped: nothing will call
        spark.streams.removeListener(listener)


def stop_metrics(spark: SparkSession) -> None:
    """Take :func:`serve_metrics`'s listener off ``spark`` and stop its endpoint (the port is free again);
    nothing when it serves none."""
    found: tuple[MetricsServer, MetricsListener, Callable[[], None]] | None = getattr(spark, _ATTR, None)
    if found is None:
        return
    delattr(spark, _ATTR)
    atexit.unregister(found[2])  # another session's hook stays
    try:
        spark.streams.removeListener(found[1])
    finally:
        found[0].close()
