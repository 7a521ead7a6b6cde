"""The bytes of the listener probe (:mod:`controlmsg.kafka.probe`): a ``SaslHandshake`` v1 request framed
as Kafka reads it, and the three kinds of answer. The probe against real listeners of each protocol is in
tests/integration/test_refused.py."""

from __future__ import annotations

import struct

from controlmsg.clusters.processes import free_ports
from controlmsg.kafka.probe import SASL_HANDSHAKE, listener_protocol, sasl_handshake_request, sasl_handshake_response


def test_the_request_is_a_framed_sasl_handshake_v1_naming_only_the_mechanism() -> None:
    frame = sasl_handshake_request("SCRAM-SHA-512")
    (size,) = struct.unpack_from(">i", frame)
    assert size == len(frame) - 4
    api_key, version, correlation, client_len = struct.unpack_from(">hhih", frame, 4)
    assert (api_key, version) == (SASL_HANDSHAKE, 1)
    client = frame[14:14 + client_len]
    (mechanism_len,) = struct.unpack_from(">h", frame, 14 + client_len)
    assert frame[16 + client_len:] == b"SCRAM-SHA-512" and mechanism_len == 13
    assert client == b"controlmsg-probe" and correlation != 0


def _response(error: int, correlation: int | None = None, mechanisms: tuple[bytes, ...] = ()) -> bytes:
    request = sasl_handshake_request("PLAIN")
    sent = struct.unpack_from(">i", request, 8)[0] if correlation is None else correlation
    body = struct.pack(">ihi", sent, error, len(mechanisms))
    return body + b"".join(struct.pack(">h", len(m)) + m for m in mechanisms)


def test_the_answers_tell_a_sasl_listener_from_one_without() -> None:
    assert sasl_handshake_response(_response(0, mechanisms=(b"PLAIN",))) is True
    assert sasl_handshake_response(_response(33, mechanisms=(b"SCRAM-SHA-512",))) is True  # offers others
    assert sasl_handshake_response(_response(34)) is False  # ILLEGAL_SASL_STATE: no SASL on the listener
    assert sasl_handshake_response(_response(35)) is None  # another error tells nothing
    assert sasl_handshake_response(_response(0, correlation=7)) is None  # not the answer to the probe
    assert sasl_handshake_response(b"\x00\x00") is None


def test_nothing_listening_tells_nothing() -> None:
    assert listener_protocol(f"127.0.0.1:{free_ports()}", timeout=1.0) is None
    assert listener_protocol("no-port") is None
