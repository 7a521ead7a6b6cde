"""What a streaming query's own checkpoint says of a micro-batch, as a ``controlmsg`` sink needs it.

Spark writes, before it runs micro-batch *n*, the file ``<checkpointLocation>/offsets/<n>``: a version
line, one JSON line of metadata whose ``batchWatermarkMs`` is the event-time watermark in force in
micro-batch *n* (0 when the query has none), then one line per source with the offset the micro-batch
reads up to (``-`` for a source without one). Version ``v1`` (Spark's default) writes the offset alone;
version ``v2`` (``spark.sql.streaming.offsetLog.formatVersion=2``, Spark 4.1+) prefixes it with the source's
id and a colon (``0:{...}``). A ``controlmsg`` source's offset holds its bookkeeping, whose ``streamEnded``
says whether every upstream task has ended; a plain topic's (``envelope none``,
:mod:`controlmsg.spark.reading.plain_readers`) says ``"ended": true`` when its input ended. A query with a stateful
operator has a ``state`` directory beside ``offsets``. The sink's ``commit`` runs after the micro-batch, so the file
is there. This is Spark's offset log format (``OffsetSeqLog``), read only.

**Where it can be read.** The sink's ``commit`` runs in a Python worker of the driver, which has no way
into the JVM, and so none into Spark's Hadoop file systems and their configuration (``hdfs:``, ``s3a:``,
``abfss:``, ``gs:``, ``viewfs:``, a scheme of one's own). Rather than guess at a file system, or carry on
with a weaker rule unasked (a stage whose end of stream never comes), the writer reads only a checkpoint on
the driver's local file system (a plain path or ``file:``) and refuses any other location when the query
starts (:func:`offset_log_dir`), naming the options that do without it: ``stageProgress driver`` (the
driver program follows the query's progress, :mod:`controlmsg.spark.stage`: a checkpoint anywhere) and
``stageProgress eventTime`` (the weaker rule). Whatever it cannot read or does not know later (a missing entry, another
format version) is refused the same way (:func:`stage_progress`): nothing is ever assumed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final
from urllib.parse import unquote, urlparse

from controlmsg.core.messages import MAX_TIMESTAMP
from controlmsg.core.watermarks import WatermarkPolicy
from controlmsg.errors import CheckpointError, WatermarkNotFollowed

__all__ = ["END_OF_TIME_MS", "WATERMARK_ROWS_KEY", "StageProgress", "check_offset_log_follows",
           "check_watermark_follows", "offset_ended", "offset_entry", "offset_log_dir", "offset_reconciled", "query_id",
           "sources_give_rows", "sources_reconciled", "stage_progress"]

END_OF_TIME_MS: Final = 253_402_300_799_999
"""9999-12-31T23:59:59.999Z, Spark's largest timestamp in ms: the ``_watermark`` of the end of stream, and so
Spark's watermark once a stage's input has ended (the protocol's +infinity,
:data:`~controlmsg.core.messages.MAX_TIMESTAMP`, is no timestamp Spark can hold)."""

_VERSIONS: Final = ("v1", "v2")
_WEAKER: Final = ("or set option stageProgress to driver and wait on the query with "
                  "controlmsg.spark.await_stage(query, options) (a checkpoint anywhere), or to eventTime for the "
                  "weaker rule (the watermark: the largest eventTime written minus allowedLateness; no end of "
                  "stream by itself: call controlmsg.spark.end_stream after the query)")

WATERMARK_ROWS_KEY: Final = "watermarkRows"
"""The key a controlmsg source's offset holds (``true``) when the stream gives watermark rows (its schema
declares ``_control``), i.e. is read for :func:`~controlmsg.spark.with_watermark`."""


@dataclass(frozen=True, slots=True)
class StageProgress:
    """One micro-batch of a query: Spark's ``watermark`` in force in it (ms, 0: the query has none),
    whether every source had ended by its end (``inputs_ended``: all are controlmsg streams, or plain
    topics, that ended), and whether the query keeps state (``stateful``: windows, timers... that an end of
    input does not flush unless the watermark reaches the end of time)."""

    watermark: int
    inputs_ended: bool
    stateful: bool = False
    reconciled: int | None = None
    """The reconciled watermark the query's sources had given by the end of the micro-batch (the smallest
    over them; :data:`END_OF_TIME_MS` once ended), when every source is a controlmsg stream with watermark
    rows that has one; else ``None``. :func:`with_watermark` makes Spark's watermark in the next micro-batch
    exactly this (:func:`check_watermark_follows`)."""
    watermark_rows: bool = False
    """Whether a source gives watermark rows (a controlmsg stream read for :func:`with_watermark`): Spark's
    watermark then follows the reconciled one, and :meth:`forwarded` takes nothing else."""

    def forwarded(self, max_event_time: int | None, allowed_lateness_ms: int) -> int | None:
        """The watermark a stage may forward after this micro-batch (ms), before its floor (the last one
        written) is applied; ``None``: nothing to forward yet.

        A query without state on :func:`with_watermark` forwards its inputs' reconciled watermark as of the
        end of this micro-batch (:attr:`reconciled`), one micro-batch before Spark's watermark gets there:
        every row it writes later comes from a record read later, kept only when at or after that record's
        ``_watermark``, itself at least the reconciled watermark at the start of its micro-batch; and what
        this micro-batch read is written before the round. A query with state keeps Spark's watermark in
        force: its windows, its join's pairs, are emitted up to it, a micro-batch after their input.

        Else Spark's watermark in force when the query has one (>0). Before it (a query's first micro-batch,
        or before its inputs' first reconciled watermark), a query on :func:`with_watermark` forwards nothing:
        its input's reconciled watermark is not known to have passed anything, and the largest event time
        seen may run ahead of it (a slow input's, a slow task's records are still to come). Only a query
        without watermark rows falls back to the weaker rule, ``max_event_time`` minus
        ``allowed_lateness_ms`` (documented as such: docs/SPARK.md)."""
        if not self.stateful and self.reconciled is not None:
            return min(max(self.watermark, self.reconciled), MAX_TIMESTAMP - 1)
        if self.watermark > 0:
            return min(self.watermark, MAX_TIMESTAMP - 1)
        if self.watermark_rows or max_event_time is None:
            return None
        return WatermarkPolicy(allowed_lateness_ms).watermark_for(max_event_time)


def local_path(location: str) -> Path | None:
    """``location`` as a local path: a plain path or a ``file:`` URI; ``None`` for any other scheme."""
    parsed = urlparse(location)
    if parsed.scheme in ("", "file"):
        return Path(unquote(parsed.path) if parsed.scheme else location)
    if len(parsed.scheme) == 1:  # a Windows drive letter
        return Path(location)
    return None


def offset_log_dir(checkpoint: str | None, topic: str) -> Path:
    """The local directory of the query's checkpoint, whose offset log the writer to ``topic`` reads.

    Called when the query starts (the writer is made before its first micro-batch runs). Raises
    :class:`~controlmsg.errors.CheckpointError`, one line naming the location, the reason and the option of
    the weaker rule, when there is no ``checkpointLocation`` option or it is not on the driver's local file
    system."""
    where = f"writeStream.format('controlmsg') to topic {topic!r}"
    if checkpoint is None:
        raise CheckpointError(
            f"{where}: no option checkpointLocation, and the writer reads the stage's watermark and whether its "
            "input ended from the query's offset log there (Spark does not pass its default location, "
            f"spark.sql.streaming.checkpointLocation, to a data source); set .option('checkpointLocation', DIR) "
            f"on the query, {_WEAKER}")
    root = local_path(checkpoint)
    if root is None:
        raise CheckpointError(
            f"{where}: checkpointLocation {checkpoint!r} is not on the driver's local file system (scheme "
            f"{urlparse(checkpoint).scheme!r}), and the writer, a Python worker without Spark's Hadoop file "
            "systems, reads the stage's watermark and whether its input ended from the query's offset log "
            f"there; put the checkpoint on a local path or file: URI of the driver, {_WEAKER}")
    return root


def stage_progress(root: Path, batch_id: int, topic: str) -> StageProgress:
    """The offset log's entry for ``batch_id`` under the local checkpoint directory ``root``.

    Raises :class:`~controlmsg.errors.CheckpointError` naming the file when the entry is missing or
    unreadable, or written in an offset log version this reader does not know: the writer never goes on
    without knowing the stage's watermark and whether its input ended."""
    path = root / "offsets" / str(batch_id)
    where = f"writeStream.format('controlmsg') to topic {topic!r}: the query's offset log entry {str(path)!r}"
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise CheckpointError(f"{where} cannot be read ({exc.strerror or exc}); Spark writes it before the "
                              f"micro-batch runs, so the checkpoint is not where the writer looks, {_WEAKER}") from exc
    watermark, sources = offset_entry(lines, where, _WEAKER)
    return StageProgress(watermark, bool(sources) and all(offset_ended(offset) for offset in sources),
                         (root / "state").is_dir(), sources_reconciled(sources), sources_give_rows(sources))


