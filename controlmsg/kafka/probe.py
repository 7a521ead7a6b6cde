"""Which security protocol a Kafka listener speaks, found by asking it: one probe, a few seconds at most.

A client whose ``security.protocol`` does not match its broker's listener gets no error from librdkafka
that names the cause: the listener closes the connection, or a TLS handshake fails on bytes that are no
TLS, and librdkafka retries. :func:`listener_protocol` tells which of Kafka's four protocols the listener
speaks, so that :mod:`controlmsg.kafka.refusals` can say "the listener speaks SASL_SSL, the client
PLAINTEXT" within seconds instead of a timeout. Two questions, each on its own connection:

* **TLS?** A TLS handshake without verification (nothing is trusted or sent on it but the probe). A
  plaintext listener reads the ClientHello's first bytes as a request size far above
  ``socket.request.max.bytes`` and closes the connection, so the handshake fails at once.
* **SASL?** A ``SaslHandshake`` request (v1), over TLS when the listener spoke it. A SASL listener's
  authenticator answers it (no error, or ``UNSUPPORTED_SASL_MECHANISM`` with the mechanisms it offers); a
  listener without SASL answers ``ILLEGAL_SASL_STATE``. Kafka has answered so since 1.0 and still does in
  4.x (checked against the project's brokers: tests/integration/test_refused.py).

No credential is ever sent: the handshake names a mechanism, never a user or a password.
"""

from __future__ import annotations

import socket
import ssl
import struct
from typing import Final

__all__ = ["listener_protocol", "sasl_handshake_request", "sasl_handshake_response"]

SASL_HANDSHAKE: Final = 17
"""Kafka's API key of ``SaslHandshake``."""
_NONE: Final = 0
_UNSUPPORTED_SASL_MECHANISM: Final = 33
_ILLEGAL_SASL_STATE: Final = 34
_CORRELATION: Final = 0x636D  # "cm"
_CLIENT_ID: Final = b"controlmsg-probe"


def sasl_handshake_request(mechanism: str) -> bytes:
    """The framed bytes of a ``SaslHandshake`` v1 request for ``mechanism`` (request header v1)."""
    name = mechanism.encode()
    body = struct.pack(">hhih", SASL_HANDSHAKE, 1, _CORRELATION, len(_CLIENT_ID)) + _CLIENT_ID
    body += struct.pack(">h", len(name)) + name
    return struct.pack(">i", len(body)) + body


def sasl_handshake_response(payload: bytes) -> bool | None:
    """Whether the listener that sent ``payload`` (a ``SaslHandshake`` response without its size prefix)
    has SASL: ``True`` for no error or ``UNSUPPORTED_SASL_MECHANISM``, ``False`` for ``ILLEGAL_SASL_STATE``,
    ``None`` for anything else (another correlation id, another error, too short)."""
    if len(payload) < 6:
        return None
    correlation, error = struct.unpack_from(">ih", payload)
    if correlation != _CORRELATION:
        return None
    if error in (_NONE, _UNSUPPORTED_SASL_MECHANISM):
        return True
    return False if error == _ILLEGAL_SASL_STATE else None


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the listener closed the connection")
        data += chunk
    return data


def _unverified() -> ssl.SSLContext:
    """A TLS context that trusts any certificate: the probe only asks whether the listener speaks TLS (the
    client's own connections verify as configured)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def _speaks_tls(host: str, port: int, timeout: float) -> bool | None:
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw, \
                _unverified().wrap_socket(raw, server_hostname=host):
            return True
    except (ssl.SSLError, ConnectionError, EOFError):  # refused or closed in the handshake: no TLS there
        return False
    except OSError:  # unreachable, timed out: no answer either way
        return None


def _has_sasl(host: str, port: int, tls: bool, mechanism: str, timeout: float) -> bool | None:
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw:
            sock = _unverified().wrap_socket(raw, server_hostname=host) if tls else raw
            try:
                sock.sendall(sasl_handshake_request(mechanism))
                (size,) = struct.unpack(">i", _read_exactly(sock, 4))
                if not 0 < size < 65536:
                    return None
                return sasl_handshake_response(_read_exactly(sock, size))
            finally:
                if sock is not raw:
                    sock.close()
    except (OSError, ssl.SSLError):
        return None


def listener_protocol(address: str, mechanism: str = "PLAIN", timeout: float = 3.0) -> str | None:
    """The ``security.protocol`` the Kafka listener at ``address`` (``host:port``) speaks (``PLAINTEXT``,
    ``SSL``, ``SASL_PLAINTEXT`` or ``SASL_SSL``), or ``None`` when the probe could not tell (nothing
    listens, no answer within ``timeout`` s, an answer that is not Kafka's). ``mechanism``: the SASL
    mechanism the handshake names (any works: only the kind of answer counts)."""
    host, _, port_text = address.rpartition(":")
    host = host.strip("[]")
    try:
        port = int(port_text)
    except ValueError:
        return None
    tls = _speaks_tls(host, port, timeout)
    if tls is None:
        return None
    sasl = _has_sasl(host, port, tls, mechanism, timeout)
    if sasl is None:
        return None
    return ("SASL_" if sasl else "") + ("SSL" if tls else "PLAINTEXT")
