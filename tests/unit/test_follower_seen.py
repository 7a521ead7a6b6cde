"""The sink's check that a ``stageProgress driver`` query is still followed (:func:`next_follower_seen`): the
clock starts again whenever the follower's written round moves, is the micro-batch before, or the query run
changes; a round that stands still for longer than ``timeout`` while the query commits fails it in one line."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlmsg.errors import ControlMsgError
from controlmsg.spark.options import WriteOptions
from controlmsg.spark.writing.run_control import next_follower_seen

OPTS = WriteOptions.parse({"topic": "pairs", "runId": "p1", "kafka.bootstrap.servers": "localhost:9092",
                           "stageProgress": "driver", "timeout": "60"})


def test_a_follower_that_stops_writing_rounds_fails_the_query_after_the_timeout() -> None:
    seen = next_follower_seen(None, "run-a", 3, 4, 1_000, OPTS)  # round 3 at the commit of 4: up to date
    assert seen == ["run-a", 3, 1_000]
    seen = next_follower_seen(seen, "run-a", 3, 5, 2_000, OPTS)  # still 3 at the commit of 5: the clock runs
    assert seen == ["run-a", 3, 1_000]
    assert next_follower_seen(seen, "run-a", 3, 40, 61_000, OPTS) == seen  # 60 s: not more than the timeout
    with pytest.raises(ControlMsgError, match=(
            r"^topic 'pairs' run 'p1': option stageProgress driver: the driver program that follows query run "
            r"run-a has written no stage round after micro-batch 3 for 61 s while the query committed up to "
            r"micro-batch 41 \(timeout 60 s\): it has gone .* controlmsg.spark.await_stage\(query, options\)$")):
        next_follower_seen(seen, "run-a", 3, 41, 62_000, OPTS)


def test_a_round_that_moves_or_a_new_run_starts_the_clock_again() -> None:
    behind = ["run-a", 3, 0]
    assert next_follower_seen(behind, "run-a", 4, 41, 100_000, OPTS) == ["run-a", 4, 100_000]  # it moved
    assert next_follower_seen(behind, "run-b", 3, 41, 100_000, OPTS) == ["run-b", 3, 100_000]  # restarted
    assert next_follower_seen(["bad"], "run-a", 3, 41, 100_000, OPTS) == ["run-a", 3, 100_000]


@given(st.lists(st.integers(0, 3), min_size=1, max_size=60), st.integers(0, 5))
def test_a_follower_that_keeps_up_never_fails_the_query(gaps: list[int], lag: int) -> None:
    """Micro-batches 10 s apart, a follower ``lag`` micro-batches behind that writes a round within each 30 s
    (it may skip micro-batches): never refused, whatever the lag."""
    seen = None
    batch, written, now = 0, -1, 0
    for gap in gaps:
        batch, now = batch + 1 + gap, now + 10_000
        if now % 30_000 == 0:
            written = max(written, batch - 1 - lag)
        seen = next_follower_seen(seen, "run-a", written, batch, now, OPTS)
