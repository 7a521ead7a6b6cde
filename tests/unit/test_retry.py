"""Retriable Kafka errors are asked again with a bounded backoff; final ones fail at once."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from controlmsg.kafka.retry import is_retriable, retrying


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
