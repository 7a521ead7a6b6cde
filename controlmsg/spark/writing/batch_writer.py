"""``df.write.format("controlmsg")``: the batch writer Spark calls, and its driver's commit, the run's end of
stream once every task has committed (:mod:`controlmsg.spark.writing`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from controlmsg.core.messages import EndOfStreamMessage
from controlmsg.core.naming import driver_transactional_id
from controlmsg.errors import ControlMsgError
from controlmsg.kafka.markers import Round, write_control_round
from controlmsg.kafka.writer import ControlWriter
from controlmsg.spark.options import WriteOptions
from controlmsg.spark.writing.plan import plan_write
from controlmsg.spark.writing.run_control import UPSTREAM_DRIVER, refuse_ended, upstream_of
from controlmsg.spark.writing.task import TaskCommit, max_time, task_commits, write_task

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["BatchWriter"]


class BatchWriter(DataSourceArrowWriter):
    """``df.write.format("controlmsg")``: see :mod:`controlmsg.spark.writing`. Created on the driver."""

    def __init__(self, opts: WriteOptions, schema: StructType) -> None:
        refuse_ended(opts)  # before anything is created
        self.plan = plan_write(opts, schema)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskCommit:
        return write_task(self.plan, iterator, batch_id=0, query_id=None, stage=self.at_stage)

    def at_stage(self, stage: str, writer: ControlWriter) -> None:
        """Called in the task at ``"before_commit"`` (records and marker sent, the transaction open) and
        ``"after_commit"``. Does nothing; a seam for the tests of the exactly-once machinery."""

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        opts = self.plan.opts
        commits = task_commits(opts, messages)
        # Spark runs no task for a DataFrame without partitions (an empty relation): the driver ends the run
        # all the same, so that readers see it end.
        tasks = len(commits)
        rows = sum(c.rows for c in commits)

        def plan(committed: dict[str, Any] | None) -> Round | None:
            if committed is not None and committed.get("ended"):
                return None
            name, generation, _ = upstream_of(opts, committed)
            marker = {"upstream": UPSTREAM_DRIVER, "taskCount": 1, "generation": generation, "ended": True,
                      "writeTasks": tasks, "rows": rows, "maxEventTime": max_time(commits)}
            return [EndOfStreamMessage(name, 1, opts.run_id, generation=generation)], marker

        done = write_control_round(dict(opts.config), opts.topic, self.plan.partitions, plan,
                                   transactional_id=driver_transactional_id(opts.topic, opts.job, opts.run_id),
                                   timeout=opts.timeout)
        if done is not None and (done.get("writeTasks", done.get("taskCount")), done.get("rows")) != (tasks, rows):
            raise ControlMsgError(f"topic {opts.topic!r}: run {opts.run_id!r} had already ended with "
                                  f"{done.get('rows')} rows from {done.get('writeTasks', done.get('taskCount'))} "
                                  f"tasks, this write has {rows} from {tasks}; use a new runId")

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        pass  # failed tasks aborted their transactions; committed ones stay, and a rerun skips them
