"""What the benchmark scripts share: the Kafka cluster of a run.

Imported by the scripts as a sibling module (``python benchmarks/<script>.py`` puts this directory first
on ``sys.path``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from controlmsg.clusters.local_address import local_bootstrap_servers
from controlmsg.clusters.processes import free_ports
from controlmsg.kafka.settings import add_client_options, client_config_from_args, write_properties

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from controlmsg.kafka import Item

DAY_MS = 86_400_000
EVENTS_START_MS = 1_764_547_200_000  # 2025-12-01T00:00:00Z, the first day of the synthetic events


@dataclass(frozen=True)
class Cluster:
    """The cluster a benchmark runs against: its client settings, and the same settings in a properties
    file (0600) for the jobs the benchmark starts, so that no secret is on a command line."""

    config: dict[str, str]
    properties: Path

    @property
    def servers(self) -> str:
        return self.config["bootstrap.servers"]


def add_cluster_options(parser: argparse.ArgumentParser) -> None:
    """``--bootstrap-servers``, ``-X key=value`` and ``--kafka-config PATH``, as every controlmsg command."""
    add_client_options(parser, bootstrap_help="the Kafka cluster (default: bootstrap.servers of -X or "
                                              "--kafka-config, else $KAFKA_BOOTSTRAP_SERVERS, else a broker "
                                              "started for the run)")


def _given(args: argparse.Namespace) -> bool:
    if args.bootstrap_servers or args.kafka_config or os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip():
        return True
    return any(s.partition("=")[0].strip() == "bootstrap.servers" for s in args.kafka_settings)


@contextlib.contextmanager
def kafka_cluster(args: argparse.Namespace) -> Iterator[Cluster]:
    """The cluster the options (or ``$KAFKA_BOOTSTRAP_SERVERS``) name, resolved as every controlmsg command
    does; without one, a local broker started here on a free port for the run (stopped and its data
    removed on exit). Says which on stdout."""
    work = Path(tempfile.mkdtemp(prefix="controlmsg-bench-kafka-"))
    try:
        if _given(args):
            config = client_config_from_args(args, default_servers=local_bootstrap_servers)
            print(f"broker: {config['bootstrap.servers']} (given)", flush=True)
            yield Cluster(config, write_properties(config, work / "kafka.properties"))
            return
        from controlmsg.clusters.broker import start_broker, stop_broker

        data_dir = work / "broker"
        started = time.monotonic()
        handle = start_broker(port=free_ports(), data_dir=data_dir)
        print(f"broker: started {handle.bootstrap_servers} ({time.monotonic() - started:.1f} s)", flush=True)
        try:
            config = {"bootstrap.servers": handle.bootstrap_servers}
            yield Cluster(config, write_properties(config, work / "kafka.properties"))
        finally:
            stop_broker(data_dir)
    finally:
        shutil.rmtree(work, ignore_errors=True)



class PlainReader:
    """Reads every partition of a topic of plain records (not controlmsg envelopes, e.g. what Spark's own
    Kafka connector writes) from the beginning, ``read_committed``, with the surface of ``ControlReader``
    that ``bench_streaming.Observer`` uses: :meth:`poll` gives each record as a ``DataRecord`` whose
    payload is the record's value; there are no control messages, so never a watermark or an end of
    stream. Raises ``ReadError`` when Kafka reports an error."""

    def __init__(self, config: dict[str, str], topic: str, partitions: int, batch_size: int = 2000) -> None:
        import uuid

        from confluent_kafka import Consumer, TopicPartition

        from controlmsg.kafka.settings import for_client

        self.topic = topic
        self.batch_size = batch_size
        self._positions = dict.fromkeys(range(partitions), -2)  # -2: librdkafka's OFFSET_BEGINNING
        self._consumer = Consumer({"group.id": f"controlmsg-bench-plain-{uuid.uuid4().hex}",
                                   "enable.auto.commit": False, "isolation.level": "read_committed",
                                   "auto.offset.reset": "earliest", "fetch.queue.backoff.ms": 10,
                                   **for_client(config, "consumer")})
        self._consumer.assign([TopicPartition(topic, p, o) for p, o in self._positions.items()])

    @property
    def positions(self) -> dict[int, int]:
        """Next offset to read per partition (negative: from the beginning)."""
        return dict(self._positions)

    def poll(self, timeout: float = 1.0) -> list[Item]:
        """Consume one batch, waiting up to ``timeout`` s for the first record; its records, in order."""
        from controlmsg.errors import ReadError
        from controlmsg.kafka import DataRecord

        items: list[Item] = []
        for msg in self._consumer.consume(self.batch_size, timeout):
            if msg.error() is not None:
                raise ReadError(f"reading {self.topic!r}: {msg.error()}")
            partition, offset = msg.partition(), msg.offset()
            assert partition is not None and offset is not None  # a record's, not an error's
            self._positions[partition] = offset + 1
            key = msg.key()
            items.append(DataRecord(partition, offset, None if key is None else bytes(key), bytes(msg.value() or b""),
                                    msg))
        return items

    def close(self) -> None:
        self._consumer.close()


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, as text ("?" where the system has none)."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"


def delete_topics(config: dict[str, str], topics: list[str]) -> None:
    """Delete ``topics``, warning on stderr about any that cannot be deleted."""
    if not topics:
        return
    import sys

    from confluent_kafka.admin import AdminClient

    settings: dict[str, Any] = dict(config)
    admin = AdminClient(settings)  # keep it alive until the futures resolve
    futures = admin.delete_topics(topics, operation_timeout=30)
    for name, f in futures.items():
        try:
            f.result(30)
        except Exception as exc:
            print(f"warning: cannot delete topic {name}: {exc}", file=sys.stderr)


def synthetic_events(spark: SparkSession, events: int, keys: int, days: int = 30) -> DataFrame:
    """``events`` synthetic click events: ``user`` (``user-<n>``, ``keys`` users skewed towards low
    numbers: n = keys * U^3), ``event_time`` (epoch ms, uniform over ``days`` days from
    :data:`EVENTS_START_MS`), ``amount`` (2% null) and ``items`` (1..5). Deterministic (fixed seeds)."""
    from pyspark.sql import functions as F

    return spark.range(events, numPartitions=4).select(
        F.concat(F.lit("user-"), (F.pow(F.rand(7), F.lit(3)) * keys).cast("int").cast("string")).alias("user"),
        (F.lit(EVENTS_START_MS) + (F.rand(11) * days * DAY_MS).cast("long")).alias("event_time"),
        F.when(F.rand(13) < 0.02, F.lit(None)).otherwise(F.round(F.rand(17) * 100, 2)).alias("amount"),
        (F.rand(19) * 5 + 1).cast("int").alias("items"),
    )


def counts(text: str) -> list[int]:
    """An argparse type: one count or several, comma-separated (``100000,1_000_000``), each at least 1."""
    try:
        values = [int(part.replace("_", "")) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a count or a comma-separated list of counts: {text!r}") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"every count must be at least 1: {text!r}")
    return values
