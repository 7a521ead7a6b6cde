"""The ``controlmsg`` command: a local broker; writing, reading, inspecting and cleaning up after runs.

Exit codes: 0 success (for ``consume``: end of stream, or with ``-e``/``-c`` the end of the partitions/the count; for
``inspect --watch``: interrupted), 1 usage or environment error, 2 protocol error
(stderr names topic, partition, offset and reason), 3 ``consume --timeout`` passed before end of
stream, 4 ``cleanup --delete`` refused (the run is live, or has not ended and ``--force`` was not given;
nothing was deleted), 130 interrupted.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import importlib
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Final, NoReturn, TextIO

import orjson
from confluent_kafka import TIMESTAMP_NOT_AVAILABLE

from controlmsg.clusters.local_address import local_bootstrap_servers
from controlmsg.core.bookkeeping import PartitionEnded, StreamEnded, WatermarkAdvanced
from controlmsg.core.messages import MAX_TIMESTAMP
from controlmsg.core.progress import expected_task_names, waiting_for
from controlmsg.errors import ControlMsgError, ProtocolError
from controlmsg.kafka.admin import add_topic_options, create_topic, topic_settings_from_args
from controlmsg.kafka.reader import DataRecord, Item
from controlmsg.kafka.settings import add_client_options, client_config_from_args

if TYPE_CHECKING:
    from controlmsg.clusters.broker import BrokerHandle

__all__ = ["main"]

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_PROTOCOL = 2
EXIT_TIMEOUT = 3
EXIT_REFUSED = 4
EXIT_INTERRUPTED = 130


def _bootstrap(args: argparse.Namespace) -> dict[str, Any]:
    """The client settings of ``--bootstrap-servers``, ``-X`` and ``--kafka-config`` (see
    :mod:`controlmsg.kafka.settings`); without an address, the local broker's
    (:func:`~controlmsg.clusters.local_address.local_bootstrap_servers`)."""
    return dict(client_config_from_args(args, default_servers=local_bootstrap_servers))


# ---------------------------------------------------------------------------------------------- broker


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


# ---------------------------------------------------------------------------------------------- topics


def _cmd_create_topic(args: argparse.Namespace) -> int:

    topics = topic_settings_from_args(args)
    create_topic(_bootstrap(args), args.topic, args.partitions, replication_factor=topics.replication_factor,
                 topic_config=topics.config)
    print(f"topic {args.topic!r} has {args.partitions} partitions", file=sys.stderr)
    return EXIT_OK


# ---------------------------------------------------------------------------------------------- produce


def _cmd_produce(args: argparse.Namespace) -> int:
    from controlmsg.kafka.writer import ControlWriter

    conf = _bootstrap(args)
    if args.partitions:
        create_topic(conf, args.topic, args.partitions)
    sent = 0
    with ControlWriter(
        conf, args.topic, task_name=args.task_name, task_count=args.task_count, run_id=args.run_id,
        data_headers=True,
    ) as writer:
        stream: TextIO | None = None
        if args.input:
            stream = sys.stdin if args.input == "-" else open(args.input, encoding="utf-8")  # noqa: SIM115
        elif not sys.stdin.isatty():
            stream = sys.stdin
        if stream is not None:
            for lineno, line in enumerate(stream, 1):
                if not line.strip():
                    continue
                try:
                    value = orjson.loads(line)
                except orjson.JSONDecodeError as exc:
                    print(f"input line {lineno} is not JSON: {exc}", file=sys.stderr)
                    return EXIT_ERROR
                key = None
                if args.key_field is not None:
                    field = value.get(args.key_field) if isinstance(value, dict) else None
                    key = None if field is None else str(field)
                writer.send(value, key)
                sent += 1
        if args.watermark is not None:
            writer.send_watermark(args.watermark)
        if args.eos:
            writer.send_end_of_stream()
    parts = [f"{sent} message(s)"]
    if args.watermark is not None:
        parts.append(f"watermark {args.watermark}")
    if args.eos:
        parts.append("end of stream")
    print(f"{args.task_name}: wrote {', '.join(parts)} to {args.topic!r}", file=sys.stderr)
    return EXIT_OK


# ---------------------------------------------------------------------------------------------- consume


def _text(value: bytes) -> str | dict[str, str]:
    """Bytes as a UTF-8 string, or ``{"base64": ...}`` when they are not UTF-8."""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(value).decode()}


def _item_json(item: Item) -> bytes:
    if isinstance(item, DataRecord):
        line: dict[str, Any] = {"kind": "data", "partition": item.partition, "offset": item.offset}
        if item.message is not None:
            kind, ts = item.message.timestamp()
            line["timestamp"] = ts if kind != TIMESTAMP_NOT_AVAILABLE else None
            line["headers"] = [[name, None if value is None else _text(bytes(value))]
                               for name, value in item.message.headers() or ()]
        if item.key is None:
            line["key"] = None
        else:
            try:
                line["key"] = item.key.decode("utf-8")
            except UnicodeDecodeError:
                line["key"] = None
                line["key_base64"] = base64.b64encode(item.key).decode()
        try:
            line["value"] = orjson.loads(item.payload)
        except orjson.JSONDecodeError:
            line["value_base64"] = base64.b64encode(item.payload).decode()
        return orjson.dumps(line)
    if isinstance(item, WatermarkAdvanced):
        return orjson.dumps({"kind": "watermark", "timestamp": item.timestamp})
    if isinstance(item, PartitionEnded):
        return orjson.dumps({"kind": "partition_end", "partition": item.partition})
    assert isinstance(item, StreamEnded)
    return b'{"kind":"end_of_stream"}'


class _Interrupted(Exception):
    pass


def _on_signal(signum: int, frame: FrameType | None) -> NoReturn:
    raise _Interrupted(signal.Signals(signum).name)


_ENDING_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT)
"""What ends a ``consume`` or an ``inspect --watch``. SIGINT too is handled explicitly: a command started in
the background by a non-interactive shell inherits SIGINT ignored, and Python then raises no
KeyboardInterrupt, so ``kill -INT`` would not end it."""


def _handle_ending_signals() -> list[Any]:
    """Install :func:`_on_signal` for :data:`_ENDING_SIGNALS`; returns the previous handlers, in order."""
    return [signal.signal(signum, _on_signal) for signum in _ENDING_SIGNALS]


def _restore_signals(previous: list[Any]) -> None:
    for signum, handler in zip(_ENDING_SIGNALS, previous, strict=True):
        signal.signal(signum, handler)


def _consume_refusal(args: argparse.Namespace) -> str | None:
    """The one-line reason a combination of ``consume`` options is refused, or ``None``."""
    if args.offset is not None and args.checkpoint and Path(args.checkpoint).exists():
        return (f"-o {args.offset} and --checkpoint {args.checkpoint}, which exists: a checkpoint resumes where it "
                "stands; remove -o, or give a new checkpoint file")
    if args.count is not None and args.checkpoint:
        return ("-c and --checkpoint: a checkpoint saved after -c stops could stand past records read but not "
                "printed; leave out one of them")
    if args.count is not None and args.count < 1:
        return f"-c {args.count}: give a count of at least 1"
    return None


def _cmd_consume(args: argparse.Namespace) -> int:
    from controlmsg.kafka.checkpoint import FileCheckpointStore
    from controlmsg.kafka.offsets import parse_start, resolve_start
    from controlmsg.kafka.reader import ControlReader

    refusal = _consume_refusal(args)
    if refusal is not None:
        print(f"error: {refusal}", file=sys.stderr)
        return EXIT_ERROR
    start = parse_start(args.offset) if args.offset is not None else None
    conf = _bootstrap(args)
    if args.exit_at_end:
        conf["enable.partition.eof"] = True
    topic_timeout = args.timeout if args.timeout is not None else 30.0
    partitions = sorted(set(args.partition)) if args.partition else None
    start_offsets = None
    if start is not None or partitions is not None:
        from controlmsg.kafka.admin import wait_for_topic

        count = wait_for_topic(conf, args.topic, topic_timeout)
        missing = [p for p in partitions or () if not 0 <= p < count]
        if missing:
            print(f"error: -p {missing[0]}: topic {args.topic!r} has partitions 0 to {count - 1}", file=sys.stderr)
            return EXIT_ERROR
        if start is not None:
            start_offsets = resolve_start(conf, args.topic, partitions or list(range(count)), start)
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    store = FileCheckpointStore(args.checkpoint) if args.checkpoint else None
    reader = ControlReader(
        conf, args.topic, run_id=args.run_id, checkpoint=store, dead_letter_topic=args.dead_letter_topic,
        stop_at_end=args.until_eos, topic_timeout=topic_timeout, partitions=partitions, start_offsets=start_offsets,
    )
    out = sys.stdout.buffer
    previous = _handle_ending_signals()
    code = EXIT_OK
    printed = 0
    owned_set = set(reader.positions)
    try:
        while True:
            if args.until_eos and reader.tracker.is_ended:
                break
            if args.exit_at_end and reader.partitions_at_end >= owned_set:
                break
            if args.count is not None and printed >= args.count:
                break
            wait = 0.5
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
                if wait <= 0:
                    break
            items = reader.poll(max(wait, 0.0))
            if args.count is not None:
                items = _first_records(items, args.count - printed)
            if items:
                out.write(b"".join(_item_json(i) + b"\n" for i in items))
                out.flush()
                printed += sum(isinstance(i, DataRecord) for i in items)
                reader.save_checkpoint()
        finished = ((args.exit_at_end and reader.partitions_at_end >= owned_set)
                    or (args.count is not None and printed >= args.count))
        if not reader.tracker.is_ended and not finished:
            code = EXIT_TIMEOUT
            print(f"timeout: topic {args.topic!r} has not reached end of stream after {args.timeout:g} s",
                  file=sys.stderr)
            expected = expected_task_names(reader.tracker)
            for status in reader.tracker.statuses():
                if not status.is_ended:
                    print(f"  partition {status.partition}: {waiting_for(status, expected)}", file=sys.stderr)
    except ProtocolError as exc:
        print(f"protocol error: {exc}", file=sys.stderr)
        code = EXIT_PROTOCOL
    except (KeyboardInterrupt, _Interrupted):
        code = EXIT_INTERRUPTED
    finally:
        _restore_signals(previous)
        try:
            reader.save_checkpoint()
        finally:
            reader.close()
    if reader.dead_lettered:
        print(f"{reader.dead_lettered} bad record(s) went to dead-letter topic {args.dead_letter_topic!r}",
              file=sys.stderr)
    return code


def _first_records(items: list[Item], count: int) -> list[Item]:
    """``items`` up to and including the ``count``-th data record (events before it are kept)."""
    seen = 0
    for index, item in enumerate(items):
        if isinstance(item, DataRecord):
            seen += 1
            if seen == count:
                return items[:index + 1]
    return items


# ---------------------------------------------------------------------------------------------- inspect


def _fmt_ts(ts: int | None) -> str:
    if ts is None:
        return "undefined"
    if ts >= MAX_TIMESTAMP:
        return "end"
    return str(ts)


def _cmd_inspect(args: argparse.Namespace) -> int:
    conf = _bootstrap(args)
    if args.watch is None:
        return _inspect_once(conf, args)
    if args.watch <= 0:
        print(f"error: --watch {args.watch:g}: give a number of seconds above 0", file=sys.stderr)
        return EXIT_ERROR
    previous = _handle_ending_signals()
    clear = sys.stdout.isatty()
    try:
        while True:
            started = time.monotonic()
            if clear:
                sys.stdout.write("\x1b[H\x1b[2J")
            print(f"every {args.watch:g} s: {time.strftime('%Y-%m-%d %H:%M:%S')} (Ctrl-C ends)", flush=True)
            _inspect_once(conf, args)
            sys.stdout.flush()
            time.sleep(max(0.0, args.watch - (time.monotonic() - started)))
    except (KeyboardInterrupt, _Interrupted):
        return EXIT_OK  # the one way a watch ends
    finally:
        _restore_signals(previous)


def _inspect_once(conf: dict[str, Any], args: argparse.Namespace) -> int:
    from controlmsg.kafka.inspect import inspect_topic

    report = inspect_topic(conf, args.topic, args.run_id)
    if args.json:
        doc = {
            "topic": report.topic,
            "endOffsets": {str(p): o for p, o in report.end_offsets.items()},
            "userMessages": {str(p): n for p, n in report.user_messages.items()},
            "runs": {
                run.run_id: [
                    {
                        "partition": s.partition,
                        "generation": s.generation,
                        "taskCount": s.task_count,
                        "reportedTasks": sorted(s.reported_tasks),
                        "watermarks": dict(s.watermarks),
                        "endedTasks": sorted(s.ended_tasks),
                        "idleTasks": sorted(s.idle_tasks),
                        "holdingTask": None if s.holding_task is None else dict(
                            zip(("task", "watermark"), s.holding_task, strict=True)),
                        "watermark": None if s.watermark is None else s.watermark,
                        "ended": s.is_ended,
                        "openTasks": s.open_tasks,
                        "unheardTasks": s.unheard_tasks,
                    }
                    for s in run.partitions
                ]
                for run in report.runs.values()
            },
            "newestRun": report.newest_run.run_id if report.newest_run else None,
            "errors": [str(e) for e in report.errors],
        }
        sys.stdout.buffer.write(orjson.dumps(doc, option=0 if args.watch is not None else orjson.OPT_INDENT_2)
                                + b"\n")
        sys.stdout.buffer.flush()
        return EXIT_PROTOCOL if report.errors else EXIT_OK
    print(f"topic {report.topic!r}: {len(report.end_offsets)} partitions, "
          f"{sum(report.user_messages.values())} user messages")
    if not report.runs:
        print("  no control messages" + (f" of run {args.run_id!r}" if args.run_id else ""))
    newest = report.newest_run
    for run in report.runs.values():
        label = " (newest)" if run is newest and len(report.runs) > 1 else ""
        generation = run.tracker.generation
        rescaled = f" (generation {generation})" if generation else ""
        print(f"run {run.run_id!r}{label}: taskCount {run.tracker.task_count}{rescaled}")
        for s in run.partitions:
            marks = ", ".join(f"{t}={ts}" for t, ts in sorted(s.watermarks.items())) or "-"
            ended = ", ".join(sorted(s.ended_tasks)) or "-"
            behind = f" (generation {s.generation})" if s.generation != generation else ""
            line = (f"  partition {s.partition}{behind}: watermark {_fmt_ts(s.watermark)}; reported "
                    f"{len(s.reported_tasks)}/{s.task_count}; watermarks [{marks}]; ended [{ended}]")
            if s.idle_tasks:
                line += f"; idle [{', '.join(sorted(s.idle_tasks))}]"
            if not s.is_ended:
                line += f"; {waiting_for(s, expected_task_names(run.tracker))}"
                holder = s.holding_task
                if holder is not None:
                    others = [ts for t, ts in s.watermarks.items()
                              if t != holder[0] and t not in s.ended_tasks and t not in s.idle_tasks]
                    ahead = min(others) - holder[1] if others else None
                    line += f"; held back by {holder[0]} at {holder[1]}"
                    if ahead is not None:
                        line += f" ({ahead} ms behind the next task)"
            print(line)
    for err in report.errors:
        print(f"error: {err}")
    return EXIT_PROTOCOL if report.errors else EXIT_OK


# ---------------------------------------------------------------------------------------------- metadata


def _cmd_metadata(args: argparse.Namespace) -> int:
    from controlmsg.kafka.admin import cluster_metadata

    meta = cluster_metadata(_bootstrap(args), timeout=args.timeout)
    topics = {name: t for name, t in sorted(meta.topics.items()) if args.topic is None or name == args.topic}
    if args.topic is not None and not topics:
        print(f"error: topic {args.topic!r} does not exist", file=sys.stderr)
        return EXIT_ERROR
    if args.json:
        doc = {
            "controllerId": meta.controller_id,
            "brokers": [{"id": b.id, "host": b.host, "port": b.port} for b in sorted(meta.brokers.values(),
                                                                                    key=lambda b: b.id)],
            "topics": [{"topic": name, "error": None if t.error is None else t.error.str(),
                        "partitions": [{"partition": p.id, "leader": p.leader, "replicas": list(p.replicas),
                                        "isrs": list(p.isrs)} for p in sorted(t.partitions.values(),
                                                                             key=lambda p: p.id)]}
                       for name, t in topics.items()],
        }
        sys.stdout.buffer.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")
        return EXIT_OK
    print(f"Metadata for {'topic ' + repr(args.topic) if args.topic else 'all topics'} "
          f"(from broker {meta.orig_broker_id}: {meta.orig_broker_name}):")
    print(f" {len(meta.brokers)} brokers:")
    for broker in sorted(meta.brokers.values(), key=lambda b: b.id):
        controller = " (controller)" if broker.id == meta.controller_id else ""
        print(f"  broker {broker.id} at {broker.host}:{broker.port}{controller}")
    print(f" {len(topics)} topics:")
    for name, topic in topics.items():
        error = f" error: {topic.error.str()}" if topic.error is not None else ""
        print(f"  topic {name!r} with {len(topic.partitions)} partitions:{error}")
        for part in sorted(topic.partitions.values(), key=lambda p: p.id):
            replicas = ",".join(map(str, part.replicas))
            isrs = ",".join(map(str, part.isrs))
            print(f"    partition {part.id}, leader {part.leader}, replicas: {replicas}, isrs: {isrs}")
    return EXIT_OK


# ---------------------------------------------------------------------------------------------- cleanup


def _cmd_cleanup(args: argparse.Namespace) -> int:
    from controlmsg.kafka.cleanup import describe_run, find_run, live_signs, unended

    conf = _bootstrap(args)
    run = args.run_id
    try:
        found = find_run(conf, run, runs_dir=Path(args.runs_dir), timeout=args.timeout)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    if found.empty:
        print(f"run {run}: nothing found (no topic named after it, no consumer group of its writers, no "
              f"{Path(args.runs_dir) / run})", file=sys.stderr)
        return EXIT_OK
    for line in describe_run(found):
        print(line)
    live = live_signs(conf, found, timeout=args.timeout)
    # A live run's topics are still being written: whether it has ended says nothing yet.
    open_ends = [] if live or (args.delete and args.force) else unended(conf, found, timeout=args.timeout)
    counts = (f"{len(found.topics)} topic(s), {len(found.groups)} consumer group(s), "
              f"{len(found.files)} local path(s)")
    if not args.delete:
        for sign in live:
            print(f"live: {sign}")
        for problem in open_ends:
            print(f"not ended: {problem}")
        verdict = ("live: --delete would be refused" if live else
                   "not live, not ended (stopped or failed): --delete --force deletes it" if open_ends else
                   "not live, ended: --delete deletes it")
        print(f"run {run}: {counts}; {verdict}; nothing deleted", file=sys.stderr)
        return EXIT_OK
    if live:
        more = f" (and {len(live) - 1} more: run without --delete to list them)" if len(live) > 1 else ""
        print(f"refused: run {run} is live, nothing deleted: {live[0]}{more}", file=sys.stderr)
        return EXIT_REFUSED
    if open_ends:
        print(f"refused: run {run} has not ended, nothing deleted: {'; '.join(open_ends)} (stopped or failed: its "
              f"jobs started again with --run-id {run} resume it; --force deletes it anyway)", file=sys.stderr)
        return EXIT_REFUSED
    from controlmsg.kafka.cleanup import delete_run

    delete_run(conf, found, timeout=args.timeout)
    print(f"run {run}: deleted {counts} (its writers' transactional ids, named like their marker groups, "
          "cannot be deleted: the brokers expire them after transactional.id.expiration.ms)", file=sys.stderr)
    return EXIT_OK


# ---------------------------------------------------------------------------------------------- demo


def _cmd_demo(args: argparse.Namespace) -> int:
    from controlmsg.demo import run_demo

    config = client_config_from_args(
        args, default_servers=lambda: local_bootstrap_servers(start=True, port=args.port))
    run_demo(config, sys.stdout, tasks=args.tasks, partitions=args.partitions,
             events=args.events)
    return EXIT_OK


# ---------------------------------------------------------------------------------------------- parser


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


_LOCAL_PARTS: Final = {"kafka": "", "hdfs": "controlmsg.clusters.hdfs", "s3": "controlmsg.clusters.s3",
                       "spark": "controlmsg.clusters.standalone", "connect": "controlmsg.clusters.connect"}
"""``controlmsg local PART``: the module whose ``main`` takes the rest of the command line (kafka: ``broker``)."""


def _cmd_local(args: argparse.Namespace) -> int:
    """One verb family for every local cluster: the part's own command line, with its own help."""
    if args.part == "kafka":
        return main(["broker", *args.rest])
    module = importlib.import_module(_LOCAL_PARTS[args.part])
    code: int = module.main(list(args.rest))
    return code


