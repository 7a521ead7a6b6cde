"""How :class:`controlmsg.kafka.refusals.ConnectionWatch` reads librdkafka's error callback: which errors
are refusals at once, which after a grace, and which never (once the process reached the cluster). The
texts are librdkafka's own, as seen against the secured broker (tests/integration/test_refused.py runs
them for real)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pytest
from confluent_kafka import KafkaError

from controlmsg.errors import ClusterRefused
from controlmsg.kafka import refusals
from controlmsg.kafka.refusals import GRACE_ENV, ConnectionWatch, mark_reached
from controlmsg.kafka.settings import for_client

AUTH = ("sasl_ssl://{a}/bootstrap: SASL authentication error: Authentication failed during authentication due to "
        "invalid credentials with SASL mechanism SCRAM-SHA-512 (after 312ms in state AUTH_REQ)")
REFUSED = "sasl_ssl://{a}/{node}: Connect to ipv4#127.0.0.1:1 failed: Connection refused (after 0ms in state CONNECT)"


def _servers() -> str:
    return f"127.0.0.1:{uuid.uuid4().int % 50000 + 10000}"  # a cluster no other test's watch has seen


def _watch(servers: str, *, unreachable: bool = True) -> ConnectionWatch:
    """The watch of an admin client (``unreachable``), as for_client makes it, or of another client."""
    return ConnectionWatch({"bootstrap.servers": servers, "sasl.username": "pipeline", "sasl.password": "s3cret",
                            "sasl.mechanism": "SCRAM-SHA-512"}, unreachable=unreachable)


def test_authentication_is_refused_at_once_and_then_kept() -> None:
    servers = _servers()
    watch = _watch(servers)
    with pytest.raises(ClusterRefused) as info:
        watch(KafkaError(KafkaError._AUTHENTICATION, AUTH.format(a=servers)))
    line = str(info.value)
    assert line == (f"SASL authentication refused (broker {servers}, principal User:pipeline): wrong user name or "
                    f"password (SCRAM-SHA-512); check sasl.username and sasl.password")
    assert "s3cret" not in line
    watch(KafkaError(KafkaError._AUTHENTICATION, AUTH.format(a=servers)))  # the callback raises once
    with pytest.raises(ClusterRefused):
        watch.check()  # the waiting calls keep raising it


def test_errors_that_name_no_broker_or_are_no_refusal_pass() -> None:
    watch = _watch(_servers())
    watch(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    watch(KafkaError(KafkaError._TIMED_OUT, "sasl_ssl://127.0.0.1:9/1: ApiVersionRequest failed: Local: Timed out"))
    watch.check()
    assert watch.refusal is None


def test_a_refused_connection_is_told_after_its_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(GRACE_ENV, "0.3")
    servers = _servers()
    watch = _watch(servers)
    watch(KafkaError(KafkaError._TRANSPORT, REFUSED.format(a=servers, node="bootstrap")))
    watch.check()  # within the grace: a broker that is starting
    time.sleep(0.4)
    with pytest.raises(ClusterRefused) as info:
        watch.check()
    assert str(info.value).startswith(f"connection refused (broker {servers}, principal User:pipeline): every "
                                      f"connection refused for 0 s")


def test_producers_and_consumers_leave_refused_connections_to_the_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """In Spark a step may run in a new process while a broker restarts: only the first contact (topic admin)
    tells an unreachable cluster. A refusal of the client itself is told by every client."""
    monkeypatch.setenv(GRACE_ENV, "0")
    servers = _servers()
    consumer = _watch(servers, unreachable=False)
    consumer(KafkaError(KafkaError._TRANSPORT, REFUSED.format(a=servers, node="bootstrap")))
    consumer(KafkaError(KafkaError._RESOLVE, REFUSED.format(a=servers, node="bootstrap")))
    consumer.check()
    with pytest.raises(ClusterRefused, match="SASL authentication refused"):
        consumer(KafkaError(KafkaError._AUTHENTICATION, AUTH.format(a=servers)))


def test_the_grace_is_counted_across_the_clients_of_a_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(GRACE_ENV, "0.3")
    servers = _servers()
    _watch(servers)(KafkaError(KafkaError._RESOLVE, REFUSED.format(a=servers, node="bootstrap")))
    time.sleep(0.4)
    later = _watch(servers)  # the admin session's next client, say
    with pytest.raises(ClusterRefused, match="unknown host"):
        later(KafkaError(KafkaError._RESOLVE, REFUSED.format(a=servers, node="bootstrap")))


def test_a_cluster_once_reached_is_left_to_the_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(GRACE_ENV, "0")
    servers = _servers()
    watch = _watch(servers)
    # A broker named by its node id: the client had the cluster's metadata, so this is a broker restarting.
    watch(KafkaError(KafkaError._TRANSPORT, REFUSED.format(a=servers, node="1")))
    watch(KafkaError(KafkaError._TRANSPORT, REFUSED.format(a=servers, node="bootstrap")))
    watch.check()
    other = _watch(servers)  # a new client of the same process
    other(KafkaError(KafkaError._TRANSPORT, REFUSED.format(a=servers, node="bootstrap")))
    other.check()
    fresh = _servers()
    mark_reached({"bootstrap.servers": fresh})  # an admin request answered
    _watch(fresh)(KafkaError(KafkaError._TRANSPORT, REFUSED.format(a=fresh, node="bootstrap")))


def test_for_client_installs_a_watch_of_its_own_and_keeps_the_users_callback() -> None:
    seen: list[KafkaError] = []
    conf = for_client({"bootstrap.servers": "h:1", "error_cb": seen.append}, "producer")
    watch = conf["error_cb"]
    assert isinstance(watch, ConnectionWatch) and watch.chained == seen.append and not watch.unreachable
    again = for_client(conf, "admin")  # another client from the first one's settings
    assert isinstance(again["error_cb"], ConnectionWatch) and again["error_cb"] is not watch
    assert again["error_cb"].chained == seen.append and again["error_cb"].unreachable
    watch(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    assert len(seen) == 1


def test_a_cluster_with_one_address_answering_is_not_unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(GRACE_ENV, "0")
    one, two = _servers(), _servers()
    watch = _watch(f"{one},{two}")
    watch(KafkaError(KafkaError._TRANSPORT, REFUSED.format(a=one, node="bootstrap")))  # a node of three is dead
    watch.check()
    with pytest.raises(ClusterRefused) as info:  # every address refuses
        watch(KafkaError(KafkaError._TRANSPORT, REFUSED.format(a=two, node="bootstrap")))
    assert f"(broker {one},{two}," in str(info.value)


def test_each_new_client_after_a_refusal_has_a_grace_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Spark task that failed so is retried: its next attempt must not fail at once."""
    monkeypatch.setenv(GRACE_ENV, "0.3")
    servers = _servers()
    watch = _watch(servers)
    watch(KafkaError(KafkaError._TRANSPORT, REFUSED.format(a=servers, node="bootstrap")))
    time.sleep(0.4)
    with pytest.raises(ClusterRefused):
        watch.check()
    retry = _watch(servers)
    retry(KafkaError(KafkaError._TRANSPORT, REFUSED.format(a=servers, node="bootstrap")))
    retry.check()  # a new grace


