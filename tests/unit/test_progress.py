"""The progress a running consumer reports: who holds the watermark back, how many upstream tasks ended."""

from __future__ import annotations

import logging

import pytest

from controlmsg.core.bookkeeping import InputTracker
from controlmsg.core.messages import MIN_TIMESTAMP, EndOfStreamMessage, WatermarkMessage
from controlmsg.core.progress import format_duration, format_timestamp, progress_line, upstream_progress
from controlmsg.kafka.settings import RepeatFilter

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def _wm(task: str, ts: int, *, idle: bool = False) -> WatermarkMessage:
    return WatermarkMessage(task_name=task, task_count=2, timestamp=ts, run_id="r", idle=idle)


def _eos(task: str) -> EndOfStreamMessage:
    return EndOfStreamMessage(task_name=task, task_count=2, run_id="r")


def test_before_any_control_message_nothing_is_known() -> None:
    progress = upstream_progress(InputTracker([0, 1], run_id="r"))
    assert progress.watermark is None and progress.task_count is None and progress.holding_task is None
    assert progress_line(progress, now_ms=T0, records=0, rate=None) == "0 records, no watermark yet"


def test_a_task_not_heard_of_is_named_as_what_the_watermark_waits_for() -> None:
    tracker = InputTracker([0, 1], run_id="r")
    for p in (0, 1):
        tracker.on_control(p, _wm("a", T0))
    tracker.on_control(0, _wm("b", T0))
    progress = upstream_progress(tracker)
    assert (progress.unheard, progress.unheard_partition) == (1, 1)
    line = progress_line(progress, now_ms=T0, records=10, rate=2.0)
    assert "waiting to hear from 1 upstream task(s) on partition 1" in line
    assert line.startswith("10 records (2/s), no watermark yet")


def test_the_slowest_task_on_the_lowest_partition_holds_the_watermark_back() -> None:
    tracker = InputTracker([0, 1], run_id="r")
    for p in (0, 1):
        tracker.on_control(p, _wm("a", T0 + 60_000))
    tracker.on_control(0, _wm("b", T0 + 120_000))
    tracker.on_control(1, _wm("b", T0 + 30_000))
    progress = upstream_progress(tracker)
    assert progress.watermark == T0 + 30_000
    assert (progress.holding_task, progress.holding_partition, progress.holding_watermark) == ("b", 1, T0 + 30_000)
    line = progress_line(progress, now_ms=T0 + 40_000, records=1234, rate=None)
    assert line == ("1,234 records, watermark 2026-01-01T00:00:30Z (lag 10 s), held back by b at "
                    "2026-01-01T00:00:30Z on partition 1, 0 of 2 upstream tasks ended")


def test_an_idle_task_does_not_hold_back_and_ended_tasks_are_counted_once_ended_everywhere() -> None:
    tracker = InputTracker([0, 1], run_id="r")
    for p in (0, 1):
        tracker.on_control(p, _wm("a", T0, idle=True))
        tracker.on_control(p, _wm("b", T0 + 5_000))
    tracker.on_control(0, _eos("a"))  # a has ended on partition 0 only
    progress = upstream_progress(tracker)
    assert progress.holding_task == "b" and progress.ended_tasks == 0
    tracker.on_control(1, _eos("a"))
    assert upstream_progress(tracker).ended_tasks == 1
    for p in (0, 1):
        tracker.on_control(p, _eos("b"))
    done = upstream_progress(tracker)
    assert done.ended and done.ended_tasks == 2 and done.holding_task is None
    assert progress_line(done, now_ms=T0, records=5, rate=None) == "5 records, end of stream from every upstream task"


@pytest.mark.parametrize(("seconds", "text"), [
    (0.42, "0.4 s"), (12, "12 s"), (200, "3 min 20 s"), (5 * 3600 + 120, "5 h 02 min"),
    (12 * 86400 + 4 * 3600 + 5, "12 d 4 h"), (-3, "-3.0 s"),
])
def test_durations_read_as_a_person_says_them(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_timestamps_and_their_bounds() -> None:
    assert format_timestamp(T0) == "2026-01-01T00:00:00Z"
    assert format_timestamp(None) == "-"
    assert format_timestamp(MIN_TIMESTAMP) == "-inf"


def test_debug_lines_of_the_client_are_never_held_back() -> None:
    """``-X debug=...`` lines repeat by nature; the filter meant for a refused connection every few ms must
    let every one of them through, while it still holds back a repeated warning."""
    rf = RepeatFilter(every=60)

    def record(level: int) -> logging.LogRecord:
        return logging.LogRecord("controlmsg.kafka.client", level, __file__, 1, "BROKER [rdkafka#producer-1] x", None,
                                 None)

    assert all(rf.filter(record(logging.DEBUG)) for _ in range(3))
    assert [rf.filter(record(logging.WARNING)) for _ in range(3)] == [True, False, False]
