"""The run-control API of a ``controlmsg`` write (:mod:`controlmsg.spark.writing`): what the driver has
committed for its run (:func:`run_status`), the end of a stream by hand (:func:`end_stream`), and who the
run's one upstream task is (:func:`upstream_of`), which the driver's commits and the driver program's stage
rounds (:mod:`controlmsg.spark.stage`) write as. Imports no pyspark."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from controlmsg.core.messages import EndOfStreamMessage
from controlmsg.core.naming import driver_task_name, driver_transactional_id, stage_transactional_id
from controlmsg.errors import ControlMsgError
from controlmsg.kafka.markers import MarkerStore, Round, write_control_round
from controlmsg.spark.options import STAGE_PROGRESS_DRIVER, WriteOptions

__all__ = ["FOLLOWED_RUN", "FOLLOWER_SEEN", "UPSTREAM_DRIVER", "await_follower", "end_stream", "follower_seen",
           "next_follower_seen", "refuse_ended", "run_status", "upstream_of"]

UPSTREAM_DRIVER: Final = "driver"
"""The driver's marker says ``"upstream": "driver"``: the driver is the run's one upstream task."""
FOLLOWED_RUN: Final = "followedRun"
"""With ``stageProgress driver``: in the stage marker, the query run that a driver program's follower claimed
(:func:`controlmsg.spark.stage.claim_stage`); in the sink's marker, the run whose claim the sink has seen."""
FOLLOWER_SEEN: Final = "followerSeen"
"""With ``stageProgress driver``, in the sink's marker: ``[query run, micro-batch, epoch ms]``, the last stage
round's micro-batch the sink has seen its follower write, and since when (:func:`next_follower_seen`)."""
_CLAIM_POLL_S: Final = 0.5


def await_follower(opts: WriteOptions, query_run: str) -> None:
    """Wait, up to the option ``timeout``, until the stage marker says a follower claimed the query run
    ``query_run``; raise :class:`~controlmsg.errors.ControlMsgError` in one line when none did. The sink's
    first commit with records of each run calls it with ``stageProgress driver``: without a follower nothing
    would write the stage's watermark or end of stream, and the query would end as if all were well."""
    import time

    deadline = time.monotonic() + opts.timeout
    with MarkerStore(dict(opts.config), stage_transactional_id(opts.topic, opts.job, opts.run_id), opts.topic,
                     opts.timeout) as store:
        while True:
            claimed = (store.load() or {}).get(FOLLOWED_RUN)
            if claimed == query_run:
                return
            if time.monotonic() >= deadline:
                break
            time.sleep(_CLAIM_POLL_S)
    raise ControlMsgError(
        f"topic {opts.topic!r} run {opts.run_id!r}: option stageProgress {STAGE_PROGRESS_DRIVER} needs the driver "
        f"program to follow the query: nothing claimed query run {query_run} within {opts.timeout:g} s (timeout), "
        "so nothing would write its watermark or end of stream; wait on it with "
        "controlmsg.spark.await_stage(query, options) (or a StageFollower) instead of awaitTermination()")


def follower_seen(opts: WriteOptions, query_run: str, batch_id: int, seen: Any, now_ms: int) -> list[Any]:
    """:func:`next_follower_seen` with the stage round's micro-batch read from the stage marker (one lookup).
    Called by the sink's commit of micro-batch ``batch_id`` with records, once its run is claimed."""
    with MarkerStore(dict(opts.config), stage_transactional_id(opts.topic, opts.job, opts.run_id), opts.topic,
                     opts.timeout) as store:
        written = int((store.load() or {}).get("batch", -1))
    return next_follower_seen(seen, query_run, written, batch_id, now_ms, opts)


def next_follower_seen(seen: Any, query_run: str, written: int, batch_id: int, now_ms: int,
                       opts: WriteOptions) -> list[Any]:
    """Whether the driver program still follows the query, as the sink's commit of micro-batch ``batch_id``
    (with records) sees it: ``written`` is the micro-batch of the last stage round written (-1: none),
    ``seen`` what the sink's marker kept of it (:data:`FOLLOWER_SEEN`). Returns what to keep now.

    A follower writes the round of each micro-batch after Spark reports its progress, so at the commit of
    micro-batch *n* it can have written *n - 1*; it may skip micro-batches (each round says all there is), but
    while the query commits, it moves. The clock starts again whenever the written round moves, or is *n - 1*,
    or the query run is another (a restart, whose new follower has not written anything yet). Raises
    :class:`~controlmsg.errors.ControlMsgError` in one line when the written round has not moved for the option
    ``timeout`` while the query kept committing: the follower has gone (a Spark Connect client that
    disconnected, a driver program that stopped waiting), and nothing would write the stage's watermark or end
    of stream. Failing the query frees its checkpoint for the driver program started again."""
    fresh = [query_run, written, now_ms]
    if (not isinstance(seen, list) or len(seen) != 3 or seen[0] != query_run or seen[1] != written
            or written >= batch_id - 1):
        return fresh
    since = int(seen[2])
    if now_ms - since <= opts.timeout * 1000:
        return list(seen)
    raise ControlMsgError(
        f"topic {opts.topic!r} run {opts.run_id!r}: option stageProgress {STAGE_PROGRESS_DRIVER}: the driver "
        f"program that follows query run {query_run} has written no stage round after micro-batch {written} for "
        f"{(now_ms - since) / 1000:.0f} s while the query committed up to micro-batch {batch_id} (timeout "
        f"{opts.timeout:g} s): it has gone (a Spark Connect client that disconnected, a program that stopped "
        "waiting), so nothing would write the stage's watermark or end of stream; start the driver program again "
        "(the query resumes from its checkpoint) and wait with controlmsg.spark.await_stage(query, options)")


