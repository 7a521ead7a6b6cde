"""The sub-commands' command lines: each one's options, and the command it runs (its ``func``); ``--version``.
The parser itself, and the ``local`` sub-command that runs the command line again, are in :mod:`controlmsg.cli`."""

from __future__ import annotations

import argparse

from controlmsg.cli.broker import _cmd_broker, _cmd_demo
from controlmsg.cli.cleanup import _cmd_cleanup
from controlmsg.cli.consume import _cmd_consume
from controlmsg.cli.inspecting import _cmd_inspect, _cmd_metadata
from controlmsg.cli.writing import _cmd_create_topic, _cmd_produce
from controlmsg.kafka.admin import add_topic_options
from controlmsg.kafka.settings import add_client_options


def _version() -> str:
    """``controlmsg X (confluent-kafka Y, librdkafka Z)``."""
    from importlib.metadata import PackageNotFoundError, version

    import confluent_kafka

    try:
        own = version("controlmsg")
    except PackageNotFoundError:
        own = "unknown (not installed)"
    return (f"controlmsg {own} (confluent-kafka {confluent_kafka.__version__}, "
            f"librdkafka {confluent_kafka.libversion()[0]})")


def _add_kafka_options(p: argparse.ArgumentParser) -> None:
    """The client options and the ``--topic`` of the sub-commands that work on one topic."""
    add_client_options(p)
    p.add_argument("--topic", required=True)


def _add_broker_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    b = sub.add_parser("broker", help="a local Kafka broker, or a local replicated cluster (no Docker needed)")
    b.add_argument("action", choices=["start", "stop", "status"])
    b.add_argument("--port", type=int, default=9092, help="client port (of the first node; node i uses port+i-1)")
    b.add_argument("--brokers", type=int, default=1,
                   help="start: N > 1 starts an N-node KRaft cluster (a controller quorum of N, replication "
                        "factor min(3, N), min.insync.replicas min(2, N)); stop/status find a cluster by itself")
    b.add_argument("--data-dir", help="where the broker keeps its data (default: ~/.cache/controlmsg/broker)")
    b.add_argument("--security", choices=["plaintext", "sasl-ssl"], default="plaintext",
                   help="start: sasl-ssl = SCRAM-SHA-512 over TLS with ACLs; users, passwords, certificates and "
                        "client-<user>.properties files are made in the data directory (default: plaintext)")
    b.set_defaults(func=_cmd_broker)


def _add_create_topic_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    t = sub.add_parser("create-topic", help="create an intermediate topic")
    _add_kafka_options(t)
    t.add_argument("--partitions", type=int, required=True)
    add_topic_options(t)
    t.set_defaults(func=_cmd_create_topic)


def _add_produce_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("produce", help="write user messages and control messages as one upstream task")
    _add_kafka_options(p)
    p.add_argument("--task-name", required=True)
    p.add_argument("--task-count", type=int, required=True)
    p.add_argument("--run-id", default="")
    p.add_argument("--key-field", help="use this field of each JSON object as the message key")
    p.add_argument("--input", help="JSON lines file ('-' for stdin; default: stdin when it is not a terminal)")
    p.add_argument("--watermark", type=int, help="after the messages, write this watermark (ms)")
    p.add_argument("--eos", action="store_true", help="finally, write this task's end of stream")
    p.add_argument("--partitions", type=int, help="create the topic with this many partitions if missing")
    p.set_defaults(func=_cmd_produce)


