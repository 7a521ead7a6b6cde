"""The offset log as the stream writer reads it: versions 1 and 2, and a named refusal for whatever it cannot
read or does not know (never a silent ``None``). Spark's own files are exercised in
tests/spark/test_checkpoint_locations.py; these are the cases Spark does not write on demand."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlmsg.errors import CheckpointError, WatermarkNotFollowed
from controlmsg.spark.query_log import (
    END_OF_TIME_MS,
    StageProgress,
    check_offset_log_follows,
    check_watermark_follows,
    offset_log_dir,
    stage_progress,
)
from controlmsg.spark.stage import _epoch_ms, _iso_ms, progress_of

ENDED = json.dumps({"bookkeeping": {"streamEnded": True}})
GOING = json.dumps({"bookkeeping": {"streamEnded": False}})


def entry(root: Path, batch: int, *lines: str) -> None:
    (root / "offsets").mkdir(exist_ok=True)
    (root / "offsets" / str(batch)).write_text("\n".join(lines))


@pytest.mark.parametrize(("version", "sources", "ended"), [
    ("v1", [ENDED, ENDED], True),
    ("v1", [ENDED, GOING], False),
    ("v1", [ENDED, "-"], False),
    ("v2", [f"0:{ENDED}", f"1:{ENDED}"], True),
    ("v2", [f"0:{ENDED}", "1:-"], False),
    ("v2", [f"src_a:{json.dumps({'envelope': 'none', 'ended': True})}"], True),
])
def test_versions_1_and_2(tmp_path: Path, version: str, sources: list[str], ended: bool) -> None:
    entry(tmp_path, 3, version, json.dumps({"batchWatermarkMs": 1234}), *sources)
    assert stage_progress(tmp_path, 3, "t") == StageProgress(1234, ended, False)


def test_another_version_is_refused(tmp_path: Path) -> None:
    entry(tmp_path, 0, "v3", json.dumps({"batchWatermarkMs": 0}), ENDED)
    with pytest.raises(CheckpointError, match=r"of version 'v3', this reader reads v1 and v2 .*stageProgress"):
        stage_progress(tmp_path, 0, "t")


def test_a_missing_entry_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"offsets/7' cannot be read .*stageProgress"):
        stage_progress(tmp_path, 7, "t")


def test_no_metadata_line_is_refused(tmp_path: Path) -> None:
    entry(tmp_path, 0, "v1")
    with pytest.raises(CheckpointError, match="no metadata line with batchWatermarkMs"):
        stage_progress(tmp_path, 0, "t")


@pytest.mark.parametrize("location", ["hdfs://nn:8020/ck", "s3a://bucket/ck", "abfss://c@a.dfs.core.windows.net/ck",
                                      "gs://bucket/ck", "viewfs://cluster/ck", "myfs://anything"])
def test_locations_only_hadoop_reaches_are_refused(location: str) -> None:
    with pytest.raises(CheckpointError, match=rf"checkpointLocation '{location}' is not on the driver's local file"):
        offset_log_dir(location, "t")


def test_local_locations(tmp_path: Path) -> None:
    assert offset_log_dir(str(tmp_path), "t") == tmp_path
    assert offset_log_dir(tmp_path.as_uri(), "t") == tmp_path
    with pytest.raises(CheckpointError, match="no option checkpointLocation"):
        offset_log_dir(None, "t")


def controlmsg_offset(watermark: int | None, *, ended: bool = False, rows: bool = True) -> str:
    book = {"streamEnded": ended, "emittedWatermark": watermark}
    return json.dumps({"format": 1, "bookkeeping": book, **({"watermarkRows": True} if rows else {})})


@pytest.mark.parametrize(("sources", "reconciled"), [
    ([controlmsg_offset(5000)], 5000),
    ([controlmsg_offset(5000), controlmsg_offset(3000)], 3000),  # the smallest over the sources
    ([controlmsg_offset(5000, ended=True)], END_OF_TIME_MS),
    ([controlmsg_offset(None)], None),  # no watermark yet
    ([controlmsg_offset(5000, rows=False)], None),  # read without _control: no watermark rows, nothing to follow
    ([controlmsg_offset(5000), "-"], None),  # another source feeds Spark's watermark too
])
def test_the_reconciled_watermark_of_the_sources(tmp_path: Path, sources: list[str], reconciled: int | None) -> None:
    entry(tmp_path, 1, "v1", json.dumps({"batchWatermarkMs": 0}), *sources)
    assert stage_progress(tmp_path, 1, "t").reconciled == reconciled


def test_sparks_watermark_behind_the_reconciled_one_is_refused_naming_the_spark_version(tmp_path: Path) -> None:
    entry(tmp_path, 4, "v1", json.dumps({"batchWatermarkMs": 1_000}), controlmsg_offset(7_200_000))
    entry(tmp_path, 5, "v1", json.dumps({"batchWatermarkMs": 3_600_000}), controlmsg_offset(7_200_000))
    entry(tmp_path, 6, "v1", json.dumps({"batchWatermarkMs": 7_200_000}), controlmsg_offset(7_200_000))
    check_offset_log_follows(tmp_path, 4, stage_progress(tmp_path, 4, "t"), "t")  # no entry 3: nothing to compare
    check_offset_log_follows(tmp_path, 6, stage_progress(tmp_path, 6, "t"), "t")  # follows
    before, now = stage_progress(tmp_path, 4, "t"), stage_progress(tmp_path, 5, "t")
    check_watermark_follows(before, StageProgress(0, False, reconciled=7_200_000), 5, "t", "9.9.9")  # no watermark
    with pytest.raises(WatermarkNotFollowed, match=(
            r"^t: Spark's watermark in micro-batch 5 is 1970-01-01T01:00:00.000Z, behind the reconciled watermark "
            r"1970-01-01T02:00:00.000Z its controlmsg sources had given by micro-batch 4: Spark 9.9.9 does not "
            r"follow with_watermark")) as refused:
        check_watermark_follows(before, now, 5, "t", "9.9.9")
    assert refused.value.spark_version == "9.9.9"


@given(st.integers(0, END_OF_TIME_MS))
def test_progress_timestamps_read_back_exactly_to_the_end_of_time(ms: int) -> None:
    """Spark's progress says its watermark as an ISO text; read back in whole milliseconds, the end of time
    included (through a float's seconds it came back 1 ms short, and a stage that had ended did not end)."""
    text = (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)).isoformat(timespec="milliseconds")
    assert _epoch_ms(text.replace("+00:00", "Z")) == ms
    assert _iso_ms(ms) == text.replace("+00:00", "Z")
    assert progress_of({"eventTime": {"watermark": _iso_ms(ms)}, "sources": []}).watermark == ms


