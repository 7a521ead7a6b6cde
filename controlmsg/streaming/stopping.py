"""Graceful stop of the streaming jobs (and of the pipeline that runs them): SIGTERM and SIGINT.

The contract (docs/STREAMING.md, "Running the streaming chain" and "Stopping"):

* On the first SIGTERM or SIGINT a job stops at a commit: each long-running task commits what it has
  read (a transaction holding its output, its watermark and its input offsets or state), or, if it
  cannot get there in time, its open transaction is aborted; nothing partial ever becomes readable to
  ``read_committed`` readers. The job then exits with :func:`exit_code` (128 + the signal: 143 for
  SIGTERM, 130 for SIGINT, as a shell reports a process the signal ended). A job whose input had
  already ended when the signal came exits 0 as usual. A restart with the same ``--run-id`` resumes at
  the last commit, so nothing is lost or doubled.
* A second signal stops at once (the tasks are cancelled, as a ``kill`` would; still nothing partial).
* Bounds: tasks that have not returned :data:`STOP_GRACE_S` after the stop request are cancelled and
  their transactional ids fenced (which aborts their open transactions; the stop names them), and the
  process exits :data:`HARD_LIMIT_S` after the first signal whatever it was doing.
* A stop record that cannot be written is not a clean stop: the tasks are cancelled and fenced at once
  and the job fails with :class:`StopFailed` (exit 1), naming the stop topic and the reason.

How the stop reaches the tasks: the driver (the job's own process) receives the signal; its tasks run
in Python workers, possibly on other machines, and already talk to Kafka, so the driver writes a stop
record to the job's *stop topic* (:class:`StopChannel`, one partition, ``<output topic>-stop``) and each
task reads it between commits (:class:`StopWatch`, polled without waiting on every turn of its loop).
A record only stops the application that wrote it: it carries a token made at start, and tasks read
from the topic's end offset taken before they started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Final

from controlmsg.errors import ControlMsgError

__all__ = [
    "HARD_LIMIT_S",
    "STOP_GRACE_S",
    "StopChannel",
    "StopFailed",
    "StopRequested",
    "StopWatch",
    "Stopper",
    "exit_code",
    "installed",
    "signal_name",
    "watch_parent",
]

STOP_GRACE_S: Final = 5.0
"""Seconds the tasks of a job have, after the stop request, to commit and return before they are cancelled."""
HARD_LIMIT_S: Final = 15.0
"""Seconds after the first signal at which a job's process exits, whatever it was doing."""
STOP_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT)

_installed: Stopper | None = None


def exit_code(signum: int) -> int:
    """The exit code of a process stopped by ``signum``: 128 + signum (143 SIGTERM, 130 SIGINT)."""
    return 128 + signum


def signal_name(signum: int) -> str:
    """``"SIGTERM"`` for 15, and so on."""
    return signal.Signals(signum).name


class StopRequested(BaseException):
    """Raised in the main thread of a job that was asked to stop (a ``BaseException``, like
    ``KeyboardInterrupt``: it passes through ``except Exception``). ``signum`` is the signal,
    ``summaries`` what the tasks returned when they stopped at a commit (empty otherwise)."""

    def __init__(self, signum: int, detail: str = "", summaries: list[dict[str, Any]] | None = None) -> None:
        super().__init__(f"stopped by {signal_name(signum)}" + (f": {detail}" if detail else ""))
        self.signum = signum
        self.summaries = summaries or []


class StopFailed(ControlMsgError):
    """A stop was asked for, but the job could not stop at a commit: its stop record could not be written, so
    its tasks could not hear of the stop and were cancelled in the middle of their work. The message names
    the stop topic, the reason, and what became of the cancelled tasks' open transactions (fenced, i.e.
    aborted, or left open naming their ids). A job exits 1 on it, not 128 + the signal: not a clean stop.
    A restart with the same ``--run-id`` still resumes at the last commit."""


class Stopper:
    """A process's SIGTERM and SIGINT handling (:meth:`install`, main thread only).

    The first signal sets :attr:`requested` and starts the hard limit (:data:`HARD_LIMIT_S`, then
    ``os._exit(exit_code(signum))``). Inside :meth:`deferring` that is all it does: the code there polls
    :meth:`is_set` and stops at its next commit. Outside it, the handler also raises
    :class:`StopRequested` in the main thread (the job is then starting or ending: nothing to commit).
    A second signal always raises."""

    def __init__(self, name: str, hard_limit_s: float = HARD_LIMIT_S) -> None:
        self.name = name
        self.hard_limit_s = hard_limit_s
        self.requested = threading.Event()
        self.signum: int | None = None
        self._deferring = 0
        self._previous: dict[int, Any] = {}

    def install(self) -> Stopper:
        """Handle SIGTERM and SIGINT from now on (again after PySpark replaced the SIGINT handler)."""
        global _installed
        for signum in STOP_SIGNALS:
            previous = signal.signal(signum, self._handle)
            if previous != self._handle:
                self._previous.setdefault(signum, previous)
        _installed = self
        return self

    def uninstall(self) -> None:
        """Give SIGTERM and SIGINT back to the handlers they had before the first :meth:`install`."""
        global _installed
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()
        if _installed is self:
            _installed = None

    def is_set(self) -> bool:
        return self.requested.is_set()

    def raise_if_set(self, detail: str = "") -> None:
        if self.signum is not None:
            raise StopRequested(self.signum, detail)

    @contextlib.contextmanager
    def deferring(self) -> Iterator[None]:
        """A stretch of work that stops by itself at a commit once :meth:`is_set`: a first signal inside
        it does not raise. Raises :class:`StopRequested` on entry when a stop was already requested."""
        self.raise_if_set()
        self._deferring += 1
        try:
            yield
        finally:
            self._deferring -= 1

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:
            raise StopRequested(self.signum, f"second signal ({signal_name(signum)}): stopping at once")
        self.signum = signum
        self.requested.set()
        print(f"{time.strftime('%H:%M:%S')} {self.name}: {signal_name(signum)}: stopping at the next commit "
              f"(again to stop at once)", file=sys.stderr, flush=True)
        threading.Thread(target=self._hard_limit, args=(signum,), name="stop-hard-limit", daemon=True).start()
        if not self._deferring:
            raise StopRequested(signum)

    def _hard_limit(self, signum: int) -> None:
        time.sleep(self.hard_limit_s)
        print(f"{self.name}: not stopped {self.hard_limit_s:g} s after {signal_name(signum)}: exiting now "
              "(an open transaction is aborted by the restart)", file=sys.stderr, flush=True)
        os._exit(exit_code(signum))


