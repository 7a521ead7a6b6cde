"""What the job CLIs share: common options, the run summary file, topic names, logging."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

Work = Callable[["SparkSession", argparse.Namespace, dict[str, str]], dict[str, Any]]
"""A job's work: ``work(spark, args, kafka_config)`` returns the job's summary."""

__all__ = [
    "add_common_options",
    "controlmsg_options",
    "job_logger",
    "kafka_config",
    "run_job",
    "spark_conf",
    "topic_names",
    "write_summary",
]


def add_common_options(parser: argparse.ArgumentParser) -> None:
    from controlmsg.kafka.admin import add_topic_options
    from controlmsg.kafka.settings import add_client_options

    add_client_options(parser)
    add_topic_options(parser)
    parser.add_argument("--run-id", required=True, help="the pipeline run this job belongs to")
    parser.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    parser.add_argument("--timeout", type=float, help="fail if the input has not ended after SECONDS")
    parser.add_argument("--summary", help="write a JSON summary of the job here when it succeeds")
    parser.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting (repeatable)")


def spark_conf(args: argparse.Namespace) -> dict[str, str]:
    """``--spark-conf KEY=VALUE`` options as a dict. Raises ``ValueError`` for one without ``=``."""
    conf = {}
    for setting in args.spark_conf:
        key, sep, value = setting.partition("=")
        if not sep:
            raise ValueError(f"--spark-conf {setting!r}: expected KEY=VALUE")
        conf[key.strip()] = value.strip()
    return conf


def kafka_config(args: argparse.Namespace) -> dict[str, str]:
    """The job's Kafka client settings: ``--bootstrap-servers``, ``-X``, ``--kafka-config``, resolved by
    :func:`controlmsg.kafka.settings.client_config` (one rule for every command)."""
    from controlmsg.kafka.settings import client_config_from_args

    return client_config_from_args(args)


def controlmsg_options(args: argparse.Namespace, config: dict[str, str], topic: str,
                       **more: str | None) -> dict[str, str]:
    """The ``format("controlmsg")`` options of a job: the topic, the run, every client setting as
    ``kafka.<setting>``, the job's ``--timeout``, how it creates topics (``--replication-factor``,
    ``--topic-config``), and ``more`` (``None`` values left out)."""
    from controlmsg.kafka.admin import topic_settings_from_args

    options = {"topic": topic, "runId": args.run_id, **{f"kafka.{k}": v for k, v in config.items()},
               **topic_settings_from_args(args).as_options()}
    if args.timeout is not None:
        options["timeout"] = str(args.timeout)
    options.update({k: v for k, v in more.items() if v is not None})
    return options


def topic_names(run_id: str, prefix: str = "controlmsg") -> tuple[str, str]:
    """The pipeline's two intermediate topics: keyed events, and window results."""
    return f"{prefix}-{run_id}-events", f"{prefix}-{run_id}-windows"


def job_logger(name: str) -> logging.Logger:
    logger = logging.getLogger(f"spark_jobs.{name}")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(f"%(asctime)s {name}: %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    return logger


def write_summary(path: str | None, **fields: Any) -> None:
    """Write the job's summary (``fields`` plus ``finished_at``, epoch seconds) as JSON, atomically."""
    if not path:
        return
    target = Path(path)
    tmp = target.with_suffix(target.suffix + ".tmp")
    tmp.write_bytes(orjson.dumps({**fields, "finished_at": time.time()}, option=orjson.OPT_INDENT_2))
    tmp.replace(target)


def run_job(name: str, parser: argparse.ArgumentParser, work: Work, argv: Sequence[str] | None = None) -> int:
    """A job's ``main``: parse ``argv``, start its own Spark application, run ``work(spark, args,
    kafka_config)``, write its summary (``--summary``), stop Spark. Returns the exit code."""
    from controlmsg.spark import spark_session

    args = parser.parse_args(argv)
    started = time.monotonic()
    config = kafka_config(args)
    spark = spark_session(args.master, conf=spark_conf(args), app_name=f"controlmsg-{name}-{args.run_id}")
    try:
        summary = work(spark, args, config)
    finally:
        spark.stop()
    write_summary(args.summary, job=name, seconds=time.monotonic() - started, **summary)
    return 0
