"""The bad-record options of the data source's readers (``mode``, ``deadLetterTopic``,
``columnNameOfCorruptRecord``): parsed once, refused with the values they take. No Spark needed."""

from __future__ import annotations

import pytest

from controlmsg.spark.options import BadRecordMode, ReadOptions

BASE = {"topic": "t", "runId": "r", "kafka.bootstrap.servers": "b:1"}


def parse(**more: str) -> ReadOptions:
    return ReadOptions.parse({**BASE, **more})


def test_defaults_fail_fast() -> None:
    opts = parse()
    assert (opts.mode, opts.dead_letter_topic, opts.corrupt_column) == (BadRecordMode.FAILFAST, None, "_corrupt_record")


def test_modes_in_any_case_and_the_dead_letter_topic() -> None:
    assert parse(mode="permissive", columnNameOfCorruptRecord="bad").mode is BadRecordMode.PERMISSIVE
    assert parse(MODE="FailFast").mode is BadRecordMode.FAILFAST
    assert parse(columnNameOfCorruptRecord="bad").corrupt_column == "bad"
    alone = parse(deadLetterTopic="dlq")
    assert (alone.mode, alone.dead_letter_topic) == (BadRecordMode.DROPMALFORMED, "dlq")
    assert parse(mode="DROPMALFORMED", deadlettertopic="dlq") == alone


def test_refusals_say_what_is_valid() -> None:
    with pytest.raises(ValueError, match=r"'mode' must be one of FAILFAST, PERMISSIVE, DROPMALFORMED .*'lenient'"):
        parse(mode="lenient")
    with pytest.raises(ValueError, match=r"DROPMALFORMED leaves bad records out.*'deadLetterTopic'"):
        parse(mode="DROPMALFORMED")
    for mode in ("FAILFAST", "PERMISSIVE"):
        with pytest.raises(ValueError, match=f"cannot be combined with mode {mode}"):
            parse(mode=mode, deadLetterTopic="dlq")


def test_a_read_written_for_format_kafka_is_told_about_envelope_none() -> None:
    """The guide's read with only the format's name changed: no runId, so it is not an intermediate topic's
    read; the error names the option that reads a plain topic."""
    with pytest.raises(ValueError, match=r"needs the option 'runId'.*envelope none"):
        ReadOptions.parse({"kafka.bootstrap.servers": "b:9092", "subscribe": "topic1"})
    assert ReadOptions.parse({"kafka.bootstrap.servers": "b:9092", "subscribe": "topic1", "runId": "r"}).run_id == "r"
