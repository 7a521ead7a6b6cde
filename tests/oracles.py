"""Oracles that share no code with the system under test: nothing here imports ``spark_jobs`` or ``controlmsg``.

**The windowed count of an input file** (:func:`windowed_counts`). The input is read with Python's own
readers (``csv``, ``json``, pyarrow for Parquet), the documented reject rules are applied here
(``spark_jobs/events.py``'s docstring, docs/PIPELINE.md), and the tumbling windows are summed in plain
Python: a bug in the jobs' reader, reject rules, event-time parsing or windowing cannot be in both answers.
The rules, as documented:

* Formats by extension: ``.csv`` (header row; an empty field and ``null_value`` are null; a column whose
  values are all integers is integral, all numbers fractional, as Spark's ``inferSchema`` types them),
  ``.json``/``.jsonl``/``.ndjson`` (JSON lines; a line that is not a JSON object is a row of nulls; a column
  of mixed JSON types holds each value's JSON text, as Spark's inference makes it a string column),
  ``.parquet`` (pyarrow). A directory reads its files in name order.
* Event time: an integer of epoch ms (a number, a whole floating-point number, or a string of digits), an
  ISO-8601 ``YYYY-MM-DD[T ]HH:MM:SS[.fff]`` string with a zone (``Z``, ``+HH:MM``) or without (UTC), or a
  Parquet timestamp. Anything else is unparseable.
* A row with a null key or an unparseable event time is rejected (counted, not in any window).
* Sums: SQL SUM. Null and non-numeric values are skipped, a window with none has a null sum; a column with
  a fractional value anywhere is summed as floating point, else as integers.
* Keys are written as strings: a string as it is, an integer in decimal. (Fractional or timestamp keys are
  not modelled: Java's number formatting is not Python's, so such an input would fail, never pass, here.)

**The wire format** (docs/PROTOCOL.md): :func:`read_run` reads a topic raw with a ``read_committed``
consumer, decodes each envelope (a MessageType byte, then JSON) itself and follows each partition's
watermark by the reader's rules (:class:`PartitionWatermark`). :func:`late_problems` and
:func:`watermark_problems` are the stage chain's oracle over it (see their docstrings).
"""

from __future__ import annotations

import csv
import json
import math
import re
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any, Final

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

__all__ = [
    "END_OF_TIME",
    "PartitionWatermark",
    "Run",
    "Windowed",
    "WireRecord",
    "duration_ms",
    "event_time_ms",
    "iso_ms",
    "late_problems",
    "multiset",
    "read_input",
    "read_output",
    "read_run",
    "watermark_problems",
    "windowed_counts",
]

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_LONG: Final = range(-(2**63), 2**63)
_INTEGER: Final = re.compile(r"[+-]?[0-9]+", re.ASCII)
_NUMBER: Final = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)
_ISO: Final = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})[ T]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,9}))?"
                         r"(Z|[+-][0-9]{2}:[0-9]{2})?", re.ASCII)
_UNITS: Final = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def duration_ms(text: str) -> int:
    """``"15m"`` -> 900000: ``<digits>[ms|s|m|h|d]``, a bare number being milliseconds."""
    match = re.fullmatch(r"\s*([0-9]+)\s*(ms|s|m|h|d)?\s*", text)
    if match is None:
        raise ValueError(f"not a duration: {text!r}")
    return int(match[1]) * _UNITS[match[2] or "ms"]


def iso_ms(ms: int) -> str:
    """Epoch ms -> ``YYYY-MM-DDTHH:MM:SSZ``, ``.SSS`` before the ``Z`` only when there are milliseconds: how
    every sink writes ``window_start`` and ``window_end`` (docs/PIPELINE.md: ISO-8601 UTC)."""
    text = (_EPOCH + timedelta(milliseconds=ms)).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{text}.{ms % 1000:03d}Z" if ms % 1000 else f"{text}Z"


