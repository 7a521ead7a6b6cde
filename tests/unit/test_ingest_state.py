"""The streaming ingest task's pure state (controlmsg.streaming.ingest_state): the pacing of ``max_rate``
(TokenBucket), the partitions' records handed out in turns (PartitionTurns), what a commit stores and a start
restores, and the watermark a commit writes. The expected values are worked out here from the documented
contracts, not taken from the code."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlmsg.core.messages import MIN_TIMESTAMP
from controlmsg.core.watermarks import WatermarkPolicy
from controlmsg.errors import CheckpointError
from controlmsg.streaming.ingest_state import IngestState, PartitionTurns, TokenBucket


@dataclass
class Committed:
    """A committed offset as confluent-kafka's TopicPartition gives it."""

    partition: int
    offset: int
    metadata: str | None


# ------------------------------------------------------------------------------------------------ pacing


def test_the_bucket_starts_empty_and_says_how_long_to_wait_for_one_record() -> None:
    bucket = TokenBucket(100.0, now=50.0)
    assert bucket.refill(50.0) == pytest.approx(0.01)  # one record at 100/s
    assert bucket.refill(50.005) == pytest.approx(0.005)  # half of it earned already
    assert bucket.refill(50.01) is None
    assert bucket.batch(1000) == 1


def test_the_bucket_holds_at_most_a_tenth_of_a_second_and_at_least_one_record() -> None:
    fast = TokenBucket(1000.0, now=0.0)
    assert fast.refill(60.0) is None  # a minute idle earns no burst of 60,000
    assert fast.batch(10_000) == 100
    assert fast.batch(30) == 30  # never more than asked
    slow = TokenBucket(2.0, now=0.0)
    assert slow.refill(60.0) is None
    assert slow.batch(10_000) == 1


def test_a_paced_read_takes_rate_records_a_second() -> None:
    """A loop as the ingest task's: refill, sleep what it says or read what batch() allows, take it."""
    rate, now, read = 250.0, 0.0, 0
    bucket = TokenBucket(rate, now)
    while now < 10.0:
        pause = bucket.refill(now)
        if pause is not None:
            now += pause
            continue
        got = bucket.batch(1000)
        assert got >= 1
        bucket.take(got)
        read += got
        now += 0.003  # what reading and writing them took
    assert 10.0 * rate - 1 <= read <= 10.0 * rate + rate / 10  # plus at most one full bucket


# ------------------------------------------------------------------------------ commit and restore


def restore(committed: list[Committed], generation: int = 0, partitions: tuple[int, ...] = (0, 2)) -> IngestState:
    return IngestState.restore(committed, source_topic="raw", source_partitions=list(partitions), run_id="r1",
                               task_index=0, task_count=2, generation=generation)


def test_what_a_commit_stores_a_start_restores() -> None:
    state = IngestState(positions={0: 120, 2: 40}, max_event={0: 9_000, 2: 7_000}, last_mark=6_000, records=150,
                        rejected=3, commits=4, idle_periods=1)
    committed = [Committed(p, o, state.metadata(p, task_count=2, generation=0)) for p, o in state.positions.items()]
    back = restore(committed)
    assert back.positions == {0: 120, 2: 40}
    assert back.max_event == {0: 9_000, 2: 7_000}
    assert back.last_mark == 6_000 and not back.idle and not back.ended
    assert (back.records, back.rejected, back.idle_periods) == (150, 3, 1)
    assert back.commits == 5  # the commit that stored it counts


def test_nothing_committed_starts_at_zero_and_not_ended() -> None:
    back = restore([Committed(0, -1001, None), Committed(2, -1001, None)])
    assert back.positions == {0: 0, 2: 0} and back.max_event == {} and back.last_mark is None
    assert not back.ended


def test_a_task_that_ended_on_every_partition_restores_as_ended() -> None:
    state = IngestState(positions={0: 10, 2: 10}, ended=True)
    ended = [Committed(p, 10, state.metadata(p, 2, 0)) for p in (0, 2)]
    assert restore(ended).ended
    state.ended = False
    half = [ended[0], Committed(2, 10, state.metadata(2, 2, 0))]
    assert not restore(half).ended


def test_an_older_generation_gives_only_each_partitions_largest_event_time() -> None:
    old = IngestState(positions={0: 120, 2: 40}, max_event={0: 9_000, 2: 7_000}, last_mark=6_000, ended=True,
                      records=150)
    committed = [Committed(p, o, old.metadata(p, task_count=4, generation=0)) for p, o in old.positions.items()]
    back = restore(committed, generation=1)
    assert back.max_event == {0: 9_000, 2: 7_000} and back.positions == {0: 120, 2: 40}
    assert back.last_mark is None and not back.ended and back.records == 0


def test_a_newer_generation_or_another_layout_is_refused() -> None:
    state = IngestState(positions={0: 5, 2: 5})
    newer = [Committed(p, 5, state.metadata(p, 2, generation=3)) for p in (0, 2)]
    with pytest.raises(CheckpointError, match=r"generation 3 .* newer than this task's 1"):
        restore(newer, generation=1)
    other = [Committed(p, 5, state.metadata(p, task_count=3, generation=0)) for p in (0, 2)]
    with pytest.raises(CheckpointError, match="the task layout is part of the checkpoint"):
        restore(other)


