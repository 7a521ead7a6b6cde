"""The body of one streaming ingest task: raw source partitions -> the intermediate topic, exactly once.

The streaming pipeline's ingest (see docs/STREAMING.md); it runs as plain Python, and inside a
long-running Spark task (:mod:`controlmsg.streaming.runtime`; the example job `spark_jobs.runtime.ingest`).
One task owns some partitions of the raw source topic (JSON objects with the fields a file input has) and
is one upstream task of the intermediate topic:

* each source record becomes ``{"key", "event_ms", <carried fields>}`` keyed by the key field; a record
  with a null key or an unparseable event time goes to the rejects topic with the reason and its source
  partition and offset in headers (never dropped), in the same transaction;
* every ``watermark_interval_s`` it writes its watermark (the minimum over its source partitions of the
  largest event time read from each, minus the allowed lateness; only when that rose) and commits ONE
  Kafka transaction holding the records written since the last commit, that watermark, and the source
  offsets (``send_offsets_to_transaction`` to the run's source group, :func:`source_group`, with each
  partition's largest event time and the task's last watermark, layout and generation in the offset
  metadata). A restart resumes from the committed offsets and state: nothing twice, nothing lost, the
  watermark never goes back;
* **rescaling** (docs/PROTOCOL.md, "Generations"): the state that matters across a change of the task
  layout (``--tasks``, or partitions added to the source) is per source partition: its offset and largest
  event time. :func:`plan_generation` tells a restart with another layout from one with the same; a new
  layout runs as the next generation, whose tasks take each source partition's offset and largest event
  time from whichever task of an older generation committed it, and start their watermarks, idleness
  and counters afresh;
* with ``until`` (end offsets taken at start: ``--until-source-end``), it writes its end of stream once
  its source partitions reach them, commits and returns;
* **idleness** (docs/PROTOCOL.md, "Idle upstream tasks"): a source partition that has given no record for
  ``idle_timeout_s`` and whose position is at its end is *idle* and leaves the task's minimum (a quiet
  partition must not hold the task back). When all of the task's partitions that have not ended are
  idle, the task sends an *idle* watermark (its last watermark again, with the idle flag) so downstream
  leaves it out of their minimum too; the first record it reads afterwards is preceded by its last
  watermark without the flag, so it counts again from that record on. Records of a partition that was
  idle and are older than what was promised meanwhile are late downstream (counted there, in the late
  topic), never dropped here.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final, cast

import orjson
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from controlmsg.core.naming import task_name, transactional_id
from controlmsg.core.progress import format_duration, format_timestamp
from controlmsg.core.watermarks import WatermarkPolicy
from controlmsg.errors import ReadError
from controlmsg.kafka.periodic_log import Progress
from controlmsg.kafka.retry import ConsumerErrors, retrying
from controlmsg.kafka.settings import for_client
from controlmsg.kafka.writer import ControlWriter
from controlmsg.metrics.server import Reporter
from controlmsg.streaming.ingest_state import IngestState, PartitionTurns, TokenBucket, ended_partitions
from controlmsg.streaming.task_metrics import INGEST_STAGE, ingest_samples

__all__ = ["IngestSummary", "committed_source_state", "parse_event_time", "plan_generation", "run_ingest_task",
           "source_group"]

READ_AHEAD: Final = 20_000
"""How many source records a task reads ahead of what it writes, to hand its partitions' records out in turns
(:class:`~controlmsg.streaming.ingest_state.PartitionTurns`): a full fetch of about 1 MB from each of four
partitions of 200-byte records."""
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_DIGITS: Final = re.compile(r"^-?\d+$")


def parse_event_time(value: Any) -> int | None:
    """Event time in epoch ms, by the same rules as the batch ingest: an integer of epoch ms (number or
    string of digits), an ISO-8601 string with a zone, or ``YYYY-MM-DD HH:MM:SS`` taken as UTC. ``None``
    when it cannot be parsed."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    if not isinstance(value, str):
        return None
    text = value.strip()
    if _DIGITS.match(text):
        return int(text)
    if len(text) < 19 or text[4] != "-" or text[10] not in " T":
        return None
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return (parsed - _EPOCH) // timedelta(milliseconds=1)


