"""The checks every job CLI and the pipeline make before any Spark application starts.

Each check returns its problems as lines ``<flag> <value>: <what is wrong>[; what to do]`` (an empty
list when all is well), so a command can print every problem at once, one line each, and exit 2 without
having started a JVM. Pure Python: no pyspark, no Kafka (pyarrow only to read a Parquet file's schema).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import orjson

__all__ = [
    "FILE_FORMATS",
    "duration_problems",
    "input_problems",
    "output_problems",
    "positive_problems",
]

FILE_FORMATS: Final = (".csv", ".json", ".jsonl", ".ndjson", ".parquet")


def duration_problems(durations: Sequence[tuple[str, str, bool]]) -> list[str]:
    """``(flag, text, zero allowed)`` each: a duration such as ``500ms``, ``30s``, ``15m``, ``1h``, ``1d``."""
    from controlmsg.core.durations import parse_duration

    problems = []
    for flag, text, zero in durations:
        try:
            parse_duration(text, allow_zero=zero)
        except ValueError as exc:
            problems.append(f"{flag}: {exc}")
    return problems


def positive_problems(numbers: Sequence[tuple[str, float | None]]) -> list[str]:
    """``(flag, value)`` each: above zero when given (``None``: not given)."""
    return [f"{flag} {value:g}: must be above 0" for flag, value in numbers if value is not None and value <= 0]


def topic_problems(args: argparse.Namespace) -> list[str]:
    """``--replication-factor`` and ``--topic-config`` (see :func:`controlmsg.kafka.admin.add_topic_options`)."""
    from controlmsg.kafka.admin import topic_settings_from_args

    try:
        topic_settings_from_args(args)
    except ValueError as exc:
        return [str(exc)]
    return []


def input_problems(flag: str, path: str, columns: Sequence[tuple[str, str]] = ()) -> list[str]:
    """The input file ``path`` (given with ``flag``): exists, has a known format, is not empty, and has each
    column of ``columns`` (``(flag, column)`` each) as far as its head tells without Spark."""
    source = Path(path)
    if not source.exists():
        return [f"{flag} {path}: no such file or directory"]
    if not source.name.lower().endswith(FILE_FORMATS):
        return [f"{flag} {path}: unknown file type; use {', '.join(FILE_FORMATS)}"]
    if source.is_file() and source.stat().st_size == 0:
        return [f"{flag} {path}: the file is empty"]
    found = _columns(source)
    if found is None:
        return []
    return [f"{column_flag} {column}: no such column in {path} (columns: {', '.join(found) or 'none'})"
            for column_flag, column in columns if column not in found]


def output_problems(flag: str, path: str, formats: Sequence[str] | None = FILE_FORMATS) -> list[str]:
    """The output file ``path`` (given with ``flag``): a known format (``formats``; ``None``: any name), in
    a directory this user can write (created if missing), and not a directory itself."""
    target = Path(path)
    problems = []
    if formats is not None and not target.name.lower().endswith(tuple(formats)):
        problems.append(f"{flag} {path}: unknown file type; use {', '.join(formats)}")
    existing = target.parent.resolve()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK):
        problems.append(f"{flag} {path}: cannot write in {existing}")
    elif target.is_dir():
        problems.append(f"{flag} {path}: is a directory; name the output file")
    return problems


def _columns(path: Path) -> list[str] | None:
    """The column names of an input file, read from its head (``None``: cannot tell without Spark)."""
    lower = path.name.lower()
    if path.is_dir():
        return None
    if lower.endswith(".csv"):
        with path.open(encoding="utf-8", errors="replace") as f:
            header = f.readline().strip()
        return [c.strip().strip('"') for c in header.split(",")] if header else []
    if lower.endswith((".json", ".jsonl", ".ndjson")):
        with path.open("rb") as f:
            for line in f:
                if line.strip():
                    try:
                        first = orjson.loads(line)
                    except orjson.JSONDecodeError:
                        return None
                    return list(first) if isinstance(first, dict) else None
        return []
    if lower.endswith(".parquet"):
        import pyarrow.parquet as pq

        try:
            return list(pq.read_schema(path).names)
        except Exception:  # unreadable here: the ingest job reports it in Spark's own words
            return None
    return None
