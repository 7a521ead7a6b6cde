"""When the cluster refuses a client: tell it within seconds, naming the cause, instead of at a timeout.

librdkafka reports a refused connection on the client's error callback and keeps trying, so every
request of a client with a wrong password waits for its timeout and then says "timed out". Every client
controlmsg makes takes its settings from :func:`controlmsg.kafka.settings.for_client`, which installs a
:class:`ConnectionWatch` as its ``error_cb``. The watch turns the refusals that no retry can pass into a
:class:`~controlmsg.errors.ClusterRefused`, raised

* at once, from the call that serves the callback (``poll``, ``consume``, ``flush``; a callback's
  exception propagates out of the confluent-kafka call that ran it), and
* again by :meth:`ConnectionWatch.check` (:func:`check_client`), which the waiting loops call between
  their short waits (admin requests, transactions, flushes, readers).

What counts, and how soon:

=====================================================  =====================================
refusal (librdkafka error)                             raised
=====================================================  =====================================
SASL authentication failed (``_AUTHENTICATION``)       at once, by every client
SASL mechanism not offered (``_AUTHENTICATION``)       at once, by every client
TLS certificate verify failed (``_SSL``)               at once, by every client; a probe tells
                                                       an untrusted CA from a hostname the
                                                       certificate does not name
a listener of another security protocol (only          by admin clients only, at once, once a
``_ALL_BROKERS_DOWN``, or a closed TLS handshake)      probe of the listener (a TLS handshake, a
                                                       ``SaslHandshake``: :mod:`.probe`) told which
                                                       protocol it speaks, while this process has
                                                       never reached that cluster
unknown host (``_RESOLVE``), connection refused        by admin clients only, after
(``_TRANSPORT``)                                       :data:`GRACE_ENV` seconds (default 10),
                                                       once every address of
                                                       ``bootstrap.servers`` failed so, and only
                                                       while this process has never reached
                                                       that cluster
=====================================================  =====================================

"Reached" a cluster: an admin request succeeded, transactions were initialised, a Spark task was planned by
its driver, or librdkafka named a broker by its node id, in this process or, for a PySpark worker, in
another worker of the same Spark application (:mod:`controlmsg.kafka.reached`). The protocol probe runs at
the first contact only, once per address and protocol within :data:`DEFAULT_GRACE_S`. Producers and
consumers leave refused connections to the retries, and everything else (timeouts, a slow broker, other TLS
errors) is left alone; why (brokers that start or restart refuse connections too, a Spark step may run in a
new process in the middle of a restart): docs/SECURITY.md, "When the cluster refuses a client".
"""

from __future__ import annotations

import os
import re
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from confluent_kafka import KafkaError

from controlmsg.errors import ClusterRefused
from controlmsg.kafka.probe import listener_protocol
from controlmsg.kafka.reached import remember, remembered

__all__ = [
    "DEFAULT_GRACE_S", "GRACE_ENV", "ConnectionWatch", "check_client", "denied", "mark_reached", "principal",
]

GRACE_ENV: Final = "CONTROLMSG_UNREACHABLE_GRACE_S"
"""Environment variable: seconds an unknown host or a refused connection may last, in a process that has
never reached the cluster, before the waiting calls raise :class:`~controlmsg.errors.ClusterRefused`."""
DEFAULT_GRACE_S: Final = 10.0

# "sasl_ssl://127.0.0.1:9093/bootstrap: SASL authentication error: ... (after 312ms in state AUTH_REQ)":
# the broker's address, then "bootstrap" (not yet in the cluster's metadata) or its node id.
_BROKER: Final = re.compile(r"^(?:[a-z_]+://)?(?P<address>[^/\s]+)/(?P<node>[^:\s]+): (?P<text>.*)$", re.S)
_AFTER: Final = re.compile(r"\s*\(after \d+ms in state [A-Z_]+\)(?: \(\d+ identical error\(s\) suppressed\))?\s*$")
_OFFERED: Final = re.compile(r"supported mechanisms: (?P<mechanisms>[\w, -]+)")

