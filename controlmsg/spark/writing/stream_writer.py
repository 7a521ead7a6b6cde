"""``df.writeStream.format("controlmsg")``: the stream writer Spark calls, and its driver's commit after
every micro-batch, the run's watermark or its end of stream (:mod:`controlmsg.spark.writing`)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from controlmsg.core.messages import EndOfStreamMessage, WatermarkMessage
from controlmsg.core.naming import driver_transactional_id, task_name, transactional_id
from controlmsg.core.watermarks import WatermarkPolicy
from controlmsg.errors import ControlMsgError
from controlmsg.kafka.markers import Round, write_control_round
from controlmsg.kafka.writer import fence_transactions
from controlmsg.spark.options import STAGE_PROGRESS_DRIVER, STAGE_PROGRESS_OFFSET_LOG, WriteOptions
from controlmsg.spark.phases import log_phase
from controlmsg.spark.query_log import (
    END_OF_TIME_MS,
    check_offset_log_follows,
    offset_log_dir,
    query_id,
    stage_progress,
)
from controlmsg.spark.writing.plan import plan_write
from controlmsg.spark.writing.run_control import (
    FOLLOWED_RUN,
    FOLLOWER_SEEN,
    UPSTREAM_DRIVER,
    await_follower,
    follower_seen,
    refuse_ended,
    run_status,
    upstream_of,
)
from controlmsg.spark.writing.task import TaskCommit, max_time, query_run_of, rows_ahead, task_commits, write_task

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["StreamWriter"]

_BATCH_ID_PROPERTY: Final = "streaming.sql.batchId"
_QUERY_ID_PROPERTY: Final = "sql.streaming.queryId"


class StreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("controlmsg")``: see :mod:`controlmsg.spark.writing`. Created on the driver."""

    def __init__(self, opts: WriteOptions, schema: StructType) -> None:
        made = time.monotonic()
        # Made when the query starts, and again for every micro-batch: a checkpoint whose offset log the writer
        # cannot read is refused before anything is created or written.
        self.offset_log: Path | None = (offset_log_dir(opts.checkpoint, opts.topic)
                                        if opts.stage_progress == STAGE_PROGRESS_OFFSET_LOG else None)
        # Micro-batches after the end this query wrote are let through. With stageProgress driver the query's id
        # is out of reach here (its checkpoint may be anywhere): its tasks compare theirs with the marker's.
        if opts.stage_progress == STAGE_PROGRESS_DRIVER:
            marker = run_status(opts)
        else:
            marker = refuse_ended(opts, query_id(opts.checkpoint))
        self.marker = marker
        self.ended = bool(marker and marker.get("ended"))
        self.ended_by: str | None = None if marker is None else marker.get("queryId")
        """The streaming query that wrote the run, when it has ended."""
        self.plan = plan_write(opts, schema)
        self.init_ms = round((time.monotonic() - made) * 1000, 1)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskCommit:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        assert ctx is not None
        batch = ctx.getLocalProperty(_BATCH_ID_PROPERTY)
        if batch is None or not batch.lstrip("-").isdigit():
            raise ControlMsgError(f"write to topic {self.plan.opts.topic!r}: the micro-batch id did not reach the "
                                  f"task (local property {_BATCH_ID_PROPERTY!r} is {batch!r})")
        if self.ended:  # a micro-batch after this query's end of stream (e.g. Spark's last no-data batch)
            if ctx.getLocalProperty(_QUERY_ID_PROPERTY) != self.ended_by:
                refuse_ended(self.plan.opts)
            if any(b.num_rows for b in iterator):
                raise ControlMsgError(f"topic {self.plan.opts.topic!r}: run {self.plan.opts.run_id!r} has ended; "
                                      f"micro-batch {batch} of the same query has rows after its end of stream")
            return TaskCommit(ctx.partitionId(), ctx.attemptNumber(), 0, None, True,
                              ctx.getLocalProperty(_QUERY_ID_PROPERTY), 0.0, query_run_of(ctx))
        began = time.monotonic()
        iterator, empty = rows_ahead(iterator)
        if empty and ctx.attemptNumber() == 0:
            # A first attempt with nothing to write leaves Kafka alone: no earlier attempt of this task in this
            # micro-batch can have an open transaction, and any of an earlier run of the query (a replayed
            # micro-batch) is fenced by the driver's commit (see commit).
            done = TaskCommit(ctx.partitionId(), 0, 0, None, False, ctx.getLocalProperty(_QUERY_ID_PROPERTY),
                              time.monotonic() - began, query_run_of(ctx), skipped=True)
        else:
            done = dataclasses.replace(write_task(self.plan, iterator, batch_id=int(batch),
                                                   query_id=ctx.getLocalProperty(_QUERY_ID_PROPERTY), stage=None),
                                       query_run=query_run_of(ctx))
        if self.plan.opts.log_phases:
            log_phase("write", self.plan.opts.topic, batch=int(batch), task=done.index, attempt=done.attempt,
                      ms=round((time.monotonic() - began) * 1000, 1), rows=done.rows, skipped=done.skipped)
        return done

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        began = time.monotonic()
        self._commit(messages, batchId)
        if self.plan.opts.log_phases:
            log_phase("commit", self.plan.opts.topic, batch=batchId, ms=round((time.monotonic() - began) * 1000, 1),
                      init_ms=self.init_ms, tasks=len(messages),
                      skipped=sum(1 for m in messages if isinstance(m, TaskCommit) and m.skipped))

    def _commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        opts = self.plan.opts
        # stageProgress eventTime: no offset log, so no stage watermark and no end by itself (end_stream);
        # stageProgress driver: the driver program writes both (controlmsg.spark.stage), this commit neither.
        stage = None if self.offset_log is None else stage_progress(self.offset_log, batchId, opts.topic)
        if stage is not None and self.offset_log is not None:  # Spark's watermark follows with_watermark's rows
            check_offset_log_follows(self.offset_log, batchId, stage, opts.topic)
        by_driver = opts.stage_progress == STAGE_PROGRESS_DRIVER
        if by_driver and self.ended:
            return  # the driver program's stage round ended the run; this micro-batch wrote nothing (its tasks said)
        # Ended input: a stateless stage ends with it; a stateful one once Spark's watermark is the end of time,
        # i.e. after the micro-batch that emitted its last windows (a plain input never gets there: end_stream).
        # Spark's watermark is 0 in a query's first micro-batch even when it has one: 0 says nothing for a
        # stateful query, which may emit its windows in the next micro-batch.
        ending = (stage is not None and stage.inputs_ended
                  and (stage.watermark == END_OF_TIME_MS or not stage.stateful))
        if not messages and not ending:
            return
        commits = task_commits(opts, messages) if messages else []
        query = commits[0].query_id if commits else None
        run = commits[0].query_run if commits else None
        top = max_time(commits) if commits else None
        followed = by_driver and run is not None and (self.marker or {}).get(FOLLOWED_RUN) == run
        if by_driver and run is not None and not followed:
            await_follower(opts, run)  # the first commit of this run of the query: is a driver following it?
        # ... and at every commit with records: is it still? (A Connect client can go while its query runs.)
        seen = (follower_seen(opts, run, batchId, (self.marker or {}).get(FOLLOWER_SEEN), int(time.time() * 1000))
                if by_driver and run is not None and commits else None)

        def plan(committed: dict[str, Any] | None) -> Round | None:
            """Decided after fencing, from what the last driver committed: its watermark is the floor."""
            previous: int | None = None
            if committed is not None:
                if committed.get("ended"):
                    return None  # nothing after the end (a later micro-batch of the query that ended it)
                if int(committed.get("batch", -1)) >= batchId and (not commits or committed.get("queryId") == query):
                    return None  # a replayed micro-batch: its round is in
                if not commits and committed.get("ended"):
                    return None
                if commits:
                    _check_same_stream(opts, committed, query)
                previous = committed.get("watermark")
            name, generation, switch = upstream_of(opts, committed)
            slots = int((committed or {}).get("taskSlots", (committed or {}).get("writeTasks", 0)) or 0)
            if commits and len(commits) < slots and (committed or {}).get("queryRun") != run:
                # The first micro-batch of a new start of the query, with fewer write tasks than the query had
                # (restarted with fewer after a kill -9, say): a task that will not run again under its id may
                # have left a transaction open, which would hold every read_committed reader of its partitions
                # back until the transaction's timeout. Fence those ids now.
                fence_transactions(dict(opts.config), [transactional_id(opts.topic, task_name(opts.job, opts.run_id, i))
                                                       for i in range(len(commits), slots)], opts.timeout)
                slots = len(commits)
            skipped = [c.index for c in commits if c.skipped]
            if skipped and (committed or {}).get("queryRun") != run:
                # The first micro-batch of a start of the query may replay one that an earlier start ran: its
                # tasks that skipped Kafka (no rows) did not fence what a killed attempt of theirs left open.
                fence_transactions(dict(opts.config), [transactional_id(opts.topic, task_name(opts.job, opts.run_id, i))
                                                       for i in skipped], opts.timeout)
            tops = [t for t in (top, (committed or {}).get("maxEventTime")) if t is not None]
            status = {"upstream": UPSTREAM_DRIVER, "taskCount": 1, "generation": generation, "batch": batchId,
                      "writeTasks": len(commits), "taskSlots": max(slots, len(commits)), "watermark": previous,
                      "queryId": query or (committed or {}).get("queryId"),
                      "queryRun": run or (committed or {}).get("queryRun"),
                      "maxEventTime": max(tops) if tops else None}
            if by_driver:  # the marker alone: the driver program's rounds take its maxEventTime
                return [], {**status, FOLLOWED_RUN: run or (committed or {}).get(FOLLOWED_RUN),
                            FOLLOWER_SEEN: seen or (committed or {}).get(FOLLOWER_SEEN)}
            if ending:
                return [EndOfStreamMessage(name, 1, opts.run_id, generation=generation)], {**status, "ended": True}
            mark = previous
            if stage is not None:
                candidate = stage.forwarded(top, opts.allowed_lateness_ms)
            else:  # stageProgress eventTime: the weaker rule
                candidate = None if top is None else WatermarkPolicy(opts.allowed_lateness_ms).watermark_for(top)
            if candidate is not None:
                mark = candidate if previous is None else max(previous, candidate)
            # A new generation's first round is written even at the same watermark: it replaces the old tasks.
            marks = ([] if mark is None or (mark == previous and not switch) else
                     [WatermarkMessage(name, 1, mark, opts.run_id, generation=generation)])
            return marks, {**status, "watermark": mark}

        write_control_round(dict(opts.config), opts.topic, self.plan.partitions, plan,
                            transactional_id=driver_transactional_id(opts.topic, opts.job, opts.run_id),
                            timeout=opts.timeout)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass


def _check_same_stream(opts: WriteOptions, marker: Mapping[str, Any], query: str | None) -> None:
    where = f"topic {opts.topic!r} run {opts.run_id!r}"
    if marker.get("ended"):
        raise ControlMsgError(f"{where} has already ended; a new stream needs a new runId")
    if marker.get("queryId") != query:
        raise ControlMsgError(f"{where} is written by streaming query {marker.get('queryId')}, not by this query "
                              f"{query}; a new query (a new checkpointLocation) needs a new runId")

