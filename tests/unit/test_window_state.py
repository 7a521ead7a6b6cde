"""The window state changelog (controlmsg.streaming.window_state) and the change tracking of TumblingWindows:
a restore from the committed records equals a replay of everything committed, whatever the interleaving
of records, watermarks, commits, restarts, compaction and other tasks writing the same partition."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlmsg.errors import CheckpointError
from controlmsg.streaming.window_state import STATE_FORMAT, TaskStateLog, commit_records, header_key, window_prefix
from controlmsg.streaming.windows import TumblingWindows, WindowResult

PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

RUN, TASK = "r/1", 3
# Other tasks writing the same partition, with run ids chosen to look like this task's keys.
OTHERS = [("r/1", 31), ("r", 1), ("r/1/3/w", 0), ('r/1/3/w/[0,"a', 5), ("r/1/3", 0), ("", 3)]

Record = tuple[bytes | None, bytes | None]


def commit(windows: TumblingWindows, run_id: str, task: int, extra: Mapping[str, Any] | None = None) -> list[Record]:
    """The records of one commit, as controlmsg.streaming.window writes them (window records, then the header last)."""
    records: list[Record] = list(commit_records(window_prefix(run_id, task), windows.changes()))
    header = {"format": STATE_FORMAT, **(extra or {}), "windows": windows.state_header()}
    records.append((header_key(run_id, task).encode(), orjson.dumps(header)))
    windows.mark_committed()
    return records


def fold(log: list[Record], run_id: str = RUN, task: int = TASK) -> TaskStateLog:
    state = TaskStateLog(run_id, task)
    for key, value in log:
        state.apply(key, value)
    return state


def compacted(log: list[Record], rng: random.Random) -> list[Record]:
    """What Kafka's cleaner may leave: some keys' older records dropped (never a key's latest), and some
    keys whose latest record is a tombstone dropped whole (the cleaner removes a tombstone only after the
    records before it, once ``delete.retention.ms`` has passed)."""
    last = {key: i for i, (key, _) in enumerate(log)}
    gone = {key for key, i in last.items() if log[i][1] is None and rng.random() < 0.5}
    return [(key, value) for i, (key, value) in enumerate(log)
            if key not in gone and (last[key] == i or rng.random() < 0.3)]


def ours(key: bytes | None) -> bool:
    """Whether ``key`` is a window record key of task (RUN, TASK), by decoding it."""
    prefix = window_prefix(RUN, TASK)
    if key is None or not key.startswith(prefix):
        return False
    try:
        window = orjson.loads(key[len(prefix):])
    except orjson.JSONDecodeError:
        return False
    return isinstance(window, list) and orjson.dumps(window) == key[len(prefix):]


# ------------------------------------------------------------------ the model check


keys = st.sampled_from(["a", "b", '"', "/w/[", 'x"]', "ä", "\\", ""])
record_values = st.fixed_dictionaries({}, optional={"x": st.one_of(st.none(), st.integers(-50, 50),
                                                                    st.sampled_from([0.5, 2**70, -0.0]))})
Op = tuple[Any, ...]
ops = st.one_of(
    st.tuples(st.just("add"), keys, st.integers(-30, 60), record_values),
    st.tuples(st.just("advance"), st.integers(-30, 70)),
    st.tuples(st.just("commit")),
    st.tuples(st.just("restore"), st.booleans()),  # compacted log or not
    st.tuples(st.just("other"), st.integers(0, len(OTHERS) - 1), keys, st.integers(-30, 60)),
)


@dataclass
class Other:
    """Another task writing the same state partition (it only adds and commits)."""

    run_id: str
    task: int
    windows: TumblingWindows = field(default_factory=lambda: TumblingWindows(5, ("x",)))


def apply(w: TumblingWindows, op: Op) -> list[WindowResult]:
    if op[0] == "add":
        w.add(op[1], op[2], op[3])
        return []
    if op[0] == "close_all":
        return w.close_all()
    return w.advance(op[1])


@PROPERTY
@given(st.lists(ops, max_size=60), st.booleans(), st.randoms(use_true_random=False))
def test_restore_equals_a_replay_of_everything_committed(ops_: list[Op], end: bool, rng: random.Random) -> None:
    size, fields = 5, ("x",)
    live = TumblingWindows(size, fields)
    log: list[Record] = []
    others = [Other(r, t) for r, t in OTHERS]
    committed: list[Op] = []  # the operations a commit made durable
    pending: list[Op] = []  # since the last commit: lost by a restart (the input is read again)
    emitted: list[WindowResult] = []  # committed output
    emitted_pending: list[WindowResult] = []
    restores = 0

    def replay() -> TumblingWindows:
        model = TumblingWindows(size, fields)
        for op in committed:
            apply(model, op)
        return model

    def do_commit() -> None:
        nonlocal pending, emitted_pending
        log.extend(commit(live, RUN, TASK, {"offsets": len(committed) + len(pending)}))
        committed.extend(pending)
        emitted.extend(emitted_pending)
        pending, emitted_pending = [], []

    for op in ops_:
        if op[0] in ("add", "advance"):
            emitted_pending += apply(live, op)
            pending.append(op)
        elif op[0] == "commit":
            do_commit()
        elif op[0] == "other":
            other = others[op[1]]
            other.windows.add(op[2], op[3], {"x": 1})
            log.extend(commit(other.windows, other.run_id, other.task))
        else:
            source = compacted(log, rng) if op[1] else log
            state = fold(source)
            if state.header is None:
                assert not committed
                live = TumblingWindows(size, fields)
            else:
                assert state.header["offsets"] == len(committed)
                live = state.windows(size, fields)
            assert live.snapshot() == replay().snapshot()
            assert live.changes().updated == [] and live.changes().closed == []
            pending, emitted_pending = [], []
            restores += 1
    if end:
        emitted_pending += live.close_all()
        pending.append(("close_all",))
        do_commit()
        restored = fold(compacted(log, rng)).windows(size, fields)
        assert restored.snapshot() == live.snapshot()
        assert restored.is_ended and restored.open_windows == 0
        # every window record of the task ends deleted: compaction can drop them all once the run ended
        latest = dict(log)
        assert all(latest[k] is None for k in latest if ours(k))
        # the committed output is what one uninterrupted run of the committed operations emits
        model = TumblingWindows(size, fields)
        expected = [r for op in committed for r in apply(model, op)]
        assert sorted(emitted, key=repr) == sorted(expected, key=repr)
    # nothing committed twice: each window is emitted at most once across every restart
    windows = [(r.start, r.key) for r in emitted]
    assert len(windows) == len(set(windows))
    # the other tasks' state is theirs, untouched by ours
    for other in others:
        state = fold(log, other.run_id, other.task)
        if state.header is not None:
            assert state.windows(size, fields).snapshot() == other.windows.snapshot()


# ------------------------------------------------------------------ change tracking


def test_changes_list_what_changed_and_what_closed_since_the_last_commit() -> None:
    w = TumblingWindows(10, ("x",))
    w.add("a", 1, {"x": 1})
    w.add("b", 2, {"x": 2})
    w.add("a", 3, {"x": 3})
    assert sorted(w.changes().updated) == [[0, "a", 2, [4]], [0, "b", 1, [2]]]
    w.mark_committed()
    assert w.changes().updated == [] and w.changes().closed == []
    w.add("b", 4, {"x": 5})  # changed
    w.add("c", 12, {})  # created
    w.add("d", 5, {})  # created and closed before the next commit: in neither list
    w.advance(10)
    changes = w.changes()
    assert [u[:3] for u in changes.updated] == [[10, "c", 1]]
    assert sorted(changes.closed) == [(0, "a"), (0, "b")]
    w.mark_committed()
    w.close_all()
    assert w.changes().closed == [(10, "c")]


def test_mark_uncommitted_lists_every_open_window() -> None:
    w = TumblingWindows(10)
    for k in "abc":
        w.add(k, 1)
    w.mark_committed()
    w.mark_uncommitted()
    assert sorted(u[1] for u in w.changes().updated) == ["a", "b", "c"]
    w.advance(10)
    assert w.changes().closed == []  # never committed window by window: no tombstone needed


def test_sums_json_cannot_carry_survive_the_changelog() -> None:
    w = TumblingWindows(10, ("x",))
    w.add("a", 1, {"x": 2**70})
    w.add("b", 1, {"x": float("inf")})
    w.add("c", 1, {"x": -0.0})
    log = commit(w, RUN, TASK)
    restored = fold(log).windows(10, ("x",))
    assert repr(restored.close_all()) == repr(w.close_all())


# ------------------------------------------------------------------ errors and the old format


def test_format_1_header_is_read_and_rewritten_window_by_window() -> None:
    w = TumblingWindows(10, ("x",))
    w.add("a", 1, {"x": 1})
    w.add("b", 11, {"x": 2})
    old = {"format": 1, "offsets": {"0": 7}, "windows": w.snapshot()}
    log: list[Record] = [(header_key(RUN, TASK).encode(), orjson.dumps(old))]
    state = fold(log)
    assert state.header is not None and state.header["offsets"] == {"0": 7}
    restored = state.windows(10, ("x",))
    assert restored.snapshot() == w.snapshot()
    restored.advance(10)  # closes a window no changelog holds: no tombstone
    log += commit(restored, RUN, TASK)
    again = fold(log).windows(10, ("x",))
    assert again.snapshot() == restored.snapshot() and again.open_windows == 1


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (b"not json", "not JSON"),
        (b'{"format": 3, "windows": {}}', "format 3"),
        (b"[1, 2]", "format None"),
    ],
)
def test_a_header_of_an_unknown_format_names_the_key(value: bytes, match: str) -> None:
    state = TaskStateLog(RUN, TASK, "state topic 'st' partition 0")
    state.apply(header_key(RUN, TASK).encode(), value)
    with pytest.raises(CheckpointError, match=match) as info:
        _ = state.header
    assert "'r/1/3'" in str(info.value) and "'st'" in str(info.value)


def test_a_lost_window_record_is_an_error_not_a_silent_loss() -> None:
    w = TumblingWindows(10)
    w.add("a", 1)
    w.add("b", 1)
    log = commit(w, RUN, TASK)
    with pytest.raises(CheckpointError, match="counts 2 open windows but 1"):
        fold(log[1:]).windows()


def test_another_window_size_is_refused() -> None:
    w = TumblingWindows(10)
    w.add("a", 1)
    with pytest.raises(CheckpointError, match="10 ms"):
        fold(commit(w, RUN, TASK)).windows(20)


def test_a_tombstoned_header_is_no_state() -> None:
    w = TumblingWindows(10)
    log = [*commit(w, RUN, TASK), (header_key(RUN, TASK).encode(), None)]
    assert fold(log).header is None
