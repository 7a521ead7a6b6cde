"""How a read's partitions are grouped into Spark tasks (``controlmsg.spark.reading.planning.task_groups``): given
``partitionsPerTask`` or ``maxTasks``, as the user said; given neither, by the offsets the partitions hold,
so that a read of few records in many partitions has few tasks (issue 24). No Spark session needed."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from controlmsg.spark.options import ReadOptions
from controlmsg.spark.reading.planning import MIN_TASKS as _MIN_TASKS
from controlmsg.spark.reading.planning import RECORDS_PER_TASK as _RECORDS_PER_TASK
from controlmsg.spark.reading.planning import task_groups as _groups

BASE = {"topic": "t", "runId": "r", "kafka.bootstrap.servers": "b:1"}


def opts(**more: str) -> ReadOptions:
    return ReadOptions.parse({**BASE, **more})


def test_given_options_group_as_before() -> None:
    assert _groups(range(5), opts(partitionsPerTask="2"), {p: 10**9 for p in range(5)}) == [[0, 1], [2, 3], [4]]
    assert _groups(range(10), opts(maxTasks="3")) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert _groups(range(3), opts()) == [[0], [1], [2]]  # sizes unknown: one task per partition


def test_few_records_in_many_partitions_make_few_tasks() -> None:
    groups = _groups(range(200), opts(), {p: 50 for p in range(200)})  # 10,000 records in 200 partitions
    assert len(groups) == _MIN_TASKS and sorted(p for g in groups for p in g) == list(range(200))
    assert {len(g) for g in groups} == {25}
    assert _groups(range(3), opts(), {0: 0, 1: 5, 2: 0}) == [[0], [1], [2]]  # fewer partitions than the floor


def test_tasks_follow_the_records() -> None:
    sizes = {p: _RECORDS_PER_TASK // 10 for p in range(1000)}  # 100 tasks' worth
    groups = _groups(range(1000), opts(), sizes)
    assert len(groups) == 100 and all(sum(sizes[p] for p in g) == _RECORDS_PER_TASK for g in groups)


@given(st.lists(st.integers(0, 10 * _RECORDS_PER_TASK), min_size=1, max_size=300))
def test_every_partition_once_and_the_load_spread(sizes_list: list[int]) -> None:
    sizes = dict(enumerate(sizes_list))
    groups = _groups(range(len(sizes)), opts(), sizes)
    total = sum(sizes_list)
    assert sorted(p for g in groups for p in g) == list(range(len(sizes)))
    assert all(g for g in groups)
    assert len(groups) == min(len(sizes), max(_MIN_TASKS, -(-total // _RECORDS_PER_TASK)))
    loads = [sum(sizes[p] for p in g) for g in groups]
    assert max(loads) - min(loads) <= max(sizes_list)  # largest first to the least loaded task
