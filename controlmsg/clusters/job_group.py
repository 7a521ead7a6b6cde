"""Named jobs started together and stopped at once: :class:`JobGroup`, what the pipeline command, the tests and
the benchmarks run their chains with. Each job is a :class:`~controlmsg.clusters.jobs.Job` and keeps that
contract (start, signal, kill, stop, wait, tail, close); the group starts a name again with its log kept,
waits until the first failure, stops every running job within one grace, and closes them all, so that
nothing it started outlives it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from controlmsg.clusters.jobs import LINGER_S, Job, stop_jobs

__all__ = ["JobGroup"]


class JobGroup(Mapping[str, Job]):
    """Named jobs, each a :class:`Job` whose log is ``<log_dir>/<name>.log`` unless given, all with the
    environment ``env`` (``None``: ours). A mapping of name to job, in the order they were first started.

    Use it as a context manager, or call :meth:`close`: nothing it started outlives it.
    """

    def __init__(self, log_dir: Path, *, env: Mapping[str, str] | None = None) -> None:
        self.log_dir = log_dir
        self.env = None if env is None else dict(env)
        self._jobs: dict[str, Job] = {}

    def start(self, name: str, argv: Sequence[str], *, log_path: Path | None = None, nice: int = 0,
              echo: Callable[[bytes], bool] | None = None) -> Job:
        """Start the job ``name`` (see :class:`Job`); a name started before starts again with ``argv``,
        its log, nice level and echo kept. Returns at once; raises :class:`JobError` if it is still running
        or cannot be started."""
        job = self._jobs.get(name)
        if job is not None:
            job.start(argv)
            return job
        job = Job(name, argv, log_path or self.log_dir / f"{name}.log", env=self.env, nice=nice, echo=echo)
        job.start()
        self._jobs[name] = job
        return job

    def wait(self, timeout: float, *, stop_when: Callable[[], bool] | None = None,
             poll_s: float = 0.2) -> dict[str, int | None]:
        """Block until every job has ended, one has ended with a code other than 0, ``stop_when()`` is true,
        or ``timeout`` s have passed; returns each job's exit code (``None``: still running)."""
        deadline = time.monotonic() + timeout
        while True:
            codes = {name: job.poll() for name, job in self._jobs.items()}
            if all(code is not None for code in codes.values()) or any(code for code in codes.values()):
                return codes
            now = time.monotonic()
            if (stop_when is not None and stop_when()) or now >= deadline:
                return codes
            time.sleep(min(poll_s, deadline - now))

    def signal(self, signum: int, *, group: bool = False) -> None:
        """:meth:`Job.signal` to every job: never waits, safe in a signal handler."""
        for job in list(self._jobs.values()):
            job.signal(signum, group=group)

    def stop(self, grace: float, *, linger: float = LINGER_S) -> dict[str, int]:
        """:meth:`Job.stop` of every running job at once (one ``grace`` for all), then the same ``linger``
        for what every job's group still holds, ended jobs' groups too. Returns the exit code of each job
        that was running."""
        return stop_jobs(list(self._jobs.values()), grace, linger)

    def close(self) -> None:
        """:meth:`Job.close` of every job."""
        for job in self._jobs.values():
            job.close()

    def __enter__(self) -> JobGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getitem__(self, name: str) -> Job:
        return self._jobs[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._jobs)

    def __len__(self) -> int:
        return len(self._jobs)
