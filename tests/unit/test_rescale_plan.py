"""Which generation a start of the streaming ingest runs as (``controlmsg.streaming.ingest.plan_generation``):
the same layout resumes its generation; another layout (``--tasks``, or partitions added to the source)
runs as the next one and names the task count whose transactional ids are fenced first."""

from __future__ import annotations

from typing import Any

from controlmsg.streaming.ingest import plan_generation
from controlmsg.streaming.runtime import slot_groups


def committed(groups: list[list[int]], generation: int = 0, only: set[int] | None = None) -> dict[int, dict[str, Any]]:
    """The offset metadata a layout commits (``only``: the partitions that have committed so far)."""
    out: dict[int, dict[str, Any]] = {}
    for group in groups:
        for p in group:
            if only is None or p in only:
                state: dict[str, Any] = {"taskCount": len(groups), "partitions": sorted(group), "maxEvent": p}
                if generation:
                    state["generation"] = generation
                out[p] = state
    return out


def layout(tasks: int, partitions: int) -> list[list[int]]:
    return slot_groups(partitions, tasks)  # round-robin, as partition_groups deals them


def test_a_first_start_is_generation_zero() -> None:
    assert plan_generation({}, layout(2, 4)) == (0, None)


def test_the_same_layout_resumes_its_generation() -> None:
    assert plan_generation(committed(layout(2, 4)), layout(2, 4)) == (0, None)
    assert plan_generation(committed(layout(4, 4), 1), layout(4, 4)) == (1, None)
    # Only some partitions committed yet (a task had not committed when the run stopped): still the same.
    assert plan_generation(committed(layout(2, 4), only={0, 2}), layout(2, 4)) == (0, None)


def test_another_task_count_is_the_next_generation_and_retires_the_old_tasks() -> None:
    assert plan_generation(committed(layout(2, 4)), layout(4, 4)) == (1, 2)
    assert plan_generation(committed(layout(4, 4), 1), layout(3, 4)) == (2, 4)
    assert plan_generation(committed(layout(3, 4), 2), layout(2, 4)) == (3, 3)


def test_partitions_added_to_the_source_are_a_new_layout() -> None:
    assert plan_generation(committed(layout(2, 4)), layout(2, 6)) == (1, 2)


def test_a_rescale_that_stopped_half_way_resumes_the_new_generation() -> None:
    # 2 -> 4 tasks: only partitions 0 and 1 committed under generation 1 before the run stopped; the
    # others still hold generation 0's state. The same 4 tasks resume generation 1; 3 tasks make a 2nd.
    mixed = {**committed(layout(2, 4)), **committed(layout(4, 4), 1, only={0, 1})}
    assert plan_generation(mixed, layout(4, 4)) == (1, None)
    assert plan_generation(mixed, layout(3, 4)) == (2, 4)