_lock = threading.Lock()
_reached: set[str] = set()
"""``bootstrap.servers`` of the clusters some client of this process has had an answer from."""
_probed: dict[tuple[str, str], float] = {}
"""(address, security protocol) -> when a client of this process last probed that listener (again only
after :data:`DEFAULT_GRACE_S`: a broker that was starting may answer the next probe)."""
_unreachable: dict[str, tuple[float, float, frozenset[str]]] = {}
"""``bootstrap.servers`` -> (first, last) time a client of this process saw one of its addresses
unresolvable or refusing connections, and which addresses did."""


def _grace_s() -> float:
    try:
        return max(float(os.environ.get(GRACE_ENV, "")), 0.0)
    except ValueError:
        return DEFAULT_GRACE_S


def principal(config: Mapping[str, Any]) -> str | None:
    """The principal a client of ``config`` asks as, as the broker's ACLs name it: ``User:<sasl.username>``;
    ``None`` without a SASL user name."""
    user = config.get("sasl.username")
    return f"User:{user}" if user else None


# What a broker answers a principal that no ACL allows an operation (Kafka's StandardAuthorizer), and the
# kind of resource the ACL is on.
_DENIED: Final = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "topic",
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "cluster",
    KafkaError.GROUP_AUTHORIZATION_FAILED: "group",
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "transactional id",
}


def denied(config: Mapping[str, Any], error: object, operation: str, resource: str) -> str | None:
    """One line for an ACL refusal: ``error`` (a :class:`KafkaError`) is an authorization failure of
    ``operation`` (e.g. ``"describe topic 't'"``), naming the principal and the ``resource`` its ACLs must
    cover; ``None`` when ``error`` is not an authorization failure."""
    if not isinstance(error, KafkaError) or error.code() not in _DENIED:
        return None
    who = principal(config)
    kind = _DENIED[error.code()]
    return (f"not authorized to {operation}{f' (principal {who})' if who else ''}: {error.str()}; check the "
            f"ACLs of {who or 'the client'} on {kind} {resource}")


def mark_reached(config: Mapping[str, Any]) -> None:
    """Note that a client of ``config`` had an answer from its cluster: from now on this process, and the
    other Python workers of its Spark application if it is one, leave connection errors to that cluster to
    the retries (a broker that restarts)."""
    servers = str(config.get("bootstrap.servers", ""))
    with _lock:
        new = servers not in _reached
        _reached.add(servers)
        _unreachable.pop(servers, None)
    if new:
        remember(servers)  # for the other Python workers of this Spark application (controlmsg.kafka.reached)


