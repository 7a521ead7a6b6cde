"""A window task's state as a changelog in a compacted Kafka topic: the records a commit writes, and the
fold that rebuilds the state from them. Pure: no I/O; the Kafka reading and writing is the caller's.

Each commit of task ``i`` of run ``r`` writes, in one transaction, to one partition of the state topic:

* one **window record** per window created or changed since the last commit, keyed
  ``window_key(r, i, start, key)`` = ``f"{r}/{i}/w/"`` + the compact JSON of ``[start, key]``, whose
  value is the JSON ``[count, [sum per field]]`` (sums encoded as in
  :meth:`~controlmsg.streaming.windows.TumblingWindows.snapshot`);
* one **tombstone** (value ``None``) per window that the last commit held and that has closed since;
* then, **last**, the **header record** keyed ``header_key(r, i)`` = ``f"{r}/{i}"``: a JSON object with
  ``"format": STATE_FORMAT``, the caller's fields (input offsets, bookkeeping...) and ``"windows"``:
  :meth:`~controlmsg.streaming.windows.TumblingWindows.state_header` (watermark, counters and the number of
  open windows).

Every record is small (one window), so no commit comes near Kafka's record size limit however many
windows it writes, and compaction keeps one record per open window: the latest value of its key, the
tombstone of a closed one is dropped after ``delete.retention.ms``.

**Restore** (:class:`TaskStateLog`) reads the partition in offset order, ``read_committed``: the latest
value of each of the task's keys wins, a tombstone deletes; records of other tasks and runs are ignored.
Since every transaction ends with its header, the latest committed header and the window records that
survive describe the state of one and the same commit, exactly. The header's ``openWindows`` is checked
against the window records found, so a lost record (a topic that is not compacted but deletes by
retention) is an error, not a silent loss.

**Keys are unambiguous** for any run id and window key. The fold takes as the task's own a key equal to
its header key, or one that starts with its window prefix and whose rest is exactly the compact JSON of an
``[int, str]`` array. No other task's key passes: a header key is its run id, ``/`` and the index, so two
tasks' header keys differ (the index is what follows the last ``/``), and another task's header key that
starts with this task's window prefix ends with a digit, not ``]``. Another task's window key with this
task's prefix has a rest that contains ``/<index>/w/[`` followed by its own ``<start>,"`` (an unescaped
quote after a comma), which no JSON string can hold and which cannot stand outside one.

**Format 1**, the previous layout (one header holding the whole window snapshot and no window records),
is read too: its windows come back counted as changed, so the first commit after it rewrites them all as
window records and the format 2 header replaces the old one.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

import orjson

from controlmsg.errors import CheckpointError
from controlmsg.streaming.windows import TumblingWindows, WindowChanges

__all__ = [
    "STATE_FORMAT",
    "TaskStateLog",
    "commit_records",
    "header_key",
    "window_key",
    "window_prefix",
]

STATE_FORMAT: Final = 2
"""The header's ``format``: 2 is header plus window records; 1 (read only) held the whole snapshot."""

_OLD_FORMAT: Final = 1


def header_key(run_id: str, task_index: int) -> str:
    """The key of task ``task_index``'s header record: ``f"{run_id}/{task_index}"``."""
    if type(task_index) is not int or task_index < 0:
        raise ValueError(f"a task index is an int >= 0, got {task_index!r}")
    return f"{run_id}/{task_index}"


def window_prefix(run_id: str, task_index: int) -> bytes:
    """What every window record key of the task starts with: ``f"{run_id}/{task_index}/w/"`` in UTF-8."""
    return f"{header_key(run_id, task_index)}/w/".encode()


def window_key(prefix: bytes, start: int, key: str) -> bytes:
    """The record key of window ``[start, ...)`` of ``key``: ``prefix`` (:func:`window_prefix`) + JSON."""
    return prefix + orjson.dumps([start, key])


def commit_records(prefix: bytes, changes: WindowChanges) -> Iterator[tuple[bytes, bytes | None]]:
    """The window records of one commit, as ``(key, value)``: one per updated window, a ``None`` value
    (tombstone) per closed one. The caller writes them in this order, then the header, in one
    transaction."""
    dumps = orjson.dumps
    for start, key, count, sums in changes.updated:
        yield prefix + dumps([start, key]), dumps([count, sums])
    for start, key in changes.closed:
        yield prefix + dumps([start, key]), None


