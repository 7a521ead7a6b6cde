"""What the chain tests assert about their jobs, on the one runner of jobs as process groups
(:class:`controlmsg.clusters.job_group.JobGroup`: each job its own process group, driver, JVM and Python
workers, so that a ``kill -9`` takes the whole job as a crashed machine would)."""

from __future__ import annotations

from controlmsg.clusters.job_group import JobGroup


def kill9(jobs: JobGroup, job: str) -> None:
    """``kill -9`` of ``job``, which must still be running: else the test lost its timing."""
    victim = jobs[job]
    assert victim.running(), f"{job} ended before it could be killed: the test lost its timing\n{victim.tail()}"
    victim.kill()


def wait_all_ok(jobs: JobGroup, timeout: float) -> None:
    """Every job started ends with exit code 0 within ``timeout`` s in all; else fail with its log's tail."""
    for job, code in jobs.wait(timeout).items():
        assert code == 0, f"{job} exit {code}:\n{jobs[job].tail()}"
