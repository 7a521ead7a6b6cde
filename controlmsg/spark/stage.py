"""A stage's watermark and end of stream from its driver: :func:`await_stage`, for a checkpoint anywhere.

A ``writeStream.format("controlmsg")`` query passes on the stage's watermark (Spark's, in force in each
micro-batch) and ends its stream once its input has ended. By default its sink reads both from the query's
offset log (:mod:`controlmsg.spark.query_log`), which it can do only on the driver's local file system. A
stage whose checkpoint is on cluster storage (``hdfs:``, ``s3a:``, ``abfss:``, ``gs:``, ``viewfs:``...)
takes the option ``stageProgress driver`` instead; its driver program's session follows the query by itself
(:mod:`controlmsg.spark.stage_listener`, classic sessions), or the program waits on the query with
:func:`await_stage` where it would call ``awaitTermination`` (any session, Spark Connect too). Then:

* the sink's tasks write their records exactly once, and its ``commit`` writes no control message, only
  its marker (the micro-batch, the query, the largest ``eventTime`` written so far);
* :func:`await_stage` follows the query's progress, which Spark reports after each micro-batch has
  committed, in the same terms as the offset log (``batchId``; ``eventTime.watermark``, Spark's watermark
  in force in it; each source's ``endOffset``, a controlmsg source's holding ``streamEnded``; its
  ``stateOperators``), and writes the **stage round** of the latest micro-batch it has not written yet: the
  stage's watermark (Spark's; or, for a query without one, the largest ``eventTime`` minus
  ``allowedLateness``), or the end of stream once every source has ended and, for a query that keeps state,
  Spark's watermark is the end of time. So nothing depends on where the checkpoint is, or on Spark's
  file formats: the progress is Spark's public API, the same on a classic and a Spark Connect session.

**Nothing is left unfollowed silently.** A query started with ``stageProgress driver`` that nothing follows
(a Spark Connect client that waits with ``awaitTermination()``) would end without a watermark or an end of
stream on its output, and every exit code 0. So a follower claims the query's run in the stage marker when
it starts (:func:`claim_stage`: the session's listener, :class:`StageFollower` and :func:`await_stage` call
it), and the sink's first commit of each run of the query waits for that claim, up to the option
``timeout``: without it the commit fails the query in one line that names ``await_stage``, before the
micro-batch is counted.

The rounds are the driver's (``taskName`` ``<job>-<runId>-driver``, ``taskCount`` 1), in one transaction
each with a marker of their own (transactional id: the driver's with ``-stage``), so a round is written
once, and the watermark never goes back, whatever the process that writes it: a driver restarted after
``kill -9`` goes on from the last round committed. Skipping micro-batches loses nothing (each round says
all there is to say up to its micro-batch), so the progress is polled, not every event heard.

**A driver started again after the last micro-batch.** A driver killed after the last micro-batch committed
and before its round was written, then started again, finds nothing left to run. Spark reports that trigger
all the same, under the id of the micro-batch it would have run; :func:`round_batch` makes it the round of
the last committed micro-batch, whose facts it carries: the end of stream when the input had ended. A
follower that gets no progress at all reads the same from the query's checkpoint
(:func:`checkpoint_progress`: the commit log's last entry and the offset log's entry of it, through the
session's own Hadoop file systems, so on any storage the query can checkpoint to). Only a Spark Connect
client that gets neither (it has no JVM) has :func:`await_stage` raise :class:`StageNotEnded`, which says to
check the input and call :func:`~controlmsg.spark.writing.run_control.end_stream`: what it cannot know, it
does not guess.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

import orjson

from controlmsg.core.messages import EndOfStreamMessage, WatermarkMessage
from controlmsg.core.naming import stage_transactional_id
from controlmsg.errors import ControlMsgError
from controlmsg.kafka.admin import wait_for_topic
from controlmsg.kafka.markers import MarkerStore, Round, write_control_round
from controlmsg.spark.options import STAGE_PROGRESS_DRIVER, WriteOptions
from controlmsg.spark.query_log import (
    END_OF_TIME_MS,
    StageProgress,
    offset_ended,
    offset_entry,
    sources_give_rows,
    sources_reconciled,
)
from controlmsg.spark.writing.run_control import FOLLOWED_RUN, run_status, upstream_of

if TYPE_CHECKING:
    from pyspark.sql.streaming.query import StreamingQuery

__all__ = ["StageFollower", "StageNotEnded", "await_stage", "checkpoint_progress", "checkpoint_root", "claim_stage",
           "progress_of", "round_batch", "stage_status", "write_stage_round"]

_POLL_S: Final = 0.25
_TXN_LOCKS: dict[str, threading.Lock] = {}
_TXN_LOCKS_LOCK: Final = threading.Lock()


def _one_at_a_time(transactional_id: str) -> threading.Lock:
    """The lock of one stage transactional id in this process: the session's listener
    (:mod:`controlmsg.spark.stage_listener`) and an ``await_stage`` may follow the same query, and two
    producers of one transactional id at once would fence each other."""
    with _TXN_LOCKS_LOCK:
        return _TXN_LOCKS.setdefault(transactional_id, threading.Lock())


class StageNotEnded(ControlMsgError):
    """The query terminated without a micro-batch after which its input had ended, so :func:`await_stage`
    wrote no end of stream."""


def round_batch(progress: Mapping[str, Any]) -> int:
    """The micro-batch whose facts a ``StreamingQueryProgress`` reports: its ``batchId``, or, for a trigger
    that ran no micro-batch, the one before it. Spark reports such a trigger too (a query started again with
    nothing new, a stream waiting for data: at once, then every ``noDataProgressEventInterval``), under the
    id of the micro-batch it would have run, without ``addBatch`` in its ``durationMs``; its sources' offsets
    are those of the last committed micro-batch. Written under its own id, its round would make the real
    micro-batch of that id look written, and that micro-batch's round (its end of stream) would be skipped.
    -1: nothing committed yet."""
    batch = int(progress["batchId"])
    return batch if "addBatch" in (progress.get("durationMs") or {}) else batch - 1


def progress_of(progress: Mapping[str, Any]) -> StageProgress:
    """The stage's facts in one ``StreamingQueryProgress`` (a classic or a Connect one, or its JSON as a
    dict): Spark's watermark in force (0 when the query has none), whether every source had ended, and
    whether the query keeps state."""
    mark = (progress.get("eventTime") or {}).get("watermark")
    sources = progress.get("sources") or []
    ends = [source.get("endOffset") for source in sources]
    texts = [_as_text(end) for end in ends]
    return StageProgress(_epoch_ms(mark) if mark else 0, bool(texts) and all(offset_ended(end) for end in texts),
                         bool(progress.get("stateOperators")), sources_reconciled(texts), sources_give_rows(texts))


def stage_status(options: WriteOptions | Mapping[str, str]) -> dict[str, Any] | None:
    """The last stage round committed for the run (``batch``, ``watermark``, ``ended``, ``queryId``), or
    ``None`` before the first."""
    opts = options if isinstance(options, WriteOptions) else WriteOptions.parse(options)
    with MarkerStore(dict(opts.config), _txn(opts), opts.topic, opts.timeout) as store:
        return store.load()


def claim_stage(options: WriteOptions | Mapping[str, str], query_run: str) -> None:
    """Say in the stage marker that a driver follows the query run ``query_run`` (``StreamingQuery.runId``):
    the sink's first commit of a run waits for it, and fails the query without it (see the module docstring).
    Keeps the rounds' figures as they are. Raises :class:`~controlmsg.errors.DeliveryError` when Kafka refuses."""
    opts = options if isinstance(options, WriteOptions) else WriteOptions.parse(options)
    config = dict(opts.config)
    partitions = wait_for_topic(config, opts.topic, opts.timeout)

    def plan(committed: dict[str, Any] | None) -> Round | None:
        if committed is not None and committed.get(FOLLOWED_RUN) == query_run:
            return None
        return [], {**(committed or {}), FOLLOWED_RUN: query_run}

    with _one_at_a_time(_txn(opts)):
        write_control_round(config, opts.topic, partitions, plan, transactional_id=_txn(opts), timeout=opts.timeout)