class TaskStateLog:
    """The fold that restores one task's state: feed it every committed record of the task's state
    partition in offset order with :meth:`apply`, then read :attr:`header` and call :meth:`windows`.

    Keeps the latest value of the header and of each window record of the task (run ``run_id``, index
    ``task_index``); a tombstone removes the key. ``source`` names the topic in errors. Memory: the raw
    bytes of the task's live window records.
    """

    __slots__ = ("_header", "_header_key", "_prefix", "_source", "_windows")

    def __init__(self, run_id: str, task_index: int, source: str = "state topic") -> None:
        self._header_key = header_key(run_id, task_index).encode()
        self._prefix = window_prefix(run_id, task_index)
        self._source = source
        self._header: bytes | None = None
        self._windows: dict[bytes, bytes] = {}

    @property
    def key(self) -> str:
        """The header record's key."""
        return self._header_key.decode()

    def apply(self, key: bytes | None, value: bytes | None) -> None:
        """One committed record of the partition, in offset order (records of other tasks are ignored)."""
        if key is None:
            return
        if key == self._header_key:
            self._header = value
        elif key.startswith(self._prefix) and key.endswith(b"]"):
            if value is None:
                self._windows.pop(key, None)
            else:
                self._windows[key] = value

    @property
    def window_records(self) -> int:
        """How many window records of the task are live (not deleted by a later tombstone)."""
        return len(self._windows)

    @property
    def header(self) -> dict[str, Any] | None:
        """The latest header record, decoded (``None``: there is none, or its latest value is a tombstone).
        Raises :class:`CheckpointError` naming the topic and key when it is not a JSON object of a known
        format."""
        if self._header is None:
            return None
        where = f"state record {self.key!r} in {self._source}"
        try:
            doc = orjson.loads(self._header)
        except orjson.JSONDecodeError as exc:
            raise CheckpointError(f"{where} is not JSON ({exc}): delete the state topic to start the run "
                                  "over, or use a new run id") from exc
        if not isinstance(doc, dict) or doc.get("format") not in (STATE_FORMAT, _OLD_FORMAT):
            fmt = doc.get("format") if isinstance(doc, dict) else None
            raise CheckpointError(
                f"{where} has format {fmt!r:.40}; this version reads formats {_OLD_FORMAT} and {STATE_FORMAT}: "
                "resume it with the version that wrote it, or start a new run id")
        return doc

    def windows(self, size_ms: int | None = None, sum_fields: Sequence[str] | None = None) -> TumblingWindows:
        """The window operator as the latest header's commit left it, with no changes pending (format 1:
        every window pending, see the module docstring). ``size_ms`` and ``sum_fields``: what the job
        expects (see :meth:`TumblingWindows.restore`). Raises :class:`CheckpointError` when there is no
        header, the window records do not decode, or their number disagrees with the header."""
        header = self.header
        if header is None:
            raise CheckpointError(f"no state record {self.key!r} in {self._source}")
        where = f"state {self.key!r} in {self._source}"
        meta = header.get("windows")
        if not isinstance(meta, Mapping):
            raise CheckpointError(f"{where}: the header has no window state")
        if header["format"] == _OLD_FORMAT:
            if self._entries(where):
                raise CheckpointError(f"{where}: a format {_OLD_FORMAT} header with window records")
            try:
                restored = TumblingWindows.restore(meta, size_ms=size_ms, sum_fields=sum_fields)
            except CheckpointError as exc:
                raise CheckpointError(f"{where}: {exc}") from exc
            restored.mark_uncommitted()
            return restored
        entries = self._entries(where)
        expected = meta.get("openWindows")
        if expected != len(entries):
            raise CheckpointError(
                f"{where}: the header counts {expected!r:.40} open windows but {len(entries)} window records "
                "are live (was the state topic created without cleanup.policy=compact, so that retention "
                "deleted records?)")
        snapshot = {k: v for k, v in meta.items() if k != "openWindows"}
        snapshot["windows"] = entries
        try:
            return TumblingWindows.restore(snapshot, size_ms=size_ms, sum_fields=sum_fields)
        except CheckpointError as exc:
            raise CheckpointError(f"{where}: {exc}") from exc

    def _entries(self, where: str) -> list[list[Any]]:
        """The task's live window records as snapshot entries ``[start, key, count, sums]``."""
        entries: list[list[Any]] = []
        skip = len(self._prefix)
        loads = orjson.loads
        for key, value in self._windows.items():
            rest = key[skip:]
            try:
                window = loads(rest)
            except orjson.JSONDecodeError:
                continue  # not this task's (see "Keys are unambiguous")
            if (not isinstance(window, list) or len(window) != 2 or type(window[0]) is not int
                    or type(window[1]) is not str or orjson.dumps(window) != rest):
                continue
            try:
                count, sums = loads(value)
            except (orjson.JSONDecodeError, ValueError, TypeError) as exc:
                raise CheckpointError(f"{where}: window record {key!r:.100} has a malformed value "
                                      f"{value!r:.60}") from exc
            entries.append([window[0], window[1], count, sums])
        return entries
