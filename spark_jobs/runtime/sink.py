"""``python -m spark_jobs.runtime.sink``: window results -> one CSV or JSON-lines file, appended as they
arrive, exactly once across restarts.

The last stage of the streaming pipeline. The batch ``sink`` writes its file once, at end of stream; in
an unbounded run that never comes, so this one appends each result as soon as it is readable in the
windows topic (``read_committed``: after the window task's commit) and ends when the stream does.

It runs in one plain process, without Spark: one file has one writer, and nothing here needs a cluster.

Exactly once, by a checkpoint beside the output (``<output>.sink-checkpoint.json``): input offsets, the
control-message bookkeeping, and **the length of the output file** that belongs to them, saved atomically
after the file has been fsynced. A restart truncates the file to that length and resumes reading at those
offsets, so rows written after the last checkpoint (by a process killed before it could save one) are
cut and written again once, never twice. Rows: ``key, window_start, window_end`` (ISO-8601 UTC, as the
batch sink writes them) ``, count, sum_<col>...`` in the order the windows closed.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

import orjson

from controlmsg.core.codec import decode_json_payload
from controlmsg.core.events import StreamEnded
from controlmsg.errors import CheckpointError, ControlMsgError
from controlmsg.kafka.checkpoint import FileCheckpointStore
from controlmsg.kafka.data_records import DataRecord
from controlmsg.kafka.periodic_log import Progress
from controlmsg.kafka.reader import ControlReader
from controlmsg.kafka.settings import add_client_options
from spark_jobs import description

__all__ = ["build_parser", "checkpoint_path", "iso_ms", "main", "run_stream_sink"]

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


def iso_ms(ms: int) -> str:
    """Epoch ms -> ``YYYY-MM-DDTHH:MM:SSZ``, with ``.SSS`` only when there are milliseconds (the batch
    sink's format, ``spark_jobs.events.iso_utc``)."""
    seconds, millis = divmod(ms, 1000)
    text = (_EPOCH + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{text}.{millis:03d}Z" if millis else f"{text}Z"


def checkpoint_path(output: str | os.PathLike[str]) -> Path:
    """Where the sink keeps its checkpoint for ``output``."""
    out = Path(output)
    return out.with_name(f"{out.name}.sink-checkpoint.json")


def _format(output: str) -> str:
    lower = output.lower()
    if lower.endswith(".csv"):
        return "csv"
    if lower.endswith((".json", ".jsonl", ".ndjson")):
        return "json"
    raise ValueError(f"the streaming sink appends rows as windows close: give a .csv or .jsonl output, not {output!r}")


class _Rows:
    """Formats result records as CSV or JSON lines, in the sink's column order."""

    def __init__(self, fmt: str, sums: Sequence[str]) -> None:
        self.fmt = fmt
        self.columns = ["key", "window_start", "window_end", "count", *(f"sum_{c}" for c in sums)]

    def header(self) -> bytes:
        return self._csv(self.columns) if self.fmt == "csv" else b""

    def row(self, value: Mapping[str, Any]) -> bytes:
        row = {name: value.get(name) for name in self.columns}
        row["window_start"] = iso_ms(int(value["window_start"]))
        row["window_end"] = iso_ms(int(value["window_end"]))
        if self.fmt == "json":
            return orjson.dumps(row) + b"\n"
        return self._csv(["" if v is None else v for v in row.values()])

    @staticmethod
    def _csv(values: Sequence[Any]) -> bytes:
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerow(values)
        return buf.getvalue().encode()


def run_stream_sink(
    config: Mapping[str, Any],
    *,
    input_topic: str,
    output: str,
    run_id: str,
    sums: Sequence[str] = (),
    checkpoint_interval_s: float = 0.5,
    timeout_s: float | None = None,
    stop: Callable[[], bool] | None = None,
    group_id: str | None = None,
) -> dict[str, Any]:
    """Append the window results of ``input_topic`` (run ``run_id``) to ``output`` until end of stream,
    ``stop()`` or ``timeout_s``; resume from the checkpoint beside ``output`` when there is one.

    Returns a summary: ``rows`` written over the whole run (across restarts), ``ended``, ``resumed``,
    ``input_ended_at`` (epoch s when the end of stream was read, or ``None``). Raises ``ValueError`` for
    an output format that cannot be appended, :class:`CheckpointError` when the checkpoint does not fit
    the output file (shorter than the checkpoint says: the file was changed by someone else), and the
    reader's errors (located :class:`~controlmsg.errors.ProtocolError`, ``ReadError``). ``group_id``: a
    consumer group that each checkpoint also reports the offsets read to, for lag tools.
    """
    rows = _Rows(_format(output), sums)
    target = Path(output)
    store = FileCheckpointStore(checkpoint_path(target))
    saved = store.load()
    if saved is not None and saved.extra.get("runId") != run_id:
        raise CheckpointError(f"{store.path} belongs to run {saved.extra.get('runId')!r}, not {run_id!r}: "
                              "remove it (and the output) to start over")
    target.parent.mkdir(parents=True, exist_ok=True)
    length = int(saved.extra["outputBytes"]) if saved is not None else 0
    written = int(saved.extra.get("rows", 0)) if saved is not None else 0
    if saved is not None and not target.exists():
        raise CheckpointError(f"{target} is missing, but its checkpoint {store.path} accounts for {length} bytes "
                              "of it: remove the checkpoint too to start over")
    file = target.open("r+b" if saved is not None else "wb")
    try:
        if file.seek(0, os.SEEK_END) < length:
            raise CheckpointError(f"{target} has {file.tell()} bytes, but its checkpoint {store.path} says "
                                  f"{length}: the output was changed outside the sink")
        file.truncate(length)  # rows written after the last checkpoint are written again below
        file.seek(length)
        if saved is None:
            file.write(rows.header())
        ended_at = saved.extra.get("inputEndedAt") if saved is not None else None
        # Started before its upstream (the pipeline's default order), it waits for the topic as long as for
        # the stream: a busy cluster may take minutes to start the job that creates it.
        topic_wait = timeout_s if timeout_s is not None else 600.0
        with ControlReader(config, input_topic, run_id=run_id, resume_from=saved, topic_timeout=topic_wait,
                           group_id=group_id) as reader:
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            next_save = time.monotonic() + checkpoint_interval_s
            dirty = saved is None
            progress = Progress("stream_sink")
            while not reader.tracker.is_ended:
                if progress.due():
                    progress.upstream(reader.tracker, written)
                if (stop is not None and stop()) or (deadline is not None and time.monotonic() >= deadline):
                    break
                for item in reader.poll(min(0.1, checkpoint_interval_s)):
                    if isinstance(item, DataRecord):
                        file.write(rows.row(decode_json_payload(item.payload)))
                        written += 1
                        dirty = True
                    elif isinstance(item, StreamEnded):
                        ended_at = time.time()
                        dirty = True
                if dirty and (reader.tracker.is_ended or time.monotonic() >= next_save):
                    _save(file, store, reader, run_id, written, ended_at)
                    dirty = False
                    next_save = time.monotonic() + checkpoint_interval_s
            if dirty:
                _save(file, store, reader, run_id, written, ended_at)
            ended = reader.tracker.is_ended
    finally:
        file.close()
    return {"rows": written, "ended": ended, "resumed": saved is not None, "input_ended_at": ended_at,
            "output": str(target)}


def _save(file: Any, store: FileCheckpointStore, reader: ControlReader, run_id: str, rows: int,
          ended_at: float | None) -> None:
    """Make the rows durable, then record how much of the file they fill, with the offsets that produced
    them, in one atomic checkpoint."""
    file.flush()
    os.fsync(file.fileno())
    extra = {"runId": run_id, "outputBytes": file.tell(), "rows": rows, "inputEndedAt": ended_at}
    store.save(replace(reader.checkpoint(), extra=extra))
    reader.report_progress()  # option --group-id: the offsets now checkpointed, for lag tools


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m spark_jobs.runtime.sink", description=description(__doc__))
    p.add_argument("--input-topic", required=True)
    p.add_argument("--output", required=True, help="a .csv or .jsonl file, appended as windows close")
    p.add_argument("--sum", action="append", default=[], help="a summed column, for the column order")
    p.add_argument("--run-id", required=True)
    add_client_options(p)
    p.add_argument("--checkpoint-interval", default="500ms", help="how often the output is made durable")
    p.add_argument("--timeout", type=float, help="stop (checkpointed) after SECONDS without end of stream")
    p.add_argument("--summary", help="write the run summary (JSON) here")
    p.add_argument("--group-id", metavar="GROUP",
                   help="also commit the offsets read to this consumer group at each checkpoint, for lag tools "
                        "(kafka-consumer-groups, Burrow); nothing reads from it")
    p.add_argument("--parent-pid", type=int, metavar="PID",
                   help="stop (as on SIGTERM) once process PID is no longer this one's parent (the pipeline "
                        "passes its own)")
    p.epilog = ("exit status: 0 the stream ended and every row is written; 1 the sink failed; 3 --timeout passed "
                "first (checkpointed); 143 stopped by SIGTERM, 130 by SIGINT (Ctrl-C): the rows read so far are "
                "made durable and checkpointed first, and the same command resumes there (a stop takes one poll, "
                "at most 0.1 s, plus an fsync; at most 15 s, then the process exits anyway)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from controlmsg.streaming import Stopper, StopRequested, exit_code, signal_name, watch_parent
    from spark_jobs.common import job_logger, kafka_config, write_summary
    from spark_jobs.events import parse_duration

    args = build_parser().parse_args(argv)
    log = job_logger("stream_sink")
    started = time.monotonic()
    stopper = Stopper("stream_sink").install()
    if args.parent_pid is not None:
        watch_parent(args.parent_pid)
    try:
        with stopper.deferring():  # the loop checks stopper.is_set() on every poll, then checkpoints
            summary = run_stream_sink(
                kafka_config(args), input_topic=args.input_topic, output=args.output, run_id=args.run_id,
                sums=args.sum, checkpoint_interval_s=parse_duration(args.checkpoint_interval) / 1000,
                timeout_s=args.timeout, stop=stopper.is_set, group_id=args.group_id)
    except (ControlMsgError, ValueError) as exc:
        print(f"stream_sink: {exc}", file=sys.stderr)
        return 1
    except StopRequested as stop:  # before the output was opened, or a second signal (the checkpoint holds)
        log.info("%s; the same command resumes at the last checkpoint", stop)
        return exit_code(stop.signum)
    finally:
        stopper.uninstall()
    log.info("%d rows in %s%s", summary["rows"], args.output, "" if summary["ended"] else " (stream not ended)")
    write_summary(args.summary, job="stream_sink", seconds=time.monotonic() - started,
                  rows_in=summary["rows"], rows_out=summary["rows"], **summary)
    if not summary["ended"] and stopper.signum is not None:
        log.info("stopped by %s at a checkpoint; the same command resumes there", signal_name(stopper.signum))
        return exit_code(stopper.signum)
    return 0 if summary["ended"] else 3


if __name__ == "__main__":
    sys.exit(main())
