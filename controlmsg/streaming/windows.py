"""Event-time tumbling windows, closed by the reconciled input watermark. Pure: no I/O, no clock.

A streaming job drives one :class:`TumblingWindows` per consumer loop: every record goes in with
:meth:`~TumblingWindows.add`, every reconciled input watermark (the
:class:`~controlmsg.core.events.WatermarkAdvanced` events of its input tracker) with
:meth:`~TumblingWindows.advance`, and at end of stream it calls :meth:`~TumblingWindows.close_all`. Time
comes in only as these arguments. The rules:

* **Windows.** ``size_ms`` cuts event time into windows ``[start, start + size_ms)`` with
  ``start = event_time - (event_time mod size_ms)``, the floor, for negative times too (with size 10,
  ``-1`` lies in ``[-10, 0)``). An event time equal to a window's end belongs to the next window. There is
  one window per (window start, key). Event times are signed 64-bit ms, and a window must lie inside that
  range (only the partial windows at either end of the 64-bit range are refused).
* **Watermark.** ``advance(w)`` is the input's promise that no later record is older than ``w``. It closes
  every open window whose end is ``<= w``. A watermark not above the current one is ignored (returns
  nothing): the watermark never goes back. It is ``None`` until the first advance.
* **Lateness.** A record is late when its window has already closed: a watermark is known and the
  window's end is ``<= watermark``. A late record is not added; :meth:`~TumblingWindows.add` returns a
  :class:`LateRecord` (for the caller's side topic) and counts it. A record behind the watermark whose
  window is still open (``event_time < watermark < end``) is added. With no watermark yet nothing is late.
* **Aggregates.** Each window has a record count and, for every field in ``sum_fields``, the SQL ``SUM``
  of that field: ``None`` and missing values are skipped, a window with no value for the field sums to
  ``None``, ints sum as ints (exactly, without bound), and a sum with any float in it is a float (values
  are added in arrival order). Only ``int`` and ``float`` are numbers here: a ``bool`` or anything else is
  a ``TypeError`` that names the field.
* **Results.** :class:`WindowResult` values come out ordered by ``(end, key)``, keys in Python's string
  order (by code point). Every window is emitted exactly once, by the advance that closes it or by
  :meth:`~TumblingWindows.close_all`.
* **End of stream.** :meth:`~TumblingWindows.close_all` closes every remaining window whatever the
  watermark; afterwards the operator is ended: :meth:`~TumblingWindows.add` and
  :meth:`~TumblingWindows.advance` raise ``ValueError``, a further ``close_all`` returns nothing.
* **Failures.** A call that raises leaves the operator as it was: a record is checked completely (event
  time, key, every sum field) before anything changes.
* **Checkpoints.** :meth:`~TumblingWindows.snapshot` gives a JSON-compatible dict (string keys, orjson and
  the standard json module both carry it) and :meth:`~TumblingWindows.restore` rebuilds the operator from
  it, so a restored operator continues exactly as the original would. JSON keeps ``3`` an int and ``3.0``
  a float; a sum JSON cannot carry exactly (an int outside the signed 64-bit range, an infinite or NaN
  float, which orjson would turn into ``null``) is written as a string: its decimal digits, or ``"inf"``,
  ``"-inf"``, ``"nan"``.
* **Changes since the last commit.** The operator remembers which windows changed (were created or got a
  record) and which windows it closed since the last :meth:`~TumblingWindows.mark_committed`;
  :meth:`~TumblingWindows.changes` lists them, so that a checkpoint can write only those
  (:mod:`controlmsg.streaming.window_state`). A window created and closed between two commits is in neither
  list: the last commit never saw it. :meth:`~TumblingWindows.state_header` is the rest of the state (the
  snapshot without its windows, plus their number). A new or restored operator starts with no changes;
  :meth:`~TumblingWindows.mark_uncommitted` counts every open window as changed (when the last commit
  did not hold them window by window).

Not thread-safe; one operator per consumer loop.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from heapq import heapify, heappop, heappush
from types import MappingProxyType
from typing import Any, Final

from controlmsg.core.messages import MAX_TIMESTAMP, MIN_TIMESTAMP
from controlmsg.errors import CheckpointError

__all__ = [
    "LateRecord",
    "TumblingWindows",
    "WindowChanges",
    "WindowResult",
]

SNAPSHOT_FORMAT: Final = 1

Sum = int | float | None

_NO_VALUES: Final[Mapping[str, Any]] = MappingProxyType({})
_FLOAT_TAGS: Final[Mapping[str, float]] = MappingProxyType({"inf": math.inf, "-inf": -math.inf, "nan": math.nan})
_DIGITS: Final = re.compile(r"-?[0-9]+")


@dataclass(frozen=True, slots=True)
class WindowResult:
    """A closed window of one key: ``[start, end)`` in epoch ms, its record count and its sums.

    ``sums`` pairs each field of ``sum_fields``, in that order, with its SQL ``SUM`` (``None`` when the
    window had no value for the field).
    """

    key: str
    start: int
    end: int
    count: int
    sums: tuple[tuple[str, Sum], ...]


@dataclass(frozen=True, slots=True)
class LateRecord:
    """A record that arrived after its window had closed: ``watermark`` (the operator's watermark when it
    arrived) is ``>=`` the end of the window starting at ``window_start``. It was not added."""

    key: str
    event_time: int
    watermark: int
    window_start: int


@dataclass(frozen=True, slots=True)
class WindowChanges:
    """What changed since the last :meth:`TumblingWindows.mark_committed`.

    ``updated``: every open window created or changed since then, as ``[start, key, count, [sum per
    field]]`` (the entry format of :meth:`TumblingWindows.snapshot`, sums encoded for JSON), in no
    particular order. ``closed``: ``(start, key)`` of every window closed since then that was open at that
    commit. The two never share a window.
    """

    updated: list[list[Any]]
    closed: list[tuple[int, str]]


def _not_a_number(field: str, value: Any) -> str | None:
    """Why ``value`` cannot be summed in ``field`` (``None``: it can; ``None`` itself is not asked about)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"sum field {field!r} must be an int or a float (or None), got {type(value).__name__} {value!r:.60}"
    return None


