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

from pyspark.sql import SparkSession

__all__ = ["register", "spark_session"]


def register(spark: SparkSession) -> None:
    """Register the ``controlmsg`` data source with ``spark`` (idempotent). Not needed where Spark finds
    ``pyspark_controlmsg`` by itself, harmless there."""
    from controlmsg.spark.datasource import ControlMsgDataSource

    spark.dataSource.register(ControlMsgDataSource)


def spark_session(
    master: str = "local[2]",
    app_name: str = "controlmsg",
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """Get or create a SparkSession and register the ``controlmsg`` data source.

    Sets ``PYSPARK_PYTHON`` (and ``PYSPARK_DRIVER_PYTHON``) to ``sys.executable`` unless already set,
    the session time zone to UTC, disables the UI and keeps shuffles small, which suits the local
    masters of tests and demos; ``conf`` overrides any of it. ``master`` may carry a retry count for
    local mode: ``"local[2,4]"`` runs two cores and allows four attempts per task. Blocks while the JVM
    starts (seconds).
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
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    return spark
