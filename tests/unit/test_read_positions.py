"""What a reader subscribes to and where a plain read starts and stops (``controlmsg.spark.positions``):
``format("kafka")``'s option names and meanings, parsed once, refused in one line. No Spark needed."""

from __future__ import annotations

import pytest

from controlmsg.spark.options import ReadOptions
from controlmsg.spark.positions import DEFAULT_MAX_TRIGGER_DELAY_MS, Bound, Positions, Subscription
from controlmsg.spark.read_schema import is_raw_schema

SERVERS = {"kafka.bootstrap.servers": "b:1"}


def plain(**more: str) -> ReadOptions:
    return ReadOptions.parse({**SERVERS, "envelope": "none", **more})


def test_what_is_read() -> None:
    assert plain(topic="t").subscription == Subscription(topics=("t",))
    several = plain(subscribe="a, b,a")
    assert (several.subscription, several.topic) == (Subscription(topics=("a", "b")), "a,b")
    pattern = plain(subscribePattern="clicks-.*").subscription
    assert pattern.matches("clicks-raw") and not pattern.matches("x-clicks-raw") and not pattern.matches("__clicks-")
    assert plain(assign='{"b": [1, 0], "a": [2]}').subscription.assigned == (("a", 2), ("b", 0), ("b", 1))
    with pytest.raises(ValueError, match="give one of the options 'topic', 'subscribePattern'"):
        plain(topic="t", subscribePattern="x")
    with pytest.raises(ValueError, match="needs the option 'topic' \\(or 'subscribe', 'subscribePattern' or 'assign'"):
        plain()
    with pytest.raises(ValueError, match="'subscribePattern': '\\(' is not a regular expression"):
        plain(subscribePattern="(")
    with pytest.raises(ValueError, match="'assign' must be a JSON object of topics to partition lists"):
        plain(assign='{"a": 1}')


def test_where_a_plain_read_starts_and_stops() -> None:
    assert plain(topic="t").positions == Positions()
    assert Positions().max_trigger_delay_ms == DEFAULT_MAX_TRIGGER_DELAY_MS == 900_000
    pos = plain(topic="t", startingOffsets='{"t": {"1": -1, "0": 23}}', endingOffsets='{"t": {"0": 30, "1": -1}}',
                failOnDataLoss="FALSE", minOffsetsPerTrigger="100", maxTriggerDelay="10s").positions
    assert pos is not None
    assert pos.starting == Bound("offsets", "startingOffsets", (("t", 0, 23), ("t", 1, -1)))
    assert pos.ending.per_partition() == {("t", 0): 30, ("t", 1): -1} and pos.ending_given
    assert (pos.fail_on_data_loss, pos.min_offsets_per_trigger, pos.max_trigger_delay_ms) == (False, 100, 10_000)
    # as in Spark: the timestamp forms win, startingTimestamp first
    both = plain(topic="t", startingOffsets="latest", startingOffsetsByTimestamp='{"t": {"0": 5}}',
                 startingTimestamp="7", startingOffsetsByTimestampStrategy="LATEST").positions
    assert both is not None and both.starting == Bound("timestamp", "startingTimestamp", timestamp=7)
    assert both.timestamp_strategy == "latest"
    assert plain(topic="t", endingOffsetsByTimestamp='{"t": {"0": 5}}').positions.ending.kind == "timestamps"  # type: ignore[union-attr]


