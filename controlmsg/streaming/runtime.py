"""Long-running Spark tasks: the runtime of the streaming jobs (see docs/STREAMING.md).

A streaming job runs ``n`` logical tasks that all run at once and each loop until their input ends:
task ``i`` runs ``body(i, stop)`` and returns a JSON-compatible summary. They run in one Spark job of at
most as many Spark tasks as the application has task slots, each Spark task running its share of the
logical tasks in threads of its Python worker (:func:`slot_groups`). Spark's task retry is the restart:
a Spark task that fails (or whose executor dies) is started again, and each body resumes from its own
committed state in Kafka. A graceful stop (SIGTERM, SIGINT: see
:mod:`controlmsg.streaming.stopping`) reaches the tasks through ``stop``: true once the driver asked them
to stop, after which each commits and returns.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from pyspark.sql import SparkSession

from controlmsg.streaming.log import job_logger
from controlmsg.streaming.stopping import (
    STOP_GRACE_S,
    StopChannel,
    StopFailed,
    Stopper,
    StopRequested,
    installed,
    signal_name,
)

__all__ = ["Body", "partition_groups", "run_long_running_tasks", "slot_groups"]

Body = Callable[[int, Callable[[], bool]], dict[str, Any]]
"""A task's work: ``body(i, stop)`` loops until its input ends or ``stop()`` is true (then it commits
and returns), and returns its summary, with ``"ended"``: whether its input ended."""

_log = job_logger("streaming")


def partition_groups(config: dict[str, Any], topic: str, tasks: int, timeout: float | None) -> list[list[int]]:
    """Wait for ``topic`` and deal its partitions to ``tasks`` tasks round-robin (task ``i`` gets
    ``i, i + tasks, ...``). Raises ``ValueError`` unless ``1 <= tasks <= partitions``: a task without a
    partition would have nothing to advance its watermark with."""
    from controlmsg.kafka.admin import wait_for_topic

    partitions = wait_for_topic(config, topic, timeout)
    if not 1 <= tasks <= partitions:
        raise ValueError(f"tasks must be between 1 and the {partitions} partitions of {topic!r}, got {tasks}")
    return [list(range(i, partitions, tasks)) for i in range(tasks)]


def _never() -> bool:
    return False


def slot_groups(n: int, slots: int) -> list[list[int]]:
    """Deal ``n`` logical tasks to ``min(n, slots)`` Spark tasks round-robin (Spark task ``j`` runs the
    logical tasks ``j, j + slots, ...``). ``slots`` < 1 counts as 1."""
    width = max(1, min(n, slots))
    return [list(range(j, n, width)) for j in range(width)]


STALL_LIMIT_S: Final = 180.0
"""How long a logical task may go without turning its loop (each turn asks ``stop()``) once it has turned
it once, before its Spark task counts as wedged. The longest legitimate turn is a commit whose two
transaction calls each retry for up to 60 s (``ControlWriter``'s timeouts)."""
STALL_EXIT: Final = 70
"""The exit status of a Python worker ended by :func:`_run_group`'s watchdog."""


def _run_group(indices: list[int], body: Body, watch: Callable[[], bool],
               stall_limit_s: float = STALL_LIMIT_S) -> list[dict[str, Any]]:
    """Run the logical tasks ``indices`` in one Spark task: one thread each, all at once. ``stop()`` of
    each is ``watch()`` (under a lock: one stop consumer serves them all) or, once a sibling failed, true:
    the others then commit and return, and the first failure is raised, so Spark's retry restarts the
    group and every task resumes from its own commit. Returns the summaries in ``indices`` order.

    **Watchdog.** A task that has turned its loop once and then does not turn it for ``stall_limit_s``
    is wedged in a call that does not come back (seen once: librdkafka's ``commit_transaction`` blocked
    for minutes after a transaction coordinator was killed, past its own timeout). Python cannot
    interrupt such a call, so the watchdog writes every thread's stack to stderr (the job's log) and
    ends the Python worker with :data:`STALL_EXIT`: Spark counts the task as failed and retries it, and
    each logical task resumes from its last commit (its open transaction is aborted by the retry's
    ``init_transactions``), as after a ``kill -9``. Flink's task cancellation watchdog does the same to
    a task that ignores cancellation.
    """
    lock = threading.Lock()
    failed = threading.Event()
    errors: list[BaseException] = []
    summaries: dict[int, dict[str, Any]] = {}
    turned: dict[int, float] = {}  # logical task -> when it last asked stop()

    def stopped_for(i: int) -> Callable[[], bool]:
        def stopped() -> bool:
            turned[i] = time.monotonic()
            if failed.is_set():
                return True
            with lock:
                return watch()
        return stopped

    def run(i: int) -> None:
        try:
            summaries[i] = body(i, stopped_for(i))
        except BaseException as exc:
            errors.append(exc)
            failed.set()
        finally:
            turned.pop(i, None)

    threads = [threading.Thread(target=run, args=(i,), name=f"logical-task-{i}", daemon=True) for i in indices]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(1.0)
            now = time.monotonic()
            for i, at in list(turned.items()):
                if now - at > stall_limit_s:
                    _wedged(i, now - at)
    if errors:
        raise errors[0]
    return [summaries[i] for i in indices]


def _wedged(task: int, quiet_s: float) -> None:
    """End this Python worker: logical task ``task`` has not turned its loop for ``quiet_s`` seconds."""
    print(f"{time.strftime('%H:%M:%S')} streaming: logical task {task} has not turned its loop for "
          f"{quiet_s:.0f} s (wedged in a call that does not return): ending this Python worker (exit "
          f"{STALL_EXIT}) so that Spark retries the task from its last commit; the threads' stacks follow",
          file=sys.stderr, flush=True)
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    sys.stderr.flush()
    os._exit(STALL_EXIT)


def run_long_running_tasks(spark: SparkSession, n: int, body: Body, stop: StopChannel | None = None,
                           stall_limit_s: float = STALL_LIMIT_S,
                           transactional_ids: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Run ``body(0, stop) ... body(n-1, stop)``, all at once, until all return; return their summaries
    in task order.

    The ``n`` tasks are logical: they are dealt to at most as many Spark tasks as the application has task
    slots (default parallelism; :func:`slot_groups`), and a Spark task runs its share in one thread each.
    A logical task keeps its identity, state and exactly-once commits wherever it runs; with fewer cores
    than tasks the threads share the cores (throughput degrades, nothing waits for a slot). A failure of
    one logical task stops its siblings in the same Spark task at their next commit and fails that Spark
    task; Spark's retry restarts the group and each task resumes from its own commit.

    Graceful stop: when the process has a :class:`~controlmsg.streaming.stopping.Stopper` installed and
    ``stop`` is given, a signal makes this write the stop record (the tasks' ``stop()`` then turns true at
    their next turn) and raise :class:`~controlmsg.streaming.stopping.StopRequested` (with the summaries
    when the tasks returned), unless every task's summary says ``ended``. Tasks still running
    :data:`~controlmsg.streaming.stopping.STOP_GRACE_S` after the request are cancelled, mid-transaction:
    the ``transactional_ids`` (the logical tasks' ids, all of them: fencing one that committed costs an
    epoch and nothing else) are then fenced, which aborts their open transactions, and the
    ``StopRequested`` names them, or names those that could not be fenced and stay open until the next
    start fences them or they time out. When the stop record cannot be written at all, the tasks cannot
    hear of the stop: they are cancelled at once, fenced the same way, and this raises
    :class:`~controlmsg.streaming.stopping.StopFailed` (an error, not a clean stop) naming the stop topic and
    the reason. Without ``stop`` the tasks' ``stop()`` is always false. ``body`` is pickled (cloudpickle) to
    the workers. ``stall_limit_s``: the watchdog's limit (:func:`_run_group`).
    """
    groups = slot_groups(n, spark.sparkContext.defaultParallelism)
    if len(groups) < n:
        _log.info("%d logical tasks on %d task slots: %s", n, len(groups), groups)

    def task(j: int) -> list[dict[str, Any]]:
        from controlmsg.kafka.settings import worker_logging

        worker_logging()
        if stop is None:
            return _run_group(groups[j], body, _never, stall_limit_s)
        watch = stop.watch()
        try:
            return _run_group(groups[j], body, watch, stall_limit_s)
        finally:
            watch.close()

    sc = spark.sparkContext
    group = f"controlmsg-long-running-{uuid.uuid4().hex[:8]}"
    sc.setJobGroup(group, f"{n} long-running tasks on {len(groups)} task slots", interruptOnCancel=True)
    rdd = sc.parallelize(range(len(groups)), len(groups))

    def in_task_order(per_slot: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
        found = {i: summary for indices, got in zip(groups, per_slot, strict=True)
                 for i, summary in zip(indices, got, strict=True)}
        return [found[i] for i in range(n)]

    stopper = installed()
    if stopper is None or stop is None:
        return in_task_order(rdd.map(task).collect())
    return _collect_stopping(lambda: in_task_order(rdd.map(task).collect()), stopper, stop,
                             lambda: sc.cancelJobGroup(group), transactional_ids)


class _StopRelay:
    """The driver's side of a graceful stop while the tasks run (:meth:`run`, in a thread of its own):
    signal -> stop record -> (after the grace) cancellation through ``cancel``. It returns once ``done``
    is set without a signal. ``cancelled``: it cancelled the tasks; ``unwritten``: why the stop record
    could not be written (then it cancelled them at once)."""

    def __init__(self, stopper: Stopper, stop: StopChannel, cancel: Callable[[], None]) -> None:
        self.stopper = stopper
        self.stop = stop
        self.cancel = cancel
        self.done = threading.Event()
        self.cancelled = threading.Event()
        self.unwritten: list[str] = []

    def run(self) -> None:
        while not self.stopper.requested.wait(0.1):
            if self.done.is_set():
                return
        started = time.monotonic()
        try:
            self.stop.request(STOP_GRACE_S)
        except Exception as exc:
            # The tasks learn of a stop from this record only: without it none can reach a commit by itself.
            self.unwritten.append(str(exc))
            _log.error("could not write the stop record (%s): the tasks cannot stop at a commit; cancelling them "
                       "now, in the middle of their transactions", exc)
            self.cancelled.set()
            self.cancel()
            return
        if not self.done.wait(max(0.0, STOP_GRACE_S - (time.monotonic() - started))):
            _log.warning("tasks still running %g s after the stop request: cancelling them, in the middle of their "
                         "transactions", STOP_GRACE_S)
            self.cancelled.set()
            self.cancel()


def _collect_stopping(collect: Callable[[], list[dict[str, Any]]], stopper: Stopper, stop: StopChannel,
                      cancel: Callable[[], None], transactional_ids: Sequence[str]) -> list[dict[str, Any]]:
    """``collect()`` (the tasks' summaries) with the process's signals deferred to a :class:`_StopRelay`:
    the graceful stop of :func:`run_long_running_tasks`, whose docstring says what it raises."""
    relay = _StopRelay(stopper, stop, cancel)
    with stopper.deferring():
        thread = threading.Thread(target=relay.run, name="stop-relay", daemon=True)
        thread.start()
        try:
            summaries = collect()
        except Exception as exc:
            if stopper.signum is None:
                raise
            fenced = _fence_cancelled(stop.config, transactional_ids) if relay.cancelled.is_set() else ""
            if relay.unwritten:
                raise StopFailed(f"stopped by {signal_name(stopper.signum)}, but the stop record could not be "
                                 f"written ({relay.unwritten[0]}): the tasks were cancelled before they reached a "
                                 f"commit; {fenced or 'no transactional ids to fence were given'}") from exc
            detail = "tasks cancelled before they reached a commit" + (f"; {fenced}" if fenced else "")
            raise StopRequested(stopper.signum, detail) from exc
        finally:
            relay.done.set()
    if stopper.signum is not None and not all(s.get("ended") for s in summaries):
        raise StopRequested(stopper.signum, "every task committed and returned", summaries)
    return summaries


FENCE_BUDGET_S: Final = 5.0
"""How long fencing the cancelled tasks' transactional ids may take in all: within the job's hard limit
(:data:`~controlmsg.streaming.stopping.HARD_LIMIT_S`) after the grace and the cancellation."""


def _fence_cancelled(config: Mapping[str, Any], transactional_ids: Sequence[str],
                     budget_s: float = FENCE_BUDGET_S) -> str:
    """Fence ``transactional_ids`` after their tasks were cancelled (``init_transactions`` as a new producer
    of each: the coordinator aborts the open transaction at once, and a task still running cannot commit).
    Logs and returns one line: the ids fenced, and those that could not be (with the reason) and whose open
    transactions, if any, hold ``read_committed`` readers back until the next start fences them or their
    ``transaction.timeout.ms`` passes. Never raises: the stop is what is being reported."""
    from controlmsg.kafka.writer import fence_transactions

    if not transactional_ids:
        return ""
    deadline = time.monotonic() + budget_s
    fenced: list[str] = []
    failed: list[str] = []
    for tid in transactional_ids:
        left = deadline - time.monotonic()
        if left <= 0.5:
            failed.append(f"{tid!r} (no time left)")
            continue
        try:
            fence_transactions(config, [tid], timeout=left)
            fenced.append(tid)
        except Exception as exc:  # named in the line below; the stop goes on
            failed.append(f"{tid!r} ({exc})")
    line = f"fenced the cancelled tasks' transactional ids {fenced} (their open transactions are aborted)"
    if failed:
        line += (f"; could NOT fence {', '.join(failed)}: an open transaction of these holds read_committed readers "
                 "back until the next start with the same --run-id fences it or its transaction.timeout.ms passes")
        _log.error("%s", line)
    else:
        _log.warning("%s", line)
    return line
