"""A SparkSession set up for controlmsg: workers on this interpreter, the data source registered.

Spark's Python workers run ``PYSPARK_PYTHON``; unless it names an interpreter that has controlmsg
installed, every read or write task fails to import it. :func:`spark_session` points it at the running
interpreter (``sys.executable``) when it is not set, which is right for ``local[...]`` masters and for
standalone clusters whose workers share this environment's path.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import Any, Final

from pyspark import SparkContext
from pyspark.sql import SparkSession

from controlmsg.spark.class_archive import driver_java_options

__all__ = ["STREAM_RUNNER_KEYS", "register", "settle_shared_environment", "spark_session"]

_JAVA_OPTIONS = "spark.driver.extraJavaOptions"
_EXECUTOR_OPTIONS = "spark.executor.extraJavaOptions"
_LOG: Final = logging.getLogger(__name__)

STREAM_RUNNER_KEYS: Final = (
    "SPARK_LOCAL_DIRS", "SPARK_AUTH_SOCKET_TIMEOUT", "SPARK_BUFFER_SIZE", "SPARK_PYTHON_RUNTIME")
"""The keys Spark's ``PythonStreamingSourceRunner.init()`` (pyspark 4.2 and 4.3) inserts, without a lock, into the
environment map of a Python data source, a map every read of that data source in the JVM shares."""


def register(spark: SparkSession) -> None:
    """Make ``format("controlmsg")`` known to ``spark``, a classic or a Spark Connect session
    (idempotent). Where a classic session's Spark has found ``pyspark_controlmsg`` by itself (controlmsg
    installed, or its checkout on the Python path), that registration stands: registering again would
    replace it, and Spark logs a warning for that. A Connect session cannot be asked: the data source is
    sent to the server for this session every time; the server's Python needs controlmsg installed to
    run it. On a classic session it also adds the listener that follows every ``stageProgress driver`` stage
    (:func:`controlmsg.spark.stage_listener.follow_stages`)."""
    from controlmsg.spark.datasource import ControlMsgDataSource
    from controlmsg.spark.stage_listener import follow_stages

    if not _known(spark, ControlMsgDataSource.name()):
        spark.dataSource.register(ControlMsgDataSource)
    settle_shared_environment(spark)
    follow_stages(spark)


def settle_shared_environment(spark: SparkSession) -> None:
    """Insert :data:`STREAM_RUNNER_KEYS` into the ``controlmsg`` data source's shared environment map now, on
    the calling thread, so that no query can corrupt it later (idempotent; milliseconds; no-op on Spark Connect).

    Each streaming query over a Python data source starts a ``PythonStreamingSourceRunner`` on its own thread,
    whose ``init()`` puts four keys into the data source function's ``envVars``: one map per data source in the
    JVM, not thread-safe, and not copied (a Spark bug, reported in docs/SPARK_RACE.md). Two controlmsg streams
    that start together in a fresh JVM can insert at once and leave the map's size counter off its entries;
    from then on every serialisation of a plan that holds the map fails (``Task not serializable``,
    ``IllegalStateException: Illegal size 5 of collection, expected 7``) until the JVM ends. With the keys
    already present, a runner's ``put`` only replaces a value and the map's structure never changes.

    Each key gets the value the runner would give it (the configured local directories, the socket timeout
    and buffer size of Spark's conf, ``PYTHON_WORKER``); the runner replaces ``SPARK_LOCAL_DIRS`` with its
    block manager's directories under them when it starts. A key already there is left alone. Called by
    :func:`register` (so by :func:`spark_session`) and by ``with_watermark``. Where the map cannot be reached
    (a Spark whose internals differ), a WARNING says so and names the remedy: start streams one at a time.
    """
    jvm: Any = getattr(spark, "_jvm", None)
    if jvm is None:  # Spark Connect: the map lives in the server's JVM, out of a client's reach
        return
    try:
        from controlmsg.spark.datasource import ControlMsgDataSource

        source = spark._jsparkSession.sessionState().dataSourceManager().lookupDataSource(ControlMsgDataSource.name())
        shared = source.dataSourceCls().envVars()
        conf = spark.sparkContext._jsc.sc().conf()
        config = jvm.org.apache.spark.internal.config
        values = {
            "SPARK_LOCAL_DIRS": ",".join(jvm.org.apache.spark.util.Utils.getConfiguredLocalDirs(conf)),
            "SPARK_AUTH_SOCKET_TIMEOUT": str(conf.get(config.Python.PYTHON_AUTH_SOCKET_TIMEOUT())),
            "SPARK_BUFFER_SIZE": str(conf.get(getattr(getattr(config, "package$"), "MODULE$").BUFFER_SIZE())),
            "SPARK_PYTHON_RUNTIME": "PYTHON_WORKER",
        }
        for key in STREAM_RUNNER_KEYS:
            shared.putIfAbsent(key, values[key])
    except Exception as exc:  # a py4j error: Spark's internals are not the ones this was written for
        _LOG.warning("controlmsg could not settle the data source's shared environment map (%s: %s); two "
                     "controlmsg streams started at the same moment may then corrupt it (docs/SPARK_RACE.md): "
                     "start them one after another", type(exc).__name__, exc)


def _known(spark: SparkSession, name: str) -> bool:
    """Whether ``spark`` already has a data source ``name``, statically found or registered. ``False``
    where the JVM session cannot be asked (Spark Connect): registering then is always right."""
    try:
        return bool(spark._jsparkSession.sessionState().dataSourceManager().dataSourceExists(name))
    except Exception:  # any failure to ask means: register
        return False


def spark_session(
    master: str = "local[2]",
    app_name: str = "controlmsg",
    conf: Mapping[str, str] | None = None,
    *,
    class_archive: bool = True,
) -> SparkSession:
    """Get or create a SparkSession and register the ``controlmsg`` data source.

    Sets ``PYSPARK_PYTHON`` (and ``PYSPARK_DRIVER_PYTHON``) to ``sys.executable`` unless already set,
    the session time zone to UTC, disables the UI and keeps shuffles small, which suits the local
    masters of tests and demos; ``conf`` overrides any of it. ``master`` may carry a retry count for
    local mode: ``"local[2,4]"`` runs two cores and allows four attempts per task. Blocks while the JVM
    starts (seconds).

    ``class_archive``: a new driver JVM starts from the machine's class-data archive
    (:mod:`controlmsg.spark.class_archive`: about half the start-up CPU), built by the first session on
    the machine that has none (about 35 s, once); so do the executors of a master that is not ``local``,
    where the archive is at the same path (a cluster on this machine: 3-4 s less CPU per executor).
    Off: ``False`` or ``CONTROLMSG_CLASS_ARCHIVE=off``.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "4",
        "spark.sql.session.timeZone": "UTC",
        "spark.executorEnv.PYSPARK_PYTHON": os.environ["PYSPARK_PYTHON"],
        **(conf or {}),
    }
    if class_archive and SparkContext._active_spark_context is None:  # a new JVM: it can use the archive
        # Executors are JVMs of their own unless the master is local[...]: the same archive serves them where
        # it exists at the same path (a cluster on this machine, containers of one image); elsewhere the JVM
        # finds no file there, or one of another installation, and loads its classes as usual.
        in_process = master == "local" or master.startswith("local[")
        keys = [_JAVA_OPTIONS] if in_process else [_JAVA_OPTIONS, _EXECUTOR_OPTIONS]
        for key in keys:
            options = driver_java_options(settings.get(key, ""))
            if options:
                settings[key] = options
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    return spark
