"""The streaming runtime's own rules: logical tasks dealt to task slots, tries per task on a local master,
and the watchdog that ends a Python worker whose task is wedged (in a real child process)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from controlmsg.streaming.runtime import STALL_EXIT, slot_groups
from spark_jobs.common import with_task_attempts


@pytest.mark.parametrize(("n", "slots", "groups"), [
    (2, 2, [[0], [1]]), (8, 2, [[0, 2, 4, 6], [1, 3, 5, 7]]), (3, 8, [[0], [1], [2]]), (5, 0, [[0, 1, 2, 3, 4]]),
])
def test_logical_tasks_are_dealt_round_robin_to_the_slots(n: int, slots: int, groups: list[list[int]]) -> None:
    assert slot_groups(n, slots) == groups


@pytest.mark.parametrize(("master", "expected"), [
    ("local", "local[1,4]"), ("local[2]", "local[2,4]"), ("local[*]", "local[*,4]"),
    ("local[2,3]", "local[2,3]"), ("spark://h:7077", "spark://h:7077"),
])
def test_a_local_master_tries_a_streaming_task_as_a_cluster_does(master: str, expected: str) -> None:
    assert with_task_attempts(master, 4) == expected


def _group(body: str) -> subprocess.CompletedProcess[str]:
    """Run ``body`` (the text of ``body(i, stop)``) as logical tasks 0 and 1 of one group, with a 1 s
    stall limit, in a child process; print the summaries."""
    script = "\n".join([
        "import time",
        "from controlmsg.streaming.runtime import _run_group",
        "def body(i, stop):",
        textwrap.indent(textwrap.dedent(body).strip("\n"), "    "),
        "print(_run_group([0, 1], body, lambda: False, stall_limit_s=1.0))",
    ])
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)


def test_a_wedged_logical_task_ends_its_worker_with_the_stacks() -> None:
    """Task 1 turns its loop once, then blocks (as a client call that never returns would): the worker
    ends with STALL_EXIT, naming the task, and the stack shows where it was stuck."""
    done = _group("""
        stop()
        if i == 1:
            time.sleep(3600)  # wedged_here
        while not stop():
            time.sleep(0.05)
        return {"i": i}
    """)
    assert done.returncode == STALL_EXIT, done.stderr
    assert "logical task 1 has not turned its loop" in done.stderr
    assert "in body" in done.stderr  # faulthandler's stack of the wedged thread


def test_tasks_that_turn_their_loops_are_left_alone() -> None:
    done = _group("""
        t = time.monotonic()
        while time.monotonic() - t < 2.5:  # longer than the limit in all, never longer than it per turn
            stop()
            time.sleep(0.1)
        return {"i": i}
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[{'i': 0}, {'i': 1}]"
