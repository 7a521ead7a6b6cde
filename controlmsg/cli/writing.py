"""``controlmsg create-topic`` and ``controlmsg produce``: an intermediate topic made, and JSON lines written to it
with control messages as one upstream task."""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

import orjson

from controlmsg.cli.common import EXIT_ERROR, EXIT_OK, _bootstrap
from controlmsg.kafka.admin import create_topic, topic_settings_from_args


def _cmd_create_topic(args: argparse.Namespace) -> int:

    topics = topic_settings_from_args(args)
    create_topic(_bootstrap(args), args.topic, args.partitions, replication_factor=topics.replication_factor,
                 topic_config=topics.config)
    print(f"topic {args.topic!r} has {args.partitions} partitions", file=sys.stderr)
    return EXIT_OK


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