def event_time_ms(value: Any) -> int | None:
    """An event time in epoch ms by the documented rules (module docstring), or ``None``: unparseable."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value in _LONG else None
    if isinstance(value, float | Decimal):
        whole = math.isfinite(value) and value == int(value)
        return int(value) if whole and int(value) in _LONG else None
    if isinstance(value, datetime):  # a Parquet timestamp; one without a zone is UTC
        return (value.replace(tzinfo=value.tzinfo or UTC) - _EPOCH) // timedelta(milliseconds=1)
    if not isinstance(value, str):
        return None
    text = value.strip(" ")
    if re.fullmatch(r"-?[0-9]+", text, re.ASCII):
        return int(text) if int(text) in _LONG else None
    match = _ISO.fullmatch(text)
    if match is None:
        return None
    try:
        year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
        at = datetime(year, month, day, hour, minute, second, tzinfo=UTC)
    except ValueError:  # no such date or time of day
        return None
    ms = (at - _EPOCH) // timedelta(milliseconds=1) + int((match[7] or "").ljust(3, "0")[:3])
    zone = match[8]
    if zone is None or zone == "Z":
        return ms
    hours, minutes = int(zone[1:3]), int(zone[4:6])
    if hours > 18 or minutes > 59:
        return None
    return ms - (1 if zone[0] == "+" else -1) * (hours * 60 + minutes) * 60_000


# ------------------------------------------------------------------------------------------- input files


def _files(path: Path, suffixes: tuple[str, ...]) -> list[Path]:
    if not path.is_dir():
        return [path]
    return sorted(p for p in path.iterdir() if p.name.lower().endswith(suffixes) and p.name[0] not in "._")


def _csv_rows(path: Path, null_value: str | None) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for part in _files(path, (".csv",)):
        with part.open(newline="", encoding="utf-8") as f:
            rows += [{c: None if v in ("", null_value) else v for c, v in row.items()} for row in csv.DictReader(f)]
    for column in rows[0] if rows else {}:
        given = [r[column] for r in rows if r[column] is not None]
        if all(_INTEGER.fullmatch(v) and int(v) in _LONG for v in given):
            typed: Callable[[str], Any] = int
        elif all(_NUMBER.fullmatch(v) for v in given):
            typed = float
        else:
            continue
        for r in rows:
            r[column] = None if r[column] is None else typed(r[column])
    return rows


def _json_type(value: Any) -> str:
    return "number" if isinstance(value, int | float) and not isinstance(value, bool) else type(value).__name__


def _json_rows(path: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for part in _files(path, (".json", ".jsonl", ".ndjson")):
        for line in part.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                row = None
            rows.append(row if isinstance(row, dict) else {})  # not an object: every column null
    columns = {c for r in rows for c in r}
    for column in columns:
        given = [r[column] for r in rows if r.get(column) is not None]
        types = {_json_type(v) for v in given}
        double = types == {"number"} and any(isinstance(v, float) for v in given)
        for r in rows:
            v = r.get(column)
            if v is not None and len(types) > 1:  # a string column: each value's JSON text
                r[column] = v if isinstance(v, str) else json.dumps(v)
            elif isinstance(v, int) and double:
                r[column] = float(v)
            else:
                r[column] = v
    return rows


def _parquet_rows(path: Path) -> list[dict[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    stamps: dict[str, list[datetime | None]] = {}  # timestamps to whole ms (floor, as Spark's unix_millis), UTC
    for f in table.schema:
        if pa.types.is_timestamp(f.type):
            scale = {"s": -1000, "ms": 1, "us": 1000, "ns": 1_000_000}[f.type.unit]
            stamps[f.name] = [None if v is None else _EPOCH + timedelta(milliseconds=-v * scale if scale < 0
                                                                         else v // scale)
                              for v in table.column(f.name).cast(pa.int64()).to_pylist()]
    rows: list[dict[str, Any]] = table.drop_columns(list(stamps)).to_pylist()
    for name, values in stamps.items():
        for row, value in zip(rows, values, strict=True):
            row[name] = value
    return rows


def read_input(path: str, null_value: str | None = None) -> list[dict[str, Any]]:
    """The rows of a CSV, JSON lines or Parquet file (or directory of them), typed by the module's rules."""
    lower = path.lower().rstrip("/")
    if lower.endswith(".csv"):
        return _csv_rows(Path(path), null_value)
    if lower.endswith((".json", ".jsonl", ".ndjson")):
        return _json_rows(Path(path))
    if lower.endswith(".parquet"):
        return _parquet_rows(Path(path))
    raise ValueError(f"{path}: not .csv, .json, .jsonl, .ndjson or .parquet")


