"""``make test``: the whole suite in two lanes, the tests marked ``beside`` next to the others at a lower priority.

On the two cores CI runs on, the suite alone leaves a quarter to a third of the machine idle: many of its tests
wait on brokers (paused, stopped, killed and restarted), timeouts and restarts, not on the cores. The modules
marked ``beside`` run in a second pytest process next to the rest, at ``nice 10``: they take what the main
lane leaves idle and little more, so the main lane is slowed little by what they do, and their own minutes
leave the critical path. Marked are modules that wait more than they compute (under half the machine busy
alone, in CI's figures from ``tests/machine_load.py``) or whose bounds are minutes, not seconds (a slower
start cannot fail them; no SIGTERM grace period), and that start no session cluster the main lane starts
too (HDFS, S3, the Connect server, the secured broker). The lane of each test is a marker, so nothing runs
twice and nothing is left out: every test the suite selects runs in exactly one lane (``-m "beside"`` and
``-m "not beside"``).

Usage: ``python -m tests.lanes [pytest options for the main lane]``. The side lane's output is printed after
the main lane's; the exit status is the main lane's when it failed, else the side lane's (pytest's exit 5,
"no tests ran", is a failure in either). Ctrl-C or SIGTERM stops both. One file or one test is still run with
plain ``python -m pytest``, which runs the ``beside`` tests in place like any other.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from types import FrameType

SIDE_NICE = 10
# pyproject's addopts deselect spark42; a -m given here replaces that one, so both lanes say it again.
MAIN = "not beside and not spark42"
SIDE = "beside and not spark42"


def _side_lane(log: int) -> subprocess.Popen[bytes]:
    """The ``beside`` tests in a process group of their own (so a stop takes its brokers and JVMs too)."""
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", "-m", SIDE, "-p", "no:cacheprovider", "--durations=10"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        preexec_fn=lambda: os.nice(SIDE_NICE))


def _stop(side: subprocess.Popen[bytes]) -> None:
    if side.poll() is None:
        try:
            os.killpg(side.pid, signal.SIGTERM)
            side.wait(30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(side.pid, signal.SIGKILL)
            side.wait()


def main(argv: list[str]) -> int:
    with tempfile.TemporaryFile() as log:
        side = _side_lane(log.fileno())

        def stop(signum: int, _frame: FrameType | None) -> None:
            _stop(side)
            raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, stop)
        try:
            main_code = subprocess.call([sys.executable, "-m", "pytest", "-m", MAIN, *argv])
            print(f"\n===== the tests marked beside, run next to the others at nice {SIDE_NICE} "
                  f"(tests/lanes.py) =====", flush=True)
            side_code = side.wait()
        finally:
            _stop(side)
        log.seek(0)
        sys.stdout.flush()
        sys.stdout.buffer.write(log.read())
        sys.stdout.flush()
    for lane, code in (("main", main_code), ("beside", side_code)):
        if code != 0:
            print(f"tests/lanes.py: the {lane} lane failed (pytest exit {code})", file=sys.stderr)
    return main_code or side_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
