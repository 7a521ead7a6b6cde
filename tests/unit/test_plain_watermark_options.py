"""A plain stream's watermark options (``eventTimeField``, ``maxOutOfOrderness``, ``idleTimeout``): parsed
once, refused in one line where they cannot be honoured; the driver's reading of event times, as the
executors parse them. No Spark session, no broker."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DataType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from controlmsg.spark.options import ReadOptions
from controlmsg.spark.query_log import END_OF_TIME_MS, offset_reconciled
from controlmsg.spark.reading.plain_watermark import event_time_reader, rule_of, tick

PLAIN = {"topic": "t", "envelope": "none", "kafka.bootstrap.servers": "b:1"}
MARKS = "_watermark timestamp, _partition_watermark timestamp, _control boolean"


_TYPES: dict[str, DataType] = {"string": StringType(), "timestamp": TimestampType(), "boolean": BooleanType(),
                               "binary": BinaryType()}


def schema(ddl: str) -> StructType:
    """A schema of ``name type`` pairs (``StructType.fromDDL`` needs a session)."""
    return StructType([StructField(name, _TYPES[kind]) for name, kind in
                       (field.strip().split() for field in ddl.split(","))])


def test_the_options_parse_as_durations() -> None:
    opts = ReadOptions.parse({**PLAIN, "eventTimeField": "ts", "maxOutOfOrderness": "10s", "IDLETIMEOUT": "1m"})
    assert (opts.event_time_field, opts.max_out_of_orderness_ms, opts.idle_timeout_ms) == ("ts", 10_000, 60_000)
    assert ReadOptions.parse({**PLAIN, "maxOutOfOrderness": "0s"}).max_out_of_orderness_ms == 0
    assert ReadOptions.parse(PLAIN).max_out_of_orderness_ms is None
    drift = ReadOptions.parse({**PLAIN, "maxOutOfOrderness": "0s", "maxWatermarkDrift": "1h"})
    assert drift.max_watermark_drift_ms == 3_600_000


@pytest.mark.parametrize(("more", "message"), [
    ({"eventTimeField": "ts"}, r"option 'eventTimeField' needs the option 'maxOutOfOrderness'"),
    ({"idleTimeout": "1m"}, r"option 'idleTimeout' needs the option 'maxOutOfOrderness'"),
    ({"maxWatermarkDrift": "1h"}, r"option 'maxWatermarkDrift' needs the option 'maxOutOfOrderness'"),
    ({"maxOutOfOrderness": "soon"}, r"option 'maxOutOfOrderness': not a duration"),
    ({"maxOutOfOrderness": "1s", "idleTimeout": "0s"}, r"option 'idleTimeout': a duration must be above zero"),
])
def test_refused_in_one_line(more: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ReadOptions.parse({**PLAIN, **more})


def test_an_intermediate_topic_refuses_them() -> None:
    with pytest.raises(ValueError, match=r"option 'maxOutOfOrderness' makes the watermark of a plain topic"):
        ReadOptions.parse({"topic": "t", "runId": "r", "kafka.bootstrap.servers": "b:1", "maxOutOfOrderness": "1s"})


def test_the_watermark_fields_and_the_options_go_together() -> None:
    with_fields = schema(f"user string, ts timestamp, {MARKS}")
    none = ReadOptions.parse(PLAIN)
    with pytest.raises(ValueError, match=r"needs the options 'eventTimeField' and 'maxOutOfOrderness'"):
        rule_of(none, with_fields)
    with pytest.raises(ValueError, match=r"needs the option 'maxOutOfOrderness'"):
        rule_of(ReadOptions(**{**_fields(none), "event_time_field": "ts"}), with_fields)
    given = ReadOptions.parse({**PLAIN, "eventTimeField": "ts", "maxOutOfOrderness": "5s", "idleTimeout": "2s",
                               "maxWatermarkDrift": "1m"})
    with pytest.raises(ValueError, match=r"call with_watermark on the read"):
        rule_of(given, schema("user string, ts timestamp"))
    assert rule_of(none, schema("user string, ts timestamp")) is None
    rule = rule_of(given, with_fields)
    assert rule is not None and (rule.bound_ms, rule.idle_ms, rule.drift_ms) == (5_000, 2_000, 60_000)
    with pytest.raises(ValueError, match=r"the field 'user' is string; the event time is a timestamp field"):
        rule_of(ReadOptions(**{**_fields(given), "event_time_field": "user"}), with_fields)
    with pytest.raises(ValueError, match=r"'eventTimeField' is 'when', which is not a field of the schema"):
        rule_of(ReadOptions(**{**_fields(given), "event_time_field": "when"}), with_fields)


def _fields(opts: ReadOptions) -> dict[str, Any]:
    return {name: getattr(opts, name) for name in opts.__slots__}


class _Msg:
    def __init__(self, value: bytes | None, timestamp: tuple[int, int] = (0, -1)) -> None:
        self._value, self._timestamp = value, timestamp

    def value(self) -> bytes | None:
        return self._value

    def timestamp(self) -> tuple[int, int]:
        return self._timestamp


def test_event_times_are_read_as_the_executors_read_them() -> None:
    opts = ReadOptions.parse({**PLAIN, "eventTimeField": "ts", "maxOutOfOrderness": "0s"})
    read = event_time_reader(opts, schema(f"user string, ts timestamp, {MARKS}"))
    msgs = [_Msg(b'{"ts": "2026-01-01T01:00:00Z"}'), _Msg(b'{"ts": "2026-01-01T00:00:00.0015Z"}'),
            _Msg(b"not json"), _Msg(b'{"ts": 12}'), _Msg(b'{"ts": "yesterday"}'), _Msg(b"[1]"), _Msg(None),
            _Msg(b'{"ts": "2026-01-01 00:00:00"}')]  # no zone: the executors' cast refuses it too (a bad record)
    assert read(msgs) == [1_767_229_200_000, 1_767_225_600_001, None, None, None, None, None, None]
    stamped = ReadOptions.parse({**PLAIN, "eventTimeField": "_timestamp", "maxOutOfOrderness": "0s"})
    by_record = event_time_reader(stamped, schema(f"user string, _timestamp timestamp, {MARKS}"))
    assert by_record([_Msg(b"{}", (1, 42)), _Msg(b"{}", (2, 43)), _Msg(b"{}", (0, -1))]) == [42, 43, None]
    raw = ReadOptions.parse({**PLAIN, "eventTimeField": "timestamp", "maxOutOfOrderness": "0s"})
    assert event_time_reader(raw, schema(f"value binary, timestamp timestamp, {MARKS}"))([_Msg(b"x", (1, 7))]) == [7]


def test_the_watermark_row_and_the_reconciled_watermark_of_a_plain_offset() -> None:
    start = {"envelope": "none", "eventTime": {"watermark": 10, "partitions": []}}
    assert tick(start, {"eventTime": {"watermark": 10, "partitions": []}}) is None
    assert tick(start, {"eventTime": {"watermark": 20, "partitions": []}}) == 20
    assert tick({}, {"eventTime": {"watermark": None, "partitions": []}}) is None
    line = '{"envelope": "none", "watermarkRows": true, "ended": false, "eventTime": {"watermark": 20}}'
    assert offset_reconciled(line) == 20
    assert offset_reconciled(line.replace('"ended": false', '"ended": true')) == END_OF_TIME_MS
    assert offset_reconciled(line.replace('"watermarkRows": true', '"watermarkRows": false')) is None