def write_stage_round(options: WriteOptions | Mapping[str, str], progress: Mapping[str, Any]) -> dict[str, Any]:
    """Write the stage round of the micro-batch ``progress`` reports (:func:`round_batch`), unless a round of it
    or of a later one is in (then nothing). Returns the stage marker committed now or found. Raises
    :class:`~controlmsg.errors.ControlMsgError` for a progress from before the first committed micro-batch, and
    when the query's sink was not started with ``stageProgress driver`` on this run;
    :class:`~controlmsg.errors.DeliveryError` when Kafka refuses."""
    opts = options if isinstance(options, WriteOptions) else WriteOptions.parse(options)
    if opts.stage_progress != STAGE_PROGRESS_DRIVER:
        raise ControlMsgError(f"topic {opts.topic!r} run {opts.run_id!r}: await_stage follows a query whose "
                              f"writeStream.format('controlmsg') has option stageProgress {STAGE_PROGRESS_DRIVER}; "
                              "give the query's own options")
    batch = round_batch(progress)
    if batch < 0:
        raise ControlMsgError(f"topic {opts.topic!r} run {opts.run_id!r}: query {progress.get('id')} has committed "
                              "no micro-batch yet, so there is no stage round to write")
    facts = progress_of(progress)
    config = dict(opts.config)
    partitions = wait_for_topic(config, opts.topic, opts.timeout)
    found: list[dict[str, Any]] = []

    def plan(committed: dict[str, Any] | None) -> Round | None:
        if committed is not None and (committed.get("ended") or int(committed.get("batch", -1)) >= batch):
            found.append(committed)
            return None
        sink = run_status(opts)  # the sink's own marker: its query, its largest eventTime; an end_stream by hand
        if sink is None or sink.get("queryId") != str(progress.get("id")):
            raise ControlMsgError(
                f"topic {opts.topic!r} run {opts.run_id!r}: no micro-batch of query {progress.get('id')} was "
                f"committed by a controlmsg sink with these options (the sink's marker names query "
                f"{None if sink is None else sink.get('queryId')}); await_stage needs the query's own options")
        if sink.get("ended"):
            found.append({**(committed or {}), "ended": True})
            return None
        name, generation, _ = upstream_of(opts, sink)
        previous = None if committed is None else committed.get("watermark")
        marker = {"batch": batch, "queryId": sink["queryId"], "watermark": previous, "generation": generation,
                  FOLLOWED_RUN: (committed or {}).get(FOLLOWED_RUN)}
        if facts.inputs_ended and (facts.watermark == END_OF_TIME_MS or not facts.stateful):
            found.append({**marker, "ended": True})
            return [EndOfStreamMessage(name, 1, opts.run_id, generation=generation)], found[-1]
        top = sink.get("maxEventTime")
        candidate = facts.forwarded(None if top is None else int(top), opts.allowed_lateness_ms)
        mark = previous if candidate is None else candidate if previous is None else max(previous, candidate)
        found.append({**marker, "watermark": mark})
        if mark is None or mark == previous:
            return [], found[-1]
        return [WatermarkMessage(name, 1, mark, opts.run_id, generation=generation)], found[-1]

    with _one_at_a_time(_txn(opts)):
        write_control_round(config, opts.topic, partitions, plan, transactional_id=_txn(opts), timeout=opts.timeout)
    return found[-1]