def offset_entry(lines: list[str], where: str, otherwise: str) -> tuple[int, list[str]]:
    """An offset log entry's lines (see the module docstring) as Spark's watermark in force in the micro-batch
    (ms; 0: none) and each source's offset (its JSON text, ``-`` for none). Raises
    :class:`~controlmsg.errors.CheckpointError`, ``where`` then the reason then ``otherwise`` (what to do
    instead), for an entry of a version this reader does not know or without the metadata line."""
    if not lines or lines[0] not in _VERSIONS:
        raise CheckpointError(f"{where} is of version {lines[0] if lines else '(empty)'!r}, this reader reads "
                              f"{' and '.join(_VERSIONS)} (spark.sql.streaming.offsetLog.formatVersion 1 or 2), "
                              f"{otherwise}")
    try:
        metadata = json.loads(lines[1]) if len(lines) > 1 else None
        watermark = int(metadata.get("batchWatermarkMs", 0)) if isinstance(metadata, dict) else None
    except (ValueError, TypeError):
        watermark = None
    if watermark is None:
        raise CheckpointError(f"{where} has no metadata line with batchWatermarkMs, {otherwise}")
    return watermark, [_offset(line, lines[0]) for line in lines[2:]]


def sources_reconciled(offsets: list[str]) -> int | None:
    """:attr:`StageProgress.reconciled` of a micro-batch whose sources ended at ``offsets`` (JSON texts)."""
    marks = [offset_reconciled(offset) for offset in offsets]
    known = [mark for mark in marks if mark is not None]
    return min(known) if known and len(known) == len(marks) else None


