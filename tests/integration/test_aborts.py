"""A transaction that cannot be aborted is named, and fenced so that it does not stay open
(:mod:`controlmsg.kafka.aborts`), on a real broker with real transactions.

The abort's failure is injected (a coordinator that does not answer cannot be had on demand without
stopping the broker the whole session shares): a ``Producer`` subclass whose ``abort_transaction``
raises as librdkafka does when the coordinator times out. Everything else is real: the transaction is
open on the broker, the fence is a real ``init_transactions``, and the readers are ``read_committed``."""

from __future__ import annotations

import logging
import socket
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer

from controlmsg.kafka.aborts import abort_or_fence
from controlmsg.kafka.writer import fence_transactions
from tests.transactions import held_back

LOGGER = "controlmsg.kafka.transactions"


class CoordinatorTimesOut(Producer):
    """A real producer whose abort fails as it does when the transaction coordinator does not answer."""

    def abort_transaction(self, *args: Any) -> None:
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "abort_transaction timed out (injected)"))


def open_transaction(config: dict[str, Any], topic: str, producer_type: type[Producer] = Producer
                     ) -> tuple[Producer, dict[str, Any]]:
    """A producer of a fresh transactional id with 3 records in an open transaction on ``topic``."""
    conf = {**config, "transactional.id": f"t-abort-{uuid.uuid4().hex[:8]}", "transaction.timeout.ms": 120_000}
    producer = producer_type(conf)
    producer.init_transactions(30)
    producer.begin_transaction()
    for n in range(3):
        producer.produce(topic, f"uncommitted-{n}".encode(), partition=0)
    assert producer.flush(30) == 0
    return producer, conf


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_failed_abort_fences_the_id_and_readers_go_on(kafka_config: dict[str, Any], new_topic: Callable[..., str],
                                                        caplog: pytest.LogCaptureFixture) -> None:
    topic = new_topic(1)
    producer, conf = open_transaction(kafka_config, topic, CoordinatorTimesOut)
    assert held_back(kafka_config, topic, 1)[0] == {0: (0, 3)}  # the transaction is open: readers wait at 0
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert abort_or_fence(producer, conf, topic, timeout=10.0) is True
    waiting, records = held_back(kafka_config, topic, 1)
    assert waiting == {} and records == []  # aborted: nothing holds readers back, nothing of it is readable
    (line,) = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert conf["transactional.id"] in line and topic in line and "fenced the id" in line and "timed out" in line
    with pytest.raises(KafkaException) as fenced:  # the old producer cannot commit it any more
        producer.commit_transaction(10)
    assert fenced.value.args[0].code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED)


def test_a_producer_fenced_already_needs_no_abort(kafka_config: dict[str, Any], new_topic: Callable[..., str],
                                                  caplog: pytest.LogCaptureFixture) -> None:
    topic = new_topic(1)
    producer, conf = open_transaction(kafka_config, topic)
    fence_transactions(kafka_config, [conf["transactional.id"]], timeout=30)  # a newer instance of the id
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert abort_or_fence(producer, conf, topic, timeout=10.0) is True
    assert held_back(kafka_config, topic, 1) == ({}, [])
    (line,) = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert "no abort needed" in line and conf["transactional.id"] in line and topic in line


def test_an_abort_that_cannot_be_fenced_either_names_what_it_holds_back(
        kafka_config: dict[str, Any], new_topic: Callable[..., str], caplog: pytest.LogCaptureFixture) -> None:
    """The abort fails and the fence cannot reach a cluster (its bootstrap address answers nothing): the
    ERROR line names the id, the topic, and until when the open transaction can hold readers back."""
    topic = new_topic(1)
    producer, conf = open_transaction(kafka_config, topic, CoordinatorTimesOut)
    unreachable = {**conf, "bootstrap.servers": f"127.0.0.1:{closed_port()}"}
    try:
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            assert abort_or_fence(producer, unreachable, topic, timeout=3.0) is False
        (record,) = [r for r in caplog.records if r.name == LOGGER]
        line = record.getMessage()
        assert record.levelno == logging.ERROR
        assert conf["transactional.id"] in line and repr(topic) in line
        assert "holds read_committed readers" in line and "120000 ms" in line and "at the latest" in line
        assert held_back(kafka_config, topic, 1)[0] == {0: (0, 3)}  # honest: it is still open
    finally:
        fence_transactions(kafka_config, [conf["transactional.id"]], timeout=30)
    assert held_back(kafka_config, topic, 1) == ({}, [])
