"""``controlmsg broker`` and ``controlmsg demo``: a local Kafka broker or replicated cluster started, stopped or
asked after, and the demo run against it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from controlmsg.cli.common import EXIT_ERROR, EXIT_OK
from controlmsg.clusters.local_address import local_bootstrap_servers
from controlmsg.kafka.settings import client_config_from_args

if TYPE_CHECKING:
    from controlmsg.clusters.broker import BrokerHandle


def _cmd_broker(args: argparse.Namespace) -> int:
    from controlmsg.clusters import broker, kraft_cluster

    data_dir = Path(args.data_dir) if args.data_dir else None
    if args.brokers > 1 or kraft_cluster.is_cluster_dir(data_dir):
        return _cluster(args, data_dir)
    if args.brokers < 1:
        print("--brokers must be at least 1", file=sys.stderr)
        return EXIT_ERROR
    if args.action == "start":
        handle = broker.start_broker(port=args.port, data_dir=data_dir, security=args.security)
        print(handle.bootstrap_servers)
        print(f"broker pid {handle.pid}, data in {handle.data_dir}, log {handle.log_path}", file=sys.stderr)
        _print_client_properties(handle)
        return EXIT_OK
    if args.action == "stop":
        stopped = broker.stop_broker(data_dir)
        print("stopped" if stopped else "no broker was running", file=sys.stderr)
        return EXIT_OK
    status = broker.broker_status(data_dir)
    if status is None:
        print("no broker running", file=sys.stderr)
        return EXIT_ERROR
    print(status.bootstrap_servers)
    _print_client_properties(status)
    return EXIT_OK


def _cluster(args: argparse.Namespace, data_dir: Path | None) -> int:
    """``broker start|stop|status`` of a local multi-node cluster (see :mod:`controlmsg.clusters.kraft_cluster`)."""
    from controlmsg.clusters import kraft_cluster

    if args.security != "plaintext":
        print("--security sasl-ssl takes a single broker (--brokers 1); the local cluster is plaintext",
              file=sys.stderr)
        return EXIT_ERROR
    if args.action == "start":
        if args.brokers < 2:
            status = kraft_cluster.cluster_status(data_dir)
            args.brokers = len(status.nodes) if status is not None else 3
        cluster = kraft_cluster.start_kafka_cluster(args.brokers, port=args.port, data_dir=data_dir)
        print(cluster.bootstrap_servers)
        for node in cluster.nodes:
            print(f"node {node.node_id}: {node.address} pid {node.pid}, log {node.log_path}", file=sys.stderr)
        print(f"{len(cluster.nodes)} nodes, replication factor {min(3, len(cluster.nodes))}, min.insync.replicas "
              f"{min(2, len(cluster.nodes))}; data in {cluster.data_dir}", file=sys.stderr)
        return EXIT_OK
    if args.action == "stop":
        stopped = kraft_cluster.stop_kafka_cluster(data_dir)
        print(f"stopped {stopped} node(s)" if stopped else "no node was running", file=sys.stderr)
        return EXIT_OK
    status = kraft_cluster.cluster_status(data_dir)
    running = [] if status is None else [n for n in status.nodes if n.pid is not None]
    if status is None or not running:
        print("no cluster running", file=sys.stderr)
        return EXIT_ERROR
    print(",".join(n.address for n in running))
    down = [str(n.node_id) for n in status.nodes if n.pid is None]
    if down:
        print(f"node(s) {', '.join(down)} of {len(status.nodes)} are down", file=sys.stderr)
    return EXIT_OK


def _print_client_properties(handle: BrokerHandle) -> None:
    """Secured: where the pipeline user's client settings are (stderr; the paths only, never a secret)."""
    pipeline = handle.client_properties.get("pipeline")
    if pipeline is not None:
        others = ", ".join(f"{user}: {path}" for user, path in handle.client_properties.items() if user != "pipeline")
        print(f"SASL_SSL; client settings of user pipeline: --kafka-config {pipeline} ({others})", file=sys.stderr)


def _cmd_demo(args: argparse.Namespace) -> int:
    from controlmsg.demo import run_demo

    config = client_config_from_args(
        args, default_servers=lambda: local_bootstrap_servers(start=True, port=args.port))
    run_demo(config, sys.stdout, tasks=args.tasks, partitions=args.partitions,
             events=args.events)
    return EXIT_OK