def _number(value: Any) -> int | float | None:
    """A value to sum: numbers as they are, numeric text parsed; anything else ``None`` (skipped)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return value
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
        return int(value) if _INTEGER.fullmatch(value.strip()) else float(value)
    return None


def _key(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


@dataclass(frozen=True)
class Windowed:
    """:func:`windowed_counts`' answer: ``rows`` (``key, window_start, window_end, count, sum_<col>...``,
    the windows as ISO-8601 UTC text), how many input rows there were and how many were rejected."""

    rows: list[dict[str, Any]]
    rows_in: int
    rejects: int


def windowed_counts(path: str, *, key: str, event_time: str, window_ms: int, sums: Sequence[str],
                    null_value: str | None = None) -> Windowed:
    """The pipeline's expected output for the input file ``path``, by the module docstring's rules."""
    rows = read_input(path, null_value)
    columns = {c for r in rows for c in r}
    for name in (key, event_time, *sums):
        if rows and name not in columns:
            raise ValueError(f"{path}: no column {name!r} (columns: {sorted(columns)})")
    windows: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    rejects = 0
    for r in rows:
        ms = event_time_ms(r.get(event_time))
        if r.get(key) is None or ms is None:
            rejects += 1
        else:
            windows[(_key(r[key]), ms - ms % window_ms)].append(r)
    good = [r for members in windows.values() for r in members]
    fractional = {c: any(isinstance(_number(r.get(c)), float) for r in good) for c in sums}
    out = []
    for (k, start), members in sorted(windows.items()):
        row: dict[str, Any] = {"key": k, "window_start": iso_ms(start), "window_end": iso_ms(start + window_ms),
                               "count": len(members)}
        for c in sums:
            values = [v for v in (_number(m.get(c)) for m in members) if v is not None]
            total = math.fsum(values) if fractional[c] else sum(values)
            row[f"sum_{c}"] = total if values else None
        out.append(row)
    return Windowed(out, len(rows), rejects)


def read_output(path: str, sums: Sequence[str]) -> list[dict[str, Any]]:
    """A sink's output file as rows of ``key, window_start, window_end, count, sum_<col>...`` (CSV: an empty
    sum is null; JSON lines: an absent field is null)."""
    columns = ["key", "window_start", "window_end", "count", *(f"sum_{c}" for c in sums)]
    lower = path.lower()
    if lower.endswith(".parquet"):
        import pyarrow.parquet as pq

        return [{c: r.get(c) for c in columns} for r in pq.read_table(path).to_pylist()]
    with open(path, newline="", encoding="utf-8") as f:
        if lower.endswith(".csv"):
            return [{c: (r[c] or None) if c.startswith("sum_") else r[c] for c in columns} for r in csv.DictReader(f)]
        return [{c: row.get(c) for c in columns} for row in (json.loads(line) for line in f if line.strip())]


# ---------------------------------------------------------------------------------------------- the wire

END_OF_TIME: Final = 2**63 - 1
"""A partition's watermark once every upstream task has ended there."""

_KINDS: Final = {0: "data", 1: "watermark", 2: "eos", 3: "data"}  # 3: wire format 2, the run in the envelope


@dataclass(frozen=True)
class WireRecord:
    """One record of a topic, decoded. ``body``: the data's JSON or the control message's. For data, the
    partition's watermark before it: ``mark`` (WM(p) right before it; ``None`` while undefined) and
    ``highest`` (the highest WM(p) had been up to there: none of the partition's readers can have had a
    watermark above it when they read the record)."""

    partition: int
    offset: int
    kind: str
    body: dict[str, Any]
    mark: int | None = None
    highest: int | None = None


@dataclass
class PartitionWatermark:
    """One partition's watermark WM(p) by docs/PROTOCOL.md's reader rules: the minimum over the current
    generation's open tasks that are not idle (all open tasks when every one is idle), undefined until each
    of the generation's ``taskCount`` tasks has reported, :data:`END_OF_TIME` once all have ended. A lower
    watermark of a task is ignored; an equal one may change its idleness; a higher generation replaces the
    tasks, a lower one is ignored; a task's messages after its end are ignored, as are all once every task
    has ended."""

    generation: int = -1
    count: int = 0
    marks: dict[str, int] = field(default_factory=dict)
    idle: set[str] = field(default_factory=set)
    ended: set[str] = field(default_factory=set)
    highest: int | None = None

    def apply(self, kind: str, body: Mapping[str, Any]) -> None:
        generation, task = body.get("generation", 0), body["taskName"]
        if self.value == END_OF_TIME or generation < self.generation:
            return
        if generation > self.generation:
            self.generation, self.count = generation, body["taskCount"]
            self.marks, self.idle, self.ended = {}, set(), set()
        assert body["taskCount"] == self.count, f"taskCount {body['taskCount']} in a generation of {self.count}"
        if task in self.ended:
            return
        if kind == "eos":
            self.ended.add(task)
        elif body["timestamp"] >= self.marks.get(task, body["timestamp"]):
            self.marks[task] = body["timestamp"]
            (self.idle.add if body.get("idle", False) else self.idle.discard)(task)
        assert len(self.marks.keys() | self.ended) <= self.count, f"more tasks than taskCount {self.count}: {body}"
        now = self.value
        if now is not None and now != END_OF_TIME:
            self.highest = now if self.highest is None else max(self.highest, now)

    @property
    def value(self) -> int | None:
        if self.count == 0 or len(self.marks.keys() | self.ended) < self.count:
            return None
        open_tasks = [t for t in self.marks if t not in self.ended]
        if not open_tasks:
            return END_OF_TIME
        return min(self.marks[t] for t in [t for t in open_tasks if t not in self.idle] or open_tasks)