@dataclass(frozen=True)
class IngestSummary:
    """What an ingest task did over the whole run, across restarts (the counters are committed with the
    source offsets): records written, rejects, its last watermark, whether it wrote its end of stream,
    transactions committed, and how often it went idle."""

    records: int
    rejects: int
    watermark: int | None
    ended: bool
    commits: int
    idle_periods: int = 0
    ended_at: float | None = None
    """Epoch seconds when the transaction holding the end of stream committed (``None``: not in this call)."""
    generation: int = 0
    """The generation of upstream tasks the task ran in (counters count from its start)."""


def source_group(output_topic: str, run_id: str) -> str:
    """The consumer group every ingest task of run ``run_id`` writing ``output_topic`` commits its source
    offsets and per-partition state to, in each transaction. One for the run, not one per task: a source
    partition's state does not depend on which task read it, so another task layout finds it there."""
    return f"controlmsg-{output_topic}-ingest-{run_id}-source"


def committed_source_state(config: Mapping[str, Any], source_topic: str, group: str,
                           partitions: Sequence[int], timeout: float = 30.0) -> dict[int, dict[str, Any]]:
    """The offset metadata (parsed) of each of ``partitions`` that has a committed offset in ``group``: what
    the last committed transactions left. Offsets a transaction still open would commit are not waited
    for (a task killed mid-transaction leaves one open until its id is fenced, which needs this answer
    first); they never count, as that transaction is aborted before any task reads its offsets. Raises
    :class:`ReadError` on Kafka errors."""
    consumer = Consumer({**for_client(config, "consumer"), "group.id": group, "enable.auto.commit": False,
                         "isolation.level": "read_uncommitted"})  # librdkafka: no require_stable
    try:
        # A group coordinator still loading (a fresh cluster's offsets topic) answers NOT_COORDINATOR: ask again.
        wanted = [TopicPartition(source_topic, p) for p in partitions]
        found = retrying(lambda: consumer.committed(wanted, timeout=timeout), timeout=timeout)
    except KafkaException as exc:
        raise ReadError(f"reading the committed offsets of group {group!r} on {source_topic!r}: "
                        f"{exc.args[0]}") from exc
    finally:
        consumer.close()
    return {tp.partition: (orjson.loads(tp.metadata) if tp.metadata else {}) for tp in found if tp.offset >= 0}


def plan_generation(states: Mapping[int, Mapping[str, Any]],
                    groups: Sequence[Sequence[int]]) -> tuple[int, int | None]:
    """Which generation a start with the task layout ``groups`` (task *i* reads source partitions
    ``groups[i]``) runs as, given :func:`committed_source_state`. Pure.

    Returns ``(generation, retired)``. Nothing committed yet: ``(0, None)``. The layout of the newest
    generation committed: that generation again, ``None`` (a plain restart). Another layout: the next
    generation and the task count of the newest one, whose transactional ids must be fenced
    (:func:`~controlmsg.kafka.writer.fence_transactions`) before the new tasks write.
    """
    if not states:
        return 0, None
    newest = max(int(state.get("generation", 0)) for state in states.values())
    layout = {p: sorted(group) for group in groups for p in group}
    same, count = True, None
    for p, state in states.items():
        if int(state.get("generation", 0)) != newest:
            continue
        count = int(state.get("taskCount", len(groups)))
        same = same and count == len(groups) and sorted(state.get("partitions", ())) == layout.get(p)
    return (newest, None) if same else (newest + 1, count)