def _number(field: str, value: Any) -> int | float:
    """A sum field's value as an int or a float: ``TypeError`` naming ``field`` for anything else."""
    problem = _not_a_number(field, value)
    if problem is not None:
        raise TypeError(problem)
    return int(value) if isinstance(value, int) else float(value)


def _check_key(key: Any) -> None:
    if not isinstance(key, str):
        raise TypeError(f"a window key must be a string, got {type(key).__name__} {key!r:.60}")
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: a checkpoint could not be written
        raise ValueError(f"a window key must be valid UTF-8, got {key!r:.60}") from None


def _encode_sum(value: Sum) -> Sum | str:
    if type(value) is int and not MIN_TIMESTAMP <= value <= MAX_TIMESTAMP:
        return str(value)
    if type(value) is float and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def _decode_sum(value: Any) -> Sum:
    if value is None or type(value) is int or type(value) is float:
        return value
    if type(value) is str:
        if value in _FLOAT_TAGS:
            return _FLOAT_TAGS[value]
        if _DIGITS.fullmatch(value):
            return int(value)
    raise CheckpointError(f"windows snapshot: a sum has an invalid value {value!r:.60}")


def _expect_int(value: Any, what: str, minimum: int = MIN_TIMESTAMP, maximum: int = MAX_TIMESTAMP) -> int:
    if type(value) is not int or not minimum <= value <= maximum:
        raise CheckpointError(f"windows snapshot: {what} has an invalid value {value!r:.60}")
    return value


