"""Kafka client settings: where they come from, the one precedence rule, and which client gets which.

Every command, job and demo resolves its client settings here, from (lowest precedence first):

1. ``--kafka-config PATH``: a client properties file, ``key=value`` lines (``key: value`` too), ``#`` or
   ``!`` comments, as Kafka's own tools and kcat's ``-F`` read;
2. ``-X key=value`` (repeatable; a later one wins), librdkafka names, as kcat takes them;
3. ``--bootstrap-servers HOST:PORT``.

Every setting passes to the clients untouched: nothing is filtered out, and a setting librdkafka does not
know is an error that names it (and the file line it came from). :func:`for_client` only leaves out the
settings librdkafka defines for the *other* kind of client (a consumer's ``isolation.level`` on a
producer), which it would ignore with a warning, and adds the one thing every client controlmsg makes
shares: librdkafka's own log lines (``FAIL`` when a broker is unreachable, ...) go to the Python logger
:data:`CLIENT_LOGGER` (``controlmsg.kafka.client``) instead of straight to stderr, so an application
decides where they land. They are served by the client's ``poll``/``consume``/``flush`` calls.

When no setting names ``bootstrap.servers``, they are, in this order: ``$KAFKA_BOOTSTRAP_SERVERS``, the
local broker of :mod:`controlmsg.clusters.broker` if one is running, and, only where the caller asks for
it (demos), that local broker started on the spot. The local broker is a test tool: it is imported only
when nothing else gives an address.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Literal

from controlmsg.errors import BrokerError, ConfigError

__all__ = [
    "CLIENT_LOGGER",
    "CONSUMER_ONLY",
    "PRODUCER_ONLY",
    "add_client_options",
    "check_settings",
    "client_config",
    "client_config_from_args",
    "for_client",
    "parse_settings",
    "read_properties",
    "resolve_bootstrap_servers",
    "worker_logging",
    "write_properties",
]

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
    :class:`~controlmsg.errors.ClusterRefused` from the client's calls within seconds. Unknown settings
    pass, so librdkafka names them. Every Consumer, Producer and AdminClient controlmsg creates takes its
    settings from here."""
    from controlmsg.kafka.refusals import ConnectionWatch

    drop = (PRODUCER_ONLY if kind == "consumer" else CONSUMER_ONLY if kind == "producer"
            else PRODUCER_ONLY | CONSUMER_ONLY)
    conf = {k: v for k, v in config.items() if k not in drop}
    conf.setdefault("logger", CLIENT_LOGGER)
    # librdkafka's sparse connections (its default) open a broker connection only when a request needs
    # one, and a new client then waits ~50 ms (here, on localhost) before its first answer; a transactional
    # producer's first PID request often 500 ms more. Connecting at once cut a write task's Kafka calls
    # from ~230 ms to ~40 ms (benchmarks/bench_task_cost.py). A client opens a connection to every broker
    # it knows of; set it to true to go back.
    conf.setdefault("enable.sparse.connections", False)
    given = conf.get("error_cb")
    if isinstance(given, ConnectionWatch):  # the settings of another client of ours: a watch of its own
        given = given.chained
    conf["error_cb"] = ConnectionWatch(conf, given, unreachable=kind == "admin")
    return conf


def read_properties(path: str | Path) -> dict[str, str]:
    """A client properties file: ``key=value`` (or ``key: value``) per line; blank lines and lines starting
    with ``#`` or ``!`` are skipped; keys and values are stripped. Raises :class:`ConfigError` naming the
    file (and line) when it cannot be read or a line has no separator."""
    source = Path(path)
    try:
        text = source.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the Kafka client properties file {str(source)!r}: {exc}") from None
    settings: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", "!")):
            continue
        cut = min((i for i in (line.find("="), line.find(":")) if i > 0), default=-1)
        if cut < 0:
            raise ConfigError(f"{source}:{number}: expected key=value, got {line[:40]!r}")
        settings[line[:cut].strip()] = line[cut + 1:].strip()
    return settings


