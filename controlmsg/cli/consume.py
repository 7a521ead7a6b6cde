"""``controlmsg consume``: a topic read through the reconciling reader, its data records and events printed as
JSON lines, ended by end of stream, the partitions' ends, a count, a timeout or a signal."""

from __future__ import annotations

import argparse
import base64
import sys
import time
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import TIMESTAMP_NOT_AVAILABLE

from controlmsg.cli.common import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PROTOCOL,
    EXIT_TIMEOUT,
    _bootstrap,
    _handle_ending_signals,
    _Interrupted,
    _restore_signals,
    _Stopping,
)
from controlmsg.core.events import PartitionEnded, StreamEnded, WatermarkAdvanced
from controlmsg.core.progress import expected_task_names, waiting_for
from controlmsg.errors import ProtocolError
from controlmsg.kafka.data_records import DataRecord
from controlmsg.kafka.reader import Item


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


def _consume_refusal(args: argparse.Namespace) -> str | None:
    """The one-line reason a combination of ``consume`` options is refused, or ``None``."""
    if args.offset is not None and args.checkpoint and Path(args.checkpoint).exists():
        return (f"-o {args.offset} and --checkpoint {args.checkpoint}, which exists: a checkpoint resumes where it "
                "stands; remove -o, or give a new checkpoint file")
    if args.count is not None and args.checkpoint:
        return ("-c and --checkpoint: a checkpoint saved after -c stops could stand past records read but not "
                "printed; leave out one of them")
    if args.count is not None and args.group_id:
        return ("-c and --group-id: the offsets committed after -c stops could stand past records read but not "
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
        group_id=args.group_id,
    )
    out = sys.stdout.buffer
    # A signal is acted on between batches only: one that landed between a poll and the write of what it
    # returned would leave a checkpoint past lines never printed (a restart would then skip them).
    stopping = _Stopping()
    previous = _handle_ending_signals(stopping.note)
    code = EXIT_OK
    printed = 0
    owned_set = set(reader.positions)
    try:
        while True:
            stopping.check()
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
