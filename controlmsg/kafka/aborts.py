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

import contextlib
import logging
import sys
import time
from collections.abc import Mapping
from typing import Any, Final

from confluent_kafka import KafkaError, KafkaException, Producer

from controlmsg.kafka.retry import init_transactions, retrying_transaction

__all__ = ["TRANSACTION_LOGGER", "abort_or_fence"]

TRANSACTION_LOGGER: Final = logging.getLogger("controlmsg.kafka.transactions")
"""Where a transaction that could not be aborted is named (ERROR), and one that was fenced instead (WARNING)."""

_DEFAULT_TRANSACTION_TIMEOUT_MS: Final = 60_000  # librdkafka's transaction.timeout.ms
_FENCED: Final = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH})


def _reason(exc: BaseException) -> str:
    """``exc`` in words, for a log line; never raises (an exception whose ``str`` fails is named by its type)."""
    try:
        error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
        return error.str() if isinstance(error, KafkaError) else f"{type(exc).__name__}: {exc}"
    except Exception:
        return type(exc).__name__


def _was_fenced(exc: BaseException) -> bool:
    error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    return isinstance(error, KafkaError) and error.code() in _FENCED


def _log(level: int, msg: str, *args: Any) -> None:
    """``TRANSACTION_LOGGER.log``, which never raises here (a filter or handler that fails is reported to
    stderr, as logging does for a handler's own errors): the caller's error is the one to raise."""
    try:
        TRANSACTION_LOGGER.log(level, msg, *args)
    except Exception as exc:
        with contextlib.suppress(Exception):
            print(f"controlmsg: cannot log {msg % args!r}: {_reason(exc)}", file=sys.stderr)


def _fence(conf: Mapping[str, Any], timeout: float) -> str | None:
    """Fence ``conf``'s transactional id: a new producer of the same id, ``init_transactions``. ``None`` once
    fenced, else why not (any exception of the producer's construction, initialisation or ending)."""
    try:
        fence_conf = dict(conf)
        fence_conf.pop("on_delivery", None)  # the old producer's delivery callback is not this producer's
        fencer = Producer(fence_conf)
    except Exception as exc:
        return _reason(exc)
    try:
        init_transactions(fencer, fence_conf, timeout=timeout)
    except Exception as exc:
        return _reason(exc)
    finally:
        # Serves what is left of its callbacks (it is destroyed when dropped). Whether this fails changes
        # nothing: the fence is done, or failed above.
        with contextlib.suppress(Exception):
            fencer.flush(0)
    return None


def _open_until(conf: Mapping[str, Any]) -> str:
    """Until when an open transaction of ``conf`` can hold readers back, in words."""
    value: Any = None
    try:
        value = conf.get("transaction.timeout.ms", _DEFAULT_TRANSACTION_TIMEOUT_MS)
        timeout_ms = int(value)
        until = time.strftime("%H:%M:%S", time.localtime(time.time() + timeout_ms / 1000))
    except Exception:  # a setting that is no number of ms: its value, as given
        return f"transaction.timeout.ms ({value!r})"
    return f"transaction.timeout.ms ({timeout_ms} ms, by {until} at the latest)"


def abort_or_fence(producer: Producer, conf: Mapping[str, Any], topic: str, *, timeout: float = 10.0) -> bool:
    """Abort ``producer``'s open transaction; never raises an :class:`Exception` (call it while failing with
    another error; ``KeyboardInterrupt`` and ``SystemExit`` do propagate).

    ``conf``: the settings ``producer`` was made with (its ``transactional.id`` and cluster settings);
    ``topic``: the topic it wrote, for the log lines. When ``abort_transaction`` fails (any exception;
    retried for up to ``timeout`` s while librdkafka calls the error retriable): a producer that was fenced
    has nothing left to abort (whoever fenced it aborted its transaction), which is logged as a WARNING;
    otherwise the id is fenced by a new producer (``init_transactions``, up to ``timeout`` s), which aborts
    the open transaction at once (WARNING naming the id, the topic and the failed abort), and when that fails
    too (any exception, the new producer's construction included), an ERROR names the id, the topic and the
    time until which the open transaction can hold ``read_committed`` readers back. Blocks up to about twice
    ``timeout``. A log line that cannot be logged is reported on stderr.

    Returns ``True`` when the transaction is known to be ended (aborted, or fenced), ``False`` when it may
    still be open. After a fence the old ``producer`` is unusable (fenced).
    """
    try:
        tid = conf.get("transactional.id")
    except Exception:
        tid = None
    try:
        retrying_transaction(producer.abort_transaction, timeout=timeout, what="abort_transaction")
        return True
    except Exception as exc:  # never raise from here: the caller's error is the one that matters
        if _was_fenced(exc):
            _log(logging.WARNING,
                 "transactional id %r on topic %r: no abort needed, the producer was fenced by a newer one of the "
                 "same id, which aborted its open transaction (%s)", tid, topic, _reason(exc))
            return True
        failed = _reason(exc)
    not_fenced = _fence(conf, timeout)
    if not_fenced is not None:
        _log(logging.ERROR,
             "transactional id %r on topic %r: the abort of its open transaction failed (%s) and so did fencing the "
             "id (%s): the transaction stays open and holds read_committed readers of %r back until its coordinator "
             "aborts it at %s or the next start of the same id fences it", tid, topic, failed, not_fenced, topic,
             _open_until(conf))
        return False
    _log(logging.WARNING,
         "transactional id %r on topic %r: the abort of its open transaction failed (%s); fenced the id instead, "
         "which aborted the transaction: read_committed readers of %r are not held back", tid, topic, failed, topic)
    return True