def installed() -> Stopper | None:
    """The process's :class:`Stopper`, once one was installed (``None`` in tests that call a job's work
    directly)."""
    return _installed


def watch_parent(parent_pid: int, interval_s: float = 0.5) -> threading.Thread:
    """Send this process SIGTERM once ``parent_pid`` is no longer its parent (the parent died, even by
    ``kill -9``, and the process was adopted): a job started by the pipeline does not outlive it. Checks
    every ``interval_s`` in a daemon thread, which it returns."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(interval_s)
        print(f"{time.strftime('%H:%M:%S')} parent process {parent_pid} is gone: stopping", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=watch, name="watch-parent", daemon=True)
    thread.start()
    return thread


@dataclass(frozen=True)
class StopChannel:
    """The stop requests of one application of a job, through Kafka (picklable, sent to the tasks).

    :meth:`open` (driver, before the tasks start) creates the topic and takes its end offset;
    :meth:`request` (driver) writes the token; :meth:`watch` (task) reads from that offset."""

    config: Mapping[str, Any]
    topic: str
    start: int
    token: str = field(default_factory=lambda: uuid.uuid4().hex)

    @classmethod
    def open(cls, config: Mapping[str, Any], topic: str, *, replication_factor: int = -1,
             topic_config: Mapping[str, str] | None = None) -> StopChannel:
        """Create ``topic`` (one partition) if needed and return a channel whose requests are the records
        written to it from now on. Raises the admin errors (``TopicError``, ``BrokerError``)."""
        from controlmsg.kafka.admin import create_topic, end_offsets

        create_topic(config, topic, 1, replication_factor=replication_factor, topic_config=topic_config)
        return cls(dict(config), topic, end_offsets(config, topic)[0])

    def request(self, timeout_s: float = 5.0) -> None:
        """Write the stop record and wait until it is acknowledged (at most ``timeout_s``). Raises
        :class:`~controlmsg.errors.DeliveryError` naming the topic and the reason when it was not: still
        unacknowledged after ``timeout_s``, or refused by the cluster (a delivery report with an error)."""
        from confluent_kafka import KafkaError, KafkaException, Producer

        from controlmsg.errors import DeliveryError
        from controlmsg.kafka.settings import for_client

        refused: list[str] = []

        def delivered(err: KafkaError | None, msg: object) -> None:
            if err is not None:
                refused.append(err.str())

        conf = {k: v for k, v in for_client(self.config, "producer").items() if k not in ("transactional.id",
                                                                                          "on_delivery")}
        conf["message.timeout.ms"] = max(1, int(timeout_s * 1000))  # a refusal reported within the wait
        try:
            producer = Producer(conf)
            producer.produce(self.topic, self.token.encode(), partition=0, on_delivery=delivered)
            left = producer.flush(timeout_s)
        except KafkaException as exc:
            raise DeliveryError(f"the stop record for topic {self.topic!r} partition 0 could not be produced: "
                                f"{exc.args[0]}") from exc
        if refused:
            raise DeliveryError(f"the stop record for topic {self.topic!r} partition 0 was refused: {refused[0]}")
        if left:
            raise DeliveryError(f"the stop record for topic {self.topic!r} partition 0 was not acknowledged in "
                                f"{timeout_s:g} s")

    def watch(self) -> StopWatch:
        """A task's view: a callable that is true once this application's stop record is readable."""
        return StopWatch(self)


class StopWatch:
    """``watch()`` is true once the stop record of its :class:`StopChannel` was read (and stays true).
    Never waits: each call takes what the consumer has fetched in the background. Consumer errors
    count as "no stop" (a task must not fail because its stop channel did; the driver then cancels it
    after :data:`STOP_GRACE_S`). :meth:`close` leaves the topic."""

    def __init__(self, channel: StopChannel) -> None:
        self.channel = channel
        self._stopped = False
        self._consumer: Any = None

    def __call__(self) -> bool:
        if self._stopped:
            return True
        if self._consumer is None:
            from confluent_kafka import Consumer, TopicPartition

            from controlmsg.kafka.settings import for_client

            self._consumer = Consumer({**for_client(self.channel.config, "consumer"),
                                       "group.id": f"controlmsg-stop-{uuid.uuid4().hex}",
                                       "enable.auto.commit": False, "fetch.wait.max.ms": 100})
            self._consumer.assign([TopicPartition(self.channel.topic, 0, self.channel.start)])
        token = self.channel.token.encode()
        self._stopped = any(m.error() is None and m.value() == token for m in self._consumer.consume(100, 0))
        return self._stopped

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
