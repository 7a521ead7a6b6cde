"""The watermark an upstream task writes, and when it writes it. Pure: no I/O, no clock.

Everything about the rule lives here; the writers (the Spark upstream task, the streaming ingest, the
demo) only feed it their rows and their clock readings and send what it returns:

* **Value.** A task's watermark is its largest event time so far minus ``allowed_lateness_ms``, clamped
  into the range a watermark message can carry: ``[MIN_TIMESTAMP, MAX_TIMESTAMP - 1]``
  (:meth:`WatermarkPolicy.watermark_for`). A task whose progress is not a plain running maximum (the
  streaming ingest: the minimum over its source partitions) computes that progress itself and applies
  ``watermark_for`` to it.
* **Cadence.** A watermark is *due* once ``every_rows`` rows have been accounted since the previous due
  point, or once ``every_ms`` ms have passed since it (as read by the caller's clock), whichever comes
  first; a rule set to ``None`` never makes it due. At a due point both counts start again, whether or
  not anything is sent (:class:`WatermarkCadence`).
* **Never back.** A due watermark is sent only when it is strictly above the last one sent, so the
  watermarks of a task strictly increase; one is not sent at all while no row had an event time.

Time comes in only as ``now_ms`` arguments, from whatever monotonic clock the caller reads; only
differences between them matter.
"""

from __future__ import annotations

from dataclasses import dataclass

from controlmsg.core.messages import MAX_TIMESTAMP, MIN_TIMESTAMP

__all__ = ["WatermarkCadence", "WatermarkPolicy"]


def _check_int(value: object, name: str, minimum: int, optional: bool = False) -> None:
    if optional and value is None:
        return
    if type(value) is not int or value < minimum:
        wanted = f"an integer >= {minimum}" + (" or None" if optional else "")
        raise ValueError(f"{name} must be {wanted}, got {value!r}")


@dataclass(frozen=True, slots=True)
class WatermarkPolicy:
    """The rule: a task's watermark is its largest event time so far minus the allowed lateness, sent
    every ``every_rows`` rows and/or every ``every_ms`` ms (whichever comes first), only when it rose.

    Immutable and validated on construction (``ValueError``: a negative or non-integer
    ``allowed_lateness_ms``, an ``every_rows`` or ``every_ms`` below 1). Its mutable counterpart, one per
    task, is made by :meth:`cadence`.
    """

    allowed_lateness_ms: int = 0
    every_rows: int | None = None
    every_ms: int | None = None

    def __post_init__(self) -> None:
        _check_int(self.allowed_lateness_ms, "allowed_lateness_ms", 0)
        _check_int(self.every_rows, "every_rows", 1, optional=True)
        _check_int(self.every_ms, "every_ms", 1, optional=True)

    def watermark_for(self, event_time_ms: int) -> int:
        """The watermark of a task whose event time has reached ``event_time_ms``: that minus the allowed
        lateness, clamped to ``[MIN_TIMESTAMP, MAX_TIMESTAMP - 1]`` (``MAX_TIMESTAMP`` means ended)."""
        return min(max(event_time_ms - self.allowed_lateness_ms, MIN_TIMESTAMP), MAX_TIMESTAMP - 1)

    def cadence(self, now_ms: int) -> WatermarkCadence:
        """A fresh tracker for one task that starts at ``now_ms`` (the ``every_ms`` count starts there)."""
        return WatermarkCadence(self, now_ms)


class WatermarkCadence:
    """One task's watermark state under a :class:`WatermarkPolicy`: its largest event time, the rows and
    time since the last due point, and the last watermark sent. Not thread-safe."""

    __slots__ = ("_due_at_ms", "_max_event_time", "_since_rows", "last_sent", "policy")

    policy: WatermarkPolicy
    last_sent: int | None
    """The last watermark :meth:`observe` returned (``None``: none yet)."""

    def __init__(self, policy: WatermarkPolicy, now_ms: int) -> None:
        _check_int(now_ms, "now_ms", MIN_TIMESTAMP)
        self.policy = policy
        self.last_sent = None
        self._max_event_time: int | None = None
        self._since_rows = 0
        self._due_at_ms = now_ms

    @property
    def max_event_time(self) -> int | None:
        """The largest event time observed so far (``None``: no row had one)."""
        return self._max_event_time

    def observe(self, rows: int, max_event_time: int | None, now_ms: int) -> int | None:
        """Account ``rows`` more rows whose largest event time is ``max_event_time`` (None: none had one)
        at ``now_ms``; return the watermark to send now (due by rows or by time, and strictly above
        ``last_sent``), else None.

        The caller sends what is returned (it is then ``last_sent``). ``rows`` may be 0: that only checks
        the time rule. Rows beyond :meth:`rows_until_due` in one call are not carried over: the row count
        starts again at every due point. Raises ``ValueError`` for a negative ``rows``.
        """
        _check_int(rows, "rows", 0)
        if max_event_time is not None and (self._max_event_time is None or max_event_time > self._max_event_time):
            self._max_event_time = max_event_time
        self._since_rows += rows
        policy = self.policy
        due = (policy.every_rows is not None and self._since_rows >= policy.every_rows) or (
            policy.every_ms is not None and now_ms - self._due_at_ms >= policy.every_ms
        )
        if not due:
            return None
        self._since_rows = 0
        self._due_at_ms = now_ms
        if self._max_event_time is None:
            return None
        mark = policy.watermark_for(self._max_event_time)
        if self.last_sent is not None and mark <= self.last_sent:
            return None
        self.last_sent = mark
        return mark

    def rows_until_due(self) -> int | None:
        """How many more rows make a watermark due by the row rule (at least 1; ``None``: no row rule), so a
        caller can slice its batches at the due points."""
        every = self.policy.every_rows
        return None if every is None else every - self._since_rows
