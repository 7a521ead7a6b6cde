"""What the job CLIs share: common options, the run summary file, topic names, logging, and how a job
starts and ends (:func:`run_job`): arguments checked before Spark, failures in one or two lines."""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import orjson

from controlmsg.streaming.log import job_logger  # moved to the library with the runtime, which logs through it

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

Work = Callable[["SparkSession", argparse.Namespace, dict[str, str]], dict[str, Any]]
"""A job's work: ``work(spark, args, kafka_config)`` returns the job's summary."""
Check = Callable[[argparse.Namespace], list[str]]
"""A job's argument checks: one line per problem (see :mod:`spark_jobs.checks`), none when all is well."""

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
EXIT_CODES: Final = ("exit status: 0 done; 1 the job failed (the cause and what to do on stderr, the full trace in "
                     "--log-file); 2 bad arguments or Kafka settings, found before Spark started; 143 stopped by "
                     "SIGTERM, 130 stopped by SIGINT (Ctrl-C): a streaming job's tasks first commit (or abort) their "
                     "open transaction, nothing partial is readable, and the same command resumes at the last "
                     "commit (a stop takes a few seconds; at most 15 s, then the process exits anyway)")

__all__ = [
    "EXIT_CODES",
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "PARTITIONS_HELP",
    "SUM_HELP",
    "WINDOW_HELP",
    "Check",
    "add_common_options",
    "add_partitions_option",
    "add_run_tag_option",
    "add_window_options",
    "add_window_topic_options",
    "common_problems",
    "controlmsg_options",
    "failure_lines",
    "job_logger",
    "kafka_config",
    "run_job",
    "spark_conf",
    "topic_names",
    "write_summary",
]


def add_stall_limit_option(parser: argparse.ArgumentParser, *, help_prefix: str = "",
                           action: type[argparse.Action] | None = None) -> None:
    """``--stall-limit``, the long-running tasks' watchdog (``controlmsg.streaming.runtime``). The pipeline,
    which passes it on to its streaming jobs, adds its ``help_prefix`` and an ``action`` that notes it given."""
    parser.add_argument("--stall-limit", default="180s", action=action or "store",
                        help=f"{help_prefix}a long-running task that does not turn its loop for this long is "
                             "wedged: its Python worker ends and Spark retries it from its last commit (default "
                             "180s, above the 2 x 60 s a commit may legitimately take; docs/OPERATIONS.md)")


def add_metrics_option(parser: argparse.ArgumentParser, whose: str = "the tasks'") -> None:
    """``--metrics-port``: a job's metrics (``whose``: the runtime's tasks', a stage's queries'), served to
    Prometheus by its driver."""
    parser.add_argument("--metrics-port", type=int, metavar="PORT",
                        help=f"serve {whose} metrics (watermark, lag, upstream tasks ended out of expected, the "
                             "task holding the watermark back, late records) in Prometheus' text format on "
                             "http://<driver>:PORT/metrics (0: a free port, logged); needs pip install "
                             "'controlmsg[metrics]' (docs/OPERATIONS.md, Metrics)")


def metrics_problems(args: argparse.Namespace) -> list[str]:
    """``--metrics-port``: a port, and the client library it needs installed (said before Spark starts)."""
    import importlib.util

    from controlmsg.metrics.board import EXTRA

    port = args.metrics_port
    if port is None:
        return []
    if not 0 <= port <= 65535:
        return [f"--metrics-port {port}: must be between 0 and 65535"]
    if importlib.util.find_spec("prometheus_client") is None:
        return [f"--metrics-port needs prometheus-client, which is not installed: {EXTRA}"]
    return []


def serve_task_metrics(spark: SparkSession, args: argparse.Namespace, job: str) -> str | None:
    """Start the job's metrics endpoint on the driver when ``--metrics-port`` was given (it serves until the
    job's process ends); returns the URL its tasks report to (the driver as the executors reach it), or
    ``None``."""
    if args.metrics_port is None:
        return None
    from controlmsg.streaming import serve_job_metrics

    server = serve_job_metrics(args.metrics_port)
    host = spark.conf.get("spark.driver.host") or "127.0.0.1"
    job_logger(job).info("metrics on %s/metrics", server.url(host))
    return server.url(host)


