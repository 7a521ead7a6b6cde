"""The watermark policy (controlmsg.core.watermarks): value, cadence by rows and by time, never back,
clamping; examples, and a reference model checked over arbitrary sequences of observations."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlmsg.core import WatermarkCadence, WatermarkPolicy
from controlmsg.core.messages import MAX_TIMESTAMP, MIN_TIMESTAMP, WatermarkMessage

PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------------------------------------- examples


def test_value_is_event_time_minus_lateness() -> None:
    policy = WatermarkPolicy(allowed_lateness_ms=500)
    assert policy.watermark_for(10_000) == 9_500
    assert policy.watermark_for(0) == -500
    assert WatermarkPolicy().watermark_for(42) == 42


def test_value_is_clamped_to_what_a_watermark_message_carries() -> None:
    policy = WatermarkPolicy(allowed_lateness_ms=10)
    assert policy.watermark_for(MIN_TIMESTAMP) == MIN_TIMESTAMP
    assert policy.watermark_for(MAX_TIMESTAMP) == MAX_TIMESTAMP - 10
    assert WatermarkPolicy().watermark_for(MAX_TIMESTAMP) == MAX_TIMESTAMP - 1  # MAX_TIMESTAMP means ended
    assert WatermarkPolicy().watermark_for(2**70) == MAX_TIMESTAMP - 1


def test_every_rows() -> None:
    cadence = WatermarkPolicy(allowed_lateness_ms=1, every_rows=3).cadence(now_ms=0)
    assert cadence.rows_until_due() == 3
    assert cadence.observe(2, 10, 0) is None
    assert cadence.rows_until_due() == 1
    assert cadence.observe(1, 5, 0) == 9  # due: the largest event time so far, 10, minus 1
    assert cadence.last_sent == 9
    assert cadence.rows_until_due() == 3
    assert cadence.observe(3, 8, 0) is None  # due, but 10 - 1 did not rise
    assert cadence.observe(3, 20, 0) == 19
    assert cadence.max_event_time == 20


def test_every_ms() -> None:
    cadence = WatermarkPolicy(every_ms=1000).cadence(now_ms=5_000)
    assert cadence.rows_until_due() is None
    assert cadence.observe(100, 70, 5_999) is None
    assert cadence.observe(0, None, 6_000) == 70  # no rows: a clock check alone
    assert cadence.observe(10, 80, 6_999) is None  # the time counts from the due point, 6000
    assert cadence.observe(10, 75, 7_000) == 80


def test_whichever_comes_first() -> None:
    cadence = WatermarkPolicy(every_rows=10, every_ms=100).cadence(now_ms=0)
    assert cadence.observe(4, 1, 100) == 1  # by time
    assert cadence.rows_until_due() == 10  # both counts start again
    assert cadence.observe(10, 2, 150) == 2  # by rows
    assert cadence.observe(1, 3, 249) is None  # 99 ms since the rows made it due
    assert cadence.observe(0, None, 250) == 3


def test_due_before_any_event_time_sends_nothing_but_restarts_the_count() -> None:
    cadence = WatermarkPolicy(every_rows=2).cadence(now_ms=0)
    assert cadence.observe(2, None, 0) is None
    assert cadence.rows_until_due() == 2
    assert cadence.observe(1, 7, 0) is None
    assert cadence.observe(1, None, 0) == 7


def test_rows_beyond_the_due_point_are_not_carried_over() -> None:
    cadence = WatermarkPolicy(every_rows=3).cadence(now_ms=0)
    assert cadence.observe(7, 1, 0) == 1
    assert cadence.rows_until_due() == 3


def test_without_a_cadence_nothing_is_ever_due() -> None:
    cadence = WatermarkPolicy(allowed_lateness_ms=5).cadence(now_ms=0)
    assert cadence.observe(10**9, 100, 10**12) is None
    assert cadence.rows_until_due() is None
    assert cadence.max_event_time == 100


@pytest.mark.parametrize("kwargs", [
    {"allowed_lateness_ms": -1}, {"every_rows": 0}, {"every_ms": 0}, {"every_rows": -5},
    {"allowed_lateness_ms": 1.5}, {"every_rows": True}, {"every_ms": "1s"},
])
def test_bad_policies_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        WatermarkPolicy(**kwargs)  # type: ignore[arg-type]


def test_bad_observations_are_refused() -> None:
    cadence = WatermarkPolicy(every_rows=1).cadence(now_ms=0)
    with pytest.raises(ValueError, match="rows"):
        cadence.observe(-1, 5, 0)
    assert cadence.observe(1, 5, 0) == 5  # the refused call changed nothing


def test_the_policy_is_immutable() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        WatermarkPolicy().every_rows = 3  # type: ignore[misc]


# ---------------------------------------------------------------------------------------------- model


@dataclass
class Model:
    """The rule restated from the whole history (not incrementally): the steps since the last due point
    hold the rows and the time that decide the next one."""

    policy: WatermarkPolicy
    start_ms: int
    steps: list[tuple[int, int | None, int]] = field(default_factory=list)
    due_steps: list[int] = field(default_factory=list)
    sent: list[int] = field(default_factory=list)

    def observe(self, rows: int, max_event_time: int | None, now_ms: int) -> int | None:
        self.steps.append((rows, max_event_time, now_ms))
        i = len(self.steps) - 1
        first = self.due_steps[-1] + 1 if self.due_steps else 0
        since_ms = self.steps[self.due_steps[-1]][2] if self.due_steps else self.start_ms
        rows_since = sum(r for r, _, _ in self.steps[first:])
        p = self.policy
        if not ((p.every_rows is not None and rows_since >= p.every_rows)
                or (p.every_ms is not None and now_ms - since_ms >= p.every_ms)):
            return None
        self.due_steps.append(i)
        times = [t for _, t, _ in self.steps if t is not None]
        if not times:
            return None
        mark = max(MIN_TIMESTAMP, min(MAX_TIMESTAMP - 1, max(times) - p.allowed_lateness_ms))
        if self.sent and mark <= max(self.sent):
            return None
        self.sent.append(mark)
        return mark


timestamps = st.one_of(st.integers(-1000, 1000), st.integers(MIN_TIMESTAMP - 10, MAX_TIMESTAMP + 10))
policies = st.builds(
    WatermarkPolicy,
    allowed_lateness_ms=st.one_of(st.integers(0, 50), st.integers(0, 2**64)),
    every_rows=st.none() | st.integers(1, 20),
    every_ms=st.none() | st.integers(1, 100),
)
observations = st.lists(st.tuples(st.integers(0, 30), st.none() | timestamps, st.integers(0, 60)), max_size=60)


def run(policy: WatermarkPolicy, steps: list[tuple[int, int | None, int]]) -> tuple[WatermarkCadence, list[int], int]:
    """Feed the steps (the third element is the time elapsed since the previous step) to a cadence; return
    it, the watermarks it gave and the time of the last step."""
    now = 1_000
    cadence = policy.cadence(now)
    sent = []
    for rows, top, dt in steps:
        now += dt
        mark = cadence.observe(rows, top, now)
        if mark is not None:
            sent.append(mark)
    return cadence, sent, now


@PROPERTY
@given(policies, observations)
def test_agrees_with_the_model_at_every_step(policy: WatermarkPolicy, steps: list[tuple[int, int | None, int]]) -> None:
    now = 1_000
    cadence, model = policy.cadence(now), Model(policy, now)
    for rows, top, dt in steps:
        now += dt
        assert cadence.observe(rows, top, now) == model.observe(rows, top, now)
        if policy.every_rows is not None:
            first = model.due_steps[-1] + 1 if model.due_steps else 0
            assert cadence.rows_until_due() == policy.every_rows - sum(r for r, _, _ in model.steps[first:])
    assert cadence.last_sent == (model.sent[-1] if model.sent else None)


@PROPERTY
@given(policies, observations)
def test_never_back_never_above_the_rule_always_sendable(policy: WatermarkPolicy,
                                                         steps: list[tuple[int, int | None, int]]) -> None:
    cadence, sent, _ = run(policy, steps)
    assert sent == sorted(set(sent))  # strictly increasing
    assert cadence.last_sent == (sent[-1] if sent else None)
    times = [t for _, t, _ in steps if t is not None]
    for mark in sent:
        assert mark <= max(max(times) - policy.allowed_lateness_ms, MIN_TIMESTAMP)
        WatermarkMessage("task", 1, mark)  # inside the range a watermark message carries
    if sent:
        assert sent[-1] <= policy.watermark_for(max(times))


@PROPERTY
@given(policies, observations)
def test_rows_until_due_rows_make_it_due(policy: WatermarkPolicy, steps: list[tuple[int, int | None, int]]) -> None:
    """A caller that slices its batches at rows_until_due() gets a due point exactly there."""
    cadence, _, now = run(policy, steps)  # at the time of the last step, the time rule is not due
    left = cadence.rows_until_due()
    if policy.every_rows is None:
        assert left is None
        return
    assert left is not None
    assert 1 <= left <= policy.every_rows
    top = max(cadence.max_event_time or 0, cadence.last_sent or 0) + policy.allowed_lateness_ms + 1
    if top < MAX_TIMESTAMP:  # then the due watermark rises and is sent
        if left > 1:
            assert cadence.observe(left - 1, None, now) is None
        assert cadence.observe(1, top, now) == policy.watermark_for(top)
        assert cadence.rows_until_due() == policy.every_rows


@PROPERTY
@given(st.integers(0, 2**64), st.integers(-(2**70), 2**70))
def test_watermark_for_clamps(lateness: int, event_time: int) -> None:
    mark = WatermarkPolicy(allowed_lateness_ms=lateness).watermark_for(event_time)
    assert MIN_TIMESTAMP <= mark <= MAX_TIMESTAMP - 1
    if MIN_TIMESTAMP <= event_time - lateness <= MAX_TIMESTAMP - 1:
        assert mark == event_time - lateness
