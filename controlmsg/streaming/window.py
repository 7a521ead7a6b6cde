"""The body of one long-running streaming window task (docs/STREAMING.md, first slice). Plain Python: it
runs inside a long-running Spark task (:mod:`controlmsg.streaming.runtime`), but needs no Spark.

:func:`run_window_task` owns ``partitions`` of ``input_topic`` and loops:

1. ``ControlReader.poll()``: user records (JSON ``{"key", "event_ms", ...}``) go into a
   :class:`~controlmsg.streaming.windows.TumblingWindows`; a record whose window the reconciled watermark has
   already closed goes to ``late_topic`` instead (plain JSON, not an envelope: the record's fields plus
   ``watermark``, ``window_start``, ``reason``, ``upstream_task`` and ``upstream_partition``; its origin
   in ``controlmsg-late-*`` headers too: input topic, partition, offset and upstream task).
2. On every ``WatermarkAdvanced(ts)``: the windows it closes are written to ``output_topic`` as
   ``{"key", "window_start", "window_end", "count", "sum_<c>"...}`` keyed by the window key, then the
   task's own watermark ``ts`` goes to every output partition.
3. As soon as a watermark has closed windows, and otherwise every ``commit_interval_s``: one Kafka
   transaction commits the output and late records written since the last commit together with the
   task's **state** in the compacted ``state_topic``: a record per window changed since the last commit,
   a tombstone per window closed since, then the **header record** keyed ``f"{run_id}/{task_index}"``
   (input offsets, the reader's bookkeeping snapshot, the windows' watermark and counters, the output
   watermark, counters); see :mod:`controlmsg.streaming.window_state` (the records) and
   :mod:`controlmsg.streaming.state_topic` (writing and reading them). A restart folds the committed records
   of its state partition back into that state; whatever an interrupted task wrote after its last
   commit is aborted (or fenced by the next task's ``init_transactions``), so nothing is written twice
   and the output watermark never goes back.
4. At end of stream: close every window, write the results and the task's end of stream, commit the final
   state, return a :class:`TaskSummary`.

The state records of task ``i`` go to partition ``i mod N`` of the state topic (``N`` its partition
count), so a restarting task reads one partition only.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson

from controlmsg.core.codec import decode_json_payload
from controlmsg.core.events import StreamEnded, WatermarkAdvanced
from controlmsg.core.naming import task_name, transactional_id
from controlmsg.core.progress import upstream_progress
from controlmsg.errors import CheckpointError, DecodeError
from controlmsg.kafka.admin import wait_for_topic
from controlmsg.kafka.checkpoint import Checkpoint
from controlmsg.kafka.data_records import DataRecord
from controlmsg.kafka.periodic_log import Progress
from controlmsg.kafka.reader import ControlReader
from controlmsg.kafka.writer import ControlWriter
from controlmsg.metrics.server import Reporter
from controlmsg.streaming.heap import release_free_heap, rss_bytes
from controlmsg.streaming.state_topic import read_task_state, state_key, state_topic_config, write_task_state
from controlmsg.streaming.task_metrics import WINDOW_STAGE, window_samples
from controlmsg.streaming.window_state import STATE_FORMAT, TaskStateLog
from controlmsg.streaming.windows import LateRecord, TumblingWindows, WindowResult

# The state topic's names stay importable from here (docs/STREAMING.md names them with this module).
__all__ = [
    "HEADER_LATE_OFFSET",
    "HEADER_LATE_PARTITION",
    "HEADER_LATE_REASON",
    "HEADER_LATE_TASK",
    "HEADER_LATE_TOPIC",
    "LATE_REASON",
    "STATE_FORMAT",
    "TaskSummary",
    "read_task_state",
    "run_window_task",
    "state_key",
    "state_topic_config",
    "write_task_state",
]

LATE_REASON: Final = "behind the watermark"
HEADER_LATE_REASON: Final = "controlmsg-late-reason"
HEADER_LATE_TOPIC: Final = "controlmsg-late-topic"
HEADER_LATE_PARTITION: Final = "controlmsg-late-partition"
HEADER_LATE_OFFSET: Final = "controlmsg-late-offset"
HEADER_LATE_TASK: Final = "controlmsg-late-upstream-task"
_TRIM_LOGGED_BYTES: Final = 16 << 20
"""A heap trim that lowers the RSS by at least this much is logged (it follows a peak: restore, catch-up)."""


@dataclass(frozen=True, slots=True)
class TaskSummary:
    """What a window task did, counted over the whole run (across restarts: the counters are part of the
    committed state). ``ended``: the task reached end of stream (else it was stopped or timed out).
    ``watermark``: the last watermark the task wrote to its output (``None``: none yet). ``resumed``:
    this call started from a committed state record."""

    records: int
    late: int
    rejected: int
    windows_emitted: int
    watermark: int | None
    ended: bool
    resumed: bool
    commits: int


def _result_value(r: WindowResult) -> dict[str, Any]:
    value: dict[str, Any] = {"key": r.key, "window_start": r.start, "window_end": r.end, "count": r.count}
    for field, total in r.sums:
        value[f"sum_{field}"] = total
    return value


class _Task:
    """The state of one running window task; :func:`run_window_task` drives it."""

    def __init__(self, config: Mapping[str, Any], *, input_topic: str, partitions: list[int], run_id: str,
                 output_topic: str, late_topic: str, state_topic: str, task_index: int, task_count: int,
                 window_ms: int, sums: Sequence[str], group_id: str | None = None) -> None:
        self.input_topic = input_topic
        self.group_id = group_id
        self.partitions = sorted(partitions)
        self.run_id = run_id
        self.late_topic = late_topic
        self.state_topic = state_topic
        self.task_index = task_index
        self.key = state_key(run_id, task_index)
        self.records = 0
        self.rejected = 0
        self.windows_emitted = 0
        self.commits = 0
        self.output_watermark: int | None = None
        # The writer first: init_transactions fences a previous instance of this task and aborts its open
        # transaction, so the state read next is the last one that really committed.
        self.writer = ControlWriter(
            {**config, "transactional.id": transactional_id(output_topic, task_name("window", run_id, task_index))},
            output_topic,
            task_name=task_name("window", run_id, task_index),
            task_count=task_count,
            run_id=run_id,
        )
        try:
            self.state_partition = task_index % wait_for_topic(config, state_topic)
            log = read_task_state(config, state_topic, run_id, task_index)
            self.resumed = log is not None
            if log is None:
                self.windows = TumblingWindows(window_ms, sums)
                self.reader = ControlReader(config, input_topic, partitions=self.partitions, run_id=run_id,
                                            group_id=group_id)
            else:
                state = log.header
                assert state is not None  # read_task_state returns a log with a header only
                self.windows = self._restore(state, log, window_ms, sums)
                self.reader = self._resumed_reader(config, state)
            self.committed_positions = self.reader.positions
        except BaseException:
            self._abandon()
            raise
        self.trim_heap("after the restore")

    # ------------------------------------------------------------------ restore

    def _restore(self, state: Mapping[str, Any], log: TaskStateLog, window_ms: int,
                 sums: Sequence[str]) -> TumblingWindows:
        if state.get("inputTopic") != self.input_topic or state.get("partitions") != self.partitions:
            raise CheckpointError(
                f"state {self.key!r} is for topic {state.get('inputTopic')!r} partitions {state.get('partitions')}, "
                f"not topic {self.input_topic!r} partitions {self.partitions}: the partition grouping is part of "
                "the checkpoint"
            )
        windows = log.windows(window_ms, sums)
        counters = state.get("counters", {})
        self.records = int(counters.get("records", 0))
        self.rejected = int(counters.get("rejected", 0))
        self.windows_emitted = int(counters.get("windowsEmitted", 0))
        self.commits = int(counters.get("commits", 0))
        wm = state.get("emitted_watermark")
        self.output_watermark = None if wm is None else int(wm)
        return windows

    def _resumed_reader(self, config: Mapping[str, Any], state: Mapping[str, Any]) -> ControlReader:
        checkpoint = Checkpoint(
            self.input_topic,
            {int(p): int(o) for p, o in state["offsets"].items()},
            dict(state["bookkeeping"]),
        )
        return ControlReader(config, self.input_topic, partitions=self.partitions, run_id=self.run_id,
                             resume_from=checkpoint, group_id=self.group_id)

    def trim_heap(self, when: str) -> None:
        """Give the C heap's free pages back (:func:`~controlmsg.streaming.heap.release_free_heap`): a restore
        and a catch-up read far more at once than the steady state, and glibc keeps in its arenas what they
        freed wherever a chunk still in use sits above it, so without this a restarted task settles higher
        than a fresh one (docs/SOAK.md). Logs the RSS it returned when that is large."""
        before = rss_bytes()
        if not release_free_heap() or before is None:
            return
        after = rss_bytes()
        if after is not None and before - after >= _TRIM_LOGGED_BYTES:
            print(f"{time.strftime('%H:%M:%S')} stream_window task {self.task_index}: {when}, returned "
                  f"{(before - after) >> 20} MB of free heap (RSS {before >> 20} -> {after >> 20} MB)",
                  file=sys.stderr, flush=True)

    # ------------------------------------------------------------------ writing

    def emit(self, results: list[WindowResult]) -> None:
        for r in results:
            self.writer.send(_result_value(r), key=r.key)
        self.windows_emitted += len(results)

    def on_record(self, record: DataRecord) -> None:
        """Window one record. A record that is not a JSON object with ``key`` and ``event_ms`` (or whose key,
        event time or a sum field the windows refuse, :meth:`TumblingWindows.check`) is not dropped and does
        not stop the task: it goes, unchanged, to the side topic with the reason in a header, in the same
        transaction, and is counted as rejected. Anything that goes wrong after the record passed those
        checks is this code's fault, not the record's: it propagates (the task aborts and fails), with a
        note naming the task and the record's topic, partition and offset."""
        try:
            value = decode_json_payload(record.payload)
        except DecodeError as exc:
            self._send_rejected(record, f"malformed record: {exc.reason}")
            return
        problem = self._problem(value)
        if problem is not None:
            self._send_rejected(record, f"malformed record: {problem}")
            return
        try:
            late = self.windows.add(value["key"], value["event_ms"], value)
        except Exception as exc:
            exc.add_note(f"window task {self.task_index} ({self.key!r}) failed on the valid record at topic "
                         f"{self.input_topic!r} partition {record.partition} offset {record.offset}: an internal "
                         "error, not a malformed record")
            raise
        self.records += 1
        if late is not None:
            self._send_late(record, value, late)

    def _problem(self, value: Any) -> str | None:
        """Why the decoded record ``value`` cannot be windowed (``None``: it can)."""
        if not isinstance(value, dict):
            return f"a record must be a JSON object with key and event_ms, got {value!r:.80}"
        for field in ("key", "event_ms"):
            if field not in value:
                return f"a record must be a JSON object with key and event_ms, {field!r} is missing: {value!r:.80}"
        return self.windows.check(value["key"], value["event_ms"], value)

    def _send_rejected(self, record: DataRecord, reason: str) -> None:
        self.writer.produce_to(self.late_topic, record.payload, record.key, -1, self._origin(record, reason))
        self.rejected += 1

    def _origin(self, record: DataRecord, reason: str,
                task: str | None = None) -> list[tuple[str, str | bytes | None]]:
        """The side-topic headers of ``record``: why it is there, and where it came from (input topic,
        partition, offset, and the upstream task that wrote it when its headers say so)."""
        headers: list[tuple[str, str | bytes | None]] = [
            (HEADER_LATE_REASON, reason.encode()),
            (HEADER_LATE_TOPIC, self.input_topic.encode()),
            (HEADER_LATE_PARTITION, str(record.partition).encode()),
            (HEADER_LATE_OFFSET, str(record.offset).encode()),
        ]
        task = task or record.upstream_task
        if task is not None:
            headers.append((HEADER_LATE_TASK, task.encode()))
        return headers

    def _send_late(self, record: DataRecord, value: dict[str, Any], late: LateRecord) -> None:
        task = record.upstream_task
        body = {**value, "watermark": late.watermark, "window_start": late.window_start, "reason": LATE_REASON,
                "upstream_task": task, "upstream_partition": record.partition}
        self.writer.produce_to(self.late_topic, orjson.dumps(body), record.key, -1,
                               self._origin(record, LATE_REASON, task))

    def on_watermark(self, ts: int) -> bool:
        """Close the windows ``ts`` passes, write them and the task's own watermark. Returns whether any
        window closed (then the caller commits at once: results become readable one commit later)."""
        closed = self.windows.advance(ts)
        self.emit(closed)
        if self.output_watermark is None or ts > self.output_watermark:
            self.writer.send_watermark(ts)
            self.output_watermark = ts
        return bool(closed)

    def commit(self) -> None:
        """Add the state (the windows changed since the last commit, then the header) to the open
        transaction and commit it with everything written since."""
        header = {
            "inputTopic": self.input_topic,
            "partitions": self.partitions,
            "offsets": {str(p): o for p, o in sorted(self.reader.positions.items())},
            "bookkeeping": self.reader.tracker.snapshot(),
            "emitted_watermark": self.output_watermark,
            "counters": {"records": self.records, "rejected": self.rejected, "windowsEmitted": self.windows_emitted,
                         "commits": self.commits + 1},
        }
        write_task_state(self.writer, self.state_topic, self.state_partition, self.run_id, self.task_index, header,
                         self.windows)
        self.writer.commit()
        self.windows.mark_committed()
        self.commits += 1
        self.committed_positions = self.reader.positions
        self.reader.report_progress()  # with a group: the offsets just committed, for lag tools

    @property
    def dirty(self) -> bool:
        """True when input was read since the last commit (else a commit would only repeat the state)."""
        return self.reader.positions != self.committed_positions

    def report(self, reporter: Reporter | None) -> None:
        """Send the task's metrics (:func:`~controlmsg.streaming.task_metrics.window_samples`) through
        ``reporter``, if any."""
        if reporter is not None:
            reporter.report(window_samples(
                self.task_index, self.input_topic, self.writer.topic, upstream_progress(self.reader.tracker),
                lag=self.reader.lag(), records=self.records, late=self.windows.late_count,
                output_watermark=self.output_watermark))

    def summary(self) -> TaskSummary:
        return TaskSummary(
            records=self.records,
            late=self.windows.late_count,
            rejected=self.rejected,
            windows_emitted=self.windows_emitted,
            watermark=self.output_watermark,
            ended=self.reader.tracker.is_ended,
            resumed=self.resumed,
            commits=self.commits,
        )

    # ------------------------------------------------------------------ ending

    def close(self) -> None:
        """After a final commit: end the (empty) open transaction and leave the input."""
        try:
            self.writer.close()
        finally:
            self.reader.close()

    def _abandon(self) -> None:
        """On failure: abort what was written since the last commit. Never raises (the original error is what
        matters); a failed abort fences the task's transactional id, or is logged naming it and the topic
        (:meth:`ControlWriter.abort_or_fence`): an open transaction would hold the readers of the output, late
        and state topics back until it timed out or the task started again."""
        self.writer.abort_or_fence(10.0)
        reader = getattr(self, "reader", None)
        if reader is not None:
            reader.close()

    def abandon(self) -> None:
        self._abandon()