WINDOW_HELP: Final = ("tumbling event-time window length, e.g. 1m, 15m, 1h, 1d (windows start at whole multiples "
                      "of it since the epoch)")
SUM_HELP: Final = ("a column to sum per key and window, written as sum_<COL> (repeatable; nulls are skipped). TYPE, "
                   "long or double, declares the column's type: the bounded pipeline and window_aggregate then parse "
                   "it in the reading tasks, which is faster (a Parquet input's integer and floating point columns "
                   "are declared from its footers), and otherwise take the type from the data (double when a value "
                   "has a fraction or an exponent); stages.window reads an undeclared column as double; the "
                   "streaming runtime (--streaming, runtime.window) takes plain column names and sums each value as "
                   "the number it is")
PARTITIONS_HELP: Final = ("partitions of each intermediate topic written (created with this many if missing; an "
                          "existing one must have as many; default %(default)s)")


def add_window_options(parser: argparse.ArgumentParser) -> None:
    """``--window`` and ``--sum``, the same for the three window jobs and the pipeline. What a ``--sum`` type
    means is each job's (:data:`SUM_HELP` says how they differ); the option itself is one."""
    parser.add_argument("--window", required=True, help=WINDOW_HELP)
    parser.add_argument("--sum", action="append", default=[], metavar="COL[:TYPE]", help=SUM_HELP)


def add_window_topic_options(parser: argparse.ArgumentParser) -> None:
    """``--input-topic`` and ``--output-topic`` of a window job (both required)."""
    parser.add_argument("--input-topic", required=True, help="the intermediate topic of keyed events to read")
    parser.add_argument("--output-topic", required=True, help="the intermediate topic to write the window results to")


def add_partitions_option(parser: argparse.ArgumentParser) -> None:
    """``--partitions`` of the intermediate topics a window job or the pipeline writes."""
    parser.add_argument("--partitions", type=int, default=4, help=PARTITIONS_HELP)


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
    parser.add_argument("--log-file", metavar="PATH",
                        help="where the full trace of a failure goes "
                             "(default: .controlmsg/runs/<run id>/<job>-error.log)")
    parser.add_argument("--parent-pid", type=int, metavar="PID",
                        help="stop (as on SIGTERM) once process PID is no longer this one's parent (the pipeline "
                             "passes its own)")
    parser.epilog = EXIT_CODES


def add_run_tag_option(parser: argparse.ArgumentParser) -> None:
    """``--run-tag``, the data source's ``runTag``, for the jobs that write an intermediate topic."""
    parser.add_argument("--run-tag", choices=("envelope", "headers", "none"), default="envelope",
                        help="how each record names its run, so that readers of a topic that holds several runs "
                             "take only theirs: in its value (envelope, the default: wire format 2, at no cost to "
                             "the write), in headers (wire format 1, for readers of that format, and each record "
                             "names its task too; about 0.7 of the rate), or not at all (none)")


def common_problems(args: argparse.Namespace) -> list[str]:
    """The checks of :func:`add_common_options`' options: ``--timeout``, ``--spark-conf``, the topic
    settings, and the files
    ``--summary`` and ``--log-file`` can be written."""
    from spark_jobs.checks import output_problems, positive_problems, topic_problems

    problems = positive_problems([("--timeout", args.timeout)]) + topic_problems(args)
    problems += [f"--spark-conf {setting}: expected KEY=VALUE" for setting in args.spark_conf if "=" not in setting]
    if args.summary:
        problems += output_problems("--summary", args.summary, formats=None)
    if args.log_file:
        problems += output_problems("--log-file", args.log_file, formats=None)
    return problems


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
    :func:`controlmsg.kafka.settings.client_config` (one rule for every command); without an address, the
    local broker's (:func:`controlmsg.clusters.local_address.local_bootstrap_servers`)."""
    from controlmsg.clusters.local_address import local_bootstrap_servers
    from controlmsg.kafka.settings import client_config_from_args

    return client_config_from_args(args, default_servers=local_bootstrap_servers)


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