DOWN = "1/1 brokers are down"
CLOSED = ("ssl://{a}/bootstrap: SSL handshake failed: Disconnected: SSL connection closed by peer: connecting to a "
          "PLAINTEXT broker listener? (after 3ms in state SSL_HANDSHAKE)")


def _listener(asked: list[str], speaks: str) -> Callable[[str, str], str]:
    def probe(address: str, mechanism: str) -> str:
        asked.append(address)
        return speaks
    return probe


def test_a_listener_of_another_protocol_is_refused_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """"Brokers are down" or a closed handshake at an admin client's first contact: the listener is asked
    what it speaks (the probe, stood in for here: tests/integration/test_refused.py asks real listeners),
    once per address and protocol within the grace."""
    asked: list[str] = []
    monkeypatch.setattr(refusals, "listener_protocol", _listener(asked, "SASL_SSL"))
    servers = _servers()
    watch = _watch(servers)
    with pytest.raises(ClusterRefused) as info:
        watch(KafkaError(KafkaError._ALL_BROKERS_DOWN, DOWN))
    assert str(info.value) == (f"security protocol mismatch (broker {servers}, principal User:pipeline): the "
                               f"listener speaks SASL_SSL, the client PLAINTEXT; check security.protocol (and the "
                               f"settings it needs)")
    again = _watch(servers)
    again(KafkaError(KafkaError._ALL_BROKERS_DOWN, DOWN))  # asked a moment ago: not again
    assert asked == [servers] and again.refusal is None


def test_the_listener_is_not_asked_when_it_speaks_the_clients_protocol_or_was_reached(
        monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []
    monkeypatch.setattr(refusals, "listener_protocol", _listener(asked, "SSL"))
    servers = _servers()
    ssl_watch = ConnectionWatch({"bootstrap.servers": servers, "security.protocol": "ssl"}, unreachable=True)
    ssl_watch(KafkaError(KafkaError._SSL, CLOSED.format(a=servers)))  # a broker that was stopping
    assert ssl_watch.refusal is None and asked == [servers]
    reached = _servers()
    mark_reached({"bootstrap.servers": reached})
    _watch(reached)(KafkaError(KafkaError._ALL_BROKERS_DOWN, DOWN))  # a restart in the middle of a run
    _watch(_servers(), unreachable=False)(KafkaError(KafkaError._ALL_BROKERS_DOWN, DOWN))  # not the first contact
    assert asked == [servers]