def sources_give_rows(offsets: list[str]) -> bool:
    """Whether a source's offset (JSON text) says it gives watermark rows (:data:`WATERMARK_ROWS_KEY`)."""
    return any(_gives_rows(offset) for offset in offsets)


def _gives_rows(line: str) -> bool:
    try:
        offset = json.loads(line)
    except ValueError:
        return False
    return isinstance(offset, dict) and offset.get(WATERMARK_ROWS_KEY) is True


def offset_reconciled(line: str) -> int | None:
    """The reconciled watermark a controlmsg source's offset (its JSON text) stands at, when the stream gives
    watermark rows (:data:`WATERMARK_ROWS_KEY`): :data:`END_OF_TIME_MS` once ended; else ``None`` (no
    watermark yet, no watermark rows, or another source). A plain topic's: the watermark it made per
    partition."""
    try:
        offset = json.loads(line)
    except ValueError:
        return None
    if not isinstance(offset, dict) or offset.get(WATERMARK_ROWS_KEY) is not True:
        return None
    if offset.get("envelope") == "none":  # a plain topic's watermark per partition (reading.plain_watermark)
        state = offset.get("eventTime")
        mark = state.get("watermark") if isinstance(state, dict) else None
        return END_OF_TIME_MS if offset.get("ended") is True else (
            min(mark, END_OF_TIME_MS) if isinstance(mark, int) else None)
    book = offset.get("bookkeeping")
    if not isinstance(book, dict):
        return None
    if book.get("streamEnded") is True:
        return END_OF_TIME_MS
    mark = book.get("emittedWatermark")
    return min(mark, END_OF_TIME_MS) if isinstance(mark, int) else None