def run_window_task(
    config: Mapping[str, Any],
    *,
    input_topic: str,
    partitions: list[int],
    run_id: str,
    output_topic: str,
    late_topic: str,
    state_topic: str,
    task_index: int,
    task_count: int,
    window_ms: int,
    sums: Sequence[str],
    commit_interval_s: float = 1.0,
    stop: Callable[[], bool] | None = None,
    timeout_s: float | None = None,
    metrics_url: str | None = None,
    group_id: str | None = None,
) -> TaskSummary:
    """Run window task ``task_index`` of ``task_count`` over ``partitions`` of ``input_topic`` until end of
    stream, ``stop()`` returns true, or ``timeout_s`` passes (the last two commit the state first).

    Resumes from the task's latest committed state record in ``state_topic`` when there is one. ``config``:
    librdkafka settings for the reader and the writer (``bootstrap.servers`` at least; the writer adds its
    ``transactional.id``). ``sums``: the fields summed per window. A failure aborts the open transaction and
    raises; a restart then resumes at the last commit. ``metrics_url``: the job's metrics endpoint
    (:func:`~controlmsg.streaming.task_metrics.serve_job_metrics`), which the task reports its samples to with
    each progress line and when it returns (a report that fails never fails the task). ``group_id``: a
    consumer group that each commit also reports the task's input offsets to, for lag tools
    (:meth:`~controlmsg.kafka.reader.ControlReader.report_progress`; a refusal fails the task like any error).
    """
    task = _Task(config, input_topic=input_topic, partitions=partitions, run_id=run_id, output_topic=output_topic,
                 late_topic=late_topic, state_topic=state_topic, task_index=task_index, task_count=task_count,
                 window_ms=window_ms, sums=sums, group_id=group_id)
    reporter = None if metrics_url is None else Reporter(
        metrics_url, [WINDOW_STAGE, str(task_index)], f"stream_window task {task_index}")
    try:
        if task.reader.tracker.is_ended:  # the final state was committed: end of stream is already written
            summary = task.summary()
            task.report(reporter)
            task.close()
            return summary
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        next_commit = time.monotonic() + commit_interval_s
        progress = Progress(f"stream_window task {task_index}")
        while True:
            if progress.due():
                progress.upstream(task.reader.tracker, task.records,
                                  f"{task.windows.open_windows:,} open windows, {task.windows.late_count:,} late, "
                                  f"{task.windows_emitted:,} emitted, {task.commits} commits")
                task.report(reporter)
                task.trim_heap("at a progress line")
            if (stop is not None and stop()) or (deadline is not None and time.monotonic() >= deadline):
                if task.dirty:
                    task.commit()
                break
            items = task.reader.poll(max(0.0, min(0.1, next_commit - time.monotonic())))
            ended = closed = False
            for item in items:
                if isinstance(item, DataRecord):
                    task.on_record(item)
                elif isinstance(item, WatermarkAdvanced):
                    closed = task.on_watermark(item.timestamp) or closed
                elif isinstance(item, StreamEnded):
                    ended = True
            if ended:
                task.emit(task.windows.close_all())
                task.writer.send_end_of_stream()
                task.commit()
                break
            if closed or time.monotonic() >= next_commit:  # closed windows are published without waiting
                if task.dirty:
                    task.commit()
                next_commit = time.monotonic() + commit_interval_s
    except BaseException:
        task.abandon()
        raise
    summary = task.summary()
    task.report(reporter)
    task.close()
    return summary