class ConnectionWatch:
    """A client's ``error_cb`` (installed by :func:`~controlmsg.kafka.settings.for_client`): see the module.
    ``unreachable``: this client may tell an unreachable cluster (an admin client: the first contact).

    Calls ``chained`` (an ``error_cb`` of the user's) first. Raises :class:`~controlmsg.errors.ClusterRefused`
    from the first refusal it sees; later ones are kept for :meth:`check`. Thread-safe."""

    def __init__(self, config: Mapping[str, Any], chained: Callable[[KafkaError], None] | None = None, *,
                 unreachable: bool = False) -> None:
        self.unreachable = unreachable
        self.servers = str(config.get("bootstrap.servers", ""))
        self.addresses = frozenset(_address(a) for a in self.servers.split(",") if a.strip())
        self.principal = principal(config)
        self.mechanism = str(config.get("sasl.mechanism", config.get("sasl.mechanisms", "GSSAPI")))
        self.protocol = str(config.get("security.protocol", "plaintext")).upper()
        self.ca = config.get("ssl.ca.location")
        self.ca_pem = config.get("ssl.ca.pem")
        self.verify_host = str(config.get("ssl.endpoint.identification.algorithm", "https")).lower() != "none"
        self.chained = chained
        self.refusal: ClusterRefused | None = None
        self._pending: ClusterRefused | None = None  # a connection error within its grace

    def __call__(self, error: KafkaError) -> None:
        if self.chained is not None:
            self.chained(error)
        if self.refusal is not None:
            return
        refusal = self._refusal(error)
        if refusal is not None:
            self.refusal = refusal
            raise refusal
        self.check()

    def check(self) -> None:
        """Raise the refusal seen, if any, or a connection error that has outlasted its grace in a process
        that never reached the cluster. Cheap: call it between short waits."""
        if self.refusal is not None:
            raise self.refusal
        if self._pending is None:
            return
        if self.servers not in _reached and remembered(self.servers):
            mark_reached({"bootstrap.servers": self.servers})  # another worker of this Spark application did
        with _lock:
            if self.servers in _reached:
                self._pending = None
                return
            first, _, refused = _unreachable.get(self.servers, (time.monotonic(), 0.0, frozenset()))
            waited = time.monotonic() - first
            if not self.addresses <= refused or waited < _grace_s():
                return  # within the grace, or some bootstrap address has not failed (it may answer)
            _unreachable.pop(self.servers, None)  # the next client (a retried command) has a grace of its own
        pending = self._pending
        self.refusal = ClusterRefused(pending.what, pending.broker, pending.principal,
                                      pending.detail.replace("{waited}", f"{waited:.0f}"), pending.check)
        raise self.refusal

    def reached(self) -> None:
        """The client had an answer from the cluster (see :func:`mark_reached`)."""
        self._pending = None
        mark_reached({"bootstrap.servers": self.servers})

    # ------------------------------------------------------------------ classification

    def _refusal(self, error: KafkaError) -> ClusterRefused | None:
        """The definitive refusal ``error`` reports, if it is one; a connection error is noted as pending."""
        code = error.code()
        text = error.str()
        parsed = _BROKER.match(text)
        if parsed is None:  # "1/1 brokers are down" and the like name no broker
            if code == KafkaError._ALL_BROKERS_DOWN and self.unreachable:
                return self._wrong_protocol(self.addresses)
            return None
        address, node, detail = parsed["address"], parsed["node"], _AFTER.sub("", parsed["text"])
        if node.isdigit():  # a node id: the client has had the cluster's metadata
            self.reached()
        if code == KafkaError._AUTHENTICATION:
            return self._authentication(address, detail)
        if "certificate verify failed" in detail and code in (KafkaError._SSL, KafkaError._TRANSPORT):
            return self._certificate(address)
        if self.unreachable and (code == KafkaError._RESOLVE
                                 or (code == KafkaError._TRANSPORT and "Connection refused" in detail)):
            self._unreachable(address, code)
        elif self.unreachable and code in (KafkaError._TRANSPORT, KafkaError._SSL):
            return self._wrong_protocol({_address(address)})  # closed by the listener, a handshake failed
        return None

    def _authentication(self, address: str, detail: str) -> ClusterRefused:
        if "Unsupported SASL mechanism" in detail:
            offered = _OFFERED.search(detail)
            others = f" (it offers {offered['mechanisms'].strip()})" if offered else ""
            return ClusterRefused("SASL mechanism refused", address, self.principal,
                                  f"the broker does not offer {self.mechanism}{others}", "sasl.mechanism")
        if "invalid credentials" in detail:
            reason = f"wrong user name or password ({self.mechanism})"
        else:
            reason = detail.removeprefix("SASL authentication error: ")
        return ClusterRefused("SASL authentication refused", address, self.principal, reason,
                              "sasl.username and sasl.password")

    def _certificate(self, address: str) -> ClusterRefused:
        why, check = _diagnose_certificate(address, self.ca, self.ca_pem, self.verify_host)
        what = "TLS hostname mismatch" if check.startswith("bootstrap.servers") else "TLS certificate not trusted"
        return ClusterRefused(what, address, self.principal, why, check)

    def _wrong_protocol(self, addresses: Iterable[str]) -> ClusterRefused | None:
        """A refusal when a listener of ``addresses`` (never reached by this process) speaks another
        security protocol than the client's: asked once per address and protocol (see
        :func:`~controlmsg.kafka.probe.listener_protocol`); ``None`` when it speaks the client's or cannot
        tell."""
        for address in sorted(addresses):
            with _lock:
                if self.servers in _reached:
                    return None
                key, now = (address, self.protocol), time.monotonic()
                if now - _probed.get(key, -DEFAULT_GRACE_S) < DEFAULT_GRACE_S:
                    continue
                _probed[key] = now
            spoken = listener_protocol(address, self.mechanism)
            if spoken is not None and spoken != self.protocol:
                return ClusterRefused("security protocol mismatch", address, self.principal,
                                      f"the listener speaks {spoken}, the client {self.protocol}",
                                      "security.protocol (and the settings it needs)")
        return None

    def _unreachable(self, address: str, code: int) -> None:
        now = time.monotonic()
        with _lock:
            if self.servers in _reached:
                return
            first, last, refused = _unreachable.get(self.servers, (now, now, frozenset()))
            if now - last > 2 * max(_grace_s(), 1.0):  # an old episode: count afresh
                first, refused = now, frozenset()
            _unreachable[self.servers] = (first, now, refused | {_address(address)})
        host = address.rsplit(":", 1)[0]
        broker = address if len(self.addresses) <= 1 else self.servers
        if code == KafkaError._RESOLVE:
            self._pending = ClusterRefused("unknown host", broker, self.principal,
                                           f"host {host!r} did not resolve for {{waited}} s", "bootstrap.servers")
        else:
            self._pending = ClusterRefused("connection refused", broker, self.principal,
                                           "every connection refused for {waited} s (nothing listens there)",
                                           "bootstrap.servers and that the broker is up")