def _add_consume_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    c = sub.add_parser("consume", help="read a topic, print data and reconciled events as JSON lines")
    _add_kafka_options(c)
    c.add_argument("--run-id", help="follow this run only (default: the run of the first control message)")
    c.add_argument("--until-eos", action="store_true", help="exit 0 once every partition has ended")
    c.add_argument("--timeout", type=float, help="exit 3 if end of stream has not come after SECONDS")
    c.add_argument("--dead-letter-topic", help="send bad records here (reason in a header) instead of failing")
    c.add_argument("--checkpoint", help="resume from and save offsets and bookkeeping to this file")
    c.add_argument("--group-id", metavar="GROUP",
                   help="also commit the offsets read to this consumer group after each batch, for lag tools "
                        "(kafka-consumer-groups, Burrow); nothing reads from it")
    c.add_argument("-o", dest="offset", metavar="OFFSET",
                   help="start at: beginning (the default), end, N (absolute offset), -N (N before the end) or "
                        "s@TIMESTAMP_MS, as kcat -o; not with an existing --checkpoint")
    c.add_argument("-c", dest="count", type=int, metavar="COUNT",
                   help="exit 0 after COUNT data records (as kcat -c); not with --checkpoint")
    c.add_argument("-p", dest="partition", type=int, action="append", metavar="PARTITION",
                   help="read this partition only (repeatable; default: all)")
    c.add_argument("-e", dest="exit_at_end", action="store_true",
                   help="exit 0 once every partition read has reached its end, as kcat -e (not the end of stream: "
                        "that is --until-eos)")
    c.set_defaults(func=_cmd_consume)


def _add_inspect_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    i = sub.add_parser("inspect", help="what each partition knows about its upstream tasks (commits nothing)")
    _add_kafka_options(i)
    i.add_argument("--run-id")
    i.add_argument("--json", action="store_true", help="a JSON document (with --watch: one per line, per redraw)")
    i.add_argument("--watch", type=float, nargs="?", const=2.0, metavar="SECONDS",
                   help="redraw every SECONDS (default 2) until interrupted (Ctrl-C, SIGTERM: exit 0)")
    i.set_defaults(func=_cmd_inspect)


def _add_metadata_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    m = sub.add_parser("metadata", aliases=["list"],
                       help="the cluster: brokers, topics, partitions, leaders, replicas (as kcat -L)")
    add_client_options(m)
    m.add_argument("--topic", help="this topic only")
    m.add_argument("--json", action="store_true")
    m.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                   help="give up after SECONDS (default 10)")
    m.set_defaults(func=_cmd_metadata)


def _add_cleanup_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    k = sub.add_parser(
        "cleanup", help="list what a run left (topics, consumer groups, local files); --delete deletes it",
        description="List what run RUN left behind: the topics named after it (controlmsg-RUN-events, "
                    "-windows, and the streaming jobs' -rejects, -stop, -late, -state; controlmsg-demo-RUN), the "
                    "consumer groups of its writers (commit markers, the streaming ingest's source group) and "
                    "its run directory; say whether it is live or has ended. --delete deletes them.",
        epilog="Live (always refused): a consumer group of the run has members, a partition of one of its topics "
               "has an open transaction, or a process on this machine has --run-id RUN on its command line. Not "
               "ended (refused without --force): a stopped or failed run, which the same command with --run-id "
               "RUN would resume. Exit status: 0 listed or deleted (or nothing found); 1 error; 4 --delete "
               "refused, nothing deleted (one line says why).")
    add_client_options(k)
    k.add_argument("--run-id", required=True, metavar="RUN", help="the run (the pipeline prints it: 'run RUN: ...')")
    k.add_argument("--delete", action="store_true", help="delete what is listed (default: list only)")
    k.add_argument("--force", action="store_true",
                   help="with --delete: delete a run that has not ended (stopped or failed; it can then no longer "
                        "be resumed). A live run is refused even so")
    k.add_argument("--runs-dir", default=".controlmsg/runs", metavar="DIR",
                   help="where the run's directory is (default: .controlmsg/runs, as the pipeline and jobs make it)")
    k.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                   help="give up on a Kafka request after SECONDS (default 60)")
    k.set_defaults(func=_cmd_cleanup)


def _add_demo_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    d = sub.add_parser("demo", help="start the local broker if needed; several tasks -> one consumer to end of stream")
    add_client_options(d)
    d.add_argument("--port", type=int, default=9092, help="port for the local broker if one is started")
    d.add_argument("--tasks", type=int, default=3)
    d.add_argument("--partitions", type=int, default=4)
    d.add_argument("--events", type=int, default=2000, help="events per upstream task")
    d.set_defaults(func=_cmd_demo)
