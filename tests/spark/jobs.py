"""Jobs of a chain run as separate processes, each in its own process group (driver, JVM and the Python
workers that share the group), so that a ``kill -9`` takes the whole job as a crashed machine would."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO


class Jobs:
    """Start, ``kill -9``, wait for and stop named jobs; each job's output goes to ``<log_dir>/<job>.log``
    (appended across restarts)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: list[IO[bytes]] = []

    def launch(self, job: str, argv: Sequence[str]) -> None:
        log = (self.log_dir / f"{job}.log").open("ab")
        self.logs.append(log)
        self.procs[job] = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def kill9(self, job: str) -> None:
        proc = self.procs[job]
        assert proc.poll() is None, f"{job} ended before it could be killed: the test lost its timing\n{self.tail(job)}"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)

    def tail(self, job: str, lines: int = 30) -> str:
        return "\n".join((self.log_dir / f"{job}.log").read_text(errors="replace").splitlines()[-lines:])

    def wait(self, timeout: float) -> None:
        """Every job started ends with exit code 0 within ``timeout`` s in all; else fail with its log's tail."""
        deadline = time.monotonic() + timeout
        for job, proc in self.procs.items():
            try:
                code = proc.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                code = None
            assert code == 0, f"{job} exit {code}:\n{self.tail(job)}"

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
        for log in self.logs:
            log.close()
