"""How busy the machine was during each slow test: a pytest plugin (loaded by ``tests/conftest.py``).

pytest's ``--durations`` says how long a test took, not why. On the two cores CI runs on, a slow test is
either busy (its JVMs and Python workers use the cores: cut work, start fewer processes) or waiting
(pacing, sleeps, timeouts: cut the wait). This plugin reads the machine's CPU counters (``/proc/stat``,
every process of the machine, containers and daemons included) when each test's setup starts and when its
teardown ends, and prints after pytest's durations the slowest tests with the share of the machine's cores
that was busy meanwhile, and the same share over the whole session. Where ``/proc/stat`` is missing (not
Linux) it prints nothing. With ``CONTROLMSG_MACHINE_LOAD_TSV=<file>`` it also writes every test's row
there (seconds, busy share, test id; tab-separated), to choose the tests that mostly wait
(``tests/lanes.py``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

SHOWN = 25
_STAT = Path("/proc/stat")


def _cpu() -> tuple[int, int] | None:
    """(busy, total) jiffies of all cores since boot; None where ``/proc/stat`` is unreadable."""
    try:
        first = _STAT.read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    values = [int(v) for v in first[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return sum(values[:8]) - idle, sum(values[:8])


def _busy(before: tuple[int, int], after: tuple[int, int]) -> float:
    total = after[1] - before[1]
    return (after[0] - before[0]) / total if total > 0 else 0.0


class MachineLoad:
    """Per test id: (seconds from setup to teardown, the machine's busy share meanwhile)."""

    def __init__(self) -> None:
        self.rows: dict[str, tuple[float, float]] = {}
        self._start: dict[str, tuple[float, tuple[int, int]]] = {}
        self._session = _cpu()
        self._session_t = time.monotonic()

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        cpu = _cpu()
        if cpu is not None:
            self._start[nodeid] = (time.monotonic(), cpu)

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logfinish(self, nodeid: str, location: Any) -> None:
        started = self._start.pop(nodeid, None)
        cpu = _cpu()
        if started is not None and cpu is not None:
            self.rows[nodeid] = (time.monotonic() - started[0], _busy(started[1], cpu))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        cpu = _cpu()
        if not self.rows or cpu is None or self._session is None:
            return
        write = terminalreporter.write_line
        terminalreporter.section(f"slowest {SHOWN} tests, setup to teardown, with the machine's busy cores")
        slowest = sorted(self.rows.items(), key=lambda r: -r[1][0])[:SHOWN]
        for nodeid, (seconds, busy) in (row for row in slowest if row[1][0] >= 1.0):
            write(f"{seconds:8.1f}s  {busy:4.0%} busy  {nodeid}")
        session_s = time.monotonic() - self._session_t
        table = os.environ.get("CONTROLMSG_MACHINE_LOAD_TSV")
        if table:
            with open(table, "a", encoding="utf-8") as out:
                out.writelines(f"{seconds:.2f}\t{busy:.3f}\t{nodeid}\n"
                               for nodeid, (seconds, busy) in self.rows.items())
        write(f"the session: {session_s:.0f} s, the machine's cores {_busy(self._session, cpu):.0%} busy")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(MachineLoad(), "controlmsg-machine-load")