def _control(value: bytes) -> dict[str, Any]:
    body = json.loads(value[1:])
    assert isinstance(body, dict) and body.get("version") == 1, f"not a version 1 control message: {value!r}"
    assert isinstance(body.get("taskName"), str) and body["taskName"], body
    assert isinstance(body.get("taskCount"), int) and body["taskCount"] > 0, body
    assert value[0] != 1 or type(body.get("timestamp")) is int, body
    return body


@dataclass(frozen=True)
class Run:
    """A run of a topic as :func:`read_run` found it: every record of the run in offset order per
    partition (partitions one after the other), and whether every partition had ended."""

    records: list[WireRecord]
    ended: bool

    @property
    def data(self) -> list[dict[str, Any]]:
        return [r.body for r in self.records if r.kind == "data"]


def read_run(config: Mapping[str, Any], topic: str, run_id: str, timeout_s: float = 60.0) -> Run:
    """Every committed record of run ``run_id`` on ``topic``, from the beginning to the current end, decoded
    from the wire format here (control messages of other runs, and data records that name another run in
    their envelope or their ``controlmsg-run`` header, left out), each data record with its partition's watermarks."""
    consumer = Consumer({**config, "group.id": f"oracle-{uuid.uuid4().hex}", "enable.auto.commit": False,
                         "isolation.level": "read_committed", "enable.partition.eof": True})
    try:
        partitions = sorted(consumer.list_topics(topic, timeout=30).topics[topic].partitions)
        assert partitions, f"{topic}: no partitions"
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        messages: dict[int, list[Any]] = {p: [] for p in partitions}
        done: set[int] = set()
        deadline = time.monotonic() + timeout_s
        while len(done) < len(partitions):
            assert time.monotonic() < deadline, f"{topic}: partitions {sorted(done)} read to their end in {timeout_s} s"
            batch: list[Any] = consumer.consume(1000, 0.2)  # records read have int partitions
            for msg in batch:
                if msg.error() is not None:
                    assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                    done.add(msg.partition())
                else:
                    messages[msg.partition()].append(msg)
    finally:
        consumer.close()
    records, ended = [], True
    for p in partitions:
        watermark = PartitionWatermark()
        for msg in messages[p]:
            value: bytes = msg.value() or b""
            kind = _KINDS[value[0]]
            if kind == "data":
                run: bytes | None
                if value[0] == 3:  # byte 3, the run id's length, the run id, the JSON
                    run, payload = value[2:2 + value[1]], value[2 + value[1]:]
                    assert len(run) == value[1], f"{topic}[{p}]@{msg.offset()}: a run id cut short"
                else:
                    run, payload = dict(msg.headers() or []).get("controlmsg-run"), value[1:]
                if run is None or run == run_id.encode():
                    records.append(WireRecord(p, msg.offset(), kind, json.loads(payload), watermark.value,
                                              watermark.highest))
                continue
            body = _control(value)
            if body.get("runId", "") == run_id:
                watermark.apply(kind, body)
                records.append(WireRecord(p, msg.offset(), kind, body))
        ended = ended and watermark.value == END_OF_TIME
    return Run(records, ended)


# ------------------------------------------------------------------------------------ the stage chain


