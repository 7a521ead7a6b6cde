"""controlmsg on Spark: the ``controlmsg`` data source and session helpers.

``format("controlmsg")`` works the four ways Spark's Kafka connector does::

    df.write.format("controlmsg").option("topic", T).option("runId", R) \\
        .option("kafka.bootstrap.servers", B).option("key", "user").option("eventTime", "ts").save()
    spark.read.format("controlmsg").options(...).schema("user string, ts timestamp").load()
    spark.readStream.format("controlmsg").options(...).schema("user string, _watermark timestamp").load()
    df.writeStream.format("controlmsg").options(...).option("checkpointLocation", C).start()

The source registers itself in any session whose Python can import this package (Spark imports the
module ``pyspark_controlmsg`` it installs); :func:`register` does it explicitly. Executors need the
package installed too (the same environment, or ``spark.submit.pyFiles``).

This package imports pyspark only when one of its names is used, so ``import controlmsg`` and the Kafka
tools work without pyspark.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from controlmsg.lazy import lazy_getattr

if TYPE_CHECKING:
    from controlmsg.spark.datasource import ControlMsgDataSource
    from controlmsg.spark.event_time import WATERMARK_COLUMNS, late_records, observed_counts, with_watermark
    from controlmsg.spark.metrics import serve_metrics
    from controlmsg.spark.read_schema import RAW_SCHEMA
    from controlmsg.spark.reading.source_metrics import source_metrics
    from controlmsg.spark.reading.timeouts import EndOfStreamTimeout
    from controlmsg.spark.session import register, spark_session
    from controlmsg.spark.stage import StageFollower, StageNotEnded, await_stage
    from controlmsg.spark.writing.run_control import end_stream, run_status

__all__ = [
    "RAW_SCHEMA",
    "WATERMARK_COLUMNS",
    "ControlMsgDataSource",
    "EndOfStreamTimeout",
    "StageFollower",
    "StageNotEnded",
    "await_stage",
    "end_stream",
    "late_records",
    "observed_counts",
    "register",
    "run_status",
    "serve_metrics",
    "source_metrics",
    "spark_session",
    "with_watermark",
]

_WHERE = {
    "ControlMsgDataSource": "controlmsg.spark.datasource",
    "RAW_SCHEMA": "controlmsg.spark.read_schema",
    "WATERMARK_COLUMNS": "controlmsg.spark.event_time",
    "with_watermark": "controlmsg.spark.event_time",
    "late_records": "controlmsg.spark.event_time",
    "observed_counts": "controlmsg.spark.event_time",
    "EndOfStreamTimeout": "controlmsg.spark.reading.timeouts",
    "register": "controlmsg.spark.session",
    "spark_session": "controlmsg.spark.session",
    "source_metrics": "controlmsg.spark.reading.source_metrics",
    "serve_metrics": "controlmsg.spark.metrics",
    "StageFollower": "controlmsg.spark.stage",
    "StageNotEnded": "controlmsg.spark.stage",
    "await_stage": "controlmsg.spark.stage",
    "end_stream": "controlmsg.spark.writing.run_control",
    "run_status": "controlmsg.spark.writing.run_control",
}

__getattr__ = lazy_getattr(__name__, _WHERE)
