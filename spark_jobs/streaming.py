"""Long-running Spark tasks: the runtime of the streaming jobs (see docs/STREAMING.md).

A streaming job is one Spark job of ``n`` tasks that all run at once and each loop until their input
ends: task ``i`` runs ``body(i)`` in a Python worker and returns a JSON-compatible summary. Spark's task
retry is the restart: a task that fails (or whose executor dies) is started again, and the body resumes
from its own committed state in Kafka.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyspark.sql import SparkSession

__all__ = ["partition_groups", "run_long_running_tasks"]


def partition_groups(config: dict[str, Any], topic: str, tasks: int, timeout: float | None) -> list[list[int]]:
    """Wait for ``topic`` and deal its partitions to ``tasks`` tasks round-robin (task ``i`` gets
    ``i, i + tasks, ...``). Raises ``ValueError`` unless ``1 <= tasks <= partitions``: a task without a
    partition would have nothing to advance its watermark with."""
    from controlmsg.kafka.admin import wait_for_topic

    partitions = wait_for_topic(config, topic, timeout)
    if not 1 <= tasks <= partitions:
        raise ValueError(f"tasks must be between 1 and the {partitions} partitions of {topic!r}, got {tasks}")
    return [list(range(i, partitions, tasks)) for i in range(tasks)]


def run_long_running_tasks(spark: SparkSession, n: int, body: Callable[[int], dict[str, Any]]) -> list[dict[str, Any]]:
    """Run ``body(0) ... body(n-1)`` as ``n`` concurrent Spark tasks; block until all return; return their
    summaries in task order.

    Raises ``ValueError`` when the application has fewer than ``n`` task slots (default parallelism):
    the tasks wait on each other's progress, so a task that could only start after another ended would
    stall the pipeline. ``body`` is pickled (cloudpickle) to the workers.
    """
    slots = spark.sparkContext.defaultParallelism
    if n > slots:
        raise ValueError(f"{n} long-running tasks need {n} task slots, this application has {slots} "
                         "(raise the cores of the master, e.g. local[N], or spark.cores.max)")
    rdd = spark.sparkContext.parallelize(range(n), n)
    return rdd.map(body).collect()
