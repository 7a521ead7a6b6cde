"""Long-running Spark tasks: the runtime of the streaming jobs (see docs/STREAMING.md).

A streaming job is one Spark job of ``n`` tasks that all run at once and each loop until their input
ends: task ``i`` runs ``body(i, stop)`` in a Python worker and returns a JSON-compatible summary. Spark's
task retry is the restart: a task that fails (or whose executor dies) is started again, and the body
resumes from its own committed state in Kafka. A graceful stop (SIGTERM, SIGINT: see
:mod:`spark_jobs.stopping`) reaches the tasks through ``stop``: true once the driver asked them to stop,
after which each commits and returns.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

from pyspark.sql import SparkSession

from spark_jobs.common import job_logger
from spark_jobs.stopping import STOP_GRACE_S, StopChannel, StopRequested, installed

__all__ = ["Body", "partition_groups", "run_long_running_tasks"]

Body = Callable[[int, Callable[[], bool]], dict[str, Any]]
"""A task's work: ``body(i, stop)`` loops until its input ends or ``stop()`` is true (then it commits
and returns), and returns its summary, with ``"ended"``: whether its input ended."""

_log = job_logger("streaming")


def partition_groups(config: dict[str, Any], topic: str, tasks: int, timeout: float | None) -> list[list[int]]:
    """Wait for ``topic`` and deal its partitions to ``tasks`` tasks round-robin (task ``i`` gets
    ``i, i + tasks, ...``). Raises ``ValueError`` unless ``1 <= tasks <= partitions``: a task without a
    partition would have nothing to advance its watermark with."""
    from controlmsg.kafka.admin import wait_for_topic

    partitions = wait_for_topic(config, topic, timeout)
    if not 1 <= tasks <= partitions:
        raise ValueError(f"tasks must be between 1 and the {partitions} partitions of {topic!r}, got {tasks}")
    return [list(range(i, partitions, tasks)) for i in range(tasks)]


def _never() -> bool:
    return False


def run_long_running_tasks(spark: SparkSession, n: int, body: Body,
                           stop: StopChannel | None = None) -> list[dict[str, Any]]:
    """Run ``body(0, stop) ... body(n-1, stop)`` as ``n`` concurrent Spark tasks; block until all return;
    return their summaries in task order.

    Graceful stop: when the process has a :class:`~spark_jobs.stopping.Stopper` installed and ``stop``
    is given, a signal makes this write the stop record (the tasks' ``stop()`` then turns true at their
    next turn); tasks still running :data:`~spark_jobs.stopping.STOP_GRACE_S` later are cancelled (their
    open transactions are aborted by the next start). It then raises
    :class:`~spark_jobs.stopping.StopRequested` (with the summaries when the tasks returned), unless every
    task's summary says ``ended``. Without ``stop`` the tasks' ``stop()`` is always false.

    Raises ``ValueError`` when the application has fewer than ``n`` task slots (default parallelism):
    the tasks wait on each other's progress, so a task that could only start after another ended would
    stall the pipeline. ``body`` is pickled (cloudpickle) to the workers.
    """
    slots = spark.sparkContext.defaultParallelism
    if n > slots:
        raise ValueError(f"{n} long-running tasks need {n} task slots, this application has {slots} "
                         "(raise the cores of the master, e.g. local[N], or spark.cores.max)")

    def task(i: int) -> dict[str, Any]:
        from controlmsg.kafka.settings import worker_logging

        worker_logging()
        if stop is None:
            return body(i, _never)
        watch = stop.watch()
        try:
            return body(i, watch)
        finally:
            watch.close()

    sc = spark.sparkContext
    group = f"controlmsg-long-running-{uuid.uuid4().hex[:8]}"
    sc.setJobGroup(group, f"{n} long-running tasks", interruptOnCancel=True)
    rdd = sc.parallelize(range(n), n)
    stopper = installed()
    if stopper is None or stop is None:
        return rdd.map(task).collect()
    done = threading.Event()

    def relay() -> None:  # driver side: signal -> stop record -> (after the grace) cancellation
        while not stopper.requested.wait(0.1):
            if done.is_set():
                return
        try:
            stop.request()
        except Exception as exc:  # the cancellation below still stops the tasks
            _log.warning("could not write the stop record (%s): the tasks are cancelled in %g s", exc, STOP_GRACE_S)
        if not done.wait(STOP_GRACE_S):
            _log.warning("tasks still running %g s after the stop request: cancelling them", STOP_GRACE_S)
            sc.cancelJobGroup(group)

    with stopper.deferring():
        thread = threading.Thread(target=relay, name="stop-relay", daemon=True)
        thread.start()
        try:
            summaries = rdd.map(task).collect()
        except Exception as exc:
            if stopper.signum is not None:
                raise StopRequested(stopper.signum, "tasks cancelled before they reached a commit") from exc
            raise
        finally:
            done.set()
    if stopper.signum is not None and not all(s.get("ended") for s in summaries):
        raise StopRequested(stopper.signum, "every task committed and returned", summaries)
    return summaries
