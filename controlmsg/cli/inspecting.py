"""``controlmsg inspect`` and ``controlmsg metadata``: what a topic's partitions know about their upstream tasks
(once, or redrawn until a signal), and the cluster's brokers, topics and partitions; read only, nothing committed."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import orjson

from controlmsg.cli.common import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_PROTOCOL,
    _bootstrap,
    _handle_ending_signals,
    _Interrupted,
    _restore_signals,
)
from controlmsg.core.messages import MAX_TIMESTAMP
from controlmsg.core.progress import expected_task_names, waiting_for


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
