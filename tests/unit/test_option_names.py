"""Option names the data source does not know are refused, never silently left at their defaults
(``controlmsg.spark.options.check_names``). No Spark needed; ``tests/spark/test_datasource.py`` checks the
same refusal through a real read."""

from __future__ import annotations

import re

import pytest

from controlmsg.spark.options import OPTION_NAMES, ReadOptions, WriteOptions, check_names

BASE = {"topic": "t", "runId": "r", "kafka.bootstrap.servers": "b:1"}


@pytest.mark.parametrize("parse", [ReadOptions.parse, WriteOptions.parse])
@pytest.mark.parametrize(("typo", "meant"), [("startingOffset", "startingOffsets"),
                                             ("maxOffsetPerTrigger", "maxOffsetsPerTrigger"),
                                             ("eventtim", "eventTime"), ("runID ", "runId"),
                                             ("allowedLatenes", "allowedLateness")])
def test_a_misspelt_option_is_refused_naming_what_was_meant(parse: object, typo: str, meant: str) -> None:
    with pytest.raises(ValueError, match=rf"^option '{re.escape(typo)}' is not an option of "
                                         rf"format\(\"controlmsg\"\); did you mean .*'{meant}'"):
        parse({**BASE, typo: "1"})  # type: ignore[operator]


def test_a_name_far_from_any_points_to_the_docs_and_a_path_to_the_topic_option() -> None:
    with pytest.raises(ValueError, match=r"option 'bootstrap' is not an option .*docs/SPARK\.md lists the options"):
        check_names({**BASE, "bootstrap": "b:1"})
    with pytest.raises(ValueError, match=r"takes no path \(load\(\) and save\(\) were given 'events'\): name the "
                                         "topic with the option 'topic'"):
        ReadOptions.parse({**BASE, "path": "events"})


def test_every_known_name_in_any_case_and_the_prefixes_pass() -> None:
    check_names({name: "x" for name in OPTION_NAMES})
    check_names({name.upper(): "x" for name in OPTION_NAMES})
    check_names({"kafka.security.protocol": "SSL", "topicConfig.min.insync.replicas": "2"})
    with pytest.raises(ValueError, match=r"option 'kafka\.' is not"):
        check_names({"kafka.": "x"})  # a prefix alone names no setting


def test_one_map_serves_a_reader_and_a_writer() -> None:
    both = {**BASE, "key": "user", "eventTime": "ts", "partitionsPerTask": "2", "maxScanMs": "500"}
    assert WriteOptions.parse(both).key == "user"
    assert ReadOptions.parse(both).max_scan_ms == 500


def test_run_tag_defaults_to_the_envelope_and_data_headers_is_its_earlier_spelling() -> None:
    base = BASE
    assert WriteOptions.parse(base).run_tag == "envelope"
    assert WriteOptions.parse(base).run_in_envelope and not WriteOptions.parse(base).data_headers
    assert WriteOptions.parse({**base, "RUNTAG": " Headers "}).data_headers
    assert WriteOptions.parse({**base, "runTag": "none"}).run_tag == "none"
    assert WriteOptions.parse({**base, "dataHeaders": "true"}).run_tag == "headers"
    assert WriteOptions.parse({**base, "dataHeaders": "false"}).run_tag == "none"
    with pytest.raises(ValueError, match="option 'runTag' must be one of envelope, headers, none, got 'value'"):
        WriteOptions.parse({**base, "runTag": "value"})
    with pytest.raises(ValueError, match="options 'runTag' and 'dataHeaders' both given"):
        WriteOptions.parse({**base, "runTag": "envelope", "dataHeaders": "true"})
