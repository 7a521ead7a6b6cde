"""The streaming runtime's watchdog in a real Spark application: a logical task wedged in a call that does
not return (here a long sleep after its first turn) has its Python worker ended, Spark retries the task
(the session tries a task 3 times), and the retry runs to the end."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from controlmsg.streaming.runtime import run_long_running_tasks


def test_a_wedged_task_is_ended_and_retried(spark: SparkSession, tmp_path: Path) -> None:
    marker = tmp_path / "wedged-once"

    def body(i: int, stop: Any) -> dict[str, Any]:
        stop()  # one turn: the watchdog watches this task from now on
        retried = marker.exists()
        if i == 1 and not retried:
            marker.write_text(str(time.time()))
            time.sleep(300)  # wedged: without the watchdog this attempt returns retried=False
        return {"task": i, "retried": retried, "ended": True}

    summaries = run_long_running_tasks(spark, 2, body, stall_limit_s=3.0)
    assert [s["task"] for s in summaries] == [0, 1]
    assert summaries[1]["retried"] is True  # the second attempt, after the worker was ended
    assert marker.exists()