def late_problems(inputs: Iterable[WireRecord], late: Iterable[Mapping[str, Any]], fields: Sequence[str],
                  event_ms: str = "event_ms") -> list[str]:
    """What is wrong with ``late``, the records a window stage set aside as late, each with the ``watermark``
    it was behind, given its input topic's data records ``inputs`` (:func:`read_run`). A record is matched
    with the inputs by ``fields`` (which include ``event_ms``). Empty when nothing is wrong.

    What it proves. A reader marks a record late when its event time is below the watermark it read it
    with: the larger of its partition's watermark right before it (``mark``: it depends on the partition
    alone, so it is the same whichever micro-batch the record falls in) and the topic's reconciled watermark
    then (``_watermark``: that depends on where micro-batches begin and on the other partitions, and Spark
    applies the previous micro-batch's; but it is a minimum over the partitions, this one included, of
    watermarks already read, so it is at most ``highest``). So, per record: event time < ``mark`` => late
    (*must*); event time >= ``highest`` => not late (*may not*); and the recorded watermark lies in
    ``[mark, highest]`` and above the event time. A watermark that runs ahead of what the upstream tasks
    published before the record fails; so does a late record that is no input record, or is one twice, a
    record behind its partition's watermark that is not late, and one at or after every watermark its
    partition had that is. What it cannot prove: while a partition's watermark never goes back (no idle
    task coming back, no generation starting lower) ``mark == highest`` and the late set is exact; otherwise
    a record between the two may go either way, by micro-batch timing. Duplicate inputs (same ``fields``)
    are matched as a set: each late copy to a distinct input whose bounds hold it (greedy, smallest
    ``highest`` first), and their number between the must and the may counts."""
    def ident(v: Mapping[str, Any]) -> tuple[Any, ...]:
        return tuple(v[f] for f in fields)

    candidates: dict[tuple[Any, ...], list[WireRecord]] = defaultdict(list)
    for r in inputs:
        candidates[ident(r.body)].append(r)
    met: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    for v in late:
        met[ident(v)].append(v["watermark"])
    problems = []
    for key, rs in candidates.items():
        at = rs[0].body[event_ms]
        must = sum(1 for r in rs if r.mark is not None and at < r.mark)
        may = [r for r in rs if r.highest is not None and at < r.highest]
        marks = sorted(met.get(key, []))
        if not must <= len(marks) <= len(may):
            problems.append(f"{key}: late {len(marks)} time(s), of {len(rs)} input(s) of which {must} must and "
                            f"{len(may)} may be late (their watermarks {[(r.mark, r.highest) for r in rs]})")
        free = sorted(may, key=lambda r: r.highest or 0)
        for mark in marks:
            fits = [r for r in free if (r.mark is None or r.mark <= mark) and at < mark <= (r.highest or 0)]
            if not fits:
                problems.append(f"{key}: recorded watermark {mark} is not both above its event time and within "
                                f"[mark, highest] of an input's partition: {[(r.mark, r.highest) for r in rs]}")
            else:
                free.remove(fits[0])
    problems += [f"{key}: late {len(m)} time(s), no such input record" for key, m in met.items()
                 if key not in candidates]
    return problems


def watermark_problems(records: Sequence[WireRecord], lateness_ms: int, event_ms: str = "event_ms") -> list[str]:
    """The upstream's watermarks against its own records, for a stage whose watermark is the largest event
    time it has written minus ``lateness_ms`` (Spark's ``withWatermark``) and whose driver writes each
    watermark to every partition after the records it covers: each watermark ``w`` must be at most the
    largest event time of the records before the first watermark >= ``w`` on each partition (those hold
    every record written before ``w`` was decided), minus ``lateness_ms``. So a watermark that runs ahead of
    the data fails, which :func:`late_problems` alone, taking the published watermarks as given, cannot
    see. Empty when nothing is wrong."""
    per_partition: dict[int, list[WireRecord]] = defaultdict(list)
    for r in records:
        per_partition[r.partition].append(r)
    problems = []
    for w in sorted({r.body["timestamp"] for r in records if r.kind == "watermark"}):
        seen = -math.inf
        for rs in per_partition.values():
            for r in rs:
                if r.kind == "watermark" and r.body["timestamp"] >= w:
                    break
                if r.kind == "data":
                    seen = max(seen, r.body[event_ms])
        if w > seen - lateness_ms:
            problems.append(f"watermark {w} above the largest event time written before it ({seen}) minus "
                            f"{lateness_ms} ms")
    return problems


def multiset(rows: Iterable[Mapping[str, Any]], fields: Sequence[str]) -> Counter[tuple[Any, ...]]:
    """``rows`` projected on ``fields``, counted."""
    return Counter(tuple(r[f] for f in fields) for r in rows)
