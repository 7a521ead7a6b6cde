"""Which Kafka errors are worth another try, and a bounded backoff to try again with.

A coordinator that is loading or moving, a leader election, a request or connection that timed out: the
cluster answers these while a broker restarts or a partition moves, and they pass. Everything else
(authorization, an unknown setting, a topic that does not exist) is final and fails at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar

from confluent_kafka import KafkaError, KafkaException, Producer

from controlmsg.kafka.refusals import check_client, mark_reached

__all__ = [
    "PASSING_CONSUMER_ERRORS", "RETRIABLE", "WEDGE_GRACE_S", "ConsumerErrors", "bounded_call", "init_transactions",
    "is_retriable", "retrying", "retrying_transaction",
]

T = TypeVar("T")

RETRIABLE: Final = frozenset({
    KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.LEADER_NOT_AVAILABLE, KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.NOT_CONTROLLER,
    KafkaError.REQUEST_TIMED_OUT, KafkaError.NETWORK_EXCEPTION, KafkaError._TIMED_OUT, KafkaError._TRANSPORT,
    KafkaError._WAIT_COORD, KafkaError._ALL_BROKERS_DOWN, KafkaError.CONCURRENT_TRANSACTIONS,
})


def is_retriable(error: KafkaError) -> bool:
    """Whether ``error`` may pass if asked again: librdkafka says so, or it is one of :data:`RETRIABLE`."""
    return bool(error.retriable()) or error.code() in RETRIABLE


def retrying(call: Callable[[], T], *, timeout: float, first_wait: float = 0.1, max_wait: float = 2.0) -> T:
    """``call()``, again after a retriable :class:`KafkaException`, waiting ``first_wait`` s and doubling up
    to ``max_wait``, until ``timeout`` s have passed; then the last exception propagates. A final error
    propagates at once."""
    deadline = time.monotonic() + timeout
    wait = first_wait
    while True:
        try:
            return call()
        except KafkaException as exc:
            error = exc.args[0]
            if not isinstance(error, KafkaError) or not is_retriable(error) or time.monotonic() + wait > deadline:
                raise
        time.sleep(wait)
        wait = min(wait * 2, max_wait)


WEDGE_GRACE_S: Final = 30.0
"""How long past its own timeout a librdkafka transaction call may go on before :func:`bounded_call` counts
it as wedged. A call that honours its timeout returns within it (a commit's flush included)."""


def bounded_call(call: Callable[[float], T], timeout: float, *, what: str, grace: float | None = None) -> T:
    """``call(timeout)``, on a thread of its own, waited for at most ``timeout`` + ``grace`` s (default
    :data:`WEDGE_GRACE_S`); its value is returned and its exception raised, as if called here.

    A call still running then is wedged: librdkafka's ``send_offsets_to_transaction`` can block past its
    timeout, for good, once the group coordinator went away during the call (confluentinc/librdkafka#5456,
    seen here after a ``kill -9`` and restart of the only broker: a Spark write task waited 10 minutes).
    Python cannot interrupt a C call, so the call is left blocked on its daemon thread, and a
    :class:`KafkaException` whose error is fatal (``_TIMED_OUT``, naming ``what`` and the wait) is raised:
    the producer is unusable from then on. The caller fails as on any fatal error: the writers abort or fence
    the transactional id (:func:`~controlmsg.kafka.aborts.abort_or_fence`, a new producer of the same id
    whose ``init_transactions`` aborts the open transaction), and a Spark task is retried from its
    transactional start."""
    outcome: list[tuple[bool, Any]] = []
    done = threading.Event()

    def run() -> None:
        try:
            outcome.append((True, call(timeout)))
        except BaseException as exc:
            outcome.append((False, exc))
        finally:
            done.set()

    threading.Thread(target=run, name=f"controlmsg {what}", daemon=True).start()
    bound = timeout + (WEDGE_GRACE_S if grace is None else grace)
    if not done.wait(bound):
        raise KafkaException(KafkaError(
            KafkaError._TIMED_OUT,
            f"{what} did not return within {bound:.0f} s (its timeout {timeout:.0f} s): librdkafka's call is "
            f"wedged (confluentinc/librdkafka#5456), the producer is abandoned", fatal=True))
    ok, value = outcome[0]
    if ok:
        return value  # type: ignore[no-any-return]
    raise value


def retrying_transaction(call: Callable[[float], T], *, timeout: float, what: str = "transaction call") -> T:
    """A call of librdkafka's transactional API (``init_transactions``, ``commit_transaction``,
    ``send_offsets_to_transaction``, ``abort_transaction``), given the time left, retried while librdkafka
    marks its error retriable (a coordinator that moves or loads, a timed-out request), for up to
    ``timeout`` s in all, with the backoff of :func:`retrying`. Each call is a :func:`bounded_call` named
    ``what``: a call wedged past its timeout raises a fatal error.

    Only librdkafka's own flag counts here: an error that requires an abort (``txn_requires_abort``) or is
    fatal (a fenced producer, a wedged call) propagates at once, since calling again could not succeed; a
    transaction that must be aborted is the caller's to abort and redo.
    """
    deadline = time.monotonic() + timeout
    wait = 0.1
    while True:
        left = deadline - time.monotonic()
        try:
            return bounded_call(call, max(left, 1.0), what=what)
        except KafkaException as exc:
            error = exc.args[0]
            if (not isinstance(error, KafkaError) or not error.retriable() or error.fatal()
                    or error.txn_requires_abort() or time.monotonic() + wait > deadline):
                raise
        time.sleep(wait)
        wait = min(wait * 2, 2.0)


_INIT_SLICE_S: Final = 3.0


def init_transactions(producer: Producer, conf: Mapping[str, Any], *, timeout: float) -> None:
    """``producer.init_transactions`` (``producer`` made from ``conf``, a
    :func:`~controlmsg.kafka.settings.for_client` result) under :func:`retrying_transaction`, in calls of
    at most 3 s with the producer's callbacks served between them: the call itself serves none, so a
    cluster that refuses the producer (a wrong password) would keep it waiting for ``timeout``; this way
    it raises :class:`~controlmsg.errors.ClusterRefused` within seconds (:mod:`controlmsg.kafka.refusals`).
    A timed-out call resumes the same initialisation (librdkafka: "retry call to resume")."""
    def attempt(left: float) -> None:
        producer.poll(0)
        check_client(conf)
        producer.init_transactions(min(left, _INIT_SLICE_S))

    retrying_transaction(attempt, timeout=timeout, what="init_transactions")
    mark_reached(conf)


PASSING_CONSUMER_ERRORS: Final = frozenset({
    KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.REQUEST_TIMED_OUT, KafkaError.NETWORK_EXCEPTION, KafkaError._TIMED_OUT, KafkaError._TRANSPORT,
    KafkaError._ALL_BROKERS_DOWN, KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.FENCED_LEADER_EPOCH, KafkaError.UNKNOWN_LEADER_EPOCH,
    KafkaError.OFFSET_NOT_AVAILABLE, KafkaError.KAFKA_STORAGE_ERROR,
})
"""Errors a consumer reports while the cluster moves under it, and recovers from by itself (librdkafka
asks again): a partition whose leader does not know it yet (a topic created a moment ago on a cluster,
its metadata still travelling), a leader that died or moved, a broker that cannot be reached."""


class ConsumerErrors:
    """Tells a consumer error that passes from one that lasts, per partition.

    librdkafka delivers some errors as messages (``msg.error()``) and keeps working: an offset lookup that
    found the partition unknown to a leader that had not heard of the new topic yet is asked again. Such
    an error (:data:`PASSING_CONSUMER_ERRORS`, or one librdkafka marks retriable) passes while the
    partition has not kept reporting errors for ``patience_s`` seconds in a row (a gap of ``patience_s``
    without an error starts the count afresh); anything else, and a passing error that outlasts its
    patience, is for the caller to raise. End of partition is not an error here: callers handle it first.
    """

    def __init__(self, patience_s: float = 120.0) -> None:
        self.patience_s = patience_s
        self.passed = 0
        """Errors let pass so far."""
        self._since: dict[int | None, tuple[float, float]] = {}  # partition -> (first, last) error time

    def passes(self, error: KafkaError, partition: int | None) -> bool:
        """Whether ``error`` of ``partition`` passes (then the caller goes on reading). False: raise it."""
        if error.fatal() or not (error.code() in PASSING_CONSUMER_ERRORS or error.retriable()):
            return False
        now = time.monotonic()
        first, last = self._since.get(partition, (now, now))
        if now - last > self.patience_s:
            first = now
        self._since[partition] = (first, now)
        if now - first > self.patience_s:
            return False
        self.passed += 1
        return True