def _address(server: str) -> str:
    """``host:port`` of a ``bootstrap.servers`` entry or of a broker librdkafka names, lower case, without
    a ``protocol://`` prefix."""
    return server.strip().rsplit("://", 1)[-1].lower()


def check_client(conf: Mapping[str, Any]) -> None:
    """:meth:`ConnectionWatch.check` of the client made from ``conf`` (a :func:`for_client` result);
    nothing if it has no watch."""
    watch = conf.get("error_cb")
    if isinstance(watch, ConnectionWatch):
        watch.check()


def _diagnose_certificate(address: str, ca: object, ca_pem: object, verify_host: bool) -> tuple[str, str]:
    """Why the certificate of the broker at ``address`` failed verification, and what to check: a probe
    with Python's ssl module (one connection, a few seconds at most) tells a certificate that no CA of
    ``ssl.ca.location`` signed from one that does not name the host it was reached by."""
    where = f"ssl.ca.location {ca!r}" if ca else "ssl.ca.pem" if ca_pem else "the system's CA store"
    untrusted = (f"its certificate is not signed by a CA of {where}",
                 "ssl.ca.location (the CA that signed the broker's certificate)")
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        context = ssl.create_default_context(
            cafile=str(ca) if isinstance(ca, str) and os.path.isfile(ca) else None,
            capath=str(ca) if isinstance(ca, str) and os.path.isdir(ca) else None,
            cadata=str(ca_pem) if ca_pem else None)
        context.check_hostname = False
        with socket.create_connection((host, int(port)), timeout=3.0) as raw, \
                context.wrap_socket(raw, server_hostname=host) as tls:
            cert = tls.getpeercert()
    except ssl.SSLCertVerificationError as exc:
        return f"{untrusted[0]} ({exc.verify_message})", untrusted[1]
    except (OSError, ValueError, ssl.SSLError):
        return f"its certificate failed verification against {where}", \
            "ssl.ca.location, and that the certificate names the host in bootstrap.servers"
    names = [str(entry[1]) for entry in (cert or {}).get("subjectAltName", ())
             if len(entry) == 2 and entry[0] in ("DNS", "IP Address")]
    if verify_host and not any(host == name or (name.startswith("*.") and host.endswith(name[1:])
                                                and host.count(".") == name.count(".")) for name in names):
        named = ", ".join(names) or "no host"
        return (f"its certificate names {named}, not {host!r}",
                "bootstrap.servers (a name the certificate holds) or the broker's certificate")
    return f"its certificate failed verification against {where}", \
        "ssl.ca.location, and that the certificate names the host in bootstrap.servers"
