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
    "NUMBER_TYPES",
    "duration_problems",
    "input_problems",
    "output_problems",
    "parquet_number_types",
    "parse_typed_column",
    "positive_problems",
    "sum_problems",
    "typed_sums",
]

FILE_FORMATS: Final = (".csv", ".json", ".jsonl", ".ndjson", ".parquet")
NUMBER_TYPES: Final = ("long", "double")
"""The types a summed column may be declared with (``--sum amount:double``): what SQL SUM gives for
integral and for fractional input, and so the type of ``sum_<col>``."""
_NOT_NUMBER_TYPES: Final = frozenset({"bigint", "byte", "decimal", "float", "int", "integer", "number", "real",
                                      "short", "smallint", "string", "tinyint"})


def parse_typed_column(text: str) -> tuple[str, str | None]:
    """``"amount:double"`` -> ``("amount", "double")``; ``"amount"`` -> ``("amount", None)``.

    Only a last ``:long`` or ``:double`` (:data:`NUMBER_TYPES`) is a type; any other colon is part of the
    column's name. Raises ``ValueError`` for a suffix that names another type (``:int``, ``:float``...),
    which would otherwise be taken for part of a name and fail later as an unknown column."""
    name, sep, suffix = text.rpartition(":")
    if sep and name:
        if suffix in NUMBER_TYPES:
            return name, suffix
        if suffix.lower() in _NOT_NUMBER_TYPES or suffix.lower() in NUMBER_TYPES:
            raise ValueError(f"{text}: a summed column is declared long or double (what SUM gives for integral "
                             f"and fractional input), not {suffix}")
    return text, None


def typed_sums(texts: Sequence[str]) -> dict[str, str | None]:
    """The ``--sum`` arguments (``COL`` or ``COL:TYPE``, :func:`parse_typed_column`) as name -> declared
    type or ``None``, in their order. Raises ``ValueError`` for a bad type or a column given twice."""
    sums: dict[str, str | None] = {}
    for text in texts:
        name, typ = parse_typed_column(text)
        if name in sums:
            raise ValueError(f"{text}: column {name!r} is given twice")
        sums[name] = typ
    return sums


def sum_problems(flag: str, texts: Sequence[str]) -> list[str]:
    """The problems of :func:`typed_sums` as lines for a job's argument checks (``flag`` names them)."""
    try:
        typed_sums(texts)
    except ValueError as exc:
        return [f"{flag} {exc}"]
    return []


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


def parquet_number_types(path: str, columns: Sequence[str]) -> dict[str, str]:
    """The declared type (``long``/``double``, what SQL SUM gives) of each of ``columns`` that a Parquet
    input (a ``.parquet`` file, or a directory of ``part-*.parquet`` files as Spark writes them) stores
    as an integer or a floating-point number in every one of its files, read from the footers alone.

    A column stored as anything else (decimal, string...), missing, or of different types in different
    files is left out, and so is every column of an input that is not Parquet or cannot be read here:
    its type then comes from the data, downstream."""
    source = Path(path)
    if not source.name.lower().endswith(".parquet") or not source.exists():
        return {}
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = ([source] if source.is_file() else
             sorted(f for f in source.iterdir() if f.suffix == ".parquet" and not f.name.startswith((".", "_"))))
    found: dict[str, set[str | None]] = {c: set() for c in columns}
    try:
        schemas = [pq.read_schema(f) for f in files]
    except Exception:  # unreadable here: the ingest job reports it in Spark's own words
        return {}
    for schema in schemas:
        for column in columns:
            index = schema.get_field_index(column)
            dtype = schema.field(index).type if index >= 0 else None
            found[column].add("long" if dtype is not None and pa.types.is_integer(dtype) else
                              "double" if dtype is not None and pa.types.is_floating(dtype) else None)
    types = {}
    for column, kinds in found.items():
        kind = kinds.pop() if len(kinds) == 1 else None
        if kind is not None:
            types[column] = kind
    return types