class TumblingWindows:
    """Tumbling event-time windows of ``size_ms`` milliseconds per key, with a count and the SQL ``SUM``
    of each of ``sum_fields`` (see the module docstring for the rules).

    Raises ``ValueError`` for a size outside ``[1, 2**63-1]`` or repeated sum fields, ``TypeError`` for
    a non-int size or a non-string field.
    """

    __slots__ = ("_buckets", "_changed", "_closed", "_ended", "_fields", "_hi", "_late", "_lo", "_open", "_size",
                 "_starts", "_watermark")

    def __init__(self, size_ms: int, sum_fields: Sequence[str] = ()) -> None:
        if type(size_ms) is not int:
            raise TypeError(f"size_ms must be an int, got {type(size_ms).__name__} {size_ms!r:.60}")
        if not 1 <= size_ms <= MAX_TIMESTAMP:
            raise ValueError(f"size_ms must be in [1, 2**63-1], got {size_ms}")
        if isinstance(sum_fields, str):
            raise TypeError("sum_fields must be a sequence of field names, not one string")
        fields = tuple(sum_fields)
        for f in fields:
            if not isinstance(f, str):
                raise TypeError(f"a sum field must be a string, got {type(f).__name__} {f!r:.60}")
        if len(set(fields)) != len(fields):
            raise ValueError(f"sum_fields repeats a field: {list(fields)!r}")
        self._size = size_ms
        self._fields = fields
        # Event times whose whole window lies inside the signed 64-bit range.
        self._lo = -(-MIN_TIMESTAMP // size_ms) * size_ms
        self._hi = (MAX_TIMESTAMP + 1) // size_ms * size_ms - 1
        self._watermark: int | None = None
        self._ended = False
        self._late = 0
        self._open = 0
        # window start -> key -> [count, sum per field]; a min-heap of the starts in _buckets, so that an
        # advance that closes nothing looks at one start only.
        self._buckets: dict[int, dict[str, list[Any]]] = {}
        self._starts: list[int] = []
        # Since the last mark_committed(): (start, key) of each window created or changed -> True when the
        # last commit did not hold it (created since), and the windows that commit held and that are closed.
        self._changed: dict[tuple[int, str], bool] = {}
        self._closed: list[tuple[int, str]] = []

    def __repr__(self) -> str:
        return (
            f"TumblingWindows(size_ms={self._size}, sum_fields={self._fields!r}, watermark={self._watermark}, "
            f"open_windows={self._open}, late_count={self._late}, ended={self._ended})"
        )

    # ---------------------------------------------------------------- queries

    @property
    def size_ms(self) -> int:
        return self._size

    @property
    def sum_fields(self) -> tuple[str, ...]:
        return self._fields

    @property
    def watermark(self) -> int | None:
        """The highest watermark advanced to; ``None`` until the first :meth:`advance`."""
        return self._watermark

    @property
    def open_windows(self) -> int:
        """How many (window, key) pairs hold records and are not closed yet."""
        return self._open

    @property
    def late_count(self) -> int:
        """How many :class:`LateRecord` values :meth:`add` has returned (across restores)."""
        return self._late

    @property
    def is_ended(self) -> bool:
        """True once :meth:`close_all` has been called."""
        return self._ended

    def window_start(self, event_time: int) -> int:
        """The start of the window ``event_time`` belongs to (the floor to a multiple of ``size_ms``)."""
        return event_time - event_time % self._size

    # ---------------------------------------------------------------- transitions

    def check(self, key: Any, event_time: Any, values: Mapping[str, Any] = _NO_VALUES) -> str | None:
        """Why :meth:`add` would refuse this record for a fault of the record itself, or ``None`` when it
        would take it. Pure: changes nothing, raises nothing.

        The faults are :meth:`add`'s ``TypeError`` and ``ValueError`` cases that depend on the record: an
        event time that is not an int or whose window leaves the 64-bit range, a key that is not a string
        or not valid UTF-8, a sum field that is neither ``None`` nor an int or float. Unlike :meth:`add`,
        a record whose window has closed is checked too (a malformed record is malformed, late or not).
        Contract: after ``check`` returned ``None``, ``add`` with the same arguments raises only once the
        operator has ended, so a caller can tell bad input (``check``) from its own mistakes (``add``)."""
        if type(event_time) is not int or not self._lo <= event_time <= self._hi:
            return str(self._bad_time(event_time))
        if not isinstance(key, str):
            return f"a window key must be a string, got {type(key).__name__} {key!r:.60}"
        if not key.isascii():
            try:
                key.encode("utf-8")
            except UnicodeEncodeError:
                return f"a window key must be valid UTF-8, got {key!r:.60}"
        for field in self._fields:
            value = values.get(field)
            if value is not None and type(value) is not int and type(value) is not float:
                problem = _not_a_number(field, value)
                if problem is not None:
                    return problem
        return None

    def add(self, key: str, event_time: int, values: Mapping[str, Any] = _NO_VALUES) -> LateRecord | None:
        """Add one record: its ``key``, ``event_time`` (epoch ms) and the ``values`` of its fields.

        Returns ``None`` when the record was added, or a :class:`LateRecord` when its window has already
        closed (then it is not added, and not checked beyond its event time). Raises ``TypeError`` for an
        event time that is not an int, a key that is not a string or a sum field that is neither ``None``
        nor an int or float; ``ValueError`` for an event time whose window leaves the 64-bit range, a key
        that is not valid UTF-8, or once the operator has ended. A call that raises changes nothing.
        """
        if self._ended:
            raise ValueError("the windows were closed by close_all(): no record can be added after end of stream")
        if type(event_time) is not int or not self._lo <= event_time <= self._hi:
            raise self._bad_time(event_time)
        size = self._size
        start = event_time - event_time % size
        wm = self._watermark
        if wm is not None and start + size <= wm:
            self._late += 1
            return LateRecord(key, event_time, wm, start)
        bucket = self._buckets.get(start)
        slot = None if bucket is None else bucket.get(key)
        fields = self._fields
        if slot is not None and len(fields) < 2:
            # The common cases, kept short: a window that exists, with no sum field or one.
            if fields:
                field = fields[0]
                value = values.get(field)
                if value is not None:
                    if type(value) is not int and type(value) is not float:
                        value = _number(field, value)
                    acc = slot[1]
                    slot[1] = value if acc is None else acc + value
            slot[0] += 1
            changed = self._changed
            wk = (start, key)
            if wk not in changed:
                changed[wk] = False
            return None
        sums: list[Any] = [None] * len(fields) if slot is None else slot[1:]
        for i, field in enumerate(fields):
            value = values.get(field)
            if value is None:
                continue
            if type(value) is not int and type(value) is not float:
                value = _number(field, value)
            acc = sums[i]
            sums[i] = value if acc is None else acc + value
        if slot is not None:
            slot[1:] = sums
            slot[0] += 1
            if (start, key) not in self._changed:
                self._changed[(start, key)] = False
            return None
        _check_key(key)
        if bucket is None:
            bucket = self._buckets[start] = {}
            heappush(self._starts, start)
        bucket[key] = [1, *sums]
        self._changed[(start, key)] = True
        self._open += 1
        return None

    def advance(self, watermark: int) -> list[WindowResult]:
        """Advance to the input ``watermark``: close and return every open window with ``end <= watermark``,
        ordered by ``(end, key)``.

        A watermark not above the current one is ignored and returns ``[]``. Raises ``TypeError`` for a
        non-int watermark, ``ValueError`` for one outside the signed 64-bit range or once the operator has
        ended.
        """
        if self._ended:
            raise ValueError("the windows were closed by close_all(): no watermark can follow end of stream")
        if type(watermark) is not int:
            raise TypeError(f"a watermark must be an int, got {type(watermark).__name__} {watermark!r:.60}")
        if not MIN_TIMESTAMP <= watermark <= MAX_TIMESTAMP:
            raise ValueError(f"a watermark must be a signed 64-bit int, got {watermark}")
        current = self._watermark
        if current is not None and watermark <= current:
            return []
        self._watermark = watermark
        return self._close(watermark - self._size)

    def close_all(self) -> list[WindowResult]:
        """End of stream: close and return every open window, ordered by ``(end, key)``, whatever the
        watermark. Afterwards the operator is ended; calling this again returns ``[]``."""
        self._ended = True
        return self._close(None)

    def _close(self, last_start: int | None) -> list[WindowResult]:
        """Close the windows whose start is ``<= last_start`` (all when ``None``), in (start, key) order."""
        results: list[WindowResult] = []
        starts = self._starts
        buckets = self._buckets
        fields = self._fields
        size = self._size
        changed = self._changed
        closed = self._closed
        while starts and (last_start is None or starts[0] <= last_start):
            start = heappop(starts)
            bucket = buckets.pop(start)
            end = start + size
            for key in sorted(bucket):
                slot = bucket[key]
                results.append(WindowResult(key, start, end, slot[0], tuple(zip(fields, slot[1:], strict=True))))
                if changed.pop((start, key), False) is not True:  # the last commit held it
                    closed.append((start, key))
            self._open -= len(bucket)
        return results

    def _bad_time(self, event_time: Any) -> Exception:
        if type(event_time) is not int:
            return TypeError(f"an event time must be an int, got {type(event_time).__name__} {event_time!r:.60}")
        return ValueError(
            f"event time {event_time} is outside [{self._lo}, {self._hi}]: its window of {self._size} ms "
            "would leave the signed 64-bit range"
        )

    # ---------------------------------------------------------------- checkpoints

    def snapshot(self) -> dict[str, Any]:
        """The whole operator as a JSON-compatible dict (string keys), for a checkpoint. Open windows are
        listed in (start, key) order as ``[start, key, count, [sum per field]]``."""
        windows: list[list[Any]] = []
        for start in sorted(self._buckets):
            bucket = self._buckets[start]
            for key in sorted(bucket):
                slot = bucket[key]
                windows.append([start, key, slot[0], [_encode_sum(s) for s in slot[1:]]])
        doc = self.state_header()
        del doc["openWindows"]
        doc["windows"] = windows
        return doc

    def state_header(self) -> dict[str, Any]:
        """:meth:`snapshot` without the open windows, plus ``"openWindows"``: their number. With a changelog
        of the windows (:mod:`controlmsg.streaming.window_state`), it restores the operator exactly."""
        return {
            "format": SNAPSHOT_FORMAT,
            "sizeMs": self._size,
            "sumFields": list(self._fields),
            "watermark": self._watermark,
            "ended": self._ended,
            "lateCount": self._late,
            "openWindows": self._open,
        }

    def changes(self) -> WindowChanges:
        """The windows created or changed, and the windows closed, since the last :meth:`mark_committed`
        (or since the operator was made or restored). Does not reset them; costs time in proportion to
        the changes, not to the open windows."""
        buckets = self._buckets
        updated: list[list[Any]] = []
        for start, key in self._changed:
            slot = buckets[start][key]
            updated.append([start, key, slot[0], [_encode_sum(s) for s in slot[1:]]])
        return WindowChanges(updated, list(self._closed))

    def mark_committed(self) -> None:
        """The state as it is now has been committed: :meth:`changes` starts again from nothing. Call it
        only once the checkpoint that holds :meth:`changes` is durable."""
        self._changed = {}
        self._closed = []

    def mark_uncommitted(self) -> None:
        """Count every open window as created since the last commit: the next :meth:`changes` lists them
        all in ``updated``. For an operator restored from a whole :meth:`snapshot`, whose windows no
        changelog holds yet."""
        self._changed = {(start, key): True for start, bucket in self._buckets.items() for key in bucket}
        self._closed = []

    @classmethod
    def restore(
        cls,
        snapshot: Mapping[str, Any],
        *,
        size_ms: int | None = None,
        sum_fields: Sequence[str] | None = None,
    ) -> TumblingWindows:
        """Rebuild an operator from :meth:`snapshot`'s output (after a JSON round trip or not).

        ``size_ms`` and ``sum_fields``, when given, are what the job expects: a snapshot of another window
        size or other sum fields is refused. Raises :class:`~controlmsg.errors.CheckpointError` when the
        snapshot is malformed, of another format, inconsistent (an open window the watermark has closed,
        open windows after end of stream, a window twice), or does not match.
        """
        try:
            fmt = snapshot["format"]
            if type(fmt) is not int or fmt != SNAPSHOT_FORMAT:
                raise CheckpointError(f"windows snapshot format {fmt!r:.60} is not supported")
            size = _expect_int(snapshot["sizeMs"], "sizeMs", 1)
            if size_ms is not None and size != size_ms:
                raise CheckpointError(f"the checkpoint has windows of {size} ms, but the job asks for {size_ms} ms")
            saved_fields = snapshot["sumFields"]
            if not isinstance(saved_fields, list | tuple) or not all(isinstance(f, str) for f in saved_fields):
                raise CheckpointError(
                    f"windows snapshot: sumFields must be a list of strings, not {saved_fields!r:.60}"
                )
            if sum_fields is not None and tuple(saved_fields) != tuple(sum_fields):
                raise CheckpointError(
                    f"the checkpoint sums the fields {list(saved_fields)!r}, but the job asks for {list(sum_fields)!r}"
                )
            try:
                windows = cls(size, saved_fields)
            except ValueError as exc:
                raise CheckpointError(f"windows snapshot: {exc}") from exc
            wm_value = snapshot["watermark"]
            watermark = None if wm_value is None else _expect_int(wm_value, "watermark")
            ended = snapshot["ended"]
            if type(ended) is not bool:
                raise CheckpointError(f"windows snapshot: ended must be true or false, got {ended!r:.60}")
            late = _expect_int(snapshot["lateCount"], "lateCount", 0, 2**64 - 1)
            saved_windows = snapshot["windows"]
            if not isinstance(saved_windows, list | tuple):
                raise CheckpointError(f"windows snapshot: windows must be a list, got {saved_windows!r:.60}")
            if ended and saved_windows:
                raise CheckpointError("windows snapshot: open windows after end of stream")
            n = len(windows._fields)
            for entry in saved_windows:
                if not isinstance(entry, list | tuple) or len(entry) != 4:
                    raise CheckpointError(f"windows snapshot: a window is [start, key, count, sums], not {entry!r:.60}")
                start = _expect_int(entry[0], "a window start", windows._lo, windows._hi)
                if start % size:
                    raise CheckpointError(f"windows snapshot: window start {start} is not a multiple of {size}")
                if watermark is not None and start + size <= watermark:
                    raise CheckpointError(
                        f"windows snapshot: window [{start}, {start + size}) is open, but watermark {watermark} "
                        "has closed it"
                    )
                key = entry[1]
                try:
                    _check_key(key)
                except (TypeError, ValueError) as exc:
                    raise CheckpointError(f"windows snapshot: {exc}") from exc
                count = _expect_int(entry[2], "a window count", 1, 2**64 - 1)
                sums = entry[3]
                if not isinstance(sums, list | tuple) or len(sums) != n:
                    raise CheckpointError(f"windows snapshot: a window needs {n} sums, got {sums!r:.60}")
                bucket = windows._buckets.setdefault(start, {})
                if key in bucket:
                    raise CheckpointError(f"windows snapshot: window {start} of key {key!r:.60} appears twice")
                bucket[key] = [count, *(_decode_sum(s) for s in sums)]
            windows._watermark = watermark
            windows._ended = ended
            windows._late = late
            windows._starts = list(windows._buckets)
            heapify(windows._starts)
            windows._open = sum(len(b) for b in windows._buckets.values())
        except CheckpointError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CheckpointError(f"windows snapshot is malformed: {exc!r:.200}") from exc
        return windows