def run_ingest_task(
    config: Mapping[str, Any],
    *,
    source_topic: str,
    source_partitions: Sequence[int],
    output_topic: str,
    rejects_topic: str,
    run_id: str,
    task_index: int,
    task_count: int,
    key_field: str,
    event_time_field: str,
    carry: Sequence[str] = (),
    allowed_lateness_ms: int = 0,
    watermark_interval_s: float = 1.0,
    until: Mapping[int, int] | None = None,
    stop: Callable[[int], bool] | None = None,
    idle_timeout_s: float | None = 10.0,
    max_rate: float | None = None,
    generation: int = 0,
    metrics_url: str | None = None,
) -> IngestSummary:
    """Run the task until its source partitions reach ``until`` (then end its stream) or
    ``stop(records_written_so_far)`` is true (then commit and return without ending). Blocks. Raises
    ReadError/DeliveryError on Kafka errors; an uncommitted transaction is then aborted by the next start
    of the same task (same transactional id). ``idle_timeout_s``: how long a source partition at its end
    may give nothing before it counts as idle (``None``: never). ``max_rate``: read at most this many
    source records per second (to replay a backlog without flooding the next job; ``None``: no limit).
    The watermark is :meth:`WatermarkPolicy.watermark_for` of the task's progress; a negative
    ``allowed_lateness_ms`` is a ValueError. ``generation``: what :func:`plan_generation` decided for
    this layout; a source partition committed by a newer generation is a :class:`CheckpointError`.
    ``metrics_url``: the job's metrics endpoint (:func:`~controlmsg.streaming.task_metrics.serve_job_metrics`),
    which the task reports its samples to with each progress line and when it returns (a report that fails
    never fails the task).
    """
    policy = WatermarkPolicy(allowed_lateness_ms=allowed_lateness_ms)  # validates before anything opens
    group = source_group(output_topic, run_id)
    name = task_name("ingest", run_id, task_index)
    consumer = Consumer({**for_client(config, "consumer"), "group.id": group, "enable.auto.commit": False,
                         "isolation.level": "read_committed", "auto.offset.reset": "earliest"})
    writer = ControlWriter({**config, "transactional.id": transactional_id(output_topic, name)}, output_topic,
                           task_name=name, task_count=task_count, run_id=run_id, generation=generation,
                           data_headers=True)  # the run and task on each record: late records can name their task
    try:
        wanted = [TopicPartition(source_topic, p) for p in source_partitions]
        committed = retrying(lambda: consumer.committed(wanted, timeout=30), timeout=60)  # as in committed_source_state
        state = IngestState.restore(committed, source_topic=source_topic, source_partitions=source_partitions,
                                    run_id=run_id, task_index=task_index, task_count=task_count,
                                    generation=generation)
        if state.ended:  # a restart after the end: everything is committed, nothing is written again
            writer.close()
            return IngestSummary(state.records, state.rejected, state.last_mark, True, state.commits,
                                 state.idle_periods, generation=generation)
        consumer.assign([TopicPartition(source_topic, p, o) for p, o in state.positions.items()])
        task = _IngestLoop(consumer, writer, policy, state, source_topic=source_topic, rejects_topic=rejects_topic,
                           key_field=key_field, event_time_field=event_time_field, carry=carry, until=until,
                           idle_timeout_s=idle_timeout_s, task_count=task_count, generation=generation,
                           reporter=None if metrics_url is None else Reporter(
                               metrics_url, [INGEST_STAGE, str(task_index)], f"stream_ingest task {task_index}"))
        return task.run(stop, max_rate, watermark_interval_s, task_index)
    except KafkaException as exc:
        raise ReadError(f"ingest task {task_index} of {source_topic!r}: {exc.args[0]}") from exc
    finally:
        consumer.close()