def check_watermark_follows(before: StageProgress | None, now: StageProgress, batch_id: int, where: str,
                            spark_version: str) -> None:
    """Check that Spark's watermark in micro-batch ``batch_id`` (``now``) is at least the reconciled watermark
    the sources had given by the end of the micro-batch before (``before``), as :func:`with_watermark` makes
    it (Spark's watermark is the largest ``_watermark`` its watermark node has seen, and every micro-batch in
    which the reconciled watermark moves ends with a watermark row that carries it). Nothing is checked for a
    query without a watermark (Spark's is 0) or whose sources are not all controlmsg streams with watermark
    rows. Raises :class:`~controlmsg.errors.WatermarkNotFollowed` naming ``spark_version`` otherwise: a Spark
    whose optimizer moved a filter below the watermark node drops the watermark rows, and its watermark falls
    behind (windows close late, or at the end of stream only)."""
    if before is None or before.reconciled is None or now.watermark <= 0 or now.watermark >= before.reconciled:
        return
    raise WatermarkNotFollowed(
        f"{where}: Spark's watermark in micro-batch {batch_id} is {_iso(now.watermark)}, behind the reconciled "
        f"watermark {_iso(before.reconciled)} its controlmsg sources had given by micro-batch {batch_id - 1}: "
        f"Spark {spark_version} does not follow with_watermark, which relies on Spark's optimizer keeping its "
        "filter above the watermark node (rules PushPredicateThroughNonJoin, CombineFilters) so that the "
        "watermark rows reach it; run on a Spark version controlmsg is tested with (pyspark 4.2, 4.3) and report "
        "this one (a query that sets its own withWatermark on a stream read with WATERMARK_COLUMNS: call "
        "controlmsg.spark.with_watermark instead)", spark_version)


def check_offset_log_follows(root: Path, batch_id: int, now: StageProgress, topic: str) -> None:
    """:func:`check_watermark_follows` for the sink of micro-batch ``batch_id`` (``now``, its offset log
    entry), against the entry before it (when the offset log still has it)."""
    if batch_id <= 0 or now.watermark <= 0:
        return
    try:
        before = stage_progress(root, batch_id - 1, topic)
    except CheckpointError:
        return  # purged, or written by another Spark: nothing to compare with
    import pyspark

    check_watermark_follows(before, now, batch_id, f"writeStream.format('controlmsg') to topic {topic!r}",
                            pyspark.__version__)


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _offset(line: str, version: str) -> str:
    """A source's offset in an offset log line: as it is in ``v1``; after ``<source id>:`` in ``v2``."""
    if version == "v2":
        source, sep, offset = line.partition(":")
        if sep and source and not source.lstrip().startswith(("{", "-")):
            return offset
    return line


def offset_ended(line: str) -> bool:
    """Whether a source's offset (its JSON text) says its input has ended: a controlmsg stream whose
    bookkeeping has ``streamEnded``, or a plain topic's ``"ended": true``; any other offset has not."""
    if line.strip() in ("", "-"):
        return False
    try:
        offset = json.loads(line)
    except ValueError:
        return False
    if not isinstance(offset, dict):
        return False
    if offset.get("envelope") == "none":  # a plain topic (controlmsg.spark.reading.plain_readers)
        return offset.get("ended") is True
    book = offset.get("bookkeeping")
    return isinstance(book, dict) and book.get("streamEnded") is True


def query_id(checkpoint: str | None) -> str | None:
    """The id of the streaming query whose checkpoint is ``checkpoint`` (Spark's ``metadata`` file, kept
    across restarts); ``None`` when there is no local checkpoint or no such file yet."""
    root = local_path(checkpoint) if checkpoint is not None else None
    if root is None:
        return None
    try:
        found = json.loads((root / "metadata").read_text(encoding="utf-8").splitlines()[0]).get("id")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return found if isinstance(found, str) else None
