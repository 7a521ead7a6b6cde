"""Ending a transaction that failed: abort it, or make sure it does not stay open, and say which.

An open transaction holds every ``read_committed`` reader of the partitions it wrote back at its first
record (the last stable offset) until it ends. When a writer gives up on a transaction, the abort is best
effort (the error that made it give up is the one to raise), but a failed abort must not be silent: left
alone, the transaction stays open until its coordinator aborts it at ``transaction.timeout.ms`` (60 s by
default, 600 s for the Spark writes), and every downstream reader waits that long.

:func:`abort_or_fence` therefore, when ``abort_transaction`` fails, **fences** the transactional id: a new
producer with the same ``transactional.id`` calls ``init_transactions``, on which the coordinator bumps
the producer epoch and aborts the open transaction at once (Kafka's zombie fencing); the old producer can
then neither commit nor add to it. This is preferred to closing the old producer and leaving the rest to
the coordinator's timeout because readers move on within seconds instead of after the whole timeout. When
the fence fails too (the cluster cannot be reached), nothing more can be done from here: the line says
which id holds which topic's readers back, and until when at the latest.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any, Final

from confluent_kafka import KafkaError, KafkaException, Producer

from controlmsg.errors import ControlMsgError
from controlmsg.kafka.retry import init_transactions, retrying_transaction

__all__ = ["TRANSACTION_LOGGER", "abort_or_fence"]

TRANSACTION_LOGGER: Final = logging.getLogger("controlmsg.kafka.transactions")
"""Where a transaction that could not be aborted is named (ERROR), and one that was fenced instead (WARNING)."""

_DEFAULT_TRANSACTION_TIMEOUT_MS: Final = 60_000  # librdkafka's transaction.timeout.ms
_FENCED: Final = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH})


def _reason(exc: BaseException) -> str:
    error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    return error.str() if isinstance(error, KafkaError) else str(exc)


def _was_fenced(exc: KafkaException) -> bool:
    error = exc.args[0] if exc.args else None
    return isinstance(error, KafkaError) and error.code() in _FENCED


def abort_or_fence(producer: Producer, conf: Mapping[str, Any], topic: str, *, timeout: float = 10.0) -> bool:
    """Abort ``producer``'s open transaction; never raises (call it while failing with another error).

    ``conf``: the settings ``producer`` was made with (its ``transactional.id`` and cluster settings);
    ``topic``: the topic it wrote, for the log lines. When ``abort_transaction`` fails (retried for up to
    ``timeout`` s while librdkafka calls the error retriable): a producer that was fenced has nothing left
    to abort (whoever fenced it aborted its transaction), which is logged as a WARNING; otherwise the id
    is fenced by a new producer (``init_transactions``, up to ``timeout`` s), which aborts the open
    transaction at once (WARNING naming the id, the topic and the failed abort), and when that fails too,
    an ERROR names the id, the topic and the time until which the open transaction can hold
    ``read_committed`` readers back. Blocks up to about twice ``timeout``.

    Returns ``True`` when the transaction is known to be ended (aborted, or fenced), ``False`` when it may
    still be open. After a fence the old ``producer`` is unusable (fenced).
    """
    tid = conf.get("transactional.id")
    try:
        retrying_transaction(producer.abort_transaction, timeout=timeout)
        return True
    except KafkaException as exc:
        if _was_fenced(exc):
            TRANSACTION_LOGGER.warning(
                "transactional id %r on topic %r: no abort needed, the producer was fenced by a newer one of the "
                "same id, which aborted its open transaction (%s)", tid, topic, _reason(exc))
            return True
        failed = _reason(exc)
    except Exception as exc:  # never raise from here: the caller's error is the one that matters
        failed = _reason(exc)
    fence_conf = dict(conf)
    fence_conf.pop("on_delivery", None)  # the old producer's delivery callback is not this producer's
    try:
        fencer = Producer(fence_conf)
        try:
            init_transactions(fencer, fence_conf, timeout=timeout)
        finally:
            fencer.flush(0)
    except (KafkaException, ControlMsgError) as exc:
        timeout_ms = int(conf.get("transaction.timeout.ms", _DEFAULT_TRANSACTION_TIMEOUT_MS))
        until = time.strftime("%H:%M:%S", time.localtime(time.time() + timeout_ms / 1000))
        TRANSACTION_LOGGER.error(
            "transactional id %r on topic %r: the abort of its open transaction failed (%s) and so did fencing the "
            "id (%s): the transaction stays open and holds read_committed readers of %r back until its coordinator "
            "aborts it at transaction.timeout.ms (%d ms, by %s at the latest) or the next start of the same id "
            "fences it", tid, topic, failed, _reason(exc), topic, timeout_ms, until)
        return False
    TRANSACTION_LOGGER.warning(
        "transactional id %r on topic %r: the abort of its open transaction failed (%s); fenced the id instead, "
        "which aborted the transaction: read_committed readers of %r are not held back", tid, topic, failed, topic)
    return True
