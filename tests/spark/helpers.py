"""What the Spark tests share: sample rows, and the data source calls spelled once."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from pyspark.sql import DataFrame, SparkSession

SCHEMA = "user string, ts long, amount long, score double, note string"
BASE_TS = 1_767_225_600_000


def make_rows(n: int, users: int, seed: int = 7) -> list[tuple[Any, ...]]:
    """``n`` rows of ``SCHEMA``: event times roughly rising with some out of order, some null notes."""
    rnd = random.Random(seed)
    rows = []
    for i in range(n):
        ts = BASE_TS + i * 10 + rnd.randint(-300, 300)
        note = None if i % 5 == 0 else f"note {i} \u00e9"
        rows.append((f"u{i % users}", ts, i % 97, round(rnd.random() * 100, 3), note))
    return rows


def options(topic: str, servers: str, run: str = "r1", **more: str) -> dict[str, str]:
    return {"topic": topic, "runId": run, "kafka.bootstrap.servers": servers, "timeout": "60", **more}


def write(df: DataFrame, topic: str, servers: str, run: str = "r1", **more: str) -> None:
    df.write.format("controlmsg").mode("append").options(**options(topic, servers, run, **more)).save()


def read(spark: SparkSession, topic: str, servers: str, run: str = "r1", schema: str | None = None,
         **more: str) -> DataFrame:
    reader = spark.read.format("controlmsg").options(**options(topic, servers, run, **more))
    return (reader.schema(schema) if schema is not None else reader).load()


def spark_conf_args(conf: Mapping[str, str]) -> list[str]:
    """``--spark-conf KEY=VALUE`` arguments of a job in ``spark_jobs`` for ``conf`` (for example the
    ``s3a_conf`` fixture's, which a job needs when its ``--checkpoint`` is an ``s3a://`` location)."""
    return [arg for key, value in conf.items() for arg in ("--spark-conf", f"{key}={value}")]


def query_failure(query: Any) -> str:
    """Why a streaming query stopped, for an assertion's message: its exception and the chain of Java
    causes down to the root (``StreamingQueryException`` gives only the top message, often Spark's
    "Task not serializable", whose cause is the one that tells), or that it is still active or ended well."""
    if query.isActive:
        return "the query is still active"
    failed = query._jsq.exception()  # Option[StreamingQueryException] of the JVM query
    if failed.isEmpty():
        return "the query ended without an exception"
    causes: list[str] = []
    cause = failed.get()
    while cause is not None and len(causes) < 12:
        causes.append(str(cause.toString()))
        cause = cause.getCause()
    return " <- caused by: ".join(causes)
