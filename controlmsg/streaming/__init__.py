"""The long-running-task streaming runtime: a second engine for a chain of streaming jobs, beside
Structured Streaming with ``format("controlmsg")`` (docs/STREAMING.md).

**What it is.** A streaming job runs ``n`` logical tasks that all run at once and each loop until their
input ends: task ``i`` owns a group of its input topic's partitions, reads the **reconciled** watermark
from the in-band bookkeeping (not Spark's max-event-time-minus-delay), acts on it as soon as it moves,
and commits its output, its own watermark and its input position (source offsets, or its window state)
together, in one Kafka transaction per commit. A restart, a ``kill -9`` or Spark's task retry resumes each task
from its own commit: nothing twice, nothing lost, the watermark never goes back. The pieces:

* :mod:`controlmsg.streaming.runtime`: :func:`run_long_running_tasks` runs the logical tasks in one
  Spark job, dealt to the application's task slots (:func:`slot_groups`) and run in threads of each
  Python worker, with a watchdog for a task wedged in a call that does not return.
* :mod:`controlmsg.streaming.ingest`: :func:`run_ingest_task`, a plain source topic (JSON objects) ->
  the controlmsg envelope with watermarks, idleness and rescaling between runs (:func:`plan_generation`).
* :mod:`controlmsg.streaming.window`: :func:`run_window_task`, a controlmsg topic -> tumbling windows
  emitted when the reconciled watermark passes their end, the state in a compacted state topic, late
  records to a side topic (headers ``HEADER_LATE_*``, kept in that module).
* :mod:`controlmsg.streaming.task_metrics`: the tasks' metrics, reported to their job's driver, which serves
  them to Prometheus (:func:`serve_job_metrics`; the jobs' ``--metrics-port``).
* :mod:`controlmsg.streaming.stopping`: graceful stop on SIGTERM and SIGINT (:class:`Stopper`), brought
  to the tasks through a stop topic (:class:`StopChannel`); the tasks stop at a commit.

The two task bodies are plain Python and need no Spark; the example jobs ``spark_jobs.runtime.ingest`` and
``spark_jobs.runtime.window`` run them inside :func:`run_long_running_tasks`.

**When to use it rather than Structured Streaming stages.** When a window's result must be readable as
soon as the reconciled watermark passes its end, or when the chain must carry a high rate (the chain on
both engines side by side: docs/STREAMING.md, "The same chain as three Structured Streaming queries"). Write
your own stages with Structured Streaming instead when you want Spark's operators, checkpoints and sinks
and can live with micro-batch latency. What this runtime costs: a core per Spark task for the whole run,
windowing in Python (tumbling windows with counts and sums), rescaling only between runs.

**Imports.** ``import controlmsg.streaming`` imports none of its modules: each name below is loaded
when first used, and only :mod:`controlmsg.streaming.runtime` (:func:`run_long_running_tasks`,
:func:`partition_groups`, :func:`slot_groups`, ``Body``) imports pyspark. The task bodies, the stop
channel and :func:`job_logger` work without pyspark.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from controlmsg.lazy import lazy_getattr

if TYPE_CHECKING:
    from controlmsg.streaming.ingest import (
        IngestSummary,
        committed_source_state,
        parse_event_time,
        plan_generation,
        run_ingest_task,
        source_group,
    )
    from controlmsg.streaming.log import job_logger
    from controlmsg.streaming.runtime import Body, partition_groups, run_long_running_tasks, slot_groups
    from controlmsg.streaming.state_topic import read_task_state, state_key, state_topic_config, write_task_state
    from controlmsg.streaming.stopping import (
        HARD_LIMIT_S,
        STOP_GRACE_S,
        StopChannel,
        StopFailed,
        Stopper,
        StopRequested,
        StopWatch,
        exit_code,
        installed,
        signal_name,
        watch_parent,
    )
    from controlmsg.streaming.task_metrics import serve_job_metrics
    from controlmsg.streaming.window import LATE_REASON, TaskSummary, run_window_task

__all__ = [
    "HARD_LIMIT_S",
    "LATE_REASON",
    "STOP_GRACE_S",
    "Body",
    "IngestSummary",
    "StopChannel",
    "StopFailed",
    "StopRequested",
    "StopWatch",
    "Stopper",
    "TaskSummary",
    "committed_source_state",
    "exit_code",
    "installed",
    "job_logger",
    "parse_event_time",
    "partition_groups",
    "plan_generation",
    "read_task_state",
    "run_ingest_task",
    "run_long_running_tasks",
    "run_window_task",
    "serve_job_metrics",
    "signal_name",
    "slot_groups",
    "source_group",
    "state_key",
    "state_topic_config",
    "watch_parent",
    "write_task_state",
]

_WHERE = {
    "Body": "controlmsg.streaming.runtime",
    "partition_groups": "controlmsg.streaming.runtime",
    "run_long_running_tasks": "controlmsg.streaming.runtime",
    "slot_groups": "controlmsg.streaming.runtime",
    "IngestSummary": "controlmsg.streaming.ingest",
    "committed_source_state": "controlmsg.streaming.ingest",
    "parse_event_time": "controlmsg.streaming.ingest",
    "plan_generation": "controlmsg.streaming.ingest",
    "run_ingest_task": "controlmsg.streaming.ingest",
    "source_group": "controlmsg.streaming.ingest",
    "LATE_REASON": "controlmsg.streaming.window",
    "TaskSummary": "controlmsg.streaming.window",
    "run_window_task": "controlmsg.streaming.window",
    "read_task_state": "controlmsg.streaming.state_topic",
    "state_key": "controlmsg.streaming.state_topic",
    "state_topic_config": "controlmsg.streaming.state_topic",
    "write_task_state": "controlmsg.streaming.state_topic",
    "HARD_LIMIT_S": "controlmsg.streaming.stopping",
    "STOP_GRACE_S": "controlmsg.streaming.stopping",
    "StopChannel": "controlmsg.streaming.stopping",
    "StopFailed": "controlmsg.streaming.stopping",
    "StopRequested": "controlmsg.streaming.stopping",
    "StopWatch": "controlmsg.streaming.stopping",
    "Stopper": "controlmsg.streaming.stopping",
    "exit_code": "controlmsg.streaming.stopping",
    "installed": "controlmsg.streaming.stopping",
    "signal_name": "controlmsg.streaming.stopping",
    "watch_parent": "controlmsg.streaming.stopping",
    "job_logger": "controlmsg.streaming.log",
    "serve_job_metrics": "controlmsg.streaming.task_metrics",
}

__getattr__ = lazy_getattr(__name__, _WHERE)
