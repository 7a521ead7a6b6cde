"""Per-partition bookkeeping and reconciliation (DESIGN.md, "Semantics")."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlmsg.core.bookkeeping import InputTracker
from controlmsg.core.events import Event, PartitionEnded, StreamEnded, WatermarkAdvanced
from controlmsg.core.messages import MAX_TIMESTAMP, ControlMessage, EndOfStreamMessage, WatermarkMessage
from controlmsg.errors import CheckpointError, Location, ProtocolViolation

from .strategies import ControlStream, control_streams

PROPERTY = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def wm(task: str, ts: int, count: int = 2, run: str = "r1") -> WatermarkMessage:
    return WatermarkMessage(task, count, ts, run)


def eos(task: str, count: int = 2, run: str = "r1") -> EndOfStreamMessage:
    return EndOfStreamMessage(task, count, run)


def checkpointed(tracker: InputTracker, run_id: str | None = None) -> InputTracker:
    """What a restart does: the snapshot goes through a JSON checkpoint file and back."""
    return InputTracker.restore(orjson.loads(orjson.dumps(tracker.snapshot())), run_id=run_id)


# ------------------------------------------------------------------ the reference scenario


def test_reference_scenario() -> None:
    t = InputTracker([0, 1], run_id="r1", topic="mid")
    assert t.on_control(0, wm("task0", 6)) == []
    assert t.on_control(0, wm("task1", 3)) == []
    assert t.status(0).watermark == 3
    assert t.watermark is None  # p1 has not heard from everyone yet
    assert t.on_control(1, wm("task0", 10)) == []
    assert t.on_control(1, wm("task1", 4)) == [WatermarkAdvanced(3)]
    assert t.on_control(0, wm("task1", 8)) == [WatermarkAdvanced(4)]
    assert t.on_control(1, wm("task1", 7)) == [WatermarkAdvanced(6)]
    assert [s.watermark for s in t.statuses()] == [6, 7]
    assert t.on_control(1, wm("task1", 5)) == []
    assert t.counters.regressions == 1
    assert t.status(1).watermarks == {"task0": 10, "task1": 7}
    assert t.emitted_watermark == 6
    assert t.counters.applied == 6


# ------------------------------------------------------------------ end of stream


def test_end_of_stream_needs_every_distinct_task() -> None:
    t = InputTracker([0], run_id="r1")
    assert t.on_control(0, eos("t0", 3)) == []
    assert t.on_control(0, eos("t0", 3)) == []  # a retried task counts once
    assert t.on_control(0, eos("t1", 3)) == []
    assert not t.status(0).is_ended
    assert t.ended_partitions == frozenset()
    assert t.on_control(0, eos("t1", 3)) == []
    assert t.on_control(0, eos("t2", 3)) == [PartitionEnded(0), StreamEnded()]
    assert t.counters.duplicate_eos == 2
    assert t.counters.applied == 3
    assert t.is_ended
    assert t.status(0).ended_tasks == {"t0", "t1", "t2"}
    assert t.on_control(0, eos("t2", 3)) == []  # never twice
    assert t.counters.duplicate_eos == 3


def test_partition_ended_per_partition_then_stream_ended_once() -> None:
    t = InputTracker([0, 1], run_id="r1")
    assert t.on_control(0, eos("t0")) == []
    assert t.on_control(1, eos("t0")) == []
    assert t.on_control(0, eos("t1")) == [PartitionEnded(0)]
    assert t.ended_partitions == {0}
    assert not t.is_ended
    assert t.on_control(1, eos("t1")) == [PartitionEnded(1), StreamEnded()]
    assert t.is_ended


def test_ended_task_counts_as_infinity() -> None:
    t = InputTracker([0], run_id="r1")
    assert t.on_control(0, wm("t0", 5)) == []
    assert t.on_control(0, wm("t1", 3)) == [WatermarkAdvanced(3)]
    assert t.on_control(0, eos("t1")) == [WatermarkAdvanced(5)]
    assert t.status(0).holding_task == ("t0", 5)
    assert t.on_control(0, wm("t0", 9)) == [WatermarkAdvanced(9)]


def test_a_task_that_ended_without_a_watermark_has_reported() -> None:
    t = InputTracker([0], run_id="r1")
    assert t.on_control(0, eos("t0")) == []
    assert t.status(0).watermark is None
    assert t.on_control(0, wm("t1", 4)) == [WatermarkAdvanced(4)]


def test_all_tasks_ended_gives_no_watermark_for_end_of_time() -> None:
    t = InputTracker([0, 1], run_id="r1")
    for p in (0, 1):
        t.on_control(p, wm("t0", 5))
        t.on_control(p, wm("t1", 3))
    assert t.emitted_watermark == 3
    assert t.on_control(0, eos("t0")) == []  # t1 still holds p0 at 3
    assert t.on_control(0, eos("t1")) == [PartitionEnded(0)]  # p0 is +inf, p1 still holds at 3
    assert t.status(0).watermark == MAX_TIMESTAMP
    assert t.watermark == 3
    assert t.on_control(1, eos("t1")) == [WatermarkAdvanced(5)]
    assert t.on_control(1, eos("t0")) == [PartitionEnded(1), StreamEnded()]
    assert t.watermark == MAX_TIMESTAMP
    assert t.emitted_watermark == 5  # end of time is never reported as a watermark


def test_only_task_ends_without_any_watermark() -> None:
    t = InputTracker([4], run_id="")
    assert t.on_control(4, eos("only", 1, run="")) == [PartitionEnded(4), StreamEnded()]
    assert t.emitted_watermark is None


def test_watermark_after_the_tasks_own_end_is_ignored() -> None:
    t = InputTracker([0], run_id="r1")
    t.on_control(0, wm("t0", 5))
    t.on_control(0, wm("t1", 7))
    assert t.on_control(0, eos("t0")) == [WatermarkAdvanced(7)]
    assert t.on_control(0, wm("t0", 100)) == []
    assert t.counters.after_end == 1
    assert t.status(0).watermarks == {"t0": 5, "t1": 7}
    assert t.status(0).watermark == 7


def test_regressions_and_repeats() -> None:
    t = InputTracker([0], run_id="r1")
    t.on_control(0, wm("t0", 5))
    assert t.on_control(0, wm("t1", 5)) == [WatermarkAdvanced(5)]
    assert t.on_control(0, wm("t0", 5)) == []  # a repeat is no regression
    assert t.on_control(0, wm("t0", 4)) == []
    assert t.on_control(0, wm("t0", -100)) == []
    assert t.counters.regressions == 2
    assert t.status(0).watermarks == {"t0": 5, "t1": 5}
    assert t.on_control(0, wm("t0", 6)) == []  # t1 still holds at 5: no strict increase
    assert t.on_control(0, wm("t1", 6)) == [WatermarkAdvanced(6)]


def test_consumer_watermark_is_the_minimum_over_partitions() -> None:
    t = InputTracker([0, 1], run_id="r1")
    t.on_control(0, wm("t0", 10, count=1))
    assert t.watermark is None
    assert t.on_control(1, wm("t0", 2, count=1)) == [WatermarkAdvanced(2)]
    assert t.on_control(0, wm("t0", 20, count=1)) == []  # p1 holds at 2
    assert t.on_control(1, wm("t0", 15, count=1)) == [WatermarkAdvanced(15)]


def test_extreme_timestamps() -> None:
    t = InputTracker([0], run_id="r1")
    low = -(2**63)
    assert t.on_control(0, wm("t0", low, count=1)) == [WatermarkAdvanced(low)]
    assert t.on_control(0, wm("t0", MAX_TIMESTAMP - 1, count=1)) == [WatermarkAdvanced(MAX_TIMESTAMP - 1)]
    assert t.on_control(0, eos("t0", count=1)) == [PartitionEnded(0), StreamEnded()]
    restored = checkpointed(t)
    assert restored.snapshot() == t.snapshot()


# ------------------------------------------------------------------ protocol violations


def test_task_count_mismatch_is_a_violation_and_changes_nothing() -> None:
    t = InputTracker([0, 1], run_id="r1", topic="mid")
    t.on_control(0, wm("t0", 5))
    before = t.snapshot()
    with pytest.raises(ProtocolViolation) as info:
        t.on_control(1, wm("t1", 6, count=3), offset=42)
    err = info.value
    assert err.location == Location("mid", 1, 42)
    assert "taskCount" in err.reason and "3" in err.reason and "2" in err.reason
    assert "topic 'mid', partition 1, offset 42" in str(err)
    assert t.snapshot() == before
    with pytest.raises(ProtocolViolation):
        t.on_control(0, eos("t0", count=1), offset=43)  # a known task, an ended one too
    assert t.snapshot() == before
    # The tracker goes on as if the bad record had never come.
    assert t.on_control(0, wm("t1", 4)) == []
    assert t.status(0).watermark == 4


def test_more_distinct_tasks_than_task_count_is_a_violation() -> None:
    t = InputTracker([0, 1], run_id="r1", topic="mid")
    t.on_control(0, wm("t0", 5))
    t.on_control(0, eos("t1"))
    t.on_control(1, wm("t2", 1))  # a different pair of tasks on p1 is no concern of p0
    before = t.snapshot()
    for message in (wm("t2", 9), eos("t2")):
        with pytest.raises(ProtocolViolation) as info:
            t.on_control(0, message, offset=7)
        assert info.value.location == Location("mid", 0, 7)
        assert "'t2'" in info.value.reason
        assert t.snapshot() == before
    assert t.on_control(0, wm("t0", 6)) == []


def test_violation_without_offset_or_topic() -> None:
    t = InputTracker([3])
    t.on_control(3, wm("t0", 1, count=1))
    with pytest.raises(ProtocolViolation) as info:
        t.on_control(3, wm("t1", 1, count=1))
    assert info.value.location == Location(None, 3, None)


def test_unowned_partition_and_empty_partitions() -> None:
    t = InputTracker([0, 2])
    with pytest.raises(KeyError):
        t.on_control(1, wm("t0", 1))
    assert t.run_id is None  # nothing was adopted from the refused message
    with pytest.raises(ValueError):
        InputTracker([])


# ------------------------------------------------------------------ runs


def test_stale_run_is_ignored_and_counted() -> None:
    t = InputTracker([0], run_id="new")
    # An old run, with another taskCount: ignored, not a violation.
    assert t.on_control(0, wm("t0", 100, count=1, run="old")) == []
    assert t.on_control(0, eos("t0", count=1, run="old")) == []
    assert t.on_control(0, eos("t0", count=5, run="")) == []
    assert t.counters.stale_run == 3
    assert not t.is_ended
    assert t.task_count is None
    assert t.on_control(0, wm("t0", 1, run="new")) == []
    assert t.on_control(0, eos("t1", run="new")) == [WatermarkAdvanced(1)]
    # The old run's end of stream never ends the followed run.
    assert t.on_control(0, eos("t0", count=2, run="old")) == []
    assert not t.is_ended
    assert t.on_control(0, eos("t0", run="new")) == [PartitionEnded(0), StreamEnded()]
    assert t.counters.stale_run == 4


def test_run_adoption() -> None:
    t = InputTracker([0, 1])
    assert t.run_id is None
    assert t.on_control(1, wm("t0", 3, count=1, run="A")) == []
    assert t.run_id == "A"
    assert t.task_count == 1
    # Later runs are ignored, whatever they say.
    assert t.on_control(0, eos("t0", count=1, run="B")) == []
    assert t.on_control(1, eos("t0", count=3, run="B")) == []
    assert t.counters.stale_run == 2
    assert t.on_control(0, wm("t0", 4, count=1, run="A")) == [WatermarkAdvanced(3)]
    assert t.on_control(0, eos("t0", count=1, run="A")) == [PartitionEnded(0)]
    assert t.on_control(1, eos("t0", count=1, run="A")) == [PartitionEnded(1), StreamEnded()]


def test_run_adoption_of_the_empty_run() -> None:
    t = InputTracker([0])
    t.on_control(0, wm("t0", 3, count=1, run=""))
    assert t.run_id == ""
    assert t.on_control(0, eos("t0", count=1, run="x")) == []
    assert t.counters.stale_run == 1
    assert checkpointed(t).run_id == ""


# ------------------------------------------------------------------ checkpoints


def test_snapshot_is_json_and_restores_the_same_tracker() -> None:
    t = InputTracker([0, 1], run_id="r1", topic="mid")
    t.on_control(0, wm("t0", 5))
    t.on_control(0, wm("t1", 6))
    t.on_control(1, eos("t0"))
    t.on_control(1, wm("t1", 2))
    t.on_control(1, wm("t1", 1))
    t.on_control(0, wm("x", 1, count=9, run="old"))
    restored = checkpointed(t, run_id="r1")
    assert restored.snapshot() == t.snapshot()
    assert restored.topic == "mid"
    assert restored.partitions == [0, 1]
    assert restored.run_id == "r1"
    assert restored.task_count == 2
    assert restored.emitted_watermark == 2
    assert restored.counters == t.counters
    assert restored.statuses() == t.statuses()
    # No event the original already emitted comes again.
    assert restored.on_control(1, wm("t1", 2)) == []
    assert restored.on_control(1, eos("t1")) == [WatermarkAdvanced(5), PartitionEnded(1)]


def test_restore_after_end_emits_nothing_again() -> None:
    t = InputTracker([0], run_id="r1")
    t.on_control(0, eos("t0"))
    assert t.on_control(0, eos("t1")) == [PartitionEnded(0), StreamEnded()]
    restored = checkpointed(t)
    assert restored.is_ended
    assert restored.ended_partitions == {0}
    assert restored.on_control(0, eos("t1")) == []
    assert restored.on_control(0, eos("t0")) == []


def test_restore_of_a_fresh_tracker_still_adopts() -> None:
    fresh = checkpointed(InputTracker([2, 0]))
    assert fresh.partitions == [0, 2]
    assert fresh.run_id is None
    fresh.on_control(0, wm("t0", 1, count=1, run="Z"))
    assert fresh.run_id == "Z"
    told = checkpointed(InputTracker([0]), run_id="Y")
    assert told.run_id == "Y"
    assert told.on_control(0, wm("t0", 1, count=1, run="Z")) == []
    assert told.counters.stale_run == 1


def test_restore_with_another_run_is_refused() -> None:
    t = InputTracker([0], run_id="r1")
    t.on_control(0, wm("t0", 1))
    with pytest.raises(CheckpointError, match="r1"):
        InputTracker.restore(t.snapshot(), run_id="r2")
    adopted = InputTracker([0])
    adopted.on_control(0, wm("t0", 1, run="A"))
    with pytest.raises(CheckpointError):
        checkpointed(adopted, run_id="B")
    assert checkpointed(adopted, run_id="A").run_id == "A"


def _good_snapshot() -> dict[str, Any]:
    t = InputTracker([0, 1], run_id="r1", topic="mid")
    t.on_control(0, wm("t0", 5))
    t.on_control(0, wm("t1", 3))
    t.on_control(1, eos("t0"))
    t.on_control(1, wm("t1", 4))
    return t.snapshot()


def _broken(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    snapshot = copy.deepcopy(_good_snapshot())
    target = snapshot
    for key in path[:-1]:
        target = target[key]
    if value is ...:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return snapshot


MALFORMED_SNAPSHOTS: list[tuple[str, Any]] = [
    ("none", None),
    ("list", []),
    ("string", "snapshot"),
    ("empty", {}),
    ("other format", _broken(("format",), 3)),
    ("no format", _broken(("format",), ...)),
    ("no runId", _broken(("runId",), ...)),
    ("no partitions", _broken(("partitions",), ...)),
    ("zero partitions", _broken(("partitions",), {})),
    ("partitions list", _broken(("partitions",), [0, 1])),
    ("partition key not int", _broken(("partitions", "x"), {"watermarks": {}, "ended": []})),
    ("no watermarks", _broken(("partitions", "0", "watermarks"), ...)),
    ("watermarks list", _broken(("partitions", "0", "watermarks"), [5])),
    ("watermark not int", _broken(("partitions", "0", "watermarks", "t0"), "soon")),
    ("ended not list", _broken(("partitions", "1", "ended"), 5)),
    ("no taskCount", _broken(("taskCount",), ...)),
    ("taskCount string", _broken(("taskCount",), "2")),
    ("no emittedWatermark", _broken(("emittedWatermark",), ...)),
    ("no streamEnded", _broken(("streamEnded",), ...)),
    ("counter not int", _broken(("counters", "applied"), "many")),
    # Ill-typed values that must not slip through into a tracker that fails later.
    ("emittedWatermark string", _broken(("emittedWatermark",), "3")),
    ("taskCount zero", _broken(("taskCount",), 0)),
    ("taskCount bool", _broken(("taskCount",), True)),
    ("runId int", _broken(("runId",), 1)),
    ("streamEnded string", _broken(("streamEnded",), "false")),
]


@pytest.mark.parametrize("snapshot", [s for _, s in MALFORMED_SNAPSHOTS], ids=[i for i, _ in MALFORMED_SNAPSHOTS])
def test_malformed_snapshot_is_a_checkpoint_error(snapshot: Any) -> None:
    with pytest.raises(CheckpointError):
        InputTracker.restore(snapshot)


def test_partition_status() -> None:
    t = InputTracker([0], run_id="r1")
    s = t.status(0)
    assert (s.task_count, s.watermark, s.unheard_tasks, s.holding_task, s.is_ended) == (None, None, None, None, False)
    t.on_control(0, wm("a", 7, count=3))
    t.on_control(0, wm("b", 2, count=3))
    s = t.status(0)
    assert s.task_count == 3
    assert s.unheard_tasks == 1
    assert s.open_tasks == ["a", "b"]
    assert s.holding_task == ("b", 2)
    assert s.watermark is None
    t.on_control(0, eos("b", count=3))
    t.on_control(0, eos("c", count=3))
    s = t.status(0)
    assert s.reported_tasks == {"a", "b", "c"}
    assert s.unheard_tasks == 0
    assert s.open_tasks == ["a"]
    assert s.holding_task == ("a", 7)
    assert s.watermark == 7
    t.on_control(0, eos("a", count=3))
    assert t.status(0).is_ended
    assert t.status(0).holding_task is None


# ------------------------------------------------------------------ idle tasks


def idle(task: str, ts: int, count: int = 2, run: str = "r1") -> WatermarkMessage:
    return WatermarkMessage(task, count, ts, run, idle=True)


def test_an_idle_task_does_not_hold_the_others_back() -> None:
    t = InputTracker([0], run_id="r1")
    assert t.on_control(0, wm("a", 100)) == []
    assert t.on_control(0, wm("b", 50)) == [WatermarkAdvanced(50)]
    assert t.status(0).holding_task == ("b", 50)
    assert t.on_control(0, idle("b", 50)) == [WatermarkAdvanced(100)]  # same timestamp, now idle
    assert t.status(0).idle_tasks == {"b"}
    assert t.status(0).holding_task == ("a", 100)
    assert t.on_control(0, wm("a", 200)) == [WatermarkAdvanced(200)]
    # b comes back at its old promise: WM(p) drops to 50, the consumer watermark stays where it was.
    assert t.on_control(0, wm("b", 50)) == []
    assert (t.status(0).watermark, t.watermark, t.emitted_watermark) == (50, 50, 200)
    assert t.status(0).idle_tasks == frozenset()
    assert t.on_control(0, wm("b", 300)) == []  # min(a=200, b=300) = 200: already emitted
    assert t.on_control(0, wm("a", 400)) == [WatermarkAdvanced(300)]


def test_when_every_open_task_is_idle_the_minimum_holds() -> None:
    t = InputTracker([0], run_id="r1", topic="mid")
    t.on_control(0, idle("a", 100))
    assert t.on_control(0, idle("b", 70)) == [WatermarkAdvanced(70)]  # both idle: the minimum, no jump
    assert t.on_control(0, eos("b")) == [WatermarkAdvanced(100)]  # ended: +inf; a idle alone: its own mark
    assert t.on_control(0, eos("a")) == [PartitionEnded(0), StreamEnded()]
    assert t.status(0).idle_tasks == frozenset()  # ended tasks are not idle


def test_idle_flag_rules() -> None:
    t = InputTracker([0], run_id="r1")
    t.on_control(0, wm("a", 100))
    t.on_control(0, wm("b", 100))
    assert t.on_control(0, idle("b", 90)) == []  # lower: ignored whatever its flag
    assert t.counters.regressions == 1 and t.status(0).idle_tasks == frozenset()
    before = t.counters.applied
    t.on_control(0, idle("b", 100))
    t.on_control(0, idle("b", 100))  # a repeat: nothing
    assert t.counters.applied == before + 1 and t.status(0).idle_tasks == {"b"}
    t.on_control(0, wm("b", 100))  # an equal watermark without the flag: active again
    assert t.counters.applied == before + 2 and t.status(0).idle_tasks == frozenset()


def test_idle_tasks_survive_a_checkpoint() -> None:
    t = InputTracker([0, 1], run_id="r1")
    for p in (0, 1):
        t.on_control(p, wm("a", 10))
        t.on_control(p, idle("b", 5))
    restored = checkpointed(t)
    assert restored.snapshot() == t.snapshot()
    assert restored.status(0).idle_tasks == {"b"} and restored.watermark == 10
    older = t.snapshot()
    for part in older["partitions"].values():
        del part["idle"]  # a snapshot written before idleness existed: nobody idle
    assert InputTracker.restore(older).watermark == 5


# ------------------------------------------------------------------ the reference model


@dataclass
class Model:
    """The semantics recomputed from the whole history of the followed run, nothing cached."""

    partitions: tuple[int, ...]
    run: str | None
    history: list[tuple[int, ControlMessage]] = field(default_factory=list)
    stale: int = 0
    regressions: int = 0
    duplicate_eos: int = 0
    after_end: int = 0
    applied: int = 0
    emitted: int | None = None

    @property
    def task_count(self) -> int | None:
        return self.history[0][1].task_count if self.history else None

    def ended(self, p: int) -> set[str]:
        return {m.task_name for q, m in self.history if q == p and isinstance(m, EndOfStreamMessage)}

    def task_states(self, p: int) -> dict[str, tuple[int, bool]]:
        """Per task: its highest watermark and whether the latest message that counted said idle (a lower
        timestamp counts for nothing; an equal one counts for its flag)."""
        states: dict[str, tuple[int, bool]] = {}
        for q, m in self.history:
            if q == p and isinstance(m, WatermarkMessage):
                ts, _ = states.get(m.task_name, (m.timestamp, m.idle))
                if m.timestamp >= ts:
                    states[m.task_name] = (m.timestamp, m.idle)
        return states

    def max_watermarks(self, p: int) -> dict[str, int]:
        return {t: ts for t, (ts, _) in self.task_states(p).items()}

    def idle(self, p: int) -> set[str]:
        return {t for t, (_, idle) in self.task_states(p).items() if idle} - self.ended(p)

    def partition_watermark(self, p: int) -> int | None:
        n = self.task_count
        ended, marks, idle = self.ended(p), self.max_watermarks(p), self.idle(p)
        tasks = ended | set(marks)
        if n is None or len(tasks) < n:
            return None
        open_tasks = tasks - ended
        if not open_tasks:
            return MAX_TIMESTAMP
        return min(marks[t] for t in (open_tasks - idle or open_tasks))

    def watermark(self) -> int | None:
        marks = [self.partition_watermark(p) for p in self.partitions]
        return None if any(m is None for m in marks) else min(m for m in marks if m is not None)

    def eos(self, p: int) -> bool:
        return self.task_count is not None and len(self.ended(p)) >= self.task_count

    def feed(self, p: int, message: ControlMessage) -> None:
        if self.run is None:
            self.run = message.run_id
        if message.run_id != self.run:
            self.stale += 1
            return
        task = message.task_name
        was_ended = task in self.ended(p)
        previous = self.task_states(p).get(task)
        self.history.append((p, message))
        if was_ended:
            if isinstance(message, EndOfStreamMessage):
                self.duplicate_eos += 1
            else:
                self.after_end += 1
        elif isinstance(message, WatermarkMessage) and previous is not None and message.timestamp < previous[0]:
            self.regressions += 1
        elif isinstance(message, WatermarkMessage) and previous == (message.timestamp, message.idle):
            pass  # a repeat
        else:
            self.applied += 1

    def step(self, p: int, message: ControlMessage) -> list[Event]:
        """Feed one message and return the events the semantics call for."""
        wm_before = self.watermark()
        ended_before = {q for q in self.partitions if self.eos(q)}
        self.feed(p, message)
        wm_after = self.watermark()
        ended_after = {q for q in self.partitions if self.eos(q)}
        # Once defined, the consumer watermark stays defined (it may go down when an idle task comes back,
        # but what is emitted never does: emitted is the running maximum).
        assert wm_before is None or wm_after is not None
        assert ended_before <= ended_after <= ended_before | {p}
        expected: list[Event] = []
        if wm_after is not None and wm_after < MAX_TIMESTAMP and (self.emitted is None or wm_after > self.emitted):
            self.emitted = wm_after
            expected.append(WatermarkAdvanced(wm_after))
        if p in ended_after - ended_before:
            expected.append(PartitionEnded(p))
            if len(ended_after) == len(self.partitions):
                expected.append(StreamEnded())
        return expected


def check_against_model(tracker: InputTracker, model: Model) -> None:
    assert tracker.run_id == model.run
    assert tracker.task_count == model.task_count
    assert tracker.watermark == model.watermark()
    for p in model.partitions:
        status = tracker.status(p)
        ended = model.ended(p)
        assert status.ended_tasks == ended
        assert status.watermark == model.partition_watermark(p)
        assert status.idle_tasks == model.idle(p)
        open_marks = {t: ts for t, ts in model.max_watermarks(p).items() if t not in ended}
        assert {t: ts for t, ts in status.watermarks.items() if t not in ended} == open_marks
        assert status.is_ended == model.eos(p)
    assert tracker.ended_partitions == {p for p in model.partitions if model.eos(p)}
    c = tracker.counters
    assert (c.stale_run, c.regressions, c.duplicate_eos, c.after_end, c.applied) == (
        model.stale,
        model.regressions,
        model.duplicate_eos,
        model.after_end,
        model.applied,
    )


# ------------------------------------------------------------------ properties


@PROPERTY
@given(control_streams())
def test_tracker_follows_the_model(stream: ControlStream) -> None:
    tracker = InputTracker(stream.partitions, run_id=stream.tracker_run, topic="mid")
    model = Model(stream.partitions, stream.tracker_run)
    emitted: list[Event] = []
    for offset, (p, message) in enumerate(stream.records):
        events = tracker.on_control(p, message, offset)
        assert events == model.step(p, message)
        for event in events:
            # (b) end of time is never a watermark; (c) end of stream never before every task ended.
            if isinstance(event, WatermarkAdvanced):
                assert event.timestamp < MAX_TIMESTAMP
            if isinstance(event, PartitionEnded):
                assert model.task_count is not None
                assert len(model.ended(event.partition)) == model.task_count
        emitted.extend(events)
        check_against_model(tracker, model)

    # (a) strictly increasing watermarks.
    marks = [e.timestamp for e in emitted if isinstance(e, WatermarkAdvanced)]
    assert marks == sorted(set(marks))
    assert tracker.emitted_watermark == (marks[-1] if marks else None)
    # (c) each partition ends at most once, the stream at most once and last, exactly when all have ended.
    ended = [e.partition for e in emitted if isinstance(e, PartitionEnded)]
    assert len(ended) == len(set(ended))
    assert set(ended) == {p for p in stream.partitions if model.eos(p)}
    stream_ended = [i for i, e in enumerate(emitted) if isinstance(e, StreamEnded)]
    if all(model.eos(p) for p in stream.partitions):
        assert stream_ended == [len(emitted) - 1]
        assert tracker.is_ended
    else:
        assert stream_ended == []
        assert not tracker.is_ended


@PROPERTY
@given(control_streams(), st.data())
def test_restore_at_any_point_changes_nothing(stream: ControlStream, data: Any) -> None:
    # (d) One tracker runs uninterrupted; another is checkpointed and restored before every message;
    # a third is restored once, at a point of hypothesis' choosing.
    original = InputTracker(stream.partitions, run_id=stream.tracker_run, topic="mid")
    always = InputTracker(stream.partitions, run_id=stream.tracker_run, topic="mid")
    cut = data.draw(st.integers(0, len(stream.records)), label="cut")
    once = InputTracker(stream.partitions, run_id=stream.tracker_run, topic="mid")
    for i, (p, message) in enumerate(stream.records):
        always = checkpointed(always, stream.tracker_run)
        assert always.snapshot() == original.snapshot()
        if i == cut:
            once = checkpointed(once, stream.tracker_run)
        events = original.on_control(p, message, i)
        assert always.on_control(p, message, i) == events
        assert once.on_control(p, message, i) == events
    for restored in (always, once, checkpointed(original, stream.tracker_run)):
        assert restored.snapshot() == original.snapshot()
        assert restored.statuses() == original.statuses()
        assert restored.is_ended == original.is_ended
        assert restored.emitted_watermark == original.emitted_watermark


@PROPERTY
@given(control_streams())
def test_applying_a_message_twice_is_idempotent(stream: ControlStream) -> None:
    # (e) Each message applied twice in a row: the first time as usual, the second time no events.
    single = InputTracker(stream.partitions, run_id=stream.tracker_run)
    double = InputTracker(stream.partitions, run_id=stream.tracker_run)
    for p, message in stream.records:
        assert double.on_control(p, message) == single.on_control(p, message)
        assert double.on_control(p, message) == []
        assert double.statuses() == single.statuses()
        assert double.emitted_watermark == single.emitted_watermark


@PROPERTY
@given(control_streams(), st.data())
def test_violations_never_change_the_tracker(stream: ControlStream, data: Any) -> None:
    tracker = InputTracker(stream.partitions, run_id=stream.tracker_run, topic="mid")
    model = Model(stream.partitions, stream.tracker_run)
    for offset, (p, message) in enumerate(stream.records):
        n = model.task_count
        if n is not None and data.draw(st.booleans()):
            q = data.draw(st.sampled_from(stream.partitions))
            run = model.run
            assert run is not None
            bad: ControlMessage
            reported = model.ended(q) | set(model.max_watermarks(q))
            if len(reported) >= n and data.draw(st.booleans()):
                task = "intruder"  # one task more than taskCount on q
                bad = data.draw(st.sampled_from([WatermarkMessage(task, n, 1, run), EndOfStreamMessage(task, n, run)]))
            else:
                task = data.draw(st.sampled_from(["task-0", "intruder"]))
                count = data.draw(st.sampled_from([n + 1, n + 7] + ([n - 1] if n > 1 else [])))
                bad = data.draw(
                    st.sampled_from([WatermarkMessage(task, count, 1, run), EndOfStreamMessage(task, count, run)])
                )
            before = tracker.snapshot()
            with pytest.raises(ProtocolViolation) as info:
                tracker.on_control(q, bad, offset=10_000 + offset)
            assert info.value.location == Location("mid", q, 10_000 + offset)
            assert tracker.snapshot() == before
        assert tracker.on_control(p, message, offset) == model.step(p, message)
    check_against_model(tracker, model)


# ------------------------------------------------------------------ generations (rescaling)


def gwm(task: str, ts: int, gen: int, count: int, idle: bool = False) -> WatermarkMessage:
    return WatermarkMessage(task, count, ts, "r1", idle=idle, generation=gen)


def geos(task: str, gen: int, count: int) -> EndOfStreamMessage:
    return EndOfStreamMessage(task, count, "r1", generation=gen)


def test_a_new_generation_replaces_the_tasks_of_a_partition() -> None:
    t = InputTracker([0, 1], run_id="r1")
    for p in (0, 1):
        t.on_control(p, wm("a", 10))
    assert t.on_control(1, wm("b", 12)) == []
    assert t.on_control(0, wm("b", 20)) == [WatermarkAdvanced(10)]
    # Rescaled 2 -> 3: partition 0 hears generation 1 first; until all three report there, WM(0) is
    # undefined, and the consumer watermark holds (never back, never past a task not heard from).
    assert t.on_control(0, gwm("a", 30, 1, 3)) == []
    assert t.status(0).watermark is None and t.status(0).generation == 1 and t.status(0).task_count == 3
    assert t.status(0).watermarks == {"a": 30}
    assert t.watermark is None and t.emitted_watermark == 10
    assert t.on_control(0, gwm("b", 31, 1, 3)) == []
    assert t.on_control(0, gwm("c", 5, 1, 3)) == []  # below what was emitted: nothing goes back
    assert t.status(0).watermark == 5
    # Partition 1 still follows generation 0 (its old tasks' last watermarks: 10 and 12).
    assert t.status(1).generation == 0 and t.status(1).watermark == 10
    assert t.on_control(0, gwm("c", 40, 1, 3)) == []  # min(WM(0) = 30, WM(1) = 10) was emitted already
    assert t.task_count == 3 and t.generation == 1
    # A late message of generation 0 on a partition that moved on is ignored and counted.
    assert t.on_control(0, wm("a", 99)) == []
    assert t.counters.stale_generation == 1
    for task in "abc":
        t.on_control(1, gwm(task, 50, 1, 3))
    assert t.emitted_watermark == 30


def test_generations_end_of_stream_and_task_counts() -> None:
    t = InputTracker([0], run_id="r1")
    t.on_control(0, eos("a"))  # generation 0: one of two ended ...
    assert t.on_control(0, geos("a", 1, 1)) == [PartitionEnded(0), StreamEnded()]  # ... generation 1: one task
    # Nothing after the end, not even a newer generation.
    assert t.on_control(0, gwm("a", 5, 2, 1)) == [] and t.counters.after_end == 1
    assert t.on_control(0, geos("a", 1, 1)) == [] and t.counters.duplicate_eos == 1
    u = InputTracker([0, 1], run_id="r1")
    u.on_control(0, gwm("a", 1, 1, 2))
    with pytest.raises(ProtocolViolation, match="generation 1 of run 'r1' has taskCount 2"):
        u.on_control(1, gwm("a", 1, 1, 3))
    u.on_control(1, gwm("a", 1, 2, 3))  # another generation, another count
    assert u.status(1).task_count == 3 and u.status(0).task_count == 2


def test_generations_survive_a_checkpoint_and_generation_zero_snapshots_stay_format_1() -> None:
    t = InputTracker([0, 1], run_id="r1")
    t.on_control(0, wm("a", 1))
    assert t.snapshot()["format"] == 1 and "taskCounts" not in t.snapshot()
    t.on_control(1, gwm("x", 7, 2, 1))
    saved = t.snapshot()
    assert saved["format"] == 2 and saved["taskCounts"] == {"0": 2, "2": 1}
    back = checkpointed(t)
    assert back.statuses() == t.statuses() and back.snapshot() == saved
    assert back.on_control(1, wm("a", 9)) == [] and back.counters.stale_generation == 1
    with pytest.raises(CheckpointError, match="generation 2, whose taskCount is not saved"):
        InputTracker.restore({**saved, "taskCounts": {"0": 2}})


@st.composite
def rescaled_streams(draw: st.DrawFn) -> tuple[list[int], list[tuple[int, ControlMessage]]]:
    """Records of a run rescaled between generations: generation g has its own task count; every task
    sends rising watermarks (some idle) to every partition and maybe its end of stream, and on each
    partition every message of generation g precedes those of g + 1 (the old tasks were fenced before
    the new ones wrote), while partitions interleave freely."""
    partitions = list(range(draw(st.integers(1, 3))))
    per_partition: dict[int, list[ControlMessage]] = {p: [] for p in partitions}
    for gen in range(draw(st.integers(1, 4))):
        count = draw(st.integers(1, 4))
        for p in partitions:
            marks = {f"t{i}": draw(st.integers(0, 50)) for i in range(count)}
            for _ in range(draw(st.integers(0, 8))):
                task = draw(st.sampled_from(sorted(marks)))
                marks[task] += draw(st.integers(0, 10))
                per_partition[p].append(gwm(task, marks[task], gen, count, idle=draw(st.booleans())))
            if draw(st.integers(0, 9)) == 0:
                per_partition[p] += [geos(task, gen, count) for task in marks]
    records: list[tuple[int, ControlMessage]] = []
    while any(per_partition.values()):
        p = draw(st.sampled_from([q for q in partitions if per_partition[q]]))
        records.append((p, per_partition[p].pop(0)))
    return partitions, records


@PROPERTY
@given(rescaled_streams())
def test_a_rescaled_stream_never_passes_a_task_of_the_current_generation(
        stream: tuple[list[int], list[tuple[int, ControlMessage]]]) -> None:
    partitions, records = stream
    t = InputTracker(partitions, run_id="r1")
    current: dict[int, tuple[int, dict[str, int], set[str], set[str], int]] = {}  # p -> gen, marks, ended, idle, count
    emitted: list[int] = []
    for p, message in records:
        gen, marks, ended, idle, count = current.get(p, (0, {}, set(), set(), message.task_count))
        if p not in current or (message.generation > gen and len(ended) < count):  # an ended partition stays
            gen, marks, ended, idle, count = message.generation, {}, set(), set(), message.task_count
        if message.generation == gen and len(ended) < count:
            if isinstance(message, EndOfStreamMessage):
                ended.add(message.task_name)
            elif message.timestamp >= marks.get(message.task_name, message.timestamp):
                marks[message.task_name] = message.timestamp
                (idle.add if message.idle else idle.discard)(message.task_name)
            current[p] = (gen, marks, ended, idle, count)
        for event in t.on_control(p, message):
            if isinstance(event, WatermarkAdvanced):
                emitted.append(event.timestamp)
                # Never past an open task of the generation each partition follows now, unless idle.
                for _, q_marks, q_ended, q_idle, q_count in current.values():
                    assert len(q_marks.keys() | q_ended) == q_count
                    active = [ts for task, ts in q_marks.items() if task not in q_ended | q_idle]
                    assert not active or event.timestamp <= min(active)
                assert len(current) == len(partitions)
        assert t.status(p).generation == current[p][0]
    assert emitted == sorted(set(emitted))  # strictly rising