def write_summary(path: str | None, **fields: Any) -> None:
    """Write the job's summary (``fields`` plus ``finished_at``, epoch seconds, and ``niceness``, the
    process's CPU priority) as JSON, atomically."""
    if not path:
        return
    target = Path(path)
    tmp = target.with_suffix(target.suffix + ".tmp")
    tmp.write_bytes(orjson.dumps({**fields, "finished_at": time.time(), "niceness": os.nice(0)},
                                 option=orjson.OPT_INDENT_2))
    tmp.replace(target)


STREAMING_TASK_ATTEMPTS: Final = 4
"""Tries per Spark task of the streaming jobs, on a local master as on a cluster (Spark's default
``spark.task.maxFailures``): a task that failed, or that the watchdog ended
(:func:`controlmsg.streaming.runtime._run_group`), resumes from its last commit."""

_LOCAL: Final = re.compile(r"^local(\[(\d+|\*)\])?$")


def with_task_attempts(master: str, attempts: int) -> str:
    """``master`` with ``attempts`` tries per task when it is a local master that sets none (``local``,
    ``local[N]``, ``local[*]`` -> ``local[N,attempts]``): a local master tries a task once, where a
    cluster tries it ``spark.task.maxFailures`` (4) times. Other masters pass unchanged."""
    match = _LOCAL.match(master.strip())
    if match is None:
        return master
    return f"local[{match.group(2) or 1},{attempts}]"


def run_job(name: str, parser: argparse.ArgumentParser, work: Work, argv: Sequence[str] | None = None,
            check: Check | None = None, task_attempts: int | None = None) -> int:
    """A job's ``main``: parse ``argv``; check the arguments (:func:`common_problems` and ``check``) and the
    Kafka settings; only then start its own Spark application, run ``work(spark, args, kafka_config)``,
    write its summary (``--summary``) and stop Spark. Returns the exit code (:data:`EXIT_CODES`).

    Bad arguments print ``<prog>: error: <problem>``, one line each, and return 2 before any JVM starts.
    A failure of the work prints two lines, ``<job>: <cause>`` and what to do, with the path of the full
    trace (``--log-file``), and returns 1. SIGTERM and SIGINT stop the job (:mod:`controlmsg.streaming.stopping`:
    a streaming job's tasks stop at a commit) and return 128 + the signal, without a summary; so does
    the death of ``--parent-pid``. ``task_attempts``: tries per task on a local master too
    (:func:`with_task_attempts`; the streaming jobs, whose tasks resume from their commits)."""
    from controlmsg.errors import ControlMsgError
    from controlmsg.streaming.stopping import Stopper, StopRequested, exit_code, watch_parent

    args = parser.parse_args(argv)
    problems = common_problems(args) + (check(args) if check is not None else [])
    try:
        config = kafka_config(args) if not problems else {}
    except ControlMsgError as exc:  # a refused setting, or no cluster named anywhere
        problems.append(str(exc))
    if problems:
        for problem in problems:
            print(f"{parser.prog}: error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    from controlmsg.spark import spark_session

    started = time.monotonic()
    stopper = Stopper(name).install()
    if args.parent_pid is not None:
        watch_parent(args.parent_pid)
    try:
        master = args.master if task_attempts is None else with_task_attempts(args.master, task_attempts)
        spark = spark_session(master, conf=spark_conf(args), app_name=f"controlmsg-{name}-{args.run_id}")
        spark_up = time.monotonic() - started
        try:
            stopper.install()  # again: PySpark's SparkContext replaced the SIGINT handler with its own
            stopper.raise_if_set()
            summary = work(spark, args, config)
        finally:
            spark.stop()
        write_summary(args.summary, job=name, seconds=time.monotonic() - started, spark_start_seconds=spark_up,
                      **summary)
    except StopRequested as stop:
        tasks = f"; tasks: {[_brief(s) for s in stop.summaries]}" if stop.summaries else ""
        print(f"{time.strftime('%H:%M:%S')} {name}: {stop} ({time.monotonic() - started:.1f} s after start); "
              f"the same command (--run-id {args.run_id}) resumes at the last commit{tasks}", file=sys.stderr)
        return exit_code(stop.signum)
    except Exception as exc:
        where = _save_trace(name, args, exc)
        cause, todo = failure_lines(exc)
        print(f"{name}: {cause}", file=sys.stderr)
        print(f"{name}: {todo}; " + (f"full trace in {where}" if where else "the full trace follows"), file=sys.stderr)
        if where is None:
            traceback.print_exception(exc, file=sys.stderr)
        return EXIT_FAILED
    finally:
        stopper.uninstall()
    return EXIT_OK


def _brief(summary: dict[str, Any]) -> dict[str, Any]:
    """A stopped task's summary without its lists (one log line)."""
    return {k: v for k, v in summary.items() if not isinstance(v, list | dict)}


_PY_ERROR = re.compile(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception|Timeout)): (\S.*)$")
_OURS = re.compile(r"^(?:controlmsg\.[\w.]+\.)(\w+): (\S.*)$")
_TODO: Final = {
    "EndOfStreamTimeout": "the upstream has not ended its stream: check that its job runs and writes this run "
                          "(--run-id), or give it more --timeout",
    "BrokerError": "check that the Kafka cluster runs and is reachable (--bootstrap-servers, -X, --kafka-config)",
    "TopicError": "check the topic and that the cluster is reachable with these settings (-X, --kafka-config)",
    "DeliveryError": "check the cluster, the topic and this principal's rights on it, then run the job again",
    "ReadError": "fix or set aside the record named (see docs/SPARK.md, bad records), or check the cluster",
    "ConfigError": "fix the Kafka client setting named (-X, --kafka-config)",
    "ClusterRefused": "fix what the line says to check (-X, --kafka-config), then run the job again",
}
_MAX_CAUSE: Final = 400


