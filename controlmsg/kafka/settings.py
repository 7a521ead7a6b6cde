"""Kafka client settings: where they come from, the one precedence rule, and which client gets which.

Every command, job and demo resolves its client settings here, from (lowest precedence first):

1. ``--kafka-config PATH``: a client properties file, read by Java's rules as Kafka's own tools read it
   (:mod:`controlmsg.kafka.properties`: escapes, line continuations, ``=``/``:``/whitespace separators,
   ``#`` and ``!`` comments);
2. ``-X key=value`` (repeatable; a later one wins), librdkafka names, as kcat takes them;
3. ``--bootstrap-servers HOST:PORT``.

:func:`normalise` is the one place the settings a user gives are made the clients' (the CLI and the jobs
through :func:`client_config`, the data source through :func:`controlmsg.spark.options.kafka_settings`):

- the settings that would break controlmsg's guarantees are refused, each in one line that says what to
  do (:data:`GUARANTEES`: a consumer's ``isolation.level`` other than ``read_committed``,
  ``enable.auto.commit=true``, a ``transactional.id`` of the user's, ``enable.idempotence=false``);
- the Java client's names are made librdkafka's (:mod:`controlmsg.kafka.java_settings`:
  ``sasl.jaas.config``, JKS and PKCS12 stores, ...), which :func:`for_client` does again for settings
  that reach a client some other way (a Spark task's copy of the options converts the stores on its own
  machine).

Every other setting passes to the clients untouched: nothing is filtered out, and a setting librdkafka does
not know is an error that names it (and the file line it came from). :func:`for_client` only leaves out the
settings librdkafka defines for the *other* kind of client (a consumer's ``isolation.level`` on a
producer), which it would ignore with a warning, and adds the one thing every client controlmsg makes
shares: librdkafka's own log lines (``FAIL`` when a broker is unreachable, ...) go to the Python logger
:data:`CLIENT_LOGGER` (``controlmsg.kafka.client``) instead of straight to stderr, so an application
decides where they land. They are served by the client's ``poll``/``consume``/``flush`` calls.

When no setting names ``bootstrap.servers``, they are, in this order: ``$KAFKA_BOOTSTRAP_SERVERS``, then
what the caller's ``default_servers`` gives (:func:`resolve_bootstrap_servers`). The ``controlmsg`` command,
the example jobs and the benchmarks pass the local broker's address
(:func:`controlmsg.clusters.local_address.local_bootstrap_servers`: the local broker if one is running,
and, only where the caller asks for it (demos), that local broker started on the spot). The local clusters
are a layer above this one: this module never imports them, the caller hands the fallback in.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Literal

from controlmsg.errors import BrokerError, ConfigError
from controlmsg.kafka.java_settings import translate
from controlmsg.kafka.properties import read_properties, read_properties_lines, write_properties

__all__ = [
    "CLIENT_LOGGER",
    "CONSUMER_ONLY",
    "GUARANTEES",
    "PRODUCER_ONLY",
    "DefaultServers",
    "add_client_options",
    "check_guarantees",
    "check_settings",
    "client_config",
    "client_config_from_args",
    "flag",
    "for_client",
    "normalise",
    "parse_settings",
    "read_properties",
    "read_properties_lines",
    "resolve_bootstrap_servers",
    "worker_logging",
    "write_properties",
]

DefaultServers = Callable[[], str | None]
"""The fallback a caller of :func:`resolve_bootstrap_servers` hands in: called with no argument, returns the
bootstrap servers or ``None``, may raise :class:`~controlmsg.errors.BrokerError` that says why there are none
(e.g. :func:`controlmsg.clusters.local_address.local_bootstrap_servers`)."""

# The settings librdkafka defines for one kind of client only (its CONFIGURATION.md, column C/P), and the
# Python client's own callbacks of one kind.
CONSUMER_ONLY: Final = frozenset({
    "auto.commit.enable", "auto.commit.interval.ms", "auto.offset.reset", "check.crcs",
    "consume.callback.max.messages", "consume_cb", "coordinator.query.interval.ms", "enable.auto.commit",
    "enable.auto.offset.store", "enable.partition.eof", "fetch.error.backoff.ms", "fetch.max.bytes",
    "fetch.message.max.bytes", "fetch.min.bytes", "fetch.queue.backoff.ms", "fetch.wait.max.ms", "group.id",
    "group.instance.id", "group.protocol", "group.protocol.type", "group.remote.assignor",
    "heartbeat.interval.ms", "isolation.level", "max.partition.fetch.bytes", "max.poll.interval.ms",
    "max.poll.records", "offset.store.method", "offset.store.path", "offset.store.sync.interval.ms",
    "offset_commit_cb", "partition.assignment.strategy", "queued.max.messages.kbytes", "queued.min.messages",
    "rebalance_cb", "session.timeout.ms", "share.acknowledgement.mode", "on_commit",
})
PRODUCER_ONLY: Final = frozenset({
    "acks", "batch.num.messages", "batch.size", "compression.codec", "compression.level", "compression.type",
    "delivery.report.only.error", "delivery.timeout.ms", "dr_cb", "dr_msg_cb", "enable.gapless.guarantee",
    "enable.idempotence", "linger.ms", "message.send.max.retries", "message.timeout.ms", "msg_order_cmp",
    "partitioner", "partitioner_cb", "produce.offset.report", "queue.buffering.backpressure.threshold",
    "queue.buffering.max.kbytes", "queue.buffering.max.messages", "queue.buffering.max.ms", "queuing.strategy",
    "request.required.acks", "request.timeout.ms", "retries", "sticky.partitioning.linger.ms",
    "transaction.timeout.ms", "transactional.id", "on_delivery",
})


GUARANTEES: Final = {
    "isolation.level": (frozenset({"read_committed"}),
                        "controlmsg reads read_committed only (a reader must never see a write that was aborted: "
                        "a failed task's attempt); remove it"),
    "enable.auto.commit": (frozenset({"false"}),
                           "controlmsg never commits a reader's offsets to a group: its position is in its checkpoint "
                           "(consume --checkpoint, a query's checkpointLocation); remove it"),
    "auto.commit.enable": (frozenset({"false"}),
                           "controlmsg never commits a reader's offsets to a group: its position is in its checkpoint "
                           "(consume --checkpoint, a query's checkpointLocation); remove it"),
    "transactional.id": (frozenset(),
                         "controlmsg gives each writing task a transactional id of its own (so that a retried task "
                         "fences its earlier attempt); one shared by every writer would fence them all; remove it"),
    "enable.idempotence": (frozenset({"true"}),
                           "controlmsg's transactional writes need idempotence (a write retried after a broker "
                           "failure must not be duplicated); remove it"),
}
"""Setting -> (the values that pass, why any other is refused and what to do): the settings a user gives
that would break controlmsg's guarantees, as Spark's Kafka source refuses its own list."""


def check_guarantees(config: Mapping[str, Any], origin: Mapping[str, str] | None = None) -> None:
    """Raise :class:`ConfigError` for the first setting of :data:`GUARANTEES` in ``config`` with a value
    that does not pass (compared lower-cased), naming it and where it came from (``origin``)."""
    for key, (passing, why) in GUARANTEES.items():
        if key in config and str(config[key]).strip().lower() not in passing:
            where = f" (from {origin[key]})" if origin and key in origin else ""
            raise ConfigError(f"Kafka client setting {key!r}{where} refused: {why}")


def normalise(config: Mapping[str, Any], origin: Mapping[str, str] | None = None) -> tuple[dict[str, Any],
                                                                                           dict[str, str]]:
    """The settings a user gave (``config``; ``origin``: setting -> where it came from) as the clients
    take them: :func:`check_guarantees`, then the Java client's names translated
    (:func:`controlmsg.kafka.java_settings.translate`). Returns the settings and their origins. Blocks only
    to convert a JKS store (keytool). Raises :class:`ConfigError` naming the setting."""
    check_guarantees(config, origin)
    return translate(config, origin)


# What varies between two log lines that say the same thing: timings, client instance numbers.
_VARYING: Final = re.compile(r"after \d+ms|#(?:producer|consumer)-\d+|\d+(?:\.\d+)?\s?ms")


class RepeatFilter(logging.Filter):
    """Lets a log line through once per ``every`` seconds per kind of line (its text without timings and
    client instance numbers: the same refused connection to the same broker); the next one that passes
    says how many were held back. A broker that restarts makes librdkafka log a refused connection every
    few milliseconds per client; one line per ten seconds tells the same story. Thread-safe enough for
    logging (a lost count under a race is harmless)."""

    def __init__(self, every: float = 10.0) -> None:
        super().__init__()
        self.every = every
        self._last: dict[str, tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno <= logging.DEBUG:  # asked for (``-X debug=...``): every line counts
            return True
        text = record.getMessage()
        kind = record.name + _VARYING.sub("", text)[:300]
        now = time.monotonic()
        seen = self._last.get(kind)
        if seen is not None and now - seen[0] < self.every:
            self._last[kind] = (seen[0], seen[1] + 1)
            return False
        if len(self._last) > 1000:
            self._last.clear()
        self._last[kind] = (now, 0)
        if seen is not None and seen[1]:
            record.msg, record.args = f"{text} ({seen[1]} like it in the last {now - seen[0]:.0f} s)", None
        return True


CLIENT_LOGGER: Final = logging.getLogger("controlmsg.kafka.client")
"""Where librdkafka's log lines of every client made from :func:`for_client` go (syslog levels mapped to
logging's: ``%3|...|FAIL|...`` is an ERROR record ``FAIL [rdkafka#consumer-1] ...``), each kind of line
at most once per 10 s (:class:`RepeatFilter`)."""
CLIENT_LOGGER.addFilter(RepeatFilter())


def worker_logging() -> None:
    """In a process that has set up no logging (a Spark Python worker), send :data:`CLIENT_LOGGER`'s
    lines to stderr, which Spark keeps in the executor's log (in local mode, the application's own
    stderr): every level, so the lines of ``-X debug=...`` appear there too. Idempotent; leaves a process
    whose logging is configured alone."""
    if CLIENT_LOGGER.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s pid %(process)d %(name)s: %(message)s"))
    CLIENT_LOGGER.addHandler(handler)
    CLIENT_LOGGER.setLevel(logging.DEBUG)
    CLIENT_LOGGER.propagate = False


def for_client(config: Mapping[str, Any], kind: Literal["producer", "consumer", "admin"]) -> dict[str, Any]:
    """``config`` for a client of ``kind``: everything, except the settings librdkafka defines for the other
    kinds only (an admin client takes neither kind's), with ``logger`` set to :data:`CLIENT_LOGGER` unless
    ``config`` names one, ``enable.sparse.connections`` false unless ``config`` sets it (see below), and
    ``error_cb`` a new :class:`~controlmsg.kafka.refusals.ConnectionWatch` (which calls an ``error_cb`` of
    ``config`` first): a cluster that refuses the client (authentication, TLS, a listener of another
    ``security.protocol``, an address that does not answer) raises
    :class:`~controlmsg.errors.ClusterRefused` from the client's calls within seconds. The Java client's
    settings are translated first (:func:`~controlmsg.kafka.java_settings.translate`: a no-op for settings
    :func:`normalise` made; raises :class:`ConfigError`). Unknown settings pass, so librdkafka names them.
    Every Consumer, Producer and AdminClient controlmsg creates takes its settings from here."""
    from controlmsg.kafka.refusals import ConnectionWatch

    drop = (PRODUCER_ONLY if kind == "consumer" else CONSUMER_ONLY if kind == "producer"
            else PRODUCER_ONLY | CONSUMER_ONLY)
    conf = {k: v for k, v in translate(config)[0].items() if k not in drop}
    conf.setdefault("logger", CLIENT_LOGGER)
    # librdkafka's sparse connections (its default) make each new client wait to connect before its first
    # answer, most of a write task's Kafka calls (docs/PERFORMANCE.md, "The cost of a write task"). A client
    # then opens a connection to every broker it knows of; set it to true to go back.
    conf.setdefault("enable.sparse.connections", False)
    given = conf.get("error_cb")
    if isinstance(given, ConnectionWatch):  # the settings of another client of ours: a watch of its own
        given = given.chained
    conf["error_cb"] = ConnectionWatch(conf, given, unreachable=kind == "admin")
    return conf


def flag(config: Mapping[str, Any], name: str) -> bool:
    """The boolean setting ``name`` of ``config`` as librdkafka reads it: ``True``/``False``, or a string
    ``true``/``t``/``1`` or ``false``/``f``/``0`` (any case); absent is false. So the string ``"false"`` (from a
    properties file or ``-X``) is false, where a plain truth test would take it for true. Raises ConfigError
    for any other value, naming the setting."""
    value = config.get(name, False)
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "t", "1"):
        return True
    if text in ("false", "f", "0"):
        return False
    raise ConfigError(f"{name}={value!r}: expected true or false")


def parse_settings(pairs: Sequence[str]) -> dict[str, str]:
    """``-X key=value`` arguments as a dict (a later key wins). Raises :class:`ConfigError` for one
    without ``=`` or with an empty key."""
    settings: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"-X {pair.split('=')[0]!r}: expected key=value (a librdkafka setting)")
        settings[key.strip()] = value.strip()
    return settings


def check_settings(config: Mapping[str, Any], origin: Mapping[str, str] | None = None) -> None:
    """Let librdkafka judge every setting (names and values) by building a producer and a consumer from
    them, neither used. Raises :class:`ConfigError` that names the setting and where it came from
    (``origin``: setting -> e.g. ``"client.properties"``)."""
    from confluent_kafka import Consumer, KafkaException, Producer

    kinds: tuple[Literal["producer", "consumer"], ...] = ("producer", "consumer")
    for kind in kinds:
        conf = {**for_client(config, kind), "log_level": 0}
        try:
            if kind == "producer":
                Producer(conf)
            else:
                Consumer({**conf, "group.id": conf.get("group.id", "controlmsg-settings-check")}).close()
        except KafkaException as exc:
            message = exc.args[0].str() if hasattr(exc.args[0], "str") else str(exc)
            named = (next((k for k in config if f'"{k}"' in message), None)  # Invalid value for "k"
                     or next((k for k in config if re.search(rf"(?<![\w.]){re.escape(k)}(?![\w.])", message)),
                             None)  # ssl.ca.location failed: ... (a file that cannot be read)
                     or _culprit(config, kind))
            where = ""
            if named is not None:
                where = f" {named!r}" + (f" (from {origin[named]})" if origin and named in origin else "")
            raise ConfigError(f"Kafka client setting{where}: {message}") from None


def _culprit(config: Mapping[str, Any], kind: Literal["producer", "consumer"]) -> str | None:
    """The first setting librdkafka refuses on its own, for an error message that does not name it."""
    from confluent_kafka import Consumer, KafkaException, Producer

    for key, value in for_client(config, kind).items():
        if key in ("logger", "error_cb"):
            continue
        conf = {key: value, "log_level": 0}
        try:
            if kind == "producer":
                Producer(conf)
            else:
                Consumer({"group.id": "controlmsg-settings-check", **conf}).close()
        except KafkaException:
            return key
    return None


def client_config(
    *,
    bootstrap_servers: str | None = None,
    settings: Sequence[str] = (),
    config_file: str | Path | None = None,
    default_servers: DefaultServers | None = None,
    check: bool = True,
) -> dict[str, str]:
    """The client settings, by the precedence rule of this module: ``config_file`` < ``settings``
    (``-X key=value``) < ``bootstrap_servers``, then through :func:`normalise` (guarantees checked, Java names
    translated); without any ``bootstrap.servers``, :func:`resolve_bootstrap_servers` finds one (the
    environment, then ``default_servers``). ``check``: let librdkafka judge them first
    (:func:`check_settings`). Raises :class:`ConfigError` or :class:`BrokerError`."""
    config: dict[str, str] = {}
    origin: dict[str, str] = {}
    if config_file is not None:
        from_file, lines = read_properties_lines(config_file)
        config.update(from_file)
        origin.update({key: f"{config_file}:{lines[key]}" for key in from_file})
    extra = parse_settings(settings)
    config.update(extra)
    origin.update(dict.fromkeys(extra, "-X"))
    config, origin = normalise(config, origin)
    if bootstrap_servers or not config.get("bootstrap.servers"):
        config["bootstrap.servers"] = resolve_bootstrap_servers(bootstrap_servers, default_servers=default_servers)
    if check:
        check_settings(config, origin)
    return config


STARTS_LOCAL_BROKER_HELP: Final = ("the Kafka cluster (default: bootstrap.servers of -X or --kafka-config, else "
                                   "$KAFKA_BOOTSTRAP_SERVERS, else the local broker, started if needed)")
"""``--bootstrap-servers`` help of a command whose ``default_servers`` starts the local broker when none runs
(:func:`controlmsg.clusters.local_address.local_bootstrap_servers` with ``start=True``)."""


def add_client_options(parser: argparse.ArgumentParser, *, bootstrap_help: str | None = None) -> None:
    """Add ``--bootstrap-servers``, ``-X key=value`` and ``--kafka-config PATH`` to ``parser``. The default
    help of ``--bootstrap-servers`` names the local broker: the fallback of a command that resolves with
    ``default_servers=``:func:`~controlmsg.clusters.local_address.local_bootstrap_servers` (every command of
    this project does); give ``bootstrap_help`` otherwise."""
    parser.add_argument("--bootstrap-servers", metavar="HOST:PORT",
                        help=bootstrap_help or "the Kafka cluster (default: bootstrap.servers of -X or --kafka-config, "
                                               "else $KAFKA_BOOTSTRAP_SERVERS, else the local broker)")
    parser.add_argument("-X", dest="kafka_settings", action="append", default=[], metavar="KEY=VALUE",
                        help="a librdkafka client setting (repeatable), e.g. -X security.protocol=SASL_SSL")
    parser.add_argument("--kafka-config", metavar="PATH",
                        help="a client properties file, read as Kafka's own tools read it (Java's properties format; "
                             "the Java client's names too, e.g. sasl.jaas.config); -X settings override it")


def client_config_from_args(args: argparse.Namespace, *,
                            default_servers: DefaultServers | None = None) -> dict[str, str]:
    """:func:`client_config` from the options :func:`add_client_options` added (``default_servers``: see
    :func:`resolve_bootstrap_servers`)."""
    return client_config(bootstrap_servers=args.bootstrap_servers, settings=args.kafka_settings,
                         config_file=args.kafka_config, default_servers=default_servers)

_ENV: Final = "KAFKA_BOOTSTRAP_SERVERS"


def resolve_bootstrap_servers(given: str | None = None, *, default_servers: DefaultServers | None = None) -> str:
    """Return the Kafka bootstrap servers (``host:port[,...]``) to use.

    ``given`` if it is not empty, else ``$KAFKA_BOOTSTRAP_SERVERS`` if set and not empty, else what
    ``default_servers()`` returns (the caller's fallback, asked only then; ``None`` or an empty string: it
    has none). The ``controlmsg`` command, the jobs and the benchmarks pass
    :func:`controlmsg.clusters.local_address.local_bootstrap_servers`: the local broker started by
    ``controlmsg broker start`` (or started on the spot, where they bind ``start=True``).

    Blocks: only in ``default_servers`` (the local broker's fallback reads a few small files, or waits
    until the broker it starts serves).

    Raises:
        BrokerError: nothing given, the variable is unset and ``default_servers`` is ``None`` or gives
            nothing (the message says to pass an address or set the variable); or what ``default_servers``
            raised (the local broker's fallback: none runs, and how to start one).
    """
    if given is not None and given.strip():
        return given.strip()
    env = os.environ.get(_ENV, "").strip()
    if env:
        return env
    fallback = default_servers() if default_servers is not None else None
    if fallback is not None and fallback.strip():
        return fallback.strip()
    raise BrokerError(f"no Kafka broker configured: no --bootstrap-servers and {_ENV} is not set; pass "
                      f"--bootstrap-servers (or bootstrap.servers in -X or --kafka-config) or set {_ENV}=host:port")
