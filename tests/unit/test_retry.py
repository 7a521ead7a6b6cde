"""Retriable Kafka errors are asked again with a bounded backoff; final ones fail at once."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from controlmsg.kafka.admin import _AdminSession
from controlmsg.kafka.retry import bounded_call, is_retriable, retrying, retrying_transaction


def failing(codes: list[int]) -> tuple[list[int], object]:
    calls: list[int] = []

    def call() -> str:
        calls.append(1)
        if len(calls) <= len(codes):
            raise KafkaException(KafkaError(codes[len(calls) - 1]))
        return "done"

    return calls, call


def test_retriable_errors_are_asked_again() -> None:
    calls, call = failing([KafkaError.NOT_COORDINATOR, KafkaError._TIMED_OUT, KafkaError.COORDINATOR_LOAD_IN_PROGRESS])
    assert retrying(call, timeout=5, first_wait=0.01) == "done"  # type: ignore[arg-type]
    assert len(calls) == 4


def test_final_errors_fail_at_once() -> None:
    calls, call = failing([KafkaError.TOPIC_AUTHORIZATION_FAILED])
    with pytest.raises(KafkaException) as info:
        retrying(call, timeout=5, first_wait=0.01)  # type: ignore[arg-type]
    assert info.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED and len(calls) == 1
    assert not is_retriable(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))


def test_after_the_timeout_the_last_error_propagates() -> None:
    calls, call = failing([KafkaError._TRANSPORT] * 1000)
    with pytest.raises(KafkaException) as info:
        retrying(call, timeout=0.3, first_wait=0.05, max_wait=0.1)  # type: ignore[arg-type]
    assert info.value.args[0].code() == KafkaError._TRANSPORT
    assert 1 < len(calls) < 1000


def txn_call(errors: list[KafkaError]) -> tuple[list[float], object]:
    """A transactional-API call that fails with ``errors`` in turn, then succeeds; records the time it was given."""
    given: list[float] = []

    def call(left: float) -> str:
        given.append(left)
        if len(given) <= len(errors):
            raise KafkaException(errors[len(given) - 1])
        return "committed"

    return given, call


def test_transaction_calls_retry_what_librdkafka_marks_retriable() -> None:
    given, call = txn_call([KafkaError(KafkaError._TIMED_OUT, "commit timed out", retriable=True),
                            KafkaError(KafkaError.NOT_COORDINATOR, "moved", retriable=True)])
    assert retrying_transaction(call, timeout=10) == "committed"  # type: ignore[arg-type]
    assert len(given) == 3 and given[0] > given[-1] > 0  # each try gets the time that is left


@pytest.mark.parametrize("error", [
    KafkaError(KafkaError._FENCED, "fenced", fatal=True),
    KafkaError(KafkaError.INVALID_TXN_STATE, "abort it", retriable=True, txn_requires_abort=True),
    KafkaError(KafkaError.NOT_COORDINATOR, "not marked retriable by librdkafka"),
])
def test_transaction_calls_fail_at_once_when_another_try_cannot_help(error: KafkaError) -> None:
    given, call = txn_call([error])
    with pytest.raises(KafkaException) as raised:
        retrying_transaction(call, timeout=10)  # type: ignore[arg-type]
    assert raised.value.args[0] is error and len(given) == 1


def test_transaction_retries_stop_at_the_timeout() -> None:
    given, call = txn_call([KafkaError(KafkaError._TIMED_OUT, "again", retriable=True)] * 1000)
    with pytest.raises(KafkaException):
        retrying_transaction(call, timeout=0.5)  # type: ignore[arg-type]
    assert 1 < len(given) < 10


def test_a_bounded_call_returns_or_raises_what_the_call_did() -> None:
    given: list[float] = []

    def returns(left: float) -> str:
        given.append(left)
        return "value"

    assert bounded_call(returns, 2.5, what="commit_transaction") == "value"
    assert given == [2.5]
    error = KafkaException(KafkaError(KafkaError._FENCED, "fenced", fatal=True))

    def fails(_left: float) -> None:
        raise error

    with pytest.raises(KafkaException) as raised:
        bounded_call(fails, 1.0, what="abort_transaction")
    assert raised.value is error


def test_a_call_wedged_past_its_timeout_is_left_behind_with_a_fatal_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """librdkafka's send_offsets_to_transaction can block past its timeout for good (librdkafka#5456): the
    caller gets a fatal error naming the call, and retrying_transaction does not call the wedged producer
    again."""
    import threading

    from controlmsg.kafka import retry

    monkeypatch.setattr(retry, "WEDGE_GRACE_S", 0.2)
    release = threading.Event()
    calls: list[float] = []

    def wedged(left: float) -> None:
        calls.append(left)
        release.wait(30)  # far past its timeout, as the C call blocks

    try:
        with pytest.raises(KafkaException) as raised:
            retrying_transaction(wedged, timeout=0.3, what="send_offsets_to_transaction")
        error = raised.value.args[0]
        assert error.fatal() and not error.retriable() and error.code() == KafkaError._TIMED_OUT
        assert "send_offsets_to_transaction did not return within 1 s" in error.str()
        assert "librdkafka#5456" in error.str() and len(calls) == 1
    finally:
        release.set()


def test_a_consumer_error_that_passes_lasts_at_most_its_patience(monkeypatch: pytest.MonkeyPatch) -> None:
    """A leader that has not heard of a new topic (what a 3-node cluster answers a moment after the
    topic was created) passes, per partition, until the partition has reported errors for longer than
    the patience; an authorization error never passes. The errors come at the times of a clock the test
    sets (a loaded machine cannot stretch a gap between two of them)."""
    from types import SimpleNamespace

    from controlmsg.kafka import retry
    from controlmsg.kafka.retry import ConsumerErrors

    now = [1000.0]
    monkeypatch.setattr(retry, "time", SimpleNamespace(monotonic=lambda: now[0]))
    errors = ConsumerErrors(patience_s=0.3)
    unknown = KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
    assert errors.passes(unknown, 1) and errors.passes(unknown, 2)
    assert not errors.passes(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED), 1)
    assert not errors.passes(KafkaError(KafkaError._FATAL, fatal=True), 1)
    passed = []
    for _ in range(9):  # partition 1 keeps failing every 0.07 s, for 0.63 s in all
        now[0] += 0.07
        passed.append(errors.passes(unknown, 1))
    assert passed == [True] * 4 + [False] * 5  # until 0.28 s of errors; past its patience (0.3 s) the caller raises
    now[0] += 0.4  # a quiet gap longer than the patience starts the count afresh
    assert errors.passes(unknown, 2) and errors.passes(unknown, 1)
    assert errors.passed == 2 + 4 + 2


def test_an_admin_session_asks_each_try_after_a_failed_one_with_a_new_client() -> None:
    """A client stuck on a dead controller fails the same way until its metadata is refreshed, so every
    retry asks with a new client; a try that succeeds keeps the client it used. No broker is needed:
    an AdminClient connects lazily, and the calls here never send."""
    session = _AdminSession({"bootstrap.servers": "127.0.0.1:9"})
    first = session.client
    used: list[AdminClient] = []

    def call(client: AdminClient) -> str:
        used.append(client)
        if len(used) < 3:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "Failed while waiting for controller"))
        return "answered"

    assert session.retrying(call, timeout=5) == "answered"
    assert used[0] is first and len({id(c) for c in used}) == 3
    assert session.client is used[-1]
    assert session.retrying(lambda client: client is used[-1], timeout=5)
