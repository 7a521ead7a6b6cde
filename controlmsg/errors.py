"""The one family of errors controlmsg raises.

Everything controlmsg raises on purpose derives from :class:`ControlMsgError`. Errors about a record
(:class:`ProtocolError` and its subclasses) carry a :class:`Location`: topic, partition and offset, as far
as the raiser knows them. The pure core does not know where a record came from, so it raises with what it
was given; the Kafka adapters pass the full location in. Third-party errors (confluent-kafka, orjson) are
translated at one boundary each and chained with ``from``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "BrokerError",
    "CheckpointError",
    "ClusterRefused",
    "ConfigError",
    "ControlMsgError",
    "DecodeError",
    "DeliveryError",
    "LocalClusterError",
    "Location",
    "ProtocolError",
    "ProtocolViolation",
    "ReadError",
    "TopicError",
    "UnsupportedVersion",
    "WatermarkNotFollowed",
]


@dataclass(frozen=True, slots=True)
class Location:
    """Where a record sits: any field may be unknown (``None``) to the code that raises."""

    topic: str | None = None
    partition: int | None = None
    offset: int | None = None

    def __str__(self) -> str:
        parts = []
        if self.topic is not None:
            parts.append(f"topic {self.topic!r}")
        if self.partition is not None:
            parts.append(f"partition {self.partition}")
        if self.offset is not None:
            parts.append(f"offset {self.offset}")
        return ", ".join(parts) if parts else "unknown location"


class ControlMsgError(Exception):
    """Root of every error controlmsg raises on purpose."""


class ProtocolError(ControlMsgError):
    """A record breaks the wire format or the protocol. ``reason`` says how, ``location`` where."""

    def __init__(self, reason: str, location: Location | None = None) -> None:
        self.reason = reason
        self.location = location if location is not None else Location()
        super().__init__(f"{self.location}: {reason}")

    def at(self, location: Location) -> ProtocolError:
        """Return the same error with ``location`` filled in (fields already known are kept)."""
        merged = Location(
            self.location.topic if self.location.topic is not None else location.topic,
            self.location.partition if self.location.partition is not None else location.partition,
            self.location.offset if self.location.offset is not None else location.offset,
        )
        err = type(self)(self.reason, merged)
        err.__cause__ = self.__cause__
        return err


class DecodeError(ProtocolError):
    """The bytes are not a valid envelope: empty value, unknown type byte, broken or ill-typed JSON."""


class UnsupportedVersion(DecodeError):
    """A control message of a protocol version this reader does not know."""


class ProtocolViolation(ProtocolError):
    """A well-formed control message that contradicts the run: taskCount disagrees, too many tasks."""


class DeliveryError(ControlMsgError):
    """Kafka did not accept records the writer produced (delivery report error, or flush timed out)."""


class CheckpointError(ControlMsgError):
    """A checkpoint cannot be read, or belongs to another topic or layout than the reader's."""


class ConfigError(ControlMsgError):
    """Client settings that cannot be used: an unreadable properties file, a malformed ``-X``, a setting
    librdkafka does not know or a value it refuses. The message names the setting and where it came from."""


class LocalClusterError(ControlMsgError):
    """A local cluster of :mod:`controlmsg.clusters` (a Kafka broker, HDFS, an S3 endpoint, a Spark
    standalone cluster) or the jars it runs from cannot be fetched, verified, started, reached or stopped.
    The message names the cluster, what failed and why, with the tail of its log where there is one."""


class BrokerError(LocalClusterError):
    """The local Kafka broker cannot be fetched, started, reached or stopped."""


class TopicError(ControlMsgError):
    """A topic cannot be created, found or described."""


class ReadError(ControlMsgError):
    """Kafka reported an error while reading (other than a protocol error in a record)."""


class ClusterRefused(ControlMsgError):
    """The cluster refused the client itself, so no request can pass: SASL authentication failed (a wrong
    user name or password), a SASL mechanism the broker does not offer, a broker certificate the client
    does not trust or that does not name the host it was reached by, a listener that speaks another
    ``security.protocol`` than the client's, or (after a short grace) a broker
    address that does not resolve or refuses connections. One line: what was refused, by which broker,
    for which principal, and what to check; never a secret. Raised by every waiting call of a client
    controlmsg made (:mod:`controlmsg.kafka.refusals`)."""

    def __init__(self, what: str, broker: str, principal: str | None, detail: str, check: str) -> None:
        self.what = what
        self.broker = broker
        self.principal = principal
        self.detail = detail
        self.check = check
        who = f", principal {principal}" if principal else ""
        super().__init__(f"{what} (broker {broker}{who}): {detail}; check {check}")


class WatermarkNotFollowed(ControlMsgError):
    """Spark's event-time watermark in a micro-batch of a query over a controlmsg stream read with watermark
    rows is not the reconciled watermark that the stream had given it by the micro-batch before (what
    :func:`controlmsg.spark.with_watermark` makes it), or the Spark in use does not read the metadata key
    ``with_watermark`` marks the event-time column with. ``with_watermark`` relies on Spark internals (its
    optimizer keeping one filter above the watermark node, the key ``spark.watermarkDelayMs``) that a Spark
    version may change: the message names the Spark version, the micro-batch, both watermarks and what to do.
    ``spark_version`` is the version."""

    def __init__(self, message: str, spark_version: str) -> None:
        self.spark_version = spark_version
        super().__init__(message)