def test_before_sparks_first_watermark_a_stage_on_with_watermark_forwards_nothing(tmp_path: Path) -> None:
    """A stateful query's first micro-batch (Spark's watermark 0) on :func:`with_watermark`: the largest event time seen
    may be ahead of what an input (a slow one, a slow task) has promised, so nothing is forwarded until Spark's
    watermark, which is the reconciled one. Only a query without watermark rows takes the weaker rule."""
    no_rows = json.dumps({"bookkeeping": {"streamEnded": False, "emittedWatermark": 600_000}})
    entry(tmp_path, 0, "v1", json.dumps({"batchWatermarkMs": 0}), controlmsg_offset(600_000), no_rows)
    entry(tmp_path, 1, "v1", json.dumps({"batchWatermarkMs": 600_000}), controlmsg_offset(600_000))
    entry(tmp_path, 2, "v1", json.dumps({"batchWatermarkMs": 0}), no_rows)
    (tmp_path / "state").mkdir()  # a query with state (windows): one without forwards its input's (below)
    first, second, plain = (stage_progress(tmp_path, b, "t") for b in (0, 1, 2))
    assert first.watermark_rows and not plain.watermark_rows
    assert first.forwarded(1_170_000, 0) is None
    assert second.forwarded(1_170_000, 0) == 600_000
    assert plain.forwarded(1_170_000, 10_000) == 1_160_000  # largest event time minus allowedLateness
    assert plain.forwarded(None, 0) is None
    # The same facts from a progress, as the driver program's rounds read them (stageProgress driver)
    progress = {"eventTime": {}, "sources": [{"endOffset": json.loads(controlmsg_offset(600_000))}],
                "stateOperators": [{"numRowsTotal": 0}]}
    assert progress_of(progress).forwarded(1_170_000, 0) is None
    assert progress_of({**progress, "eventTime": {"watermark": _iso_ms(600_000)}}).forwarded(1_170_000, 0) == 600_000


def test_a_stage_without_state_forwards_its_inputs_reconciled_watermark_a_micro_batch_early(tmp_path: Path) -> None:
    """Spark's watermark in micro-batch n is the reconciled watermark of n - 1; a stage without state forwards
    the reconciled watermark of n itself after n (a stateful one keeps Spark's: its windows come a
    micro-batch after their input)."""
    entry(tmp_path, 0, "v1", json.dumps({"batchWatermarkMs": 0}), controlmsg_offset(600_000))
    entry(tmp_path, 1, "v1", json.dumps({"batchWatermarkMs": 600_000}), controlmsg_offset(1_200_000),
          controlmsg_offset(900_000))
    first, second = stage_progress(tmp_path, 0, "t"), stage_progress(tmp_path, 1, "t")
    assert first.forwarded(None, 0) == 600_000  # before Spark's first watermark too
    assert second.forwarded(None, 0) == 900_000  # the smallest over the inputs, ahead of Spark's 600_000
    (tmp_path / "state").mkdir()
    assert stage_progress(tmp_path, 0, "t").forwarded(None, 0) is None
    assert stage_progress(tmp_path, 1, "t").forwarded(None, 0) == 600_000