@pytest.mark.parametrize(("given", "message"), [
    ({"startingOffsets": "first"}, "'startingOffsets' must be JSON here"),
    ({"startingOffsets": '{"t": {"x": 1}}'}, "'startingOffsets' must be 'earliest', 'latest' or JSON of offsets"),
    ({"startingOffsets": '{"t": {"0": -3}}'}, "an offset is a number from 0, or -2"),
    ({"endingOffsets": "earliest"}, "'endingOffsets' cannot be earliest"),
    ({"endingOffsets": '{"t": {"0": -2}}'}, "-2 \\(earliest\\) cannot be an ending offset"),
    ({"startingTimestamp": "yesterday"}, "'startingTimestamp' must be a timestamp in epoch milliseconds"),
    ({"startingOffsetsByTimestampStrategy": "skip"}, "must be error or latest"),
    ({"failOnDataLoss": "maybe"}, "'failOnDataLoss' must be true or false"),
    ({"minOffsetsPerTrigger": "0"}, "'minOffsetsPerTrigger' must be a whole number of at least 1"),
    ({"minOffsetsPerTrigger": "10", "maxOffsetsPerTrigger": "5"}, "is above 'maxOffsetsPerTrigger'"),
    ({"maxTriggerDelay": "soon"}, "'maxTriggerDelay': not a duration"),
    ({"minPartitions": "4"}, "'minPartitions' is not taken by format\\(\"controlmsg\"\\): a reading task here reads"),
])
def test_refusals_name_the_option(given: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plain(topic="t", **given)


def test_an_intermediate_topic_refuses_them_in_one_line_each() -> None:
    base = {**SERVERS, "topic": "t", "runId": "r"}
    assert ReadOptions.parse(base).positions is None
    assert ReadOptions.parse({**base, "failOnDataLoss": "true"}).positions is None  # what it does anyway
    for name in ("startingOffsets", "startingTimestamp", "startingOffsetsByTimestamp", "endingOffsets",
                 "endingTimestamp", "endingOffsetsByTimestamp"):
        with pytest.raises(ValueError, match=f"^option '{name}' is for a plain topic \\(envelope none\\); an "
                                             "intermediate topic [^\n]*$"):
            ReadOptions.parse({**base, name: "1"})


def test_an_intermediate_stream_takes_minOffsetsPerTrigger_and_maxTriggerDelay() -> None:
    base = {**SERVERS, "topic": "t", "runId": "r"}
    assert ReadOptions.parse(base).trigger_hold is None
    for read in (base, {**SERVERS, "topic": "t", "envelope": "none"}):  # alone it would do nothing: refused
        with pytest.raises(ValueError, match=r"^option 'maxTriggerDelay' .* without it: give 'minOffsetsPerTrigger'"):
            ReadOptions.parse({**read, "maxTriggerDelay": "10s"})
    assert ReadOptions.parse({**base, "minOffsetsPerTrigger": "500"}).trigger_hold == (500, 15 * 60 * 1000)
    assert ReadOptions.parse({**base, "minOffsetsPerTrigger": "500", "maxTriggerDelay": "10s"}).trigger_hold == (
        500, 10_000)
    with pytest.raises(ValueError, match=r"^option 'minOffsetsPerTrigger' must be a whole number of at least 1"):
        ReadOptions.parse({**base, "minOffsetsPerTrigger": "0"})
    assert ReadOptions.parse({**SERVERS, "topic": "t", "envelope": "none",
                              "minOffsetsPerTrigger": "5"}).trigger_hold is None  # a plain read's: in positions


def test_which_declared_schemas_read_records_as_they_are() -> None:
    assert is_raw_schema(["partition", "offset", "key", "value"])  # the schema-less columns before issue 30
    assert is_raw_schema(["value", "topic"]) and is_raw_schema(["headers", "value", "timestamp"])
    assert not is_raw_schema(["timestamp", "value"])  # JSON fields of common names
    assert not is_raw_schema(["key", "value"]) and not is_raw_schema(["partition", "offset", "key"])
    assert not is_raw_schema(["value", "topic", "amount"])
    # A binary value is the record's own (JSON has no bytes), with the watermark fields of a stream or without.
    assert is_raw_schema(["value", "_watermark", "_partition_watermark", "_control"], binary_value=True)
    assert is_raw_schema(["key", "value"], binary_value=True) and is_raw_schema(["value"], binary_value=True)
    assert not is_raw_schema(["value", "_watermark", "_control"])  # a string value next to them: a JSON field
    assert not is_raw_schema(["_watermark", "_control"], binary_value=True)
    assert not is_raw_schema(["value", "user"], binary_value=True)
