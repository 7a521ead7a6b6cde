"""What the three stages of the example chain on Structured Streaming share (``spark_jobs.stages.ingest``,
``window``, ``sink``): their options, waiting for their queries, and their summaries."""

from __future__ import annotations

import argparse
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlparse

from spark_jobs.common import add_metrics_option

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

__all__ = ["add_stage_options", "await_queries", "phase_options", "run_queries", "serve_stage_metrics",
           "stage_progress", "stage_summary", "sum_fields"]

_TRANSIENT: Final = ("Python worker failed to connect back",)
"""Failures of a query that its restart from the checkpoint cures: Spark gives a Python worker it starts for
a Python data source's planning a fixed 10 s to connect back, which a loaded machine can miss."""
_RESTARTS: Final = 3


def add_stage_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True,
                        help="the query's checkpointLocation: a local directory, or any location Spark's Hadoop file "
                             "systems reach (hdfs://, s3a://...); a restart resumes from it")
    parser.add_argument("--trigger-interval", default="1 second",
                        help="processing-time trigger of a stage that runs until stopped (default 1 second)")
    parser.add_argument("--max-offsets-per-trigger", help="at most this many records per micro-batch")
    parser.add_argument("--log-phases", action="store_true",
                        help="a line per phase of each micro-batch to stderr: the controlmsg source's scan and reading "
                             "tasks, the sink's writing tasks and commit (option logPhases), and each micro-batch's "
                             "durations as Spark reports them (controlmsg.spark.phases)")
    add_metrics_option(parser, "the queries'")


def serve_stage_metrics(spark: SparkSession, args: argparse.Namespace, log: logging.Logger) -> None:
    """``--metrics-port``: :func:`controlmsg.spark.serve_metrics` on the job's session, which serves until the
    job's process ends."""
    if args.metrics_port is None:
        return
    from controlmsg.spark import serve_metrics

    server = serve_metrics(spark, args.metrics_port)
    log.info("metrics on %s/metrics", server.url(spark.conf.get("spark.driver.host") or "127.0.0.1"))


def phase_options(args: argparse.Namespace) -> dict[str, str]:
    """The ``controlmsg`` source and sink option of ``--log-phases``."""
    return {"logPhases": "true"} if args.log_phases else {}


def stage_progress(checkpoint: str) -> dict[str, str]:
    """The ``controlmsg`` sink option for a query checkpointed at ``checkpoint``: none on the driver's local
    file system (the sink reads the offset log there), else ``stageProgress driver`` (the job follows the
    query's progress, :class:`controlmsg.spark.stage.StageFollower`, see :func:`await_queries`)."""
    scheme = urlparse(checkpoint).scheme
    local = scheme in ("", "file") or len(scheme) == 1  # a Windows drive letter is a path too
    return {} if local else {"stageProgress": "driver"}


def sum_fields(sums: Sequence[str]) -> dict[str, str]:
    """``--sum COL[:TYPE]`` values as name -> Spark SQL type (default ``double``)."""
    return {name: typ or "double" for name, _, typ in (s.partition(":") for s in sums)}


def run_queries(start: Callable[[], Sequence[StreamingQuery]], log: logging.Logger,
                sinks: Sequence[Mapping[str, str] | None] = (), *, phases: bool = False) -> list[StreamingQuery]:
    """Start the queries (``start``) and wait for them (:func:`await_queries`; ``sinks``: the ``controlmsg``
    sink options of each query, in order, or ``None``). A failure that a restart cures (:data:`_TRANSIENT`)
    stops the others and starts them all again from their checkpoints, up to :data:`_RESTARTS` times.
    Returns the queries of the last start."""
    for attempt in range(_RESTARTS + 1):
        queries = list(start())
        try:
            await_queries(queries, log, sinks, phases=phases)
            return queries
        except RuntimeError as exc:
            if attempt == _RESTARTS or not any(text in str(exc) for text in _TRANSIENT):
                raise
            log.warning("%s; starting the queries again from their checkpoints (%d of %d)", exc, attempt + 1,
                        _RESTARTS)
    raise AssertionError("unreachable")


def await_queries(queries: Sequence[StreamingQuery], log: logging.Logger,
                  sinks: Sequence[Mapping[str, str] | None] = (), *, phases: bool = False) -> None:
    """Wait until every query has ended, a second at a time (so that SIGTERM is handled between two waits);
    when one fails, stop the others and raise its failure (``RuntimeError``). A query whose ``controlmsg``
    sink (``sinks``, in the order of ``queries``) has ``stageProgress driver`` gets its stage rounds written
    between the waits and after it ends (:class:`controlmsg.spark.stage.StageFollower`). ``phases``: a
    ``query`` phase line (:mod:`controlmsg.spark.phases`) per micro-batch Spark reports, with its durations."""
    from pyspark.errors import StreamingQueryException

    from controlmsg.spark import StageFollower

    followers = {query.id: StageFollower(query, sink) for query, sink in zip(queries, sinks, strict=False)
                 if sink is not None and sink.get("stageProgress") == "driver"}
    running = list(queries)
    topics = {query.id: (sink or {}).get("topic") for query, sink in zip(queries, sinks, strict=False)}
    logged = {query.id: -1 for query in queries}
    while running:
        for query in list(running):
            try:
                ended = query.awaitTermination(1)
            except StreamingQueryException:  # it failed: query.exception() says how
                ended = True
            if phases:
                where = topics.get(query.id) or query.name or str(query.id)
                logged[query.id] = _log_progress(query, where, logged[query.id])
            follower = followers.get(query.id)
            if ended:
                running.remove(query)
                failure = query.exception()
                if follower is not None:
                    follower.finish()  # the rounds of what it committed, failed or not
                if failure is not None:
                    for other in running:
                        other.stop()
                        with contextlib.suppress(StreamingQueryException):  # it may have failed too
                            other.awaitTermination()
                    raise RuntimeError(f"query {query.name or query.id} failed: {failure}")
                log.info("query %s ended", query.name or query.id)
            elif follower is not None:
                follower.step()


def stage_summary(query: StreamingQuery, sink: Mapping[str, str]) -> dict[str, Any]:
    """Rows read by ``query`` in its recent micro-batches (the last 100 Spark keeps), and what its ``controlmsg`` sink
    (options ``sink``, or none) has committed for its run."""
    from controlmsg.spark import run_status

    recent = query.recentProgress  # Spark keeps the last 100 micro-batches
    rows = sum(int(p.get("numInputRows") or 0) for p in recent)
    status = run_status(sink) if sink else None
    return {"rows_in_recent": rows, "recent_micro_batches": len(recent), "run": status,
            "ended": bool(status and status.get("ended"))}


def _log_progress(query: StreamingQuery, topic: str, after: int) -> int:
    """A ``query`` phase line for each micro-batch of ``query`` past ``after`` that Spark still keeps;
    returns the last one's id."""
    from controlmsg.spark.phases import log_phase

    for progress in query.recentProgress:
        batch = int(progress.batchId)
        if batch > after:
            durations = dict(progress.durationMs)
            log_phase("query", topic, batch=batch, ms=durations.get("triggerExecution"), durations=durations,
                      rows=progress.numInputRows, watermark=(progress.eventTime or {}).get("watermark"))
            after = batch
    return after