def checkpoint_root(query: StreamingQuery) -> tuple[Any, str] | None:
    """The query's session in the driver's JVM and its checkpoint location as Spark resolved it, for
    :func:`checkpoint_progress`; ``None`` on a Spark Connect client (no JVM)."""
    jsq = getattr(query, "_jsq", None)
    if jsq is None or not hasattr(jsq, "streamingQuery"):
        return None
    execution = jsq.streamingQuery()
    return execution.sparkSession(), str(execution.resolvedCheckpointRoot())


def checkpoint_progress(jsession: Any, root: str, query_id: str) -> dict[str, Any] | None:
    """The last micro-batch that the checkpoint at ``root`` holds as committed, as the ``StreamingQueryProgress``
    of a trigger right after it that ran nothing (what :func:`write_stage_round` reads: ``id``, ``batchId``
    and ``durationMs`` for :func:`round_batch`, ``eventTime.watermark`` in force in that micro-batch, each
    source's ``endOffset``, ``stateOperators`` when the query keeps state), read from
    Spark's commit log and offset log (:mod:`controlmsg.spark.query_log`) through the Hadoop file systems of
    ``jsession`` (the query's session in the driver's JVM): any storage the query can write its checkpoint
    to. ``None`` when no micro-batch was committed. Raises :class:`~controlmsg.errors.CheckpointError` naming
    the entry when it cannot be read or is of an offset log version this reader does not know."""
    from pyspark import SparkContext

    jvm = SparkContext._jvm
    if jvm is None:  # no classic JVM in this process
        return None
    hadoop_path = jvm.org.apache.hadoop.fs.Path
    base = hadoop_path(root)
    # A file system of its own, not the JVM's cached one for the scheme: what the session's configuration says
    # now (a viewfs mount table, credentials) is what is read through.
    fs = jvm.org.apache.hadoop.fs.FileSystem.newInstance(base.toUri(), jsession.sessionState().newHadoopConf())
    try:
        return _last_committed(jvm, fs, base, query_id)
    finally:
        fs.close()


