"""The ``controlmsg`` Spark data source: one class for read, readStream, write and writeStream.

Registered by :func:`controlmsg.spark.register` (or by itself: Spark looks up the module
``pyspark_controlmsg`` that this package installs). Options are in :mod:`controlmsg.spark.options`; the
readers in :mod:`controlmsg.spark.reading` (a plain topic's, option ``envelope none``, in
:mod:`controlmsg.spark.reading.plain_readers`), the writers in :mod:`controlmsg.spark.writing`.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from controlmsg.spark.options import ReadOptions, WriteOptions

# The readers and writers (pyarrow, confluent-kafka) are imported when first asked for: Spark imports this
# module in every short-lived Python worker that only looks the source up by name.

__all__ = ["ControlMsgDataSource"]


def _append_only(overwrite: bool) -> None:
    if overwrite:
        raise ValueError("the controlmsg data source only appends: a run's records cannot be taken back from a "
                         "Kafka topic, so mode('overwrite') is refused; use mode('append') and a new runId")


_KAFKA_WRITE_COLUMNS = frozenset({"key", "value", "topic", "partition", "headers"})
"""The columns ``df.write.format("kafka")`` takes by name."""


def _refuse_kafka_shapes(options: Mapping[str, str], schema: StructType) -> None:
    """A write shaped for ``format("kafka")`` that a controlmsg writer would carry out otherwise is refused in
    one line rather than written differently:

    - a ``topic`` column without the option ``topic``: ``format("kafka")`` takes each row's topic from it; a
      controlmsg write is one run of one topic, whose end of stream its readers wait for;
    - a DataFrame of ``format("kafka")``'s columns only (``value`` among them) without the options ``key``
      and ``value``: ``format("kafka")`` writes the ``value`` column as the payload, a controlmsg writer
      writes each row as one JSON object unless the option ``value`` names the column."""
    given = {key.lower() for key, value in options.items() if value}
    names = {field.name.lower() for field in schema.fields}
    if "topic" not in given and "topic" in names:
        raise ValueError("a 'topic' column does not choose the topic of a controlmsg write: a run is one topic, "
                         "whose end of stream its readers wait for; give the option 'topic' (the column is then a "
                         "field of each record's value)")
    if "value" in names and names <= _KAFKA_WRITE_COLUMNS and not given & {"key", "value"}:
        raise ValueError(f"the columns {', '.join(sorted(names))} are format('kafka')'s, but a controlmsg writer "
                         "takes a column as the record's payload only by the option 'value' and as its key by the "
                         "option 'key' (else it writes each row as one JSON object): give .option('value', 'value') "
                         "and .option('key', 'key') to write them as format('kafka') does, or either option to "
                         "choose")


class ControlMsgDataSource(DataSource):
    """``format("controlmsg")``. Without ``.schema()``, reads give ``format("kafka")``'s columns: ``key``,
    ``value``, ``topic``, ``partition``, ``offset``, ``timestamp``, ``timestampType`` (and ``headers`` with
    ``includeHeaders``)."""

    @classmethod
    def name(cls) -> str:
        return "controlmsg"

    def schema(self) -> str:
        from controlmsg.spark.options import lower_keys
        from controlmsg.spark.read_schema import raw_schema

        text = (lower_keys(self.options).get("includeheaders") or "false").strip().lower()
        return raw_schema(text in ("true", "1", "yes"))

    def reader(self, schema: StructType) -> DataSourceReader:
        opts = ReadOptions.parse(self.options)
        if opts.plain:
            from controlmsg.spark.reading.plain_readers import PlainBatchReader

            return PlainBatchReader(opts, schema)
        from controlmsg.spark.reading.batch_reader import BatchReader

        return BatchReader(opts, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        opts = ReadOptions.parse(self.options)
        if opts.plain:
            from controlmsg.spark.reading.plain_readers import PlainStreamReader

            return PlainStreamReader(opts, schema)
        from controlmsg.spark.reading.stream_reader import StreamReader

        return StreamReader(opts, schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from controlmsg.spark.writing.batch_writer import BatchWriter

        _append_only(overwrite)
        _refuse_kafka_shapes(self.options, schema)
        return BatchWriter(WriteOptions.parse(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from controlmsg.spark.writing.stream_writer import StreamWriter

        _append_only(overwrite)
        _refuse_kafka_shapes(self.options, schema)
        return StreamWriter(WriteOptions.parse(self.options), schema)