def refuse_ended(opts: WriteOptions, query: str | None = None) -> dict[str, Any] | None:
    """The driver's committed marker of this run; refuse to write to a run that has ended, unless streaming
    query ``query`` ended it (its micro-batches after the end, which have no rows, write nothing)."""
    marker = run_status(opts)
    if marker is not None and marker.get("ended") and (query is None or marker.get("queryId") != query):
        raise ControlMsgError(
            f"topic {opts.topic!r}: run {opts.run_id!r} of job {opts.job!r} has already ended (its end of stream "
            "is written); write a new run with a new runId")
    return marker


def upstream_of(opts: WriteOptions, committed: Mapping[str, Any] | None) -> tuple[str, int, bool]:
    """The driver's ``taskName``, the generation of its rounds, and whether that generation starts now: the
    committed generation, or the next one when an earlier version of this writer started the run (its
    marker has no ``"upstream": "driver"``: each write task was an upstream task, with its own control
    messages). The driver's transactional id is that writer's too, so its init has fenced those rounds."""
    generation = 0 if committed is None else int(committed.get("generation", 0))
    switch = committed is not None and committed.get("upstream") != UPSTREAM_DRIVER
    return driver_task_name(opts.job, opts.run_id), generation + switch, switch


def end_stream(options: Mapping[str, str]) -> int:
    """End the run that a ``writeStream.format("controlmsg")`` query wrote: its driver's end of stream, to
    every partition, in one transaction. ``options``: the options given to the query (at least ``topic``,
    ``runId``, ``kafka.bootstrap.servers``; ``job`` if set). Call it after the query stopped
    (``awaitTermination()`` of an ``availableNow`` query). Idempotent: a run already ended is left as it
    is. Returns the run's upstream task count (``taskCount``: 1, the driver; a run ended by an earlier
    version of this writer says how many tasks it had). Raises :class:`~controlmsg.errors.ControlMsgError`
    when nothing of the run was committed yet (options that name no run: a typo is not ended silently)."""
    from controlmsg.kafka.admin import wait_for_topic

    opts = WriteOptions.parse(options)
    if (run_status(opts) or {}).get("endedBy") == "stage":
        return 1  # ended by the driver program's stage round (stageProgress driver)
    config = dict(opts.config)
    partitions = wait_for_topic(config, opts.topic, opts.timeout)
    counted: list[int] = []

    def plan(committed: dict[str, Any] | None) -> Round | None:
        if committed is None:
            raise ControlMsgError(f"topic {opts.topic!r}: no micro-batch of run {opts.run_id!r} (job {opts.job!r}) "
                                  "was committed, so there is no stream to end")
        if committed.get("ended"):
            counted.append(int(committed["taskCount"]))
            return None
        name, generation, _ = upstream_of(opts, committed)
        counted.append(1)
        return ([EndOfStreamMessage(name, 1, opts.run_id, generation=generation)],
                {**committed, "upstream": UPSTREAM_DRIVER, "taskCount": 1, "generation": generation, "ended": True})

    write_control_round(config, opts.topic, partitions, plan,
                        transactional_id=driver_transactional_id(opts.topic, opts.job, opts.run_id),
                        timeout=opts.timeout)
    return counted[0]


def run_status(options: WriteOptions | Mapping[str, str]) -> dict[str, Any] | None:
    """What the driver of a ``controlmsg`` write has committed for its run: ``None`` before the first
    commit, else ``{"upstream": "driver", "taskCount": 1, "generation", "ended", "writeTasks", ...}``
    (``taskCount`` the run's upstream tasks on the wire, the driver alone; ``writeTasks`` the Spark tasks
    that wrote records: of the write, or of the last micro-batch; a batch write adds ``rows`` and
    ``maxEventTime``; a stream the last ``batch``, its ``watermark``, ``queryId`` and ``maxEventTime``). With
    ``stageProgress driver`` in ``options``, a run that the driver program's stage round ended
    (:mod:`controlmsg.spark.stage`) says ``"ended": true, "endedBy": "stage"``."""
    opts = options if isinstance(options, WriteOptions) else WriteOptions.parse(options)
    group = driver_transactional_id(opts.topic, opts.job, opts.run_id)
    with MarkerStore(dict(opts.config), group, opts.topic, opts.timeout) as store:
        marker = store.load()
    if marker is not None and not marker.get("ended") and opts.stage_progress == STAGE_PROGRESS_DRIVER:
        # The stage rounds of a driver program (controlmsg.spark.stage) may have ended the run.
        with MarkerStore(dict(opts.config), stage_transactional_id(opts.topic, opts.job, opts.run_id), opts.topic,
                         opts.timeout) as store:
            stage = store.load()
        if stage is not None and stage.get("ended"):
            marker = {**marker, "ended": True, "endedBy": "stage"}
    return marker