@dataclass
class _IngestLoop:
    """The I/O of one ingest task from its restore to its return: reads the source, writes each record, or
    its reject, and commits every ``watermark_interval_s``; what it keeps is :class:`IngestState`'s, which
    decides the watermarks and the committed metadata."""

    consumer: Consumer
    writer: ControlWriter
    policy: WatermarkPolicy
    state: IngestState
    source_topic: str
    rejects_topic: str
    key_field: str
    event_time_field: str
    carry: Sequence[str]
    until: Mapping[int, int] | None
    idle_timeout_s: float | None
    task_count: int
    generation: int
    reporter: Reporter | None = None

    def run(self, stop: Callable[[int], bool] | None, max_rate: float | None, watermark_interval_s: float,
            task_index: int) -> IngestSummary:
        """Loop until the input ends (``until``) or ``stop(records)``, then commit, close the writer and
        return the summary. Blocks; raises what the reads, writes and commits raise."""
        state, until = self.state, self.until
        state.last_seen = dict.fromkeys(state.positions, time.monotonic())
        next_commit = time.monotonic() + watermark_interval_s
        bucket = TokenBucket(max_rate, time.monotonic()) if max_rate is not None else None
        turns: PartitionTurns[Any] = PartitionTurns(READ_AHEAD)
        lines = Progress(f"stream_ingest task {task_index}")
        errors = ConsumerErrors()
        while True:
            if lines.due():
                lines.log(_progress_line(state.records, lines.rate(state.records), state.rejected, state.last_mark,
                                         state.idle, state.commits, state.positions, until))
                self._report(task_index)
            done = until is not None and all(state.positions[p] >= until.get(p, 0) for p in state.positions)
            stopping = done or (stop is not None and stop(state.records))
            batch = 1000
            if bucket is not None and not stopping:
                pause = bucket.refill(time.monotonic())
                if pause is not None:
                    time.sleep(pause)
                    continue
                batch = bucket.batch(batch)
            msgs = [] if stopping else self._read(turns, batch, next_commit)
            if bucket is not None:
                bucket.take(len(msgs))
            now = time.monotonic()
            self._write(msgs, now, errors)
            if stopping or time.monotonic() >= next_commit:
                self._commit(now, done)
                next_commit = time.monotonic() + watermark_interval_s
                if stopping:
                    self.writer.close()
                    self._report(task_index)
                    return IngestSummary(state.records, state.rejected, state.last_mark, state.ended, state.commits,
                                         state.idle_periods, time.time() if state.ended else None, self.generation)

    def _report(self, task_index: int) -> None:
        """Send the task's metrics (:func:`~controlmsg.streaming.task_metrics.ingest_samples`), if it has a
        reporter. The lag is each source partition's end as librdkafka last fetched it (or ``until``, the
        end taken at start) minus the next offset to read; no request is made."""
        if self.reporter is None:
            return
        state, behind = self.state, []
        for p, position in state.positions.items():
            end = self.until.get(p, 0) if self.until is not None else None
            if end is None:
                try:
                    end = self.consumer.get_watermark_offsets(TopicPartition(self.source_topic, p), cached=True)[1]
                except KafkaException:
                    continue
            if end >= 0:
                behind.append(max(end - position, 0))
        self.reporter.report(ingest_samples(task_index, self.source_topic, self.writer.topic,
                                            lag=max(behind) if behind else None, records=state.records,
                                            output_watermark=state.last_mark))

    def _read(self, turns: PartitionTurns[Any], count: int, next_commit: float) -> list[Any]:
        """Up to ``count`` records, an equal share from each source partition that has any
        (:class:`PartitionTurns`), after the consumer's errors and events; tops the queue up first, waiting
        for records only while it is empty, and never past ``next_commit``."""
        room = turns.room()
        if room == 0:
            return turns.take(count)
        wait = 0.0 if turns.size else max(0.0, min(0.1, next_commit - time.monotonic()))
        read = cast(list[Any], self.consumer.consume(min(1000, room), wait))
        events = [msg for msg in read if msg.error() is not None]
        turns.add((msg.partition(), msg) for msg in read if msg.error() is None)
        return [*events, *turns.take(count)]

    def _write(self, msgs: list[Any], now: float, errors: ConsumerErrors) -> None:
        """Each record of ``msgs`` (read at ``now``) to the output topic, or to the rejects topic with the
        reason and its source partition and offset; records past ``until`` are skipped. Raises ReadError for
        a consumer error that does not pass."""
        state, until, writer = self.state, self.until, self.writer
        for msg in msgs:
            if msg.error() is not None:
                if msg.error().code() == KafkaError._PARTITION_EOF or errors.passes(msg.error(), msg.partition()):
                    continue
                raise ReadError(f"reading {self.source_topic!r} partition {msg.partition()}: {msg.error()}")
            p, off = msg.partition(), msg.offset()
            if until is not None and off >= until.get(p, 0):
                continue  # beyond the end taken at start: not this run's input
            back = state.read(p, off, now)
            if back is not None:  # back from idle: count again from here on (the promise stays what it was)
                writer.send_watermark(back)
            reason, out = _convert(msg.value(), self.key_field, self.event_time_field, self.carry)
            if out is None:
                writer.produce_to(self.rejects_topic, msg.value() or b"", msg.key(), headers=[
                    ("controlmsg-reject-reason", reason.encode()), ("controlmsg-source-partition", str(p).encode()),
                    ("controlmsg-source-offset", str(off).encode())])
                state.rejected += 1
                continue
            state.saw_event(p, out["event_ms"])
            writer.send(out, out["key"])
            state.records += 1

    def _commit(self, now: float, done: bool) -> None:
        """One transaction: the watermark :meth:`IngestState.watermark` decides (idle partitions: quiet since
        ``idle_timeout_s`` before ``now`` and at their end), the end of stream when the input is ``done``,
        and the source offsets with the task's state in their metadata."""
        state, writer = self.state, self.writer
        idle = set() if self.idle_timeout_s is None else {
            q for q in state.quiet(now, self.idle_timeout_s)
            if _at_end(self.consumer, self.source_topic, q, state.positions[q])}
        mark = state.watermark(self.policy, self.until, idle, done)
        if mark is not None:
            writer.send_watermark(mark[0], idle=mark[1])
        if done:
            writer.send_end_of_stream()
            state.ended = True
        offsets = [TopicPartition(self.source_topic, q, o, metadata=state.metadata(q, self.task_count, self.generation))
                   for q, o in state.positions.items()]
        writer.send_offsets_to_transaction(offsets, self.consumer.consumer_group_metadata())
        writer.commit()
        state.commits += 1


