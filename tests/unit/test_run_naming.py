"""The names a run's resources carry (:mod:`controlmsg.core.naming`), as ``controlmsg cleanup`` finds them:
every name the pipeline's jobs make is found for its run, and none of another run, even one whose id starts
with the first one's or ends with it."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from controlmsg.core.naming import (
    MARKER_GROUP_PREFIX,
    demo_topic,
    driver_transactional_id,
    is_run_group,
    marker_group,
    run_topics,
    stage_transactional_id,
    task_name,
    transactional_id,
)
from controlmsg.kafka.cleanup import process_signs
from controlmsg.streaming.ingest import source_group
from spark_jobs.common import topic_names

run_ids = st.text(alphabet="abcdefghij0123456789-._", min_size=1, max_size=12)


def groups_of(run: str) -> set[str]:
    """Every consumer group a run of the pipeline's jobs commits to (markers and the source group)."""
    events, windows = topic_names(run)
    found = {source_group(events, run)}
    for topic, job in ((events, "ingest"), (windows, "window_aggregate"), (windows, "window")):
        txns = {transactional_id(topic, task_name(job, run, i)) for i in (0, 1, 12)}
        txns |= {driver_transactional_id(topic, job, run), stage_transactional_id(topic, job, run)}
        found |= txns | {marker_group(t) for t in txns}  # the markers' groups, and where they were before
    return found


def test_the_pipeline_topics_are_the_runs() -> None:
    events, windows = topic_names("r1")
    # The streaming jobs' defaults: stream_ingest's --rejects-topic and stop channel, stream_window's
    # --late-topic, --state-topic and stop channel.
    made = {events, windows, f"{events}-rejects", f"{events}-stop", f"{windows}-late", f"{windows}-state",
            f"{windows}-stop", demo_topic("r1")}
    assert set(run_topics("r1")) == made
    assert set(run_topics("r1", control_only=True)) == {events, windows, demo_topic("r1")}


@given(run_ids, run_ids)
def test_a_run_finds_its_own_groups_and_no_other_runs(run: str, other: str) -> None:
    assert all(is_run_group(g, run) for g in groups_of(run))
    if other != run:
        assert not any(is_run_group(g, run) for g in groups_of(other))
        assert not set(run_topics(run)) & set(run_topics(other))


def test_look_alike_run_ids() -> None:
    for other in ("r1-2", "xr1", "r1x", "2-r1", "events-r1"):
        assert not any(is_run_group(g, "r1") for g in groups_of(other)), other
        assert not set(run_topics("r1")) & set(run_topics(other)), other
    assert not is_run_group("controlmsg-controlmsg-r1-events", "r1")  # no task after the topic
    assert not is_run_group("controlmsg-end-offsets", "r1")


@given(run_ids)
def test_every_marker_group_and_no_other_group_is_under_the_one_prefix_lag_tools_leave_out(run: str) -> None:
    events, windows = topic_names(run)
    txns = [transactional_id(events, task_name("ingest", run, 3)), driver_transactional_id(windows, "w", run),
            stage_transactional_id(windows, "w", run)]
    for txn in txns:
        assert re.match(r"^controlmsg\.marker\.", marker_group(txn)), txn
        assert marker_group(txn).removeprefix(MARKER_GROUP_PREFIX) == txn.removeprefix("controlmsg-")
        assert not re.match(r"^controlmsg\.marker\.", txn)  # where a marker was before 2026-11-28
    assert not re.match(r"^controlmsg\.marker\.", source_group(events, run))  # a real consumer's


def test_processes_naming_the_run(tmp_path: Path) -> None:
    def proc(pid: int, *argv: str) -> None:
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")

    proc(101, "python", "-m", "spark_jobs.batch.ingest", "--run-id", "r1", "--topic", "t")
    proc(102, "python", "-m", "spark_jobs.pipeline", "--run-id=r1")
    proc(103, "python", "-m", "spark_jobs.batch.ingest", "--run-id", "r1-2")
    proc(104, "python", "-m", "controlmsg", "consume", "--topic", "r1")
    (tmp_path / "self").mkdir()
    assert [s.split(" (")[0] for s in process_signs("r1", tmp_path)] == ["process 101", "process 102"]