def _last_committed(jvm: Any, fs: Any, base: Any, query_id: str) -> dict[str, Any] | None:
    from controlmsg.errors import CheckpointError

    hadoop_path = jvm.org.apache.hadoop.fs.Path
    commits = hadoop_path(base, "commits")
    if not fs.exists(commits):
        return None
    done = [int(name) for name in (str(st.getPath().getName()) for st in fs.listStatus(commits)) if name.isdigit()]
    if not done:
        return None
    batch = max(done)
    entry = hadoop_path(hadoop_path(base, "offsets"), str(batch))
    where = f"the offset log entry {str(entry.toString())!r} of the last committed micro-batch"
    try:
        stream = fs.open(entry)
        try:
            text = str(jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
        finally:
            stream.close()
    except Exception as exc:  # py4j's error of the JVM's IOException
        raise CheckpointError(f"{where} cannot be read: {str(exc).splitlines()[0] if str(exc) else exc!r}") from exc
    watermark, sources = offset_entry(text.splitlines(), where, "so the stage's last round cannot be written from it")
    # as Spark reports a trigger that runs nothing after that micro-batch (round_batch: the same facts)
    return {"id": query_id, "batchId": batch + 1, "durationMs": {}, "eventTime": {"watermark": _iso_ms(watermark)},
            "sources": [{"endOffset": source} for source in sources],
            "stateOperators": [{"fromCheckpoint": True}] if fs.exists(hadoop_path(base, "state")) else []}


class StageFollower:
    """Writes the stage rounds of one query (see the module docstring), a step at a time, for a driver program
    that waits on several queries at once; :func:`await_stage` is the one-query loop over it. ``options``:
    the options of the query's ``writeStream.format("controlmsg")`` (with ``stageProgress driver``)."""

    def __init__(self, query: StreamingQuery, options: Mapping[str, str]) -> None:
        """Claims the query's run in the stage marker (:func:`claim_stage`) before anything else: make the
        follower right after ``start()``; the sink's first commit waits up to the option ``timeout`` for it."""
        self.query = query
        self.opts = WriteOptions.parse(options)
        if self.opts.stage_progress != STAGE_PROGRESS_DRIVER:
            raise ControlMsgError(f"topic {self.opts.topic!r} run {self.opts.run_id!r}: await_stage follows a query "
                                  "whose writeStream.format('controlmsg') has option stageProgress "
                                  f"{STAGE_PROGRESS_DRIVER}; give the query's own options")
        claim_stage(self.opts, str(query.runId))
        self.written = -1
        """The last micro-batch whose round this follower wrote (or found written), -1 before the first."""
        self.ended = False

    def step(self) -> bool:
        """Write the round of the query's latest micro-batch if it is new; returns whether the stream has
        ended. Never blocks beyond the round's transaction. Raises what :func:`write_stage_round` raises."""
        progress = self.query.lastProgress
        if not self.ended and progress is not None and round_batch(progress) > self.written:
            self.written = round_batch(progress)
            self.ended = bool(write_stage_round(self.opts, progress).get("ended"))
        return self.ended

    def finish(self) -> bool:
        """After the query has terminated: the round of its last micro-batch (when this run of the query ran
        none, of the last one its checkpoint holds as committed: :func:`checkpoint_progress`), then whether the
        stream has ended. Raises :class:`StageNotEnded` when no micro-batch is known and the stream has not
        ended: then nothing says whether its input ended (see the module docstring)."""
        self.step()
        if not self.ended:
            self.ended = bool((stage_status(self.opts) or {}).get("ended"))
        if not self.ended and self.written < 0:  # no micro-batch ran: the checkpoint's last committed one
            found = checkpoint_root(self.query)
            progress = None if found is None else checkpoint_progress(*found, str(self.query.id))
            if progress is not None:
                self.written = round_batch(progress)
                self.ended = bool(write_stage_round(self.opts, progress).get("ended"))
        if not self.ended and self.written < 0:
            raise StageNotEnded(
                f"topic {self.opts.topic!r} run {self.opts.run_id!r}: query {self.query.id} terminated without "
                "running a micro-batch, and its checkpoint cannot be read here (a Spark Connect client) or holds "
                "none committed, so nothing says whether its input has ended; if it has, end the stream with "
                "controlmsg.spark.end_stream(options)")
        return self.ended


def await_stage(query: StreamingQuery, options: Mapping[str, str], *, timeout: float | None = None) -> bool:
    """Wait for ``query`` to terminate, as ``query.awaitTermination()`` does, writing its stage rounds as its
    micro-batches commit (see the module docstring); call it in the driver program in place of
    ``awaitTermination``. ``options``: the options given to the query's ``writeStream.format("controlmsg")``
    (with ``stageProgress driver``).

    Blocks until the query has terminated and the round of its last micro-batch is written, or ``timeout``
    seconds have passed (the query still running, as with ``awaitTermination(timeout)``). Returns whether
    the stream has ended (a query stopped before its input ended has not). Raises the query's own exception
    when it failed (after writing the rounds of what it committed); :class:`StageNotEnded` as
    :meth:`StageFollower.finish`; :class:`~controlmsg.errors.DeliveryError` when Kafka refuses a round."""
    follower = StageFollower(query, options)
    deadline = None if timeout is None else time.monotonic() + timeout
    while query.isActive and not follower.step():
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_S)
    try:
        query.awaitTermination()  # raises the query's exception, if any
    except Exception as failure:  # the round of the last micro-batch it committed, then its failure
        try:
            follower.step()
        except Exception as lost:
            failure.add_note(f"controlmsg: the stage round of its last micro-batch was not written: {lost}")
        raise
    return follower.finish()


def _txn(opts: WriteOptions) -> str:
    return stage_transactional_id(opts.topic, opts.job, opts.run_id)


def _as_text(offset: Any) -> str:
    if offset is None:
        return "-"
    return offset if isinstance(offset, str) else orjson.dumps(offset).decode()


_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MS: Final = timedelta(milliseconds=1)


def _epoch_ms(iso: str) -> int:
    """Spark's progress timestamps (``2026-01-01T02:30:00.000Z``) in ms since the epoch; exact (a float's
    seconds are not: 9999-12-31T23:59:59.999 came back a millisecond short)."""
    return (datetime.fromisoformat(iso.replace("Z", "+00:00")) - _EPOCH) // _MS


def _iso_ms(ms: int) -> str:
    """:func:`_epoch_ms`'s inverse, as Spark writes the progress's timestamps."""
    return (_EPOCH + ms * _MS).isoformat(timespec="milliseconds").replace("+00:00", "Z")

