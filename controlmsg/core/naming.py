"""How upstream tasks and their Kafka resources are named: one rule for every writer. Pure.

An upstream task of job ``job`` in run ``run_id`` with index ``i`` is ``f"{job}-{run_id}-p{i}"`` (the
``taskName`` of its control messages). Its transactional id, also the consumer group that holds its
commit marker, adds the topic: ``f"controlmsg-{topic}-{taskName}"``, so the same task writing two topics
uses two transactions. Readers use :func:`parse_task_name` to tell which tasks of a run they have not
heard from.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["driver_transactional_id", "parse_task_name", "task_name", "transactional_id"]

_TASK_NAME: Final = re.compile(r"^(.*)-p(\d+)$")


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


def driver_transactional_id(topic: str, job: str, run_id: str) -> str:
    """The transactional id (and marker group) of the writer that ends a job's run on ``topic``: the
    driver of a Spark write, which writes the control messages on behalf of its tasks."""
    return f"controlmsg-{topic}-{job}-{run_id}-driver"
