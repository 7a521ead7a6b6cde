"""What a streaming query's own checkpoint says of a micro-batch, as a ``controlmsg`` sink needs it.

Spark writes, before it runs micro-batch *n*, the file ``<checkpointLocation>/offsets/<n>``: a version
line (``v1``), one JSON line of metadata whose ``batchWatermarkMs`` is the event-time watermark in force in
micro-batch *n* (0 when the query has none), then one line per source with the offset the micro-batch
reads up to (``-`` for a source without one). A ``controlmsg`` source's offset holds its bookkeeping,
whose ``streamEnded`` says whether every upstream task has ended; a plain topic's (``envelope none``,
:mod:`controlmsg.spark.plain`) says ``"ended": true`` when its input ended. A query with a stateful
operator has a ``state`` directory beside ``offsets``. The sink's ``commit`` runs after the
micro-batch, so the file is there. This is Spark's offset log format (``OffsetSeqLog``, version 1), read
only; a checkpoint on a file system Python cannot open here (``hdfs:``, ``s3a:``...) gives ``None``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import unquote, urlparse

__all__ = ["END_OF_TIME_MS", "StageProgress", "query_id", "stage_progress"]

END_OF_TIME_MS: Final = 253_402_300_799_999
"""9999-12-31T23:59:59.999Z, Spark's largest timestamp in ms: the ``_watermark`` of the end of stream, and so
Spark's watermark once a stage's input has ended (the protocol's +infinity,
:data:`~controlmsg.core.messages.MAX_TIMESTAMP`, is no timestamp Spark can hold)."""


@dataclass(frozen=True, slots=True)
class StageProgress:
    """One micro-batch of a query: Spark's ``watermark`` in force in it (ms, 0: the query has none),
    whether every source had ended by its end (``inputs_ended``: all are controlmsg streams, or plain
    topics, that ended), and whether the query keeps state (``stateful``: windows, timers... that an end of
    input does not flush unless the watermark reaches the end of time)."""

    watermark: int
    inputs_ended: bool
    stateful: bool = False


def local_path(location: str) -> Path | None:
    """``location`` as a local path: a plain path or a ``file:`` URI; ``None`` for any other scheme."""
    parsed = urlparse(location)
    if parsed.scheme in ("", "file"):
        return Path(unquote(parsed.path) if parsed.scheme else location)
    if len(parsed.scheme) == 1:  # a Windows drive letter
        return Path(location)
    return None


def stage_progress(checkpoint: str | None, batch_id: int) -> StageProgress | None:
    """The offset log's entry for ``batch_id`` under ``checkpoint``; ``None`` when there is no local
    checkpoint or no such entry (nothing is assumed then: no stage watermark, no end of stream)."""
    if checkpoint is None:
        return None
    root = local_path(checkpoint)
    if root is None:
        return None
    try:
        lines = (root / "offsets" / str(batch_id)).read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    if len(lines) < 2 or lines[0] != "v1":
        return None
    watermark = int(json.loads(lines[1]).get("batchWatermarkMs", 0))
    sources = lines[2:]
    return StageProgress(watermark, bool(sources) and all(_ended(line) for line in sources),
                         (root / "state").is_dir())


def _ended(line: str) -> bool:
    if line.strip() in ("", "-"):
        return False
    try:
        offset = json.loads(line)
    except ValueError:
        return False
    if not isinstance(offset, dict):
        return False
    if offset.get("envelope") == "none":  # a plain topic (controlmsg.spark.plain)
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