# ------------------------------------------------------------------------------------- watermarks


def test_the_watermark_is_the_slowest_partition_minus_the_lateness_and_only_rises() -> None:
    policy = WatermarkPolicy(allowed_lateness_ms=1_000)
    state = IngestState(positions={0: 0, 2: 0})
    state.read(0, 0, now=1.0)
    state.saw_event(0, 10_000)
    assert state.watermark(policy, None, idle=set(), done=False) is None  # partition 2 has given nothing yet
    state.read(2, 0, now=1.0)
    state.saw_event(2, 4_000)
    assert state.watermark(policy, None, idle=set(), done=False) == (3_000, False)
    state.saw_event(2, 2_000)  # an older record does not move a partition back
    assert state.max_event[2] == 4_000
    assert state.watermark(policy, None, idle=set(), done=False) is None  # nothing rose
    state.saw_event(2, 12_000)
    assert state.watermark(policy, None, idle=set(), done=False) == (9_000, False)  # partition 0 holds it now


def test_an_idle_task_says_so_once_and_its_next_record_writes_the_last_watermark_again() -> None:
    policy = WatermarkPolicy(allowed_lateness_ms=0)
    state = IngestState(positions={0: 1, 2: 1}, max_event={0: 5_000, 2: 5_000}, last_mark=5_000)
    assert state.watermark(policy, None, idle={0, 2}, done=False) == (5_000, True)
    assert state.idle and state.idle_periods == 1
    assert state.watermark(policy, None, idle={0, 2}, done=False) is None  # said once
    assert state.read(0, 1, now=9.0) == 5_000  # back: the promise again, without the idle flag
    assert not state.idle
    assert state.read(0, 2, now=9.1) is None


def test_an_idle_task_that_never_wrote_a_watermark_promises_the_minimum() -> None:
    state = IngestState(positions={0: 0})
    assert state.watermark(WatermarkPolicy(), None, idle={0}, done=False) == (MIN_TIMESTAMP, True)


def test_quiet_partitions_are_those_silent_for_the_timeout() -> None:
    state = IngestState(positions={0: 3, 2: 3}, last_seen={0: 10.0, 2: 14.0})
    assert state.quiet(now=20.0, idle_timeout_s=6.0) == [0, 2]
    assert state.quiet(now=19.0, idle_timeout_s=6.0) == [0]


# ------------------------------------------------------------------------------------ partitions in turns


def test_a_backlog_read_one_partition_after_another_comes_out_in_turns() -> None:
    turns: PartitionTurns[str] = PartitionTurns(limit=100)
    # as librdkafka hands over a backlog written in large batches: all of partition 3, then all of 1
    turns.add([(3, f"p3-{i}") for i in range(6)] + [(1, f"p1-{i}") for i in range(6)])
    assert turns.take(4) == ["p3-0", "p3-1", "p1-0", "p1-1"]
    assert turns.take(3) == ["p3-2", "p1-2", "p3-3"]  # a share of one each, then the next turn again
    turns.add([(0, "p0-0")])
    assert turns.take(3) == ["p1-3", "p3-4", "p0-0"]  # the new partition after those in turn
    assert turns.take(10) == ["p1-4", "p1-5", "p3-5"]
    assert turns.size == 0 and turns.take(5) == []


def test_the_queue_has_room_for_limit_records() -> None:
    turns: PartitionTurns[int] = PartitionTurns(limit=5)
    assert turns.room() == 5
    turns.add((0, i) for i in range(7))  # a read may overshoot by what it asked for; room is then 0
    assert turns.size == 7 and turns.room() == 0
    assert turns.take(3) == [0, 1, 2] and turns.room() == 1
    with pytest.raises(ValueError, match="at least 1"):
        PartitionTurns(limit=0)


@given(st.lists(st.lists(st.integers(0, 4), max_size=30), max_size=8), st.lists(st.integers(1, 9), min_size=1))
def test_records_come_out_each_partitions_in_order_none_lost_and_in_equal_shares(
        reads: list[list[int]], takes: list[int]) -> None:
    """Whatever the reads (lists of partitions, each record numbered in its partition) and the takes: every
    record comes out once, each partition's in its order, and a take of at least as many records as there
    are partitions holding records gives each of them at least one."""
    turns: PartitionTurns[tuple[int, int]] = PartitionTurns(limit=1000)
    read_so_far: dict[int, int] = {}
    out: list[tuple[int, int]] = []
    for i, read in enumerate(reads):
        records = []
        for p in read:
            records.append((p, (p, read_so_far.get(p, 0))))
            read_so_far[p] = read_so_far.get(p, 0) + 1
        turns.add(records)
        holding = {p for p, _ in records} | {p for p, n in read_so_far.items()
                                             if n > sum(1 for q, _ in out if q == p)}
        count = takes[i % len(takes)]
        taken = turns.take(count)
        assert len(taken) == min(count, sum(read_so_far.values()) - len(out))
        if count >= len(holding):
            assert {p for p, _ in taken} == holding
        out += taken
    out += turns.take(10_000)
    assert turns.size == 0
    for p, n in read_so_far.items():
        assert [seq for q, seq in out if q == p] == list(range(n))
