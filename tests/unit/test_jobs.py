"""The runner of jobs as process groups (:mod:`controlmsg.clusters.jobs`), on small Python processes: each
job in a group of its own, the log appended across restarts, kill -9 of the group and of a descendant that
left it, a stop by SIGTERM then SIGKILL, a group's wait ending at the first failure, the echo, the nice
level."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from controlmsg.clusters.job_group import JobGroup
from controlmsg.clusters.jobs import Job, JobError
from controlmsg.clusters.processes import pid_alive

# A job that starts a child in the job's group and one in a session of its own (as the PySpark daemon
# leaves the group), writes both pids to argv[1], says "ready", and sleeps.
WITH_CHILDREN = """
import subprocess, sys, time
sleep = [sys.executable, "-c", "import time; time.sleep(300)"]
inside = subprocess.Popen(sleep)
outside = subprocess.Popen(sleep, start_new_session=True)
open(sys.argv[1], "w").write(f"{inside.pid} {outside.pid}")
print("ready", flush=True)
time.sleep(300)
"""
# A job that stops on SIGTERM with exit 143 after "ready" (or, given "stubborn", ignores SIGTERM).
ON_SIGTERM = """
import signal, sys, time
if sys.argv[1:] == ["stubborn"]:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
print("ready", flush=True)
time.sleep(300)
"""


def python(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", code, *args]


def gone(pids: list[int], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while any(pid_alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_job_runs_in_its_own_group_and_appends_to_its_log_across_restarts(tmp_path: Path) -> None:
    job = Job("hello", python("import os, sys; print('hello', os.getpgid(0) == os.getpid(), sys.stdin.read())"),
              tmp_path / "hello.log")
    job.start()
    assert job.wait(30) == 0 and job.ended_at is not None and job.started_at is not None
    assert job.tail() == "hello True "  # leads its own group; stdin is /dev/null
    job.start(python("print('again')"))
    job.wait_for_log("again", 30)
    with pytest.raises(JobError, match="exited with 0 before it logged 'hello'"):
        job.wait_for_log("hello", 30)  # only what it logged since its last start counts
    assert job.wait(30) == 0 and job.starts == 2
    assert (tmp_path / "hello.log").read_text().splitlines() == ["hello True ", "again"]
    assert job.tail(1, indent="  ") == "  again"
    job.close()


def test_kill_takes_the_group_and_a_descendant_that_left_it(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    job = Job("parent", python(WITH_CHILDREN, str(pids)), tmp_path / "parent.log")
    job.start()
    job.wait_for_log("ready", 30)
    children = [int(p) for p in pids.read_text().split()]
    assert all(pid_alive(p) for p in children)
    assert job.kill() == -signal.SIGKILL
    assert gone(children), "a child of the killed job survived"
    assert not job.running()
    job.close()


def test_stop_is_sigterm_to_the_job_then_sigkill_after_the_grace(tmp_path: Path) -> None:
    with JobGroup(tmp_path) as jobs:
        polite = jobs.start("polite", python(ON_SIGTERM))
        stubborn = jobs.start("stubborn", python(ON_SIGTERM, "stubborn"))
        polite.wait_for_log("ready", 30)
        stubborn.wait_for_log("ready", 30)
        # polite ends on SIGTERM; stubborn ignores it and is SIGKILLed once the grace is over (a kill that does
        # not take raises JobError after KILL_WAIT_S).
        assert jobs.stop(1.0, linger=0.5) == {"polite": 143, "stubborn": -signal.SIGKILL}
        assert jobs.stop(1.0) == {}  # nothing left running
        with pytest.raises(JobError, match="exited with 143"):
            polite.ensure_running()


def test_a_group_wait_ends_at_the_first_failure(tmp_path: Path) -> None:
    jobs = JobGroup(tmp_path, env={**os.environ, "JOB_EXIT": "3"})
    try:
        jobs.start("slow", python("import time; time.sleep(300)"))
        jobs.start("failing", python("import os, sys; print('failing'); sys.exit(int(os.environ['JOB_EXIT']))"))
        started = time.monotonic()
        assert jobs.wait(120, poll_s=0.05) == {"slow": None, "failing": 3}
        assert time.monotonic() - started < 120  # its own timeout: it returned at the failure, not at the timeout
        assert jobs["failing"].tail() == "failing"
        assert jobs.wait(0.1, stop_when=lambda: True) == {"slow": None, "failing": 3}
        assert list(jobs) == ["slow", "failing"] and len(jobs) == 2
        with pytest.raises(JobError, match="still running"):
            jobs.start("slow", python("print('twice')"))
    finally:
        jobs.close()
    assert not jobs["slow"].running() and jobs["slow"].returncode == -signal.SIGKILL


def test_echo_and_nice(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    code = "import os; print('12:00:00 mine: nice', os.nice(0)); print('noise', flush=True)"
    with JobGroup(tmp_path) as jobs:
        job = jobs.start("echoed", python(code), nice=3, echo=lambda line: line.startswith(b"12:00:00 mine"))
        assert job.wait(30) == 0
    expected = f"12:00:00 mine: nice {min(19, os.nice(0) + 3)}"
    assert capfd.readouterr().err.splitlines() == [expected]
    assert (tmp_path / "echoed.log").read_text().splitlines() == [expected, "noise"]


def test_a_running_job_is_lowered_whole_and_never_raised(tmp_path: Path) -> None:
    """lower_priority moves the job and the child in its group down to the level asked (the pipeline's
    window job once its input ended), leaves a job already at or below it alone, and a job that ended."""
    base = os.nice(0)
    assert base <= 15, f"this test process runs at nice {base}: it needs room to lower a job below it"
    ids = tmp_path / "pids"
    with JobGroup(tmp_path) as jobs:
        job = jobs.start("lowered", python(WITH_CHILDREN, str(ids)), nice=1)
        job.wait_for_log("ready", 30)
        inside = int(ids.read_text().split()[0])
        assert job.pid is not None
        assert [os.getpriority(os.PRIO_PROCESS, p) for p in (job.pid, inside)] == [base + 1] * 2
        assert job.lower_priority(base + 3)
        assert [os.getpriority(os.PRIO_PROCESS, p) for p in (job.pid, inside)] == [base + 3] * 2
        autogroup = Path(f"/proc/{job.pid}/autogroup")
        if autogroup.exists():
            assert autogroup.read_text().split()[-1] == str(base + 3)
        assert not job.lower_priority(base + 2)
        assert os.getpriority(os.PRIO_PROCESS, job.pid) == base + 3
        job.kill()
        assert not job.lower_priority(19)


def test_a_job_that_cannot_start(tmp_path: Path) -> None:
    with pytest.raises(JobError, match="cannot start missing"):
        JobGroup(tmp_path).start("missing", [str(tmp_path / "no-such-program")])
    with pytest.raises(JobError, match="never started"):
        Job("idle", ["true"], tmp_path / "idle.log").wait(1)
