"""Jobs run as process groups: the one runner of the pipeline command, the tests and the benchmarks.

A *job* is one command (a Spark application's driver, or a plain process) started in a new session, so
that it leads a process group of its own: its JVM and its Python workers join that group, and a ``kill -9``
of the group takes the whole job, as a crashed machine would. Some processes leave the group (the PySpark
daemon makes one of its own); they are found as the job's descendants while its process runs, and go with
it.

The contract (:class:`Job` for one job, :class:`~controlmsg.clusters.job_group.JobGroup` for named jobs
started together):

* **start**: ``argv`` with an environment (default: ours), stdin from ``/dev/null``, stdout and stderr
  appended to a log file (kept across restarts); optionally ``nice`` levels lower (its session's scheduler
  autogroup too) and an ``echo`` of chosen lines to our stderr. Never waits for the job.
* **signal**: a signal to the job's own process (its driver, which stops its tasks at a commit), or to its
  whole group. Never waits, so it may be sent from a signal handler.
* **kill**: SIGKILL to the group and to every descendant that left it; waits until the job's process is gone.
* **stop**: SIGTERM to the job's own process; SIGKILL to the group (as **kill**) if it is still there
  ``grace`` s later; then SIGKILL to whatever the group and the strays still hold ``linger`` s later (a JVM
  its driver left behind). Returns the exit code.
* **wait**: at most ``timeout`` s; the exit code (negative: ended by that signal), ``None`` while it runs.
* **tail** of its log, and **wait for a line** the job writes to it.
* **close**: kill what still runs, SIGKILL what its group still holds, close the log.

Everything but :meth:`Job.signal` is called from the thread that started the jobs. A pid remembered as a
stray is only signalled while it still has the start time it had then (pid reuse). POSIX only.

It imports nothing of controlmsg but :mod:`controlmsg.errors` and the local process helpers, so the
example jobs' pipeline, the tests and the benchmarks all use it.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Final

from controlmsg.clusters.processes import descendants
from controlmsg.errors import ControlMsgError

__all__ = ["KILL_WAIT_S", "LINGER_S", "Job", "JobError"]

KILL_WAIT_S: Final = 30.0
"""Seconds a job's process has to be gone after SIGKILL before :meth:`Job.kill` raises."""
LINGER_S: Final = 5.0
"""Seconds a stopped job's group and strays have to end by themselves before they are SIGKILLed."""
TAIL_LINES: Final = 30
_TAIL_BYTES = 256 * 1024  # a tail reads no more than this much of the end of the log
_PUMP_JOIN_S = 5.0


class JobError(ControlMsgError):
    """A job cannot be started, outlives its SIGKILL, or ends (or stays silent) while a line of its log is
    waited for. The message names the job and, where it helps, ends with the last lines of its log."""


