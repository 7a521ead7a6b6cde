"""What the benchmark scripts share: the Kafka cluster of a run.

Imported by the scripts as a sibling module (``python benchmarks/<script>.py`` puts this directory first
on ``sys.path``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from controlmsg.kafka.settings import add_client_options, client_config_from_args, write_properties


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
            config = client_config_from_args(args)
            print(f"broker: {config['bootstrap.servers']} (given)", flush=True)
            yield Cluster(config, write_properties(config, work / "kafka.properties"))
            return
        from controlmsg.testing.broker import start_broker, stop_broker

        data_dir = work / "broker"
        started = time.monotonic()
        handle = start_broker(port=free_port(), data_dir=data_dir)
        print(f"broker: started {handle.bootstrap_servers} ({time.monotonic() - started:.1f} s)", flush=True)
        try:
            config = {"bootstrap.servers": handle.bootstrap_servers}
            yield Cluster(config, write_properties(config, work / "kafka.properties"))
        finally:
            stop_broker(data_dir)
    finally:
        shutil.rmtree(work, ignore_errors=True)

