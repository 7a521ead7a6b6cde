"""controlmsg.kafka.background: what a write task hands off runs, in order, off the caller's thread; a
failing action is logged and does not stop the ones after it."""

from __future__ import annotations

import threading

import pytest

from controlmsg.kafka.background import run_later


def test_actions_run_in_order_off_the_callers_thread_and_a_failure_is_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    done = threading.Event()
    seen: list[tuple[int, str]] = []

    def fail() -> None:
        raise RuntimeError("boom")

    for n in range(3):
        run_later(lambda n=n: seen.append((n, threading.current_thread().name)))  # type: ignore[misc]
    run_later(fail)
    run_later(done.set)
    assert done.wait(30)
    assert [n for n, _ in seen] == [0, 1, 2]
    assert {name for _, name in seen} == {"controlmsg-background"}
    assert any("boom" in (r.exc_text or "") and "failed" in r.getMessage() for r in caplog.records)


def test_with_the_queue_full_the_caller_runs_its_action_itself() -> None:
    release, done = threading.Event(), threading.Condition()
    ran_in: list[str] = []

    def hold() -> None:  # keeps the background thread busy while the queue fills
        release.wait(30)

    def note() -> None:
        with done:
            ran_in.append(threading.current_thread().name)
            done.notify_all()

    run_later(hold)
    for _ in range(20):
        run_later(note)
    release.set()
    with done:
        assert done.wait_for(lambda: len(ran_in) == 20, timeout=30)
    assert threading.current_thread().name in ran_in  # some ran here: the queue was full
    assert "controlmsg-background" in ran_in  # the others on the background thread