def build_parser() -> argparse.ArgumentParser:
    """The ``controlmsg`` command line: a sub-command each, whose ``func`` takes the parsed arguments."""
    parser = argparse.ArgumentParser(prog="controlmsg", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True)
    _add_broker_parser(sub)
    _add_local_parser(sub)
    _add_create_topic_parser(sub)
    _add_produce_parser(sub)
    _add_consume_parser(sub)
    _add_inspect_parser(sub)
    _add_metadata_parser(sub)
    _add_cleanup_parser(sub)
    _add_demo_parser(sub)
    return parser


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


def _add_local_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    local = sub.add_parser(
        "local", help="the local clusters: kafka (as `broker`), hdfs, s3, spark (standalone), connect",
        description="Start, stop or ask after a local cluster: `controlmsg local PART ACTION [OPTIONS]`, "
                    "PART one of kafka (the options of `controlmsg broker`), hdfs, s3, spark (a standalone "
                    "master and workers) and connect (a Spark Connect server); `controlmsg local PART --help` "
                    "lists each part's actions and options.")
    local.add_argument("part", choices=sorted(_LOCAL_PARTS))
    local.add_argument("rest", nargs=argparse.REMAINDER, help="ACTION [OPTIONS] of the part")
    local.set_defaults(func=_cmd_local)


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


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except ProtocolError as exc:
        print(f"protocol error: {exc}", file=sys.stderr)
        return EXIT_PROTOCOL
    except ControlMsgError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return code


def run() -> NoReturn:
    """The ``controlmsg`` command as a process: :func:`main`, then the exit with its code once the output is
    flushed, without the interpreter's teardown. A librdkafka client that a refused connection left to the
    garbage collector can crash that teardown (seen: SIGSEGV after the refusal's line was printed, in one of
    several runs), which would turn exit code 1 into -11; nothing is left to do by then."""
    code = main()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
