"""What a run left behind, whether it is still live, and deleting it: the library of ``controlmsg cleanup``.

**What belongs to run R** (:func:`find_run`), by the naming rules of :mod:`controlmsg.core.naming`:

- *topics*: those of :func:`~controlmsg.core.naming.run_topics` that exist: the pipeline's
  ``controlmsg-R-events`` and ``controlmsg-R-windows``, the streaming jobs' ``-rejects``, ``-stop``, ``-late``
  and ``-state`` beside them, the demo's ``controlmsg-demo-R``. Topics named by hand (``--state-topic``, a
  data source ``topic``) are not found: they need not be the run's alone;
- *consumer groups* (:func:`~controlmsg.core.naming.is_run_group`): the commit markers of the run's
  writers (``controlmsg-<topic>-<job>-R-p<i>``, ``...-R-driver``) and the streaming ingest's source group
  (``controlmsg-<topic>-ingest-R-source``), found even when their topic is already gone;
- *local files*: the run directory ``<runs dir>/R`` (logs, summaries, and while the pipeline runs its
  ``kafka.properties``).

Not deleted, because Kafka cannot or the user owns them: the transactional ids of the run's writers (the
same names as their marker groups; the broker expires an id ``transactional.id.expiration.ms``, 7 days by
default, after its last transaction), the input and output files, the streaming sink's checkpoint beside
its output, the source topic of a streaming run.

**Live** (:func:`live_signs`): cleanup deletes nothing while any of these holds, and no option overrides it:

1. a consumer group of the run has members (a task or reader is in it right now);
2. a partition of one of the run's topics has an open transaction: its last stable offset (the end a
   ``read_committed`` reader sees) is behind its end offset, so a writer of the run is between
   ``begin`` and ``commit``. A writer killed mid-transaction counts until the coordinator aborts its
   transaction (``transaction.timeout.ms``) or the next attempt fences it;
3. a process on this machine (Linux ``/proc``) whose command line carries ``--run-id R``: the pipeline
   started with ``--run-id``, each of its jobs (the pipeline passes it to every one), a ``controlmsg
   consume --run-id R``.

**Ended** (:func:`unended`): every topic of the run that carries control messages (``-events``,
``-windows``, the demo topic) has, per :func:`~controlmsg.kafka.inspect.inspect_topic`, the end of stream
of every task of the run on every partition. A run that is not live but has not ended was stopped or
failed, and the same command with its run id would resume it; deleting it loses that, so the caller
refuses it unless told to go on (``--force``).
"""

from __future__ import annotations

import itertools
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

from confluent_kafka import ConsumerGroupState, IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from controlmsg.core.naming import is_run_group, run_topics
from controlmsg.errors import ControlMsgError, TopicError
from controlmsg.kafka.retry import retrying
from controlmsg.kafka.settings import for_client

__all__ = ["DEFAULT_RUNS_DIR", "CleanupError", "RunGroup", "RunResources", "RunTopic", "delete_run", "describe_run",
           "find_run", "live_signs", "process_signs", "unended"]

DEFAULT_RUNS_DIR: Final = Path(".controlmsg") / "runs"
"""Where the pipeline and the jobs keep a run's logs and summaries (``<dir>/<run id>``), relative to the
directory they were started in."""

_ACTIVE_STATES: Final = frozenset({ConsumerGroupState.STABLE.name, ConsumerGroupState.PREPARING_REBALANCING.name,
                                   ConsumerGroupState.COMPLETING_REBALANCING.name})

T = TypeVar("T")


class CleanupError(ControlMsgError):
    """Something of the run could not be listed or deleted; the message names it."""


@dataclass(frozen=True)
class RunTopic:
    name: str
    partitions: int


@dataclass(frozen=True)
class RunGroup:
    name: str
    state: str
    """The group's state as the broker reports it (``EMPTY``, ``STABLE``, ...)."""
    members: int


@dataclass(frozen=True)
class RunResources:
    """What :func:`find_run` found of one run; each tuple sorted by name."""

    run_id: str
    topics: tuple[RunTopic, ...]
    groups: tuple[RunGroup, ...]
    files: tuple[Path, ...]

    @property
    def empty(self) -> bool:
        return not (self.topics or self.groups or self.files)


def _admin(config: Mapping[str, Any]) -> AdminClient:
    return AdminClient(for_client(config, "admin"))


def _asking(what: str, call: Callable[[], T], timeout: float) -> T:
    """``call()`` retried while Kafka's answer is retriable (:func:`~controlmsg.kafka.retry.retrying`);
    any other Kafka error becomes a :class:`CleanupError` naming ``what``."""
    try:
        return retrying(call, timeout=timeout)
    except KafkaException as exc:
        error = exc.args[0]
        detail = error.str() if isinstance(error, KafkaError) else exc
        raise CleanupError(f"cannot {what}: {detail}") from exc