class Job:
    """One command run in its own session and process group, its output appended to ``log_path``.

    ``env``: the job's whole environment (``None``: ours). ``nice``: CPU priority levels below ours, for
    the job and everything it starts. ``echo``: output goes through a pipe, every line is appended to the
    log and the lines for which ``echo(line)`` is true are also written to our stderr; without it the job
    writes to the log file itself (and keeps writing if we die).
    """

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, *, env: Mapping[str, str] | None = None,
                 nice: int = 0, echo: Callable[[bytes], bool] | None = None) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = None if env is None else dict(env)
        self.nice = nice
        self.echo = echo
        self.starts = 0
        """How many times the job was started."""
        self.started_at: float | None = None
        """``time.monotonic()`` at the last start."""
        self.ended_at: float | None = None
        """``time.monotonic()`` when its end was first seen (by :meth:`poll`, :meth:`wait`, :meth:`kill`)."""
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._pump: threading.Thread | None = None
        self._log_start = 0
        self._strays: dict[int, str] = {}

    def start(self, argv: Sequence[str] | None = None) -> None:
        """Start the job (again, after it ended: with ``argv`` if given, else the same command), appending
        to its log. Returns at once. Raises :class:`JobError` if it is running or cannot be started."""
        if self.running():
            raise JobError(f"{self.name} is still running (pid {self.pid}): stop it before starting it again")
        if argv is not None:
            self.argv = list(argv)
        self._release()
        try:
            log = self.log_path.open("ab")
        except OSError as exc:
            raise JobError(f"cannot start {self.name}: cannot open its log {self.log_path}: {exc}") from exc
        self._log_start = os.fstat(log.fileno()).st_size
        try:
            proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE if self.echo else log,
                stderr=subprocess.STDOUT, env=self.env, start_new_session=True,
                preexec_fn=_lowered(self.nice) if self.nice else None)
        except OSError as exc:
            log.close()
            raise JobError(f"cannot start {self.name}: `{shlex.join(self.argv)}`: {exc}") from exc
        self._proc, self._log, self._strays = proc, log, {}
        self.started_at, self.ended_at = time.monotonic(), None
        self.starts += 1
        if self.echo is not None:
            assert proc.stdout is not None
            self._pump = threading.Thread(target=_pump, args=(proc.stdout, log, self.echo), daemon=True,
                                          name=f"{self.name} output")
            self._pump.start()

    def lower_priority(self, nice: int) -> bool:
        """Move the running job, and everything it started, down to CPU priority level ``nice`` (a nice
        value, at most 19) when it is above it: its session's scheduler autogroup and each process of its
        process group, as its start did (see :func:`_lowered`). Only ever lowers: raising a priority needs
        a privilege the caller may not have. Returns whether anything was lowered; a job that has ended,
        or processes that end meanwhile, are left alone."""
        nice = min(nice, 19)
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return False
        lowered = False
        with contextlib.suppress(OSError, ValueError), open(f"/proc/{proc.pid}/autogroup", "r+") as group:
            now = int(group.read().split()[-1])  # "/autogroup-1234 nice 12"
            if now < nice:
                group.seek(0)
                group.write(str(nice))
                group.flush()
                lowered = True
        with contextlib.suppress(OSError):
            if os.getpriority(os.PRIO_PGRP, proc.pid) < nice:  # the group's highest priority (lowest nice)
                os.setpriority(os.PRIO_PGRP, proc.pid, nice)
                lowered = True
        return lowered

    @property
    def pid(self) -> int | None:
        """The job's own process (the leader of its group), ``None`` before the first start."""
        return None if self._proc is None else self._proc.pid

    def poll(self) -> int | None:
        """The exit code if the job has ended (negative: by that signal), else ``None``; never blocks."""
        if self._proc is None:
            return None
        code = self._proc.poll()
        if code is not None and self.ended_at is None:
            self.ended_at = time.monotonic()
        return code

    @property
    def returncode(self) -> int | None:
        """:meth:`poll`."""
        return self.poll()

    def running(self) -> bool:
        """Started and not ended."""
        return self._proc is not None and self.poll() is None

    def signal(self, signum: int, *, group: bool = False) -> bool:
        """Send ``signum`` to the job's own process, or with ``group`` to every process of its group.
        Returns whether there was a process to send it to. Never waits: safe in a signal handler."""
        proc = self._proc
        if proc is None:
            return False
        try:
            if group:
                os.killpg(proc.pid, signum)
            elif proc.poll() is None:
                proc.send_signal(signum)
            else:
                return False
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def wait(self, timeout: float) -> int | None:
        """Block until the job ends, at most ``timeout`` s; its exit code, or ``None`` if it still runs."""
        proc = self._started()
        try:
            proc.wait(max(0.0, timeout))
        except subprocess.TimeoutExpired:
            return None
        return self.poll()

    def kill(self, timeout: float = KILL_WAIT_S) -> int:
        """``kill -9`` of the whole job: SIGKILL to its group and to every descendant that left the group
        (even if its own process has ended: what the group still holds). Blocks until its process is gone;
        returns the exit code. Raises :class:`JobError` if it is still there after ``timeout`` s."""
        proc = self._started()
        self._remember_strays()
        self.signal(signal.SIGKILL, group=True)
        self._kill_strays()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired as exc:
            raise JobError(f"{self.name} (pid {proc.pid}) is still alive {timeout:g} s after SIGKILL") from exc
        code = self.poll()
        assert code is not None
        return code

    def stop(self, grace: float, *, linger: float = LINGER_S) -> int:
        """Stop the job as an operator would: SIGTERM to its own process, :meth:`kill` if it has not ended
        ``grace`` s later, then SIGKILL to what its group and strays still hold ``linger`` s after that.
        Blocks for at most about ``grace + linger`` s; returns the exit code."""
        self._started()
        codes = stop_jobs([self], grace, linger)
        return codes[self.name] if self.name in codes else self._ended_code()

    def ensure_running(self) -> None:
        """Raise :class:`JobError` (the exit code, the log's tail) if the job has ended."""
        code = self.poll() if self._proc is not None else "never started"
        if code is not None:
            raise JobError(f"{self.name} exited with {code}{self._last_lines()}")

    def wait_for_log(self, text: str, timeout: float, *, poll_s: float = 0.1) -> float:
        """Block until ``text`` appears in what the job logged since its last start; returns the
        ``time.monotonic()`` it was seen at (within ``poll_s``). Raises :class:`JobError` if the job ends
        without logging it, or after ``timeout`` s."""
        self._started()
        needle = text.encode()
        keep = len(needle) - 1  # the end of one read that may start a match completed by the next
        deadline = time.monotonic() + timeout
        position, seen = self._log_start, b""
        while True:
            code = self.poll()  # before the read: a line written just before the end is still found
            with contextlib.suppress(OSError), self.log_path.open("rb") as fh:
                fh.seek(position)
                chunk = fh.read()
                position += len(chunk)
                seen = seen[-keep:] + chunk if keep else chunk
            if needle in seen:
                return time.monotonic()
            if code is not None:
                raise JobError(f"{self.name} exited with {code} before it logged {text!r}{self._last_lines()}")
            if time.monotonic() >= deadline:
                raise JobError(f"{self.name}: {text!r} not logged within {timeout:g} s{self._last_lines()}")
            time.sleep(poll_s)

    def tail(self, lines: int = TAIL_LINES, *, indent: str = "") -> str:
        """The last ``lines`` lines of the job's log (of its last 256 KiB), each after ``indent``; "" if
        there is no log."""
        try:
            with self.log_path.open("rb") as fh:
                size = fh.seek(0, os.SEEK_END)
                fh.seek(max(0, size - _TAIL_BYTES))
                data = fh.read()
        except OSError:
            return ""
        last = data.decode(errors="replace").splitlines()[-lines:] if lines > 0 else []
        return "\n".join(indent + line for line in last)

    def close(self) -> None:
        """Kill the job if it runs, SIGKILL what its group still holds, close its log. Idempotent."""
        if self._proc is not None:
            if self.running():
                self.kill()
            self._sweep(time.monotonic())
        self._release()

    def _last_lines(self) -> str:
        return f"; last lines of {self.log_path}:\n{self.tail(indent='    ')}"

    def _started(self) -> subprocess.Popen[bytes]:
        if self._proc is None:
            raise JobError(f"{self.name} was never started")
        return self._proc

    def _ended_code(self) -> int:
        code = self.poll()
        if code is None:
            raise JobError(f"{self.name} (pid {self.pid}) still runs")
        return code

    def _remember_strays(self) -> None:
        """Note the descendants of the job's process (with their start times) while it still runs: once it
        has gone, those that left its group can no longer be found."""
        if self._proc is None or self._proc.poll() is not None:
            return
        for pid in descendants(self._proc.pid):
            started = _start_time(pid)
            if started is not None:
                self._strays[pid] = started

    def _kill_strays(self) -> None:
        for pid, started in list(self._strays.items()):
            if _start_time(pid) != started:
                del self._strays[pid]  # gone (or its pid is another process's now)
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def _holds_processes(self) -> bool:
        """Whether the job's group, or a stray, still has a live process (its own must have been reaped)."""
        self._strays = {pid: started for pid, started in self._strays.items() if _start_time(pid) == started}
        if self._strays:
            return True
        if self._proc is None:
            return False
        try:
            os.killpg(self._proc.pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def _sweep(self, deadline: float) -> None:
        """Wait until the group and the strays hold no process or ``deadline`` passes, then SIGKILL them."""
        while self._holds_processes():
            if time.monotonic() >= deadline:
                self.signal(signal.SIGKILL, group=True)
                self._kill_strays()
                return
            time.sleep(0.1)

    def _release(self) -> None:
        if self._pump is not None:
            self._pump.join(_PUMP_JOIN_S)
            self._pump = None
        if self._log is not None:
            self._log.close()
            self._log = None


def stop_jobs(jobs: Sequence[Job], grace: float, linger: float) -> dict[str, int]:
    """:meth:`Job.stop` of every running job of ``jobs`` at once (one ``grace`` for all), then the same
    ``linger`` for what every job's group still holds, ended jobs' groups too. Returns the exit code of each
    job that was running. Blocks for at most about ``grace + linger`` s."""
    running = [job for job in jobs if job.running()]
    for job in running:
        job._remember_strays()
        job.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    codes: dict[str, int] = {}
    for job in running:
        code = job.wait(deadline - time.monotonic())
        codes[job.name] = job.kill() if code is None else code
    until = time.monotonic() + linger
    for job in jobs:
        if job.pid is not None:
            job._sweep(until)
    return codes


def _start_time(pid: int) -> str | None:
    """The start time of live process ``pid`` (``/proc/<pid>/stat``), ``None`` if it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # state is field 3, the start time field 22 of the whole line
    if len(fields) < 20 or fields[0] == "Z":
        return None
    return fields[19]


def _lowered(increment: int) -> Callable[[], None]:
    """A ``preexec_fn`` lowering the child's CPU priority by ``increment`` (what it starts inherits it).

    The child leads a new session, which Linux's scheduler autogroups (``sched_autogroup_enabled``): a
    process's nice value then only weighs against processes of its own group, so the group's nice value
    (``/proc/self/autogroup``) is lowered too, where the kernel has it."""
    def lower() -> None:
        os.nice(increment)
        with contextlib.suppress(OSError), open("/proc/self/autogroup", "w") as group:
            group.write(str(increment))
    return lower


def _pump(stream: IO[bytes], log: IO[bytes], echo: Callable[[bytes], bool]) -> None:
    """Append every line of ``stream`` to ``log``; write those ``echo`` picks to our stderr too."""
    err = getattr(sys.stderr, "buffer", None)
    try:
        for line in iter(stream.readline, b""):
            log.write(line)
            log.flush()
            if echo(line):
                if err is not None:
                    err.write(line)
                else:
                    sys.stderr.write(line.decode(errors="replace"))
                sys.stderr.flush()
    except (OSError, ValueError):
        pass  # the log was closed under it: the job's close stopped waiting for a process that kept the pipe
    finally:
        stream.close()
