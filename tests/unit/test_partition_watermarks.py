"""A plain topic's watermark per partition (controlmsg.core.partition_watermarks): examples, and a reference
model checked over arbitrary sequences of records, clock readings, restarts and ends."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlmsg.core.partition_watermarks import PartitionWatermarks, WatermarkRule

PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
HOUR = 3_600_000


def parts(n: int) -> list[tuple[str, int]]:
    return [("t", p) for p in range(n)]


# ---------------------------------------------------------------------------------------------- examples


def test_the_minimum_of_each_partitions_largest_event_time_minus_the_bound() -> None:
    state: PartitionWatermarks[tuple[str, int]] = PartitionWatermarks(WatermarkRule(bound_ms=10))
    state.track(parts(2), now_ms=0)
    state.observe(("t", 0), 1_000, now_ms=0)
    status = state.advance(0)
    assert status.watermark is None and status.holder == ("t", 1) and status.holder_watermark is None
    state.observe(("t", 1), 500, now_ms=0)
    state.observe(("t", 0), 700, now_ms=0)  # out of order: the largest stays 1000
    status = state.advance(0)
    assert (status.watermark, status.holder, status.holder_watermark) == (490, ("t", 1), 490)
    state.observe(("t", 1), 5_000, now_ms=0)
    assert state.advance(0).watermark == 990
    assert state.advance(0).holder == ("t", 0)


def test_a_lagging_partition_holds_the_watermark_the_issue_scenario() -> None:
    """Partitions 0-2 at hours 0-5, partition 3 at hour 0: the watermark is partition 3's, not hour 5."""
    state: PartitionWatermarks[tuple[str, int]] = PartitionWatermarks(WatermarkRule(bound_ms=0))
    state.track(parts(4), now_ms=0)
    for p in range(3):
        for h in range(6):
            state.observe(("t", p), h * HOUR + 59 * 60_000, now_ms=0)
    state.observe(("t", 3), 30 * 60_000, now_ms=0)
    status = state.advance(0)
    assert status.watermark == 30 * 60_000 and status.holder == ("t", 3)


def test_an_idle_partition_stops_holding_the_watermark_back_and_it_never_goes_back() -> None:
    state: PartitionWatermarks[tuple[str, int]] = PartitionWatermarks(WatermarkRule(bound_ms=0, idle_ms=1_000))
    state.track(parts(2), now_ms=0)
    state.observe(("t", 0), 100, now_ms=0)
    state.observe(("t", 1), 50, now_ms=0)
    assert state.advance(999).watermark == 50
    state.observe(("t", 0), 900, now_ms=1_500)
    status = state.advance(1_500)  # partition 1 gave nothing for 1.5 s
    assert (status.watermark, status.holder, status.idle) == (900, ("t", 0), 1)
    state.observe(("t", 1), 60, now_ms=1_600)  # back, behind: it holds back again, the watermark stays
    status = state.advance(1_600)
    assert (status.watermark, status.holder, status.holder_watermark, status.idle) == (900, ("t", 1), 60, 0)


def test_a_partition_without_records_is_idle_after_the_timeout_from_when_it_was_seen() -> None:
    state: PartitionWatermarks[tuple[str, int]] = PartitionWatermarks(WatermarkRule(bound_ms=5, idle_ms=100))
    state.track(parts(2), now_ms=1_000)
    state.observe(("t", 0), 40, now_ms=1_050)
    assert state.advance(1_050).watermark is None
    assert state.advance(1_099).watermark is None
    assert state.advance(1_100).watermark == 35


def test_every_partition_idle_keeps_the_watermark_and_names_no_holder() -> None:
    state: PartitionWatermarks[tuple[str, int]] = PartitionWatermarks(WatermarkRule(bound_ms=0, idle_ms=10))
    state.track(parts(1), now_ms=0)
    state.observe(("t", 0), 70, now_ms=0)
    assert state.advance(0).watermark == 70
    status = state.advance(100)
    assert (status.watermark, status.holder, status.idle) == (70, None, 1)


def test_finish_is_the_end_of_time_and_track_drops_partitions_gone() -> None:
    state: PartitionWatermarks[tuple[str, int]] = PartitionWatermarks(WatermarkRule(bound_ms=0))
    state.track(parts(3), now_ms=0)
    state.track(parts(2), now_ms=0)
    assert state.partitions() == parts(2)
    state.finish(10**15)
    state.observe(("t", 0), 5, now_ms=0)
    assert state.advance(0).watermark == 10**15