def find_run(config: Mapping[str, Any], run_id: str, *, runs_dir: Path = DEFAULT_RUNS_DIR,
             timeout: float = 30.0) -> RunResources:
    """List what belongs to run ``run_id`` (see the module docstring): its topics with their partition
    counts, its consumer groups with their state and members, its run directory under ``runs_dir``.
    Changes nothing. Blocks up to about ``timeout`` s per request; raises :class:`CleanupError`, or
    ``ValueError`` for an empty run id or one that is not a single path component."""
    if not run_id or run_id in (".", "..") or "/" in run_id or os.sep in run_id:
        raise ValueError(f"not a run id: {run_id!r}")
    admin = _admin(config)
    wanted = set(run_topics(run_id))
    metadata = _asking("list the cluster's topics", lambda: admin.list_topics(timeout=min(timeout, 10.0)), timeout)
    topics = tuple(RunTopic(name, len(t.partitions)) for name, t in sorted(metadata.topics.items())
                   if name in wanted and t.error is None)

    def list_groups() -> list[str]:
        listing = admin.list_consumer_groups(request_timeout=min(timeout, 10.0)).result()
        if listing.errors:
            raise KafkaException(listing.errors[0])
        return sorted(g.group_id for g in listing.valid if is_run_group(g.group_id, run_id))

    names = _asking("list the cluster's consumer groups", list_groups, timeout)
    groups = tuple(_describe_groups(admin, names, timeout))
    run_dir = runs_dir / run_id
    files = (run_dir,) if run_dir.exists() else ()
    return RunResources(run_id, topics, groups, files)


def _describe_groups(admin: AdminClient, names: Sequence[str], timeout: float) -> list[RunGroup]:
    if not names:
        return []

    def describe() -> list[RunGroup]:
        futures = admin.describe_consumer_groups(list(names), request_timeout=min(timeout, 10.0))
        found = []
        for name in names:
            try:
                d = futures[name].result()
            except KafkaException as exc:
                if exc.args[0].code() == KafkaError.GROUP_ID_NOT_FOUND:  # deleted since it was listed
                    continue
                raise
            state = d.state.name if isinstance(d.state, ConsumerGroupState) else str(d.state)
            found.append(RunGroup(name, state, len(d.members)))
        return found

    return _asking("describe the run's consumer groups", describe, timeout)


def live_signs(config: Mapping[str, Any], found: RunResources, *, timeout: float = 30.0,
               processes: bool = True) -> list[str]:
    """Why run ``found.run_id`` is live, one phrase per sign (the rules in the module docstring): its
    consumer groups with members, its topics' partitions with an open transaction, and with ``processes``
    the processes on this machine whose command line names the run. Empty: not live. Raises
    :class:`CleanupError` when Kafka cannot be asked."""
    signs = [f"consumer group {g.name} has {g.members} active member(s) (state {g.state})"
             for g in found.groups if g.members or g.state in _ACTIVE_STATES]
    signs += _open_transactions(config, found.topics, timeout)
    if processes:
        signs += process_signs(found.run_id)
    return signs


def _open_transactions(config: Mapping[str, Any], topics: Sequence[RunTopic], timeout: float) -> list[str]:
    if not topics:
        return []
    admin = _admin(config)
    partitions = [TopicPartition(t.name, p) for t in topics for p in range(t.partitions)]

    def ends(level: IsolationLevel) -> dict[tuple[str, int], int]:
        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        futures = admin.list_offsets({tp: latest for tp in partitions}, isolation_level=level,
                                     request_timeout=min(timeout, 10.0))
        return {(tp.topic, tp.partition): int(f.result().offset) for tp, f in futures.items()}

    stable = _asking("list the end offsets of the run's topics",
                     lambda: ends(IsolationLevel.READ_COMMITTED), timeout)
    end = _asking("list the end offsets of the run's topics",
                  lambda: ends(IsolationLevel.READ_UNCOMMITTED), timeout)
    return [f"topic {topic} partition {p} has an open transaction (last stable offset {stable[topic, p]}, end "
            f"offset {end[topic, p]})" for topic, p in sorted(end) if stable[topic, p] < end[topic, p]]


def process_signs(run_id: str, proc: Path = Path("/proc")) -> list[str]:
    """The processes under ``proc`` (Linux) other than this one and its ancestors whose command line has
    ``--run-id`` ``run_id`` (or ``--run-id=<run_id>``), as ``"process <pid> (<command line>)"``. Empty
    where there is no ``/proc``. Processes on other machines (a cluster's driver) cannot be seen."""
    if not proc.is_dir():
        return []
    mine = _ancestors(proc)
    signs = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        args = [a.decode(errors="replace") for a in argv if a]
        if f"--run-id={run_id}" in args or any(pair == ("--run-id", run_id) for pair in itertools.pairwise(args)):
            line = " ".join(args)
            signs.append(f"process {entry.name} ({line[:120]}{'...' if len(line) > 120 else ''})")
    return sorted(signs, key=lambda s: int(s.split()[1]))