def failure_lines(exc: BaseException) -> tuple[str, str]:
    """What a failed job prints: the cause in one line, and what to do.

    Spark reports a failure inside a task as a JVM error whose text holds the Python worker's trace: the
    cause is the last ``controlmsg`` error in it (the one the task raised), else the last Python error
    line, else the first line of the message; at most :data:`_MAX_CAUSE` characters."""
    text = str(exc)
    lines = [line.strip() for line in text.splitlines()]
    kind, message = type(exc).__name__, (lines[0] if lines else "")
    own = [m for m in map(_OURS.match, lines) if m is not None]
    found = own or [m for m in map(_PY_ERROR.match, lines) if m is not None]
    if found:
        kind, message = found[-1].group(1), found[-1].group(2)
    elif isinstance(exc, Exception) and type(exc).__module__.startswith("controlmsg"):
        kind = type(exc).__name__
    if len(message) > _MAX_CAUSE:
        message = message[:_MAX_CAUSE] + "..."
    todo = _TODO.get(kind, "see the full trace")
    return f"{kind}: {message}", todo


def _save_trace(name: str, args: argparse.Namespace, exc: BaseException) -> Path | None:
    """Write ``exc``'s full trace, through the job's logger, to ``--log-file`` (default
    ``.controlmsg/runs/<run id>/<job>-error.log``, appended to). ``None`` when it cannot be written."""
    path = Path(args.log_file or Path(".controlmsg") / "runs" / args.run_id / f"{name}-error.log")
    trace = logging.getLogger(f"spark_jobs.{name}.trace")
    trace.propagate = False  # the trace goes to the file only, not to the job's stderr
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(path, encoding="utf-8")
    except OSError:
        return None
    handler.setFormatter(logging.Formatter(f"%(asctime)s {name}: %(message)s"))
    trace.addHandler(handler)
    try:
        trace.error("job failed (run %s): %s", args.run_id, exc, exc_info=exc)
    finally:
        trace.removeHandler(handler)
        handler.close()
    return path
