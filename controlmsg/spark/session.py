"""A SparkSession set up for controlmsg: workers on this interpreter, the data source registered.

Spark's Python workers run ``PYSPARK_PYTHON``; unless it names an interpreter that has controlmsg
installed, every read or write task fails to import it. :func:`spark_session` points it at the running
interpreter (``sys.executable``) when it is not set, which is right for ``local[...]`` masters and for
standalone clusters whose workers share this environment's path.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pyspark import SparkContext
from pyspark.sql import SparkSession

from controlmsg.clusters.class_archive import driver_java_options

__all__ = ["register", "spark_session"]

_JAVA_OPTIONS = "spark.driver.extraJavaOptions"


def register(spark: SparkSession) -> None:
    """Make ``format("controlmsg")`` known to ``spark``, a classic or a Spark Connect session
    (idempotent). Where a classic session's Spark has found ``pyspark_controlmsg`` by itself (controlmsg
    installed, or its checkout on the Python path), that registration stands: registering again would
    replace it, and Spark logs a warning for that. A Connect session cannot be asked: the data source is
    sent to the server for this session every time; the server's Python needs controlmsg installed to
    run it."""
    from controlmsg.spark.datasource import ControlMsgDataSource

    if not _known(spark, ControlMsgDataSource.name()):
        spark.dataSource.register(ControlMsgDataSource)


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
    (:mod:`controlmsg.clusters.class_archive`: about half the start-up CPU), built by the first session on
    the machine that has none (about 35 s, once). Off: ``False`` or ``CONTROLMSG_CLASS_ARCHIVE=off``.
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
        options = driver_java_options(settings.get(_JAVA_OPTIONS, ""))
        if options:
            settings[_JAVA_OPTIONS] = options
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    return spark
