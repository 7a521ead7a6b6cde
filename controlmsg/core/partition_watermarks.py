"""The watermark of a topic that ordinary producers write: one per partition, the minimum over those that are
not idle, never going back. Pure: no I/O, no clock.

A chain's first topic carries no control messages, so its watermark can only be inferred from the event
times of its records, as Flink's Kafka source does (``WatermarkStrategy.forBoundedOutOfOrderness`` with
``withIdleness``). Everything about the rule lives here; the reader (the driver's scan of
:mod:`controlmsg.spark.reading.plain_watermark`) only feeds it the records' event times and its clock readings:

* **Per partition.** A partition's watermark is its largest event time so far minus the bound
  (:attr:`WatermarkRule.bound_ms`, the user's ``maxOutOfOrderness``): the producers promise nothing, the user
  says how far out of order a partition's records come at most.
* **Minimum over the active partitions.** The read's watermark is the minimum of the partitions' watermarks.
  A partition that has given no record yet has no watermark and keeps the read's undefined, unless it is
  idle. A partition is **idle** once it has given no record for :attr:`WatermarkRule.idle_ms` (the
  user's ``idleTimeout``; ``None``: never) by the caller's clock, counted from its last record or, before
  its first, from when the read first saw it; an idle partition is left out of the minimum until it gives a
  record again. When every partition is idle the watermark stays where it is.
* **Never back.** The watermark only rises: a minimum below it (an idle partition that came back behind
  the others) leaves it where it is, and that partition's records below it are late.
* **Alignment** (optional, Flink's ``withWatermarkAlignment``): a partition whose own watermark runs more
  than :attr:`WatermarkRule.drift_ms` past the read's is read no further until the read's catches up
  (:meth:`WatermarkRule.runs_ahead`), so a skewed backfill keeps less state; such a partition still counts as
  active (it has records waiting), so it never holds the others up by going idle.
* **The end.** :meth:`PartitionWatermarks.finish` sets it to the caller's end of time: a bounded input has
  ended, every window can close.

Time comes in only as ``now_ms`` arguments (epoch ms: the state is kept in a checkpoint and read again by a
restarted process, so the clock must be one that survives a restart); event times are epoch ms.
:meth:`PartitionWatermarks.snapshot` and :meth:`PartitionWatermarks.restore` give and take a JSON-safe
dict, so the state travels with the offsets it belongs to.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

__all__ = ["PartitionWatermarks", "WatermarkRule", "WatermarkStatus"]

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, slots=True)
class WatermarkRule:
    """How the read's watermark follows its partitions: ``bound_ms`` (>= 0) below each partition's largest
    event time, partitions idle after ``idle_ms`` (>= 1; ``None``: never), and with ``drift_ms`` (>= 0;
    ``None``: none) watermark alignment (:meth:`runs_ahead`). Raises ``ValueError`` otherwise."""

    bound_ms: int
    idle_ms: int | None = None
    drift_ms: int | None = None

    def __post_init__(self) -> None:
        if type(self.bound_ms) is not int or self.bound_ms < 0:
            raise ValueError(f"bound_ms must be an integer >= 0, got {self.bound_ms!r}")
        if self.idle_ms is not None and (type(self.idle_ms) is not int or self.idle_ms < 1):
            raise ValueError(f"idle_ms must be an integer >= 1 or None, got {self.idle_ms!r}")
        if self.drift_ms is not None and (type(self.drift_ms) is not int or self.drift_ms < 0):
            raise ValueError(f"drift_ms must be an integer >= 0 or None, got {self.drift_ms!r}")

    def runs_ahead(self, largest: int | None, watermark: int | None) -> bool:
        """Watermark alignment (Flink's ``withWatermarkAlignment``): whether a partition whose largest event
        time is ``largest`` has its own watermark more than ``drift_ms`` past the read's ``watermark``, and is
        to be read no further until the watermark catches up. Never while either is undefined, nor without
        ``drift_ms``. The partition that holds the watermark back is never ahead of it, so the read always
        moves on."""
        if self.drift_ms is None or largest is None or watermark is None:
            return False
        return largest - self.bound_ms > watermark + self.drift_ms


@dataclass(slots=True)
class _Partition:
    largest: int | None  # largest event time seen, epoch ms; None: no record with an event time yet
    active_ms: int  # the caller's clock at its last record, or when it was first seen


@dataclass(frozen=True, slots=True)
class WatermarkStatus(Generic[K]):
    """The read's watermark (``None``: undefined) and what holds it back: ``holder``, the active partition
    with the lowest watermark (or one without any event time yet, ``holder_watermark`` then ``None``);
    ``None`` when every partition is idle. ``idle``: how many partitions are idle."""

    watermark: int | None
    holder: K | None
    holder_watermark: int | None
    idle: int
    partitions: int


@dataclass
class PartitionWatermarks(Generic[K]):
    """The mutable state of one read under ``rule``: per partition (any hashable key, e.g. ``(topic,
    partition)``) its largest event time and when it was last active, and the read's watermark. See the
    module docstring for the rule; nothing here reads a clock or raises on input it is given in order."""

    rule: WatermarkRule
    _parts: dict[K, _Partition] = field(default_factory=dict)
    watermark: int | None = None
    """The read's watermark (epoch ms), ``None`` until defined; never decreases."""

    # ---------------------------------------------------------------- feeding it

    def track(self, partitions: Iterable[K], now_ms: int) -> None:
        """Partitions the read reads now: one not tracked yet is added, active from ``now_ms`` with no event
        time; one tracked and not among them is dropped (its topic or partition is gone)."""
        given = list(dict.fromkeys(partitions))  # in the order given: a set's order changes from run to run
        wanted = set(given)
        for key in [k for k in self._parts if k not in wanted]:
            del self._parts[key]
        for key in given:
            if key not in self._parts:
                self._parts[key] = _Partition(None, now_ms)

    def observe(self, partition: K, event_ms: int | None, now_ms: int) -> None:
        """A record of ``partition`` read at ``now_ms``, with event time ``event_ms`` (``None``: it has none
        that can be read, a bad record; it still counts as activity). A partition not tracked is added."""
        part = self._parts.get(partition)
        if part is None:
            part = self._parts[partition] = _Partition(None, now_ms)
        part.active_ms = max(part.active_ms, now_ms)
        if event_ms is not None and (part.largest is None or event_ms > part.largest):
            part.largest = event_ms

    def advance(self, now_ms: int) -> WatermarkStatus[K]:
        """Move the watermark to the minimum over the partitions active at ``now_ms`` if that is higher
        (see the module docstring) and return where it stands and what holds it back."""
        idle_ms = self.rule.idle_ms
        bound = self.rule.bound_ms
        active = [(k, p) for k, p in self._parts.items() if idle_ms is None or now_ms - p.active_ms < idle_ms]
        idle = len(self._parts) - len(active)
        if not active:
            return WatermarkStatus(self.watermark, None, None, idle, len(self._parts))
        unknown = [k for k, p in active if p.largest is None]
        if unknown:
            return WatermarkStatus(self.watermark, min(unknown, key=repr), None, idle, len(self._parts))
        holder, lowest = min(((k, p.largest - bound) for k, p in active if p.largest is not None),
                             key=lambda kv: (kv[1], repr(kv[0])))
        if self.watermark is None or lowest > self.watermark:
            self.watermark = lowest
        return WatermarkStatus(self.watermark, holder, lowest, idle, len(self._parts))

    def finish(self, end_ms: int) -> None:
        """The input has ended: the watermark is ``end_ms`` (the caller's end of time) from now on."""
        if self.watermark is None or end_ms > self.watermark:
            self.watermark = end_ms

    # ---------------------------------------------------------------- reading it

    def largest(self, partition: K) -> int | None:
        """``partition``'s largest event time so far (``None``: none yet, or not tracked)."""
        part = self._parts.get(partition)
        return None if part is None else part.largest

    def partitions(self) -> list[K]:
        """The partitions tracked, in the order they were first seen."""
        return list(self._parts)

    # ---------------------------------------------------------------- checkpoint

    def snapshot(self) -> dict[str, Any]:
        """A JSON-safe copy of the state: ``{"watermark": ms | None, "partitions": [[key..., largest,
        active_ms], ...]}``, a tuple key written as its items (keys are JSON scalars or tuples of them)."""
        rows = []
        for key, part in sorted(self._parts.items(), key=lambda kv: repr(kv[0])):
            items = list(key) if isinstance(key, tuple) else [key]
            rows.append([*items, part.largest, part.active_ms])
        return {"watermark": self.watermark, "partitions": rows}

    @classmethod
    def restore(cls, rule: WatermarkRule, snapshot: dict[str, Any]) -> PartitionWatermarks[Any]:
        """The state :meth:`snapshot` gave, under ``rule`` (which may differ from the one it was taken under:
        a query restarted with another ``idleTimeout``); a key of several items comes back as a tuple.
        Raises ``ValueError`` for a snapshot that is not one."""
        try:
            mark = snapshot["watermark"]
            parts: dict[Any, _Partition] = {}
            for row in snapshot["partitions"]:
                *items, largest, active = row
                key = tuple(items) if len(items) > 1 else items[0]
                if not (largest is None or type(largest) is int) or type(active) is not int:
                    raise TypeError(row)
                parts[key] = _Partition(largest, active)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a snapshot of a plain topic's watermark: {str(snapshot)[:200]}") from exc
        if not (mark is None or type(mark) is int):
            raise ValueError(f"not a snapshot of a plain topic's watermark: watermark {mark!r}")
        return cls(rule, parts, mark)