def test_snapshot_restores_through_json() -> None:
    state: PartitionWatermarks[tuple[str, int]] = PartitionWatermarks(WatermarkRule(bound_ms=3, idle_ms=7))
    state.track(parts(2), now_ms=11)
    state.observe(("t", 1), 99, now_ms=12)
    state.advance(12)
    again = PartitionWatermarks.restore(state.rule, json.loads(json.dumps(state.snapshot())))
    assert again.snapshot() == state.snapshot()
    assert again.largest(("t", 1)) == 99 and again.partitions() == parts(2)
    with pytest.raises(ValueError, match="not a snapshot"):
        PartitionWatermarks.restore(state.rule, {"watermark": 1})
    with pytest.raises(ValueError, match="not a snapshot"):
        PartitionWatermarks.restore(state.rule, {"watermark": "x", "partitions": []})


def test_alignment_holds_a_partition_that_runs_more_than_the_drift_ahead() -> None:
    rule = WatermarkRule(bound_ms=10, drift_ms=HOUR)
    assert not rule.runs_ahead(HOUR + 10, 0) and rule.runs_ahead(HOUR + 11, 0)
    assert not rule.runs_ahead(None, 0) and not rule.runs_ahead(5 * HOUR, None)
    assert not WatermarkRule(bound_ms=0).runs_ahead(5 * HOUR, 0)
    with pytest.raises(ValueError, match="drift_ms"):
        WatermarkRule(bound_ms=0, drift_ms=-1)


def test_the_rule_refuses_what_it_cannot_mean() -> None:
    with pytest.raises(ValueError, match="bound_ms"):
        WatermarkRule(bound_ms=-1)
    with pytest.raises(ValueError, match="idle_ms"):
        WatermarkRule(bound_ms=0, idle_ms=0)


# ---------------------------------------------------------------------------------------------- the model

# One step: ("record", partition, event time, clock advance) | ("tick", clock advance) | ("restart",) | ("end",)
_step = st.one_of(
    st.tuples(st.just("record"), st.integers(0, 3), st.integers(0, 10_000), st.integers(0, 300)),
    st.tuples(st.just("tick"), st.integers(0, 2_000)),
    st.tuples(st.just("restart")),
)


@PROPERTY
@given(steps=st.lists(_step, max_size=60), bound=st.integers(0, 500), idle=st.one_of(st.none(), st.integers(1, 1_000)),
       end=st.booleans())
def test_the_watermark_follows_a_reference_model_and_never_goes_back(
        steps: list[tuple[object, ...]], bound: int, idle: int | None, end: bool) -> None:
    """Against a direct model: the watermark after each advance is the highest, over every advance so far, of
    the minimum over the partitions active then of their largest event time minus the bound (a partition
    without one making that minimum undefined); a restart from a snapshot changes nothing; it never decreases;
    and it is never above an active partition's largest event time minus the bound at the time it rose."""
    rule = WatermarkRule(bound_ms=bound, idle_ms=idle)
    state: PartitionWatermarks[tuple[str, int]] = PartitionWatermarks(rule)
    now = 0
    largest: dict[int, int | None] = {p: None for p in range(4)}
    active: dict[int, int] = {p: 0 for p in range(4)}
    state.track(parts(4), now_ms=0)
    model: int | None = None
    for step in steps:
        if step[0] == "restart":
            state = PartitionWatermarks.restore(rule, json.loads(json.dumps(state.snapshot())))
            continue
        if step[0] == "record":
            _, p, event, dt = step
            assert isinstance(p, int) and isinstance(event, int) and isinstance(dt, int)
            now += dt
            state.observe(("t", p), event, now_ms=now)
            largest[p] = event if largest[p] is None else max(largest[p] or 0, event)
            active[p] = now
        else:
            dt = step[1]
            assert isinstance(dt, int)
            now += dt
        before = state.watermark
        status = state.advance(now)
        live = [p for p in range(4) if idle is None or now - active[p] < idle]
        if live and all(largest[p] is not None for p in live):
            low = min((largest[p] or 0) - bound for p in live)
            model = low if model is None or low > model else model
            assert status.holder is not None and status.holder_watermark == low
        assert status.watermark == model == state.watermark
        assert before is None or (status.watermark is not None and status.watermark >= before)
        assert status.idle == 4 - len(live)
    if end:
        state.finish(10**15)
        assert state.advance(now).watermark == 10**15