def _progress_line(records: int, rate: float | None, rejected: int, mark: int | None, idle: bool, commits: int,
                   positions: Mapping[int, int], until: Mapping[int, int] | None) -> str:
    """What an ingest task has done, for a person: records written and their rate, rejects, its watermark
    and the lag behind the wall clock, idleness, commits, and the source partitions that reached the end."""
    line = f"{records:,} records" + (f" ({rate:,.0f}/s)" if rate is not None else "") + f", {rejected:,} rejected"
    if mark is None:
        line += ", no watermark yet"
    else:
        line += (f", watermark {format_timestamp(mark)} (lag {format_duration(time.time() - mark / 1000)})"
                 + (" idle" if idle else ""))
    line += f", {commits} commits"
    if until is not None:
        line += f", {len(ended_partitions(positions, until))} of {len(positions)} source partitions at their end"
    return line


def _at_end(consumer: Consumer, topic: str, partition: int, position: int) -> bool:
    """Whether ``position`` is at the partition's end: librdkafka's high watermark as last fetched, or,
    when the partition has not been fetched yet, as its leader says now. Not at the end when that cannot
    be had: a partition is idle only when it is known to hold nothing more.

    Why ask rather than take "never fetched" for "at the end" (as before): a task paced by ``max_rate``
    on skewed partitions drains librdkafka's queue, full of one big partition's records, so slowly that
    another partition may not be fetched for longer than the idle timeout; taken for idle, every record
    it then gives that is older than the watermark the others reached would be late."""
    tp = TopicPartition(topic, partition)
    try:
        _, high = consumer.get_watermark_offsets(tp, cached=True)
        if high < 0:
            _, high = consumer.get_watermark_offsets(tp, timeout=5.0)
    except KafkaException:
        return False
    return high >= 0 and position >= high


def _convert(value: bytes | None, key_field: str, event_time_field: str,
             carry: Sequence[str]) -> tuple[str, dict[str, Any] | None]:
    try:
        doc = orjson.loads(value or b"")
    except orjson.JSONDecodeError as exc:
        return f"not JSON: {exc}", None
    if not isinstance(doc, dict):
        return "not a JSON object", None
    key = doc.get(key_field)
    if key is None:
        return "null key", None
    event_ms = parse_event_time(doc.get(event_time_field))
    if event_ms is None:
        return f"unparseable event time: {doc.get(event_time_field)!r}", None
    out = {"key": str(key), "event_ms": event_ms}
    fields = carry or [k for k in doc if k not in (key_field, event_time_field)]
    for name in fields:
        out[name] = doc.get(name)
    return "", out