def write_properties(config: Mapping[str, str], path: str | Path, comment: str | None = None) -> Path:
    """Write ``config`` as a client properties file that only this user can read (mode 0600, created anew:
    settings may hold secrets), in the format :func:`read_properties` reads. Returns the path."""
    target = Path(path)
    target.unlink(missing_ok=True)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        if comment:
            out.write(f"# {comment}\n")
        out.writelines(f"{key}={value}\n" for key, value in config.items())
    return target


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
    start_local: bool = False,
    local_port: int = 9092,
    check: bool = True,
) -> dict[str, str]:
    """The client settings, by the precedence rule of this module: ``config_file`` < ``settings``
    (``-X key=value``) < ``bootstrap_servers``; without any ``bootstrap.servers``,
    :func:`resolve_bootstrap_servers` finds one. ``check``: let librdkafka judge them first
    (:func:`check_settings`). Raises :class:`ConfigError` or :class:`BrokerError`."""
    config: dict[str, str] = {}
    origin: dict[str, str] = {}
    if config_file is not None:
        config.update(read_properties(config_file))
        origin.update(dict.fromkeys(config, str(config_file)))
    extra = parse_settings(settings)
    config.update(extra)
    origin.update(dict.fromkeys(extra, "-X"))
    if bootstrap_servers or not config.get("bootstrap.servers"):
        config["bootstrap.servers"] = resolve_bootstrap_servers(bootstrap_servers, start_local=start_local,
                                                                local_port=local_port)
    if check:
        check_settings(config, origin)
    return config


STARTS_LOCAL_BROKER_HELP: Final = ("the Kafka cluster (default: bootstrap.servers of -X or --kafka-config, else "
                                   "$KAFKA_BOOTSTRAP_SERVERS, else the local broker, started if needed)")
"""``--bootstrap-servers`` help of a command that resolves with ``start_local=True``."""


def add_client_options(parser: argparse.ArgumentParser, *, bootstrap_help: str | None = None) -> None:
    """Add ``--bootstrap-servers``, ``-X key=value`` and ``--kafka-config PATH`` to ``parser``."""
    parser.add_argument("--bootstrap-servers", metavar="HOST:PORT",
                        help=bootstrap_help or "the Kafka cluster (default: bootstrap.servers of -X or --kafka-config, "
                                               "else $KAFKA_BOOTSTRAP_SERVERS, else the local broker)")
    parser.add_argument("-X", dest="kafka_settings", action="append", default=[], metavar="KEY=VALUE",
                        help="a librdkafka client setting (repeatable), e.g. -X security.protocol=SASL_SSL")
    parser.add_argument("--kafka-config", metavar="PATH",
                        help="a client properties file (key=value lines, # comments); -X settings override it")


def client_config_from_args(args: argparse.Namespace, *, start_local: bool = False,
                            local_port: int = 9092) -> dict[str, str]:
    """:func:`client_config` from the options :func:`add_client_options` added."""
    return client_config(bootstrap_servers=args.bootstrap_servers, settings=args.kafka_settings,
                         config_file=args.kafka_config, start_local=start_local, local_port=local_port)

_ENV: Final = "KAFKA_BOOTSTRAP_SERVERS"


def resolve_bootstrap_servers(given: str | None = None, *, start_local: bool = False, local_port: int = 9092) -> str:
    """Return the Kafka bootstrap servers (``host:port[,...]``) to use.

    ``given`` if it is not empty, else ``$KAFKA_BOOTSTRAP_SERVERS`` if set and not empty, else the address
    of the local broker running from :func:`controlmsg.clusters.broker.default_data_dir`. With
    ``start_local``, when none is running, that broker is started on ``127.0.0.1:local_port`` (a one-line
    note goes to stderr first); it keeps running after the caller exits.

    Blocks: only to start the local broker (``start_local``): until it serves, a few seconds; the first
    time also while Kafka's jars are fetched (see :mod:`controlmsg.clusters.kafka_jars`). Otherwise it reads a
    few small files at most.

    Raises:
        BrokerError: nothing given, the variable is unset and no local broker runs (without
            ``start_local``; the message says how to start one or set the variable), or the local broker
            could not start (see :func:`controlmsg.clusters.broker.start_broker`).
    """
    if given is not None and given.strip():
        return given.strip()
    env = os.environ.get(_ENV, "").strip()
    if env:
        return env
    from controlmsg.clusters import broker, kraft_cluster

    running = broker.broker_status()
    if running is not None:
        return running.bootstrap_servers
    cluster = kraft_cluster.cluster_status()
    if cluster is not None:
        up = [n.address for n in cluster.nodes if n.pid is not None]
        if up:
            return ",".join(up)
    if not start_local:
        raise BrokerError(
            f"no Kafka broker configured: no --bootstrap-servers, {_ENV} is not set and no local broker is "
            f"running from {broker.default_data_dir()}; run `controlmsg broker start` or set "
            f"{_ENV}=host:port"
        )
    print(f"{_ENV} is not set: starting the local Kafka broker on 127.0.0.1:{local_port} (the first time, "
          f"Kafka {broker.KAFKA_VERSION}'s jars are fetched); stop it with: controlmsg broker stop", file=sys.stderr)
    return broker.start_broker(port=local_port).bootstrap_servers
