"""Where a micro-batch's time goes: one line per phase of the ``controlmsg`` data source, when asked.

With the option ``logPhases true`` on ``readStream.format("controlmsg")`` and/or ``writeStream.format(
"controlmsg")``, each phase of each micro-batch prints one line to stderr, ``HH:MM:SS.mmm controlmsg-phase
{json}``, from the process that runs it (in local mode all of them are the application's own stderr; on a
cluster the driver's phases are in the driver's log, the tasks' in the executors' stderr):

============  ======================================================================================
``scan``      the driver's ``latestOffset``: the scan from the last offsets (``ms``, ``records`` read,
              ``stop``: why it ended, ``moved``: whether the watermark or the end moved, ``settle``:
              a micro-batch that reads nothing so that Spark applies the watermark)
``read``      a reading task (``ms``; ``open_ms``: until its consumer had its first message; ``rows``)
``write``     a writing task (``ms``, ``rows``; ``skipped``: an empty first attempt that did not touch
              Kafka, see :mod:`controlmsg.spark.writing`)
``commit``    the driver's commit of a micro-batch (``ms``: the round's transaction; ``init_ms``: making
              the writer Spark creates for it)
============  ======================================================================================

Every line has ``topic`` and, where the process knows it, ``batch`` (the micro-batch id). The lines are
made to be aggregated (``benchmarks/bench_stages.py`` does), not read one by one. Off by default: a line
per task per micro-batch is noise in a long-running job. Imports no pyspark (a task's batch id is looked up
when asked).
"""

from __future__ import annotations

import sys
import time
from typing import Any, Final

import orjson

__all__ = ["PHASE_PREFIX", "log_phase", "parse_phase", "task_batch_id"]

PHASE_PREFIX: Final = "controlmsg-phase"


def log_phase(phase: str, topic: str, **fields: Any) -> None:
    """Print one phase line (see the module docstring) to stderr; never raises for a field that JSON
    cannot hold (it is written as its ``str``)."""
    now = time.time()
    stamp = time.strftime("%H:%M:%S", time.localtime(now)) + f".{int(now * 1000) % 1000:03d}"
    body = orjson.dumps({"phase": phase, "topic": topic, **fields}, default=str).decode()
    print(f"{stamp} {PHASE_PREFIX} {body}", file=sys.stderr, flush=True)


def parse_phase(line: str) -> dict[str, Any] | None:
    """The fields of a phase line (as :func:`log_phase` writes it, anywhere in ``line``), else ``None``."""
    at = line.find(PHASE_PREFIX + " {")
    if at < 0:
        return None
    try:
        fields = orjson.loads(line[at + len(PHASE_PREFIX) + 1:])
    except orjson.JSONDecodeError:
        return None
    return fields if isinstance(fields, dict) else None


def task_batch_id() -> int | None:
    """The micro-batch id of the Spark task running this code (Spark's local property), ``None`` outside a
    streaming task."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    text = None if ctx is None else ctx.getLocalProperty("streaming.sql.batchId")
    return int(text) if text is not None and text.lstrip("-").isdigit() else None
