"""How upstream tasks and their Kafka resources are named: one rule for every writer. Pure.

An upstream task of job ``job`` in run ``run_id`` with index ``i`` is ``f"{job}-{run_id}-p{i}"`` (the
``taskName`` of its control messages); the driver of a Spark write, the one upstream task of that write,
is ``f"{job}-{run_id}-driver"``. Its transactional id adds the topic: ``f"controlmsg-{topic}-{taskName}"``,
so the same task writing two topics uses two transactions. The consumer group that holds its commit marker is
that id under :data:`MARKER_GROUP_PREFIX` (:func:`marker_group`), one prefix that lag tools can leave out:
the groups are empty, and would otherwise show as consumers that lag. Readers use :func:`parse_task_name` to
tell which tasks of a run they have not heard from.

Topics named after a run (:func:`run_topics`): the pipeline's (``spark_jobs``) intermediate topics
``controlmsg-<run>-events`` and ``controlmsg-<run>-windows``, the topics its streaming jobs make beside them
by default (``-rejects`` and ``-stop`` of the events topic; ``-late``, ``-state`` and ``-stop`` of the windows
topic), and the ``controlmsg demo`` topic ``controlmsg-demo-<run>``. ``controlmsg cleanup`` finds a run by
these names (:mod:`controlmsg.kafka.cleanup`).
"""

from __future__ import annotations

import re
from typing import Final

__all__ = [
    "CONTROL_TOPIC_SUFFIXES",
    "MARKER_GROUP_PREFIX",
    "RUN_TOPIC_SUFFIXES",
    "demo_topic",
    "driver_task_name",
    "driver_transactional_id",
    "is_run_group",
    "marker_group",
    "parse_task_name",
    "run_topics",
    "task_name",
    "transactional_id",
]

_TASK_NAME: Final = re.compile(r"^(.*)-p(\d+)$")
_TXN_PREFIX: Final = "controlmsg-"

MARKER_GROUP_PREFIX: Final = "controlmsg.marker."
r"""Every commit marker's consumer group starts with it, and no other group of controlmsg's does (those start
with ``controlmsg-``): the one pattern for lag tools to exclude, ``^controlmsg\.marker\.`` (docs/OPERATIONS.md).
Until 2026-11-28 a marker's group was its transactional id itself, which lag tools could not tell from the
streaming ingest's source group; :class:`~controlmsg.kafka.markers.MarkerStore` still reads a marker there."""

RUN_TOPIC_SUFFIXES: Final = ("events", "events-rejects", "events-stop", "windows", "windows-late", "windows-state",
                             "windows-stop")
"""The topics ``controlmsg-<run>-<suffix>`` of a pipeline run. No suffix is another one with a part before it
cut off (``stop`` alone is not one), so a topic of run ``a-events`` is never taken for one of run ``a``."""
CONTROL_TOPIC_SUFFIXES: Final = ("events", "windows")
"""The run topics that carry control messages (the others carry plain records)."""


def task_name(job: str, run_id: str, index: int) -> str:
    """The ``taskName`` of task ``index`` of ``job`` in run ``run_id``. Raises ``ValueError`` for an empty
    job or run, or a negative index."""
    if not job or not run_id:
        raise ValueError("job and run_id must be non-empty: they name the tasks and their transactions")
    if index < 0:
        raise ValueError(f"a task index is >= 0, got {index}")
    return f"{job}-{run_id}-p{index}"


def parse_task_name(name: str) -> tuple[str, int] | None:
    """``"ingest-r1-p3"`` -> ``("ingest-r1", 3)``; ``None`` for a name not made by :func:`task_name`."""
    match = _TASK_NAME.match(name)
    return (match.group(1), int(match.group(2))) if match else None


def transactional_id(topic: str, task: str) -> str:
    """The Kafka transactional id (and commit-marker group) of upstream task ``task`` writing ``topic``:
    the same for every attempt of the task."""
    return f"controlmsg-{topic}-{task}"


def marker_group(transactional_id: str) -> str:
    """The consumer group of the commit marker of the writer whose transactional id is ``transactional_id``:
    ``controlmsg-<topic>-<task>`` -> ``controlmsg.marker.<topic>-<task>``."""
    return MARKER_GROUP_PREFIX + transactional_id.removeprefix(_TXN_PREFIX)


def driver_task_name(job: str, run_id: str) -> str:
    """The ``taskName`` of the driver of a Spark write of ``job`` in run ``run_id``: ``<job>-<run>-driver``,
    the one upstream task of the protocol for a ``format("controlmsg")`` write (its Spark tasks write
    records only; see :mod:`controlmsg.spark.writing`). Raises ``ValueError`` for an empty job or run."""
    if not job or not run_id:
        raise ValueError("job and run_id must be non-empty: they name the tasks and their transactions")
    return f"{job}-{run_id}-driver"


def driver_transactional_id(topic: str, job: str, run_id: str) -> str:
    """The transactional id (and marker group) of the driver of a Spark write of ``job`` in run ``run_id``
    on ``topic``: :func:`transactional_id` of :func:`driver_task_name`."""
    return transactional_id(topic, driver_task_name(job, run_id))


def stage_transactional_id(topic: str, job: str, run_id: str) -> str:
    """The transactional id (and marker group) of the stage rounds that a streaming write's driver program
    writes for the driver (``stageProgress driver``, :mod:`controlmsg.spark.stage`): the driver's own
    (:func:`driver_transactional_id`) with ``-stage``, so that they never fence the sink's commits."""
    return f"{driver_transactional_id(topic, job, run_id)}-stage"


def demo_topic(run_id: str) -> str:
    """The topic of a ``controlmsg demo`` run."""
    return f"controlmsg-demo-{run_id}"


def run_topics(run_id: str, *, control_only: bool = False) -> tuple[str, ...]:
    """Every topic named after run ``run_id`` (see the module docstring), whether it exists or not;
    ``control_only``: those that carry control messages (``-events``, ``-windows`` and the demo topic)."""
    carry = (*(f"controlmsg-{run_id}-{suffix}" for suffix in CONTROL_TOPIC_SUFFIXES), demo_topic(run_id))
    if control_only:
        return carry
    return (*carry, *(f"controlmsg-{run_id}-{s}" for s in RUN_TOPIC_SUFFIXES if s not in CONTROL_TOPIC_SUFFIXES))


def is_run_group(group: str, run_id: str) -> bool:
    """Whether consumer group ``group`` belongs to run ``run_id``: named ``controlmsg-<topic>-<rest>`` for
    one of :func:`run_topics`, where ``<rest>`` is a task of the run (``<job>-<run>-p<i>``: a writer's commit
    marker, see :func:`transactional_id`), its driver (``<job>-<run>-driver``) or the streaming ingest's
    source group (``ingest-<run>-source``), or the stage rounds' marker of a driver program
    (``<job>-<run>-driver-stage``); a marker's group under :data:`MARKER_GROUP_PREFIX` too."""
    tail = re.compile(rf"^.+-{re.escape(run_id)}-(p\d+|driver|driver-stage|source)$")
    if group.startswith(MARKER_GROUP_PREFIX):
        group = _TXN_PREFIX + group[len(MARKER_GROUP_PREFIX):]
    for topic in run_topics(run_id):
        prefix = f"controlmsg-{topic}-"
        if group.startswith(prefix) and tail.match(group[len(prefix):]):
            return True
    return False