def _ancestors(proc: Path) -> set[int]:
    """This process and its ancestors: the cleanup command itself, and a shell or test that started it."""
    found = set()
    pid = os.getpid()
    while pid > 0 and pid not in found:
        found.add(pid)
        try:
            stat = (proc / str(pid) / "stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # the field after the state; the name may hold spaces
    return found


def unended(config: Mapping[str, Any], found: RunResources, *, timeout: float = 120.0) -> list[str]:
    """The run's control topics (:func:`~controlmsg.core.naming.run_topics` ``control_only``) that exist
    and where the run has not reached end of stream, one phrase each: which partitions still wait, or that
    the topic holds no control message of the run. Reads each of them to its current end, as ``controlmsg
    inspect`` does (a topic of millions of records takes seconds). Raises :class:`ReadError` / ``TopicError``
    as :func:`~controlmsg.kafka.inspect.inspect_topic` does."""
    from controlmsg.kafka.inspect import inspect_topic

    carry = set(run_topics(found.run_id, control_only=True))
    problems = []
    for topic in found.topics:
        if topic.name not in carry:
            continue
        report = inspect_topic(config, topic.name, found.run_id, timeout=timeout)
        run = report.runs.get(found.run_id)
        if run is None:
            problems.append(f"topic {topic.name} holds no control message of run {found.run_id}")
            continue
        waiting = [s.partition for s in run.partitions if not s.is_ended]
        if waiting:
            problems.append(f"topic {topic.name} partition(s) {', '.join(map(str, waiting))} have not reached end "
                            f"of stream")
    return problems


def _results(futures: Mapping[str, Any], kind: str, gone: int) -> None:
    """Wait for each deletion; one of something already gone (error ``gone``) counts as done, any other
    error is raised naming the ``kind`` and name."""
    for name, future in futures.items():
        try:
            future.result()
        except KafkaException as exc:
            if exc.args[0].code() != gone:
                raise KafkaException(KafkaError(exc.args[0].code(), f"{kind} {name}: {exc.args[0].str()}")) from exc


def delete_run(config: Mapping[str, Any], found: RunResources, *, timeout: float = 60.0) -> None:
    """Delete what :func:`find_run` found: the consumer groups, then the topics (waiting until the cluster
    no longer lists them), then the local files. Checks nothing: call :func:`live_signs` first. Something
    already gone counts as deleted. Blocks up to about ``timeout`` s per step; raises :class:`CleanupError`
    naming what could not be deleted (a group that has gained a member since: ``NON_EMPTY_GROUP``)."""
    admin = _admin(config)
    if found.groups:
        def delete_groups() -> None:
            _results(admin.delete_consumer_groups([g.name for g in found.groups], request_timeout=min(timeout, 10.0)),
                     "group", KafkaError.GROUP_ID_NOT_FOUND)

        _asking("delete the run's consumer groups", delete_groups, timeout)
    if found.topics:
        names = [t.name for t in found.topics]

        def delete_topics() -> None:
            futures = admin.delete_topics(names, operation_timeout=min(timeout, 10.0),
                                          request_timeout=min(timeout, 15.0))
            _results(futures, "topic", KafkaError.UNKNOWN_TOPIC_OR_PART)

        _asking("delete the run's topics", delete_topics, timeout)
        _wait_until_gone(admin, names, timeout)
    for path in found.files:
        try:
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink(missing_ok=True)
        except OSError as exc:
            raise CleanupError(f"cannot delete {path}: {exc}") from exc


def _wait_until_gone(admin: AdminClient, topics: Sequence[str], timeout: float) -> None:
    """Block until no broker's metadata lists ``topics`` (a delete is acknowledged by the controller first)."""
    deadline = time.monotonic() + timeout
    while True:
        listed = _asking("list the cluster's topics", lambda: admin.list_topics(timeout=10.0), timeout).topics
        left = sorted(t for t in topics if t in listed)
        if not left:
            return
        if time.monotonic() > deadline:
            raise TopicError(f"topics {', '.join(left)} are still listed {timeout:g} s after their deletion")
        time.sleep(0.2)


def describe_run(found: RunResources) -> list[str]:
    """The lines ``controlmsg cleanup`` prints for ``found``: one per topic, group and file."""
    lines = [f"topic {t.name} ({t.partitions} partition{'s' if t.partitions != 1 else ''})" for t in found.topics]
    lines += [f"group {g.name} ({g.state.lower()}{f', {g.members} member(s)' if g.members else ''})"
              for g in found.groups]
    lines += [f"files {path}" for path in found.files]
    return lines

