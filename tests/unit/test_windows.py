"""Event-time tumbling windows (controlmsg.streaming.windows): bounds, SQL SUM, lateness, end of stream,
checkpoints, and a reference model checked over arbitrary interleavings of records and watermarks."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from fractions import Fraction
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlmsg.core.messages import MAX_TIMESTAMP, MIN_TIMESTAMP
from controlmsg.errors import CheckpointError
from controlmsg.streaming.windows import LateRecord, TumblingWindows, WindowResult

from .strategies import json_values

PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def checkpointed(windows: TumblingWindows, **expect: Any) -> TumblingWindows:
    """What a restart does: the snapshot goes through a JSON checkpoint file and back."""
    return TumblingWindows.restore(orjson.loads(orjson.dumps(windows.snapshot())), **expect)


def exactly(a: object, b: object) -> None:
    """Equal, and equal in repr too: 3 and 3.0, 0.0 and -0.0 differ."""
    assert a == b
    assert repr(a) == repr(b)


def result(key: str, start: int, size: int, count: int, **sums: int | float | None) -> WindowResult:
    return WindowResult(key, start, start + size, count, tuple(sums.items()))


# ------------------------------------------------------------------ window bounds


@pytest.mark.parametrize(
    ("event_time", "start"),
    [(0, 0), (1, 0), (9, 0), (10, 10), (19, 10), (-1, -10), (-9, -10), (-10, -10), (-11, -20), (-20, -20)],
)
def test_window_start_is_the_floor(event_time: int, start: int) -> None:
    w = TumblingWindows(10)
    assert w.window_start(event_time) == start
    assert w.add("k", event_time, {}) is None
    assert w.close_all() == [WindowResult("k", start, start + 10, 1, ())]


def test_event_time_equal_to_end_belongs_to_the_next_window() -> None:
    w = TumblingWindows(10)
    for t in (0, 9, 10, -10, -1):
        w.add("k", t)
    assert [(r.start, r.end, r.count) for r in w.close_all()] == [(-10, 0, 2), (0, 10, 2), (10, 20, 1)]


def test_windows_are_per_key() -> None:
    w = TumblingWindows(5, ["x"])
    w.add("a", 1, {"x": 1})
    w.add("b", 2, {"x": 2})
    w.add("a", 4, {"x": 3})
    assert w.open_windows == 2
    exactly(w.close_all(), [result("a", 0, 5, 2, x=4), result("b", 0, 5, 1, x=2)])
    assert w.open_windows == 0


def test_size_one_and_the_edges_of_the_64_bit_range() -> None:
    w = TumblingWindows(1)
    w.add("k", MIN_TIMESTAMP)
    w.add("k", MAX_TIMESTAMP)
    assert [(r.start, r.end) for r in w.close_all()] == [(MIN_TIMESTAMP, MIN_TIMESTAMP + 1), (MAX_TIMESTAMP, 2**63)]
    w = TumblingWindows(1000)
    with pytest.raises(ValueError, match="64-bit"):
        w.add("k", MIN_TIMESTAMP)  # its window would start below -2**63
    with pytest.raises(ValueError, match="64-bit"):
        w.add("k", MAX_TIMESTAMP)  # its window would end above 2**63
    lo = -(2**63) + 808  # the first multiple of 1000 at or above -2**63
    hi = 2**63 - 808 - 1  # the last ms of the last whole window
    assert lo % 1000 == 0 and (hi + 1) % 1000 == 0
    assert w.add("k", lo) is None
    assert w.add("k", hi) is None
    with pytest.raises(ValueError):
        w.add("k", hi + 1)


# ------------------------------------------------------------------ SQL SUM


def test_sum_skips_none_and_missing_values() -> None:
    w = TumblingWindows(10, ["x", "y"])
    w.add("k", 1, {"x": 1, "y": None})
    w.add("k", 2, {"x": None})
    w.add("k", 3, {})
    w.add("k", 4, {"x": 5, "other": "ignored"})
    exactly(w.close_all(), [result("k", 0, 10, 4, x=6, y=None)])


def test_int_sums_stay_int_and_any_float_makes_a_float() -> None:
    w = TumblingWindows(10, ["i", "f", "g", "z"])
    w.add("k", 1, {"i": 2, "f": 1, "g": 1.5, "z": 0})
    w.add("k", 2, {"i": 3, "f": 2.0, "g": 2, "z": -0.0})
    w.add("k", 3, {"i": 2**70, "f": 3})
    [r] = w.close_all()
    exactly(r.sums, (("i", 2**70 + 5), ("f", 6.0), ("g", 3.5), ("z", 0.0)))
    assert type(dict(r.sums)["i"]) is int


def test_sums_follow_the_order_of_sum_fields() -> None:
    w = TumblingWindows(10, ("b", "a"))
    w.add("k", 1, {"a": 1, "b": 2})
    assert w.close_all()[0].sums == (("b", 2), ("a", 1))


def test_int_and_float_subclasses_count_as_numbers() -> None:
    class Level(IntEnum):
        HIGH = 7

    class MyFloat(float):
        pass

    w = TumblingWindows(10, ["x", "y"])
    w.add("k", 1, {"x": Level.HIGH, "y": MyFloat(0.5)})
    [r] = w.close_all()
    exactly(r.sums, (("x", 7), ("y", 0.5)))
    assert type(r.sums[0][1]) is int and type(r.sums[1][1]) is float


@pytest.mark.parametrize("bad", [True, False, "3", b"3", Fraction(1, 2), [1], {"v": 1}, 1j])
def test_non_numbers_are_a_type_error_naming_the_field(bad: object) -> None:
    w = TumblingWindows(10, ["ok", "amount"])
    w.add("k", 1, {"ok": 1, "amount": 1})
    before = w.snapshot()
    with pytest.raises(TypeError, match="'amount'"):
        w.add("k", 2, {"ok": 1, "amount": bad})  # an existing window
    with pytest.raises(TypeError, match="'amount'"):
        w.add("new", 2, {"ok": 1, "amount": bad})  # a new window
    assert w.snapshot() == before  # nothing changed: no count, no partial sum, no new window
    one = TumblingWindows(10, ["amount"])
    one.add("k", 1, {"amount": 1})
    with pytest.raises(TypeError, match="'amount'"):
        one.add("k", 2, {"amount": bad})
    assert one.close_all() == [result("k", 0, 10, 1, amount=1)]


def test_a_sum_that_overflows_a_float_raises_and_changes_nothing() -> None:
    w = TumblingWindows(10, ["x"])
    w.add("k", 1, {"x": 10**400})
    before = w.snapshot()
    with pytest.raises(OverflowError):
        w.add("k", 2, {"x": 1.0})
    assert w.snapshot() == before


def test_count_only_windows() -> None:
    w = TumblingWindows(10)
    for t in range(25):
        w.add("k", t)
    assert [(r.start, r.count, r.sums) for r in w.close_all()] == [(0, 10, ()), (10, 10, ()), (20, 5, ())]


# ------------------------------------------------------------------ watermark and lateness


def test_advance_closes_windows_whose_end_is_at_or_below_the_watermark() -> None:
    w = TumblingWindows(10)
    assert w.watermark is None
    for t in (5, 15, 25):
        w.add("k", t)
    assert w.advance(9) == []
    assert w.watermark == 9
    assert w.advance(10) == [WindowResult("k", 0, 10, 1, ())]  # end == watermark: closed
    assert w.advance(29) == [WindowResult("k", 10, 20, 1, ())]
    assert w.open_windows == 1
    assert w.advance(30) == [WindowResult("k", 20, 30, 1, ())]
    assert w.advance(1000) == []


def test_a_record_is_late_when_its_window_end_is_at_or_below_the_watermark() -> None:
    w = TumblingWindows(10, ["x"])
    assert w.add("k", -100, {"x": 1}) is None  # no watermark yet: nothing is late
    w.advance(20)
    assert w.add("k", 19, {"x": 1}) == LateRecord("k", 19, 20, 10)  # [10, 20): end 20 <= 20
    assert w.add("k", 10, {"x": 1}) == LateRecord("k", 10, 20, 10)
    assert w.add("j", -5, {"x": "not checked"}) == LateRecord("j", -5, 20, -10)  # late: not added, not checked
    assert w.add("k", 20, {"x": 1}) is None  # [20, 30) is open
    assert w.late_count == 3
    w.advance(25)
    assert w.add("k", 21, {"x": 2}) is None  # behind the watermark, but its window is still open
    assert w.add("k", 19, {"x": 1}) == LateRecord("k", 19, 25, 10)
    assert w.late_count == 4
    assert w.close_all() == [result("k", 20, 10, 2, x=3)]


def test_the_watermark_never_goes_back() -> None:
    w = TumblingWindows(10)
    w.add("k", 5)
    assert w.advance(15) == [WindowResult("k", 0, 10, 1, ())]
    w.add("k", 15)
    assert w.advance(3) == []
    assert w.advance(15) == []  # equal: ignored as well
    assert w.watermark == 15
    assert w.add("k", 9) == LateRecord("k", 9, 15, 0)  # still late against 15, not against 3
    assert w.add("k", 12) is None
    assert w.advance(20) == [WindowResult("k", 10, 20, 2, ())]


def test_negative_watermarks() -> None:
    w = TumblingWindows(10)
    w.add("k", -15)
    w.add("k", -5)
    assert w.advance(-10) == [WindowResult("k", -20, -10, 1, ())]
    assert w.add("k", -11) == LateRecord("k", -11, -10, -20)
    assert w.add("k", -10) is None
    assert w.advance(MIN_TIMESTAMP) == []  # a regression
    assert w.advance(0) == [WindowResult("k", -10, 0, 2, ())]


def test_the_highest_watermark_closes_everything() -> None:
    w = TumblingWindows(1)
    w.add("k", MAX_TIMESTAMP)
    w.add("k", 0)
    assert [r.start for r in w.advance(MAX_TIMESTAMP - 1)] == [0]
    assert [r.start for r in w.advance(MAX_TIMESTAMP)] == []  # [MAX, MAX + 1) ends above every watermark
    assert w.close_all() == [WindowResult("k", MAX_TIMESTAMP, 2**63, 1, ())]


def test_results_are_ordered_by_end_then_key() -> None:
    w = TumblingWindows(10)
    for key, t in [("b", 25), ("c", 5), ("b", 5), ("a", 15), ("a", 5), ("B", 25), ("é", 5), ("a", 35)]:
        w.add(key, t)
    got = w.advance(30)
    assert [(r.end, r.key) for r in got] == [
        (10, "a"),
        (10, "b"),
        (10, "c"),
        (10, "é"),
        (20, "a"),
        (30, "B"),
        (30, "b"),
    ]
    assert [(r.end, r.key) for r in w.close_all()] == [(40, "a")]


# ------------------------------------------------------------------ end of stream


def test_close_all_closes_everything_and_ends() -> None:
    w = TumblingWindows(10, ["x"])
    w.add("b", 105, {"x": 1})
    w.add("a", 5, {"x": 2.5})
    w.advance(3)
    assert not w.is_ended
    assert w.close_all() == [result("a", 0, 10, 1, x=2.5), result("b", 100, 10, 1, x=1)]
    assert w.is_ended
    assert w.open_windows == 0
    assert w.watermark == 3  # end of stream is not a watermark
    with pytest.raises(ValueError, match="end of stream"):
        w.add("a", 500, {"x": 1})
    with pytest.raises(ValueError, match="end of stream"):
        w.advance(1000)
    assert w.close_all() == []  # again: nothing more
    restored = checkpointed(w)
    assert restored.is_ended
    with pytest.raises(ValueError):
        restored.add("a", 500, {"x": 1})


# ------------------------------------------------------------------ argument checks


@pytest.mark.parametrize("size", [0, -1, 2**63])
def test_size_out_of_range(size: int) -> None:
    with pytest.raises(ValueError, match="size_ms"):
        TumblingWindows(size)


@pytest.mark.parametrize("size", [True, 10.0, "10", None])
def test_size_not_an_int(size: Any) -> None:
    with pytest.raises(TypeError, match="size_ms"):
        TumblingWindows(size)


def test_sum_fields_checks() -> None:
    with pytest.raises(ValueError, match="repeats"):
        TumblingWindows(10, ["x", "y", "x"])
    with pytest.raises(TypeError):
        TumblingWindows(10, "xy")
    with pytest.raises(TypeError):
        TumblingWindows(10, ["x", 1])  # type: ignore[list-item]
    assert TumblingWindows(10, iter(["x", "y"])).sum_fields == ("x", "y")  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [1.0, True, "5", None])
def test_event_time_must_be_an_int(bad: Any) -> None:
    w = TumblingWindows(10)
    with pytest.raises(TypeError, match="event time"):
        w.add("k", bad)
    assert w.open_windows == 0


def test_key_must_be_a_utf8_string() -> None:
    w = TumblingWindows(10)
    with pytest.raises(TypeError, match="key"):
        w.add(1, 5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="UTF-8"):
        w.add("\ud800", 5)
    assert w.open_windows == 0
    assert w.snapshot()["windows"] == []


@pytest.mark.parametrize(
    ("bad", "error"), [(1.5, TypeError), (True, TypeError), (None, TypeError), (2**63, ValueError)]
)
def test_watermark_checks(bad: Any, error: type[Exception]) -> None:
    w = TumblingWindows(10)
    with pytest.raises(error, match="watermark"):
        w.advance(bad)
    assert w.watermark is None


# ------------------------------------------------------------------ checkpoints


def test_snapshot_layout() -> None:
    w = TumblingWindows(10, ["x", "y"])
    w.add("b", 12, {"x": 3, "y": 3.0})
    w.add("a", 12, {"x": None})
    w.add("a", 3, {"x": 1})
    w.advance(5)
    w.advance(10)
    w.add("a", 1, {"x": 1})
    assert w.snapshot() == {
        "format": 1,
        "sizeMs": 10,
        "sumFields": ["x", "y"],
        "watermark": 10,
        "ended": False,
        "lateCount": 1,
        "windows": [[10, "a", 1, [None, None]], [10, "b", 1, [3, 3.0]]],
    }


def test_snapshot_keeps_int_and_float_apart_through_json() -> None:
    w = TumblingWindows(10, ["i", "f", "big", "nbig", "inf", "ninf", "nan", "none", "negzero"])
    w.add(
        "k",
        1,
        {
            "i": 3,
            "f": 3.0,
            "big": 2**64,
            "nbig": -(2**63) - 1,
            "inf": math.inf,
            "ninf": -math.inf,
            "nan": math.nan,
            "negzero": -0.0,
        },
    )
    snap = w.snapshot()
    assert snap["windows"][0][3] == [3, 3.0, str(2**64), str(-(2**63) - 1), "inf", "-inf", "nan", None, -0.0]
    for stored in (orjson.loads(orjson.dumps(snap)), json.loads(json.dumps(snap))):
        back = TumblingWindows.restore(stored)
        [r] = back.close_all()
        sums = dict(r.sums)
        assert math.isnan(sums.pop("nan"))  # type: ignore[arg-type]
        exactly(
            sums,
            {
                "i": 3,
                "f": 3.0,
                "big": 2**64,
                "nbig": -(2**63) - 1,
                "inf": math.inf,
                "ninf": -math.inf,
                "none": None,
                "negzero": -0.0,
            },
        )


def test_restore_continues_where_the_original_was() -> None:
    w = TumblingWindows(10, ["x"])
    w.add("a", 5, {"x": 1})
    w.add("b", 15, {"x": 2.0})
    w.advance(7)
    r = checkpointed(w, size_ms=10, sum_fields=("x",))
    assert r.watermark == 7 and r.open_windows == 2 and r.late_count == 0
    assert r.snapshot() == w.snapshot()
    for op in (w, r):
        assert op.add("a", 6, {"x": 2}) is None
        assert op.advance(12) == [result("a", 0, 10, 2, x=3)]
        assert op.add("a", 9, {"x": 2}) == LateRecord("a", 9, 12, 0)
        assert op.close_all() == [result("b", 10, 10, 1, x=2.0)]


def test_restore_refuses_another_size_or_other_fields() -> None:
    snap = TumblingWindows(10, ["x"]).snapshot()
    with pytest.raises(CheckpointError, match="10 ms"):
        TumblingWindows.restore(snap, size_ms=60_000)
    with pytest.raises(CheckpointError, match="fields"):
        TumblingWindows.restore(snap, sum_fields=["y"])
    with pytest.raises(CheckpointError, match="fields"):
        TumblingWindows.restore(snap, sum_fields=["x", "y"])
    assert TumblingWindows.restore(snap, size_ms=10, sum_fields=["x"]).size_ms == 10


def _valid_snapshot() -> dict[str, Any]:
    w = TumblingWindows(10, ["x"])
    w.add("a", 25, {"x": 1})
    w.add("b", 35, {"x": 2.5})
    w.advance(20)
    return w.snapshot()


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("format",), 2),
        (("format",), True),  # True == 1, but not the format
        (("format",), "1"),
        (("sizeMs",), 0),
        (("sizeMs",), 10.0),
        (("sumFields",), "x"),
        (("sumFields",), [1]),
        (("sumFields",), ["x", "x"]),
        (("watermark",), 25.0),
        (("watermark",), 30),  # would have closed [20, 30)
        (("watermark",), 2**63),
        (("ended",), 1),
        (("ended",), True),  # ended with open windows
        (("lateCount",), -1),
        (("lateCount",), None),
        (("windows",), {}),
        (("windows", 0), [20, "a", 1]),
        (("windows", 0), "x"),
        (("windows", 0, 0), 21),  # not a window start
        (("windows", 0, 0), 10),  # a window the watermark closed
        (("windows", 0, 0), "20"),
        (("windows", 0, 1), 7),
        (("windows", 0, 1), "\ud800"),
        (("windows", 0, 2), 0),
        (("windows", 0, 2), True),
        (("windows", 0, 3), [1, 2]),
        (("windows", 0, 3), None),
        (("windows", 0, 3, 0), True),
        (("windows", 0, 3, 0), "1.5"),
        (("windows", 0, 3, 0), "Infinity"),
        (("windows", 0, 3, 0), [1]),
        (("windows", 1), [20, "a", 1, [1]]),  # the same window twice
    ],
)
def test_restore_refuses_a_malformed_snapshot(path: tuple[Any, ...], value: Any) -> None:
    snap = _valid_snapshot()
    target: Any = snap
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    with pytest.raises(CheckpointError):
        TumblingWindows.restore(snap)


@pytest.mark.parametrize("key", ["format", "sizeMs", "sumFields", "watermark", "ended", "lateCount", "windows"])
def test_restore_refuses_a_snapshot_with_a_field_missing(key: str) -> None:
    snap = _valid_snapshot()
    del snap[key]
    with pytest.raises(CheckpointError):
        TumblingWindows.restore(snap)


@pytest.mark.parametrize("snap", [None, [], "snapshot", 1, {}])
def test_restore_refuses_what_is_not_a_snapshot(snap: Any) -> None:
    with pytest.raises(CheckpointError):
        TumblingWindows.restore(snap)


@st.composite
def damaged_snapshots(draw: st.DrawFn) -> dict[str, Any]:
    """A valid snapshot with one value, anywhere in it, replaced by an arbitrary JSON value."""
    snap = _valid_snapshot()
    paths: list[tuple[Any, ...]] = []

    def walk(node: Any, path: tuple[Any, ...]) -> None:
        paths.append(path)
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, (*path, k))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, (*path, i))

    walk(snap, ())
    path = draw(st.sampled_from(paths[1:]))
    target: Any = snap
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = draw(json_values)
    return snap


@PROPERTY
@given(damaged_snapshots())
def test_a_damaged_snapshot_is_refused_or_restores_consistently(snap: dict[str, Any]) -> None:
    try:
        restored = TumblingWindows.restore(snap)
    except CheckpointError:
        return
    again = checkpointed(restored)  # what restored is valid: it checkpoints and restores again
    assert again.snapshot() == restored.snapshot()
    assert again.open_windows == len(snap["windows"])
    again.close_all()


# ------------------------------------------------------------------ the reference model


@dataclass
class Model:
    """Tumbling windows written the plain way: a dict of open windows, scanned on every watermark."""

    size: int
    fields: tuple[str, ...]
    watermark: int | None = None
    late: int = 0
    open: dict[tuple[int, str], tuple[int, tuple[Any, ...]]] = field(default_factory=dict)

    def add(self, key: str, t: int, values: Mapping[str, Any]) -> LateRecord | None:
        start = (t // self.size) * self.size
        if self.watermark is not None and start + self.size <= self.watermark:
            self.late += 1
            return LateRecord(key, t, self.watermark, start)
        count, sums = self.open.get((start, key), (0, (None,) * len(self.fields)))
        new = []
        for f, acc in zip(self.fields, sums, strict=True):
            v = values.get(f)
            new.append(acc if v is None else v if acc is None else acc + v)
        self.open[(start, key)] = (count + 1, tuple(new))
        return None

    def _emit(self, windows: list[tuple[int, str]]) -> list[WindowResult]:
        out = []
        for start, key in sorted(windows, key=lambda sk: (sk[0] + self.size, sk[1])):
            count, sums = self.open.pop((start, key))
            out.append(WindowResult(key, start, start + self.size, count, tuple(zip(self.fields, sums, strict=True))))
        return out

    def advance(self, wm: int) -> list[WindowResult]:
        if self.watermark is not None and wm <= self.watermark:
            return []
        self.watermark = wm
        return self._emit([sk for sk in self.open if sk[0] + self.size <= wm])

    def close_all(self) -> list[WindowResult]:
        return self._emit(list(self.open))


# No sum field, one (the short path of add) and two.
field_sets = st.sampled_from([(), ("x",), ("x", "y")])
numbers = st.one_of(
    st.none(),
    st.integers(-1000, 1000),
    st.floats(-1000, 1000, allow_nan=False),
    st.sampled_from([2**64, -(2**70), 0.5, -0.0]),
)
record_values = st.fixed_dictionaries({}, optional={"x": numbers, "y": numbers, "z": st.text(max_size=2)})
adds = st.tuples(st.just("add"), st.sampled_from(["a", "b", "c", "ä"]), st.integers(-20, 20), record_values)
advances = st.tuples(st.just("advance"), st.integers(-25, 25))
Op = tuple[Any, ...]
op_lists = st.lists(st.one_of(adds, advances), max_size=50)
sizes = st.sampled_from([1, 2, 3, 5, 7, 10, 40])


def apply(w: TumblingWindows | Model, op: Op) -> Any:
    if op[0] == "add":
        return w.add(op[1], op[2], op[3])
    return w.advance(op[1])


@PROPERTY
@given(sizes, field_sets, op_lists)
def test_windows_agree_with_the_model_and_a_plain_group_by(size: int, fields: tuple[str, ...], ops: list[Op]) -> None:
    w = TumblingWindows(size, fields)
    model = Model(size, fields)
    max_wm: int | None = None
    accepted: list[tuple[str, int, Mapping[str, Any]]] = []
    emitted: list[WindowResult] = []
    late = 0
    for op in ops:
        got = apply(w, op)
        exactly(got, apply(model, op))  # step by step: the same LateRecords and results, in the same order
        if op[0] == "add":
            _, key, t, values = op
            start = t - t % size
            is_late = max_wm is not None and start + size <= max_wm
            assert (got is not None) == is_late  # (b) late iff its window end <= the highest watermark so far
            if is_late:
                assert max_wm is not None
                late += 1
                assert got == LateRecord(key, t, max_wm, start)
            else:
                accepted.append((key, t, values))
        else:
            wm = op[1]
            for r in got:
                assert r.end <= wm  # (c) nothing closes before the watermark has passed its end
            assert got == [] or (max_wm is None or wm > max_wm)  # a regression closes nothing
            assert [(r.end, r.key) for r in got] == sorted((r.end, r.key) for r in got)
            max_wm = wm if max_wm is None else max(max_wm, wm)
            emitted += got
            # and everything the watermark has passed is closed by now
            assert all(start + size > max_wm for start, _ in model.open)
        assert w.watermark == max_wm
        assert w.open_windows == len(model.open)
        assert w.late_count == late
    final = w.close_all()
    exactly(final, model.close_all())
    assert [(r.end, r.key) for r in final] == sorted((r.end, r.key) for r in final)
    emitted += final
    # (c) no window twice
    windows = [(r.start, r.key) for r in emitted]
    assert len(windows) == len(set(windows))
    # (a) the results are a plain group-by of the records that were not late (values summed in arrival order)
    groups: dict[tuple[int, str], list[Mapping[str, Any]]] = {}
    for key, t, values in accepted:
        groups.setdefault(((t // size) * size, key), []).append(values)
    expected = {}
    for (start, key), rows in groups.items():
        sums: list[Any] = []
        for f in fields:
            present = [row[f] for row in rows if row.get(f) is not None]
            total: Any = None
            for v in present:
                total = v if total is None else total + v
            sums.append(total)
        expected[(start, key)] = WindowResult(
            key, start, start + size, len(rows), tuple(zip(fields, sums, strict=True))
        )
    exactly(sorted(emitted, key=lambda r: (r.start, r.key)), [expected[sk] for sk in sorted(expected)])
    assert sum(r.count for r in emitted) == len(accepted)
    for r in emitted:
        assert r.end == r.start + size and r.start % size == 0
        for (_, total), f in zip(r.sums, fields, strict=True):
            kinds = {type(row[f]) for row in groups[(r.start, r.key)] if row.get(f) is not None}
            if not kinds:
                assert total is None
            elif kinds == {int}:
                assert type(total) is int
            else:
                assert type(total) is float


@PROPERTY
@given(sizes, field_sets, op_lists, st.data())
def test_snapshot_and_restore_anywhere_changes_nothing(
    size: int, fields: tuple[str, ...], ops: list[Op], data: st.DataObject
) -> None:
    cut = data.draw(st.integers(0, len(ops)), label="cut")
    original = TumblingWindows(size, fields)
    expected = [apply(original, op) for op in ops] + [original.close_all()]

    # (d) one restart at `cut`
    w = TumblingWindows(size, fields)
    for op in ops[:cut]:
        apply(w, op)
    snap = w.snapshot()
    w = checkpointed(w, size_ms=size, sum_fields=fields)
    assert w.snapshot() == orjson.loads(orjson.dumps(snap))
    got = [apply(w, op) for op in ops[cut:]] + [w.close_all()]
    exactly(got, expected[cut:])
    assert w.late_count == original.late_count

    # a restart after every step
    w = TumblingWindows(size, fields)
    outputs = []
    for op in ops:
        outputs.append(apply(w, op))
        w = checkpointed(w)
    outputs.append(w.close_all())
    exactly(outputs, expected)
    assert checkpointed(w).snapshot() == original.snapshot()  # ended, too


@PROPERTY
@given(sizes, op_lists)
def test_a_call_that_raises_changes_nothing(size: int, ops: list[Op]) -> None:
    w = TumblingWindows(size, ("x", "y"))
    for op in ops:
        apply(w, op)
        before = w.snapshot()
        with pytest.raises(TypeError):
            w.add("a", 100, {"x": 1, "y": "two"})  # never late here: late records are not checked
        with pytest.raises(TypeError):
            w.add("new-key", 100, {"x": True})
        with pytest.raises(TypeError):
            w.advance(1.5)  # type: ignore[arg-type]
        assert w.snapshot() == before


def test_many_windows_close_in_order() -> None:
    w = TumblingWindows(10, ["x"])
    for t in reversed(range(0, 10_000, 3)):
        w.add(f"k{t % 7}", t, {"x": t})
    assert w.open_windows == len({(t // 10, t % 7) for t in range(0, 10_000, 3)})
    first = w.advance(5000)
    assert [r.end for r in first] == sorted(r.end for r in first) and first[-1].end == 5000
    rest = w.close_all()
    everything = first + rest
    assert sum(r.count for r in everything) == len(range(0, 10_000, 3))
    assert sum(dict(r.sums)["x"] or 0 for r in everything) == sum(range(0, 10_000, 3))
    assert w.open_windows == 0


_ANYTHING = st.one_of(st.none(), st.booleans(), st.integers(MIN_TIMESTAMP - 5, MAX_TIMESTAMP + 5),
                      st.floats(allow_nan=True), st.text(max_size=4), st.just("\ud800"),
                      st.lists(st.integers(), max_size=2))


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(size=st.sampled_from([1, 7, 1000]), key=_ANYTHING, event_time=_ANYTHING, amount=_ANYTHING,
       watermark=st.none() | st.integers(-2000, 2000))
def test_check_is_exactly_what_add_refuses_for_the_record(size: int, key: Any, event_time: Any, amount: Any,
                                                          watermark: int | None) -> None:
    """``check`` names a problem exactly when ``add`` would raise for the record (late or not, a malformed
    record is malformed), and after a clean ``check`` only an ended operator makes ``add`` raise: the
    window task tells a bad record from its own bug by this contract."""
    windows = TumblingWindows(size, ["amount"])
    if watermark is not None:
        windows.advance(watermark)
    problem = windows.check(key, event_time, {"amount": amount})
    fresh = TumblingWindows(size, ["amount"])  # never late: add checks everything
    try:
        fresh.add(key, event_time, {"amount": amount})
        raised = None
    except (TypeError, ValueError) as exc:
        raised = str(exc)
    assert (problem is None) == (raised is None), (problem, raised)
    if problem is None:
        windows.add(key, event_time, {"amount": amount})
        windows.close_all()
        with pytest.raises(ValueError, match="closed by close_all"):
            windows.add(key, event_time, {"amount": amount})
