"""A stage over two inputs (``examples/two_inputs.py``, run as its own application): a stream-stream join with
an event-time bound, and a union, of two controlmsg topics that two upstream jobs write.

Each, in one scenario:

1. both upstreams write a first part; the first input's watermark is 20 minutes in, the second's 10: the
   stage forwards the minimum (10) and never more;
2. the stage is killed (``kill -9`` of its process group) after its first micro-batch and started again with
   the same command;
3. the first input writes the rest and ends; the second writes the rest with its watermark at 30 minutes: the
   stage forwards 30 (the ended input counts for nothing) and does not end;
4. the second input ends: the stage ends by itself (exit 0), and its topic's end of stream follows.

What the next job reads of the output topic, to its end of stream, equals an oracle computed here from what the
upstreams wrote (every union record once; every pair of records with the same key at most a minute apart
once), and no watermark it reads is beyond the minimum of the inputs' watermarks written by then."""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from controlmsg.clusters.job_group import JobGroup
from controlmsg.core.events import StreamEnded, WatermarkAdvanced
from controlmsg.kafka import ControlReader, ControlWriter
from tests.spark.jobs import kill9

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.beside]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "two_inputs.py"
T0 = 1_767_225_600_000
MINUTE = 60_000
BOUND = MINUTE  # the join's: the example's --bound
Event = tuple[str, int, int]  # key, ts, v


class Upstream:
    """One upstream job: ``tasks`` writers of one run to ``topic``; what they wrote, and their watermark."""

    def __init__(self, config: dict[str, Any], topic: str, run_id: str, tasks: int) -> None:
        self.writers = [ControlWriter(config, topic, task_name=f"{run_id}-{t}", task_count=tasks, run_id=run_id)
                        for t in range(tasks)]
        self.events: list[Event] = []
        self.watermark = 0

    def write(self, minutes: range, offset_ms: int, watermark: int | None, *, end: bool = False) -> None:
        """Each task writes one record per minute of ``minutes`` (key ``k<minute % 3>``), at ``offset_ms`` plus
        its index in seconds into the minute; then its watermark, or its end of stream."""
        for t, writer in enumerate(self.writers):
            for m in minutes:
                event = (f"k{m % 3}", T0 + m * MINUTE + offset_ms + t * 1000, m * 10 + t)
                writer.send({"key": event[0], "ts": event[1], "v": event[2]}, key=event[0])
                self.events.append(event)
            if end:
                writer.send_end_of_stream()
            elif watermark is not None:
                writer.send_watermark(watermark)
            writer.flush()
        self.watermark = sys.maxsize if end else watermark or self.watermark

    def close(self) -> None:
        for writer in self.writers:
            writer.close()


def oracle(how: str, left: list[Event], right: list[Event]) -> Counter[tuple[Any, ...]]:
    if how == "union":
        return Counter([(k, ts, 0, v) for k, ts, v in left] + [(k, ts, 1, v) for k, ts, v in right])
    return Counter((lk, max(lt, rt), lt, rt, lv, rv) for lk, lt, lv in left for rk, rt, rv in right
                   if lk == rk and abs(lt - rt) <= BOUND)


def as_row(how: str, payload: bytes) -> tuple[Any, ...]:
    r = orjson.loads(payload)
    if how == "union":
        return r["key"], r["ts"], r["side"], r["v"]
    return r["key"], r["ts"], r["left_ts"], r["right_ts"], r["left_v"], r["right_v"]


class Downstream:
    """The next job: reads the stage's topic, and checks each watermark against the inputs' minimum."""

    def __init__(self, config: dict[str, Any], topic: str, run_id: str, bound: Callable[[], int]) -> None:
        self.reader = ControlReader(config, topic, run_id=run_id, topic_timeout=120)
        self.bound = bound
        self.payloads: list[bytes] = []
        self.watermarks: list[int] = []
        self.ended = False

    def poll_until(self, done: Callable[[], bool], seconds: float, what: str, jobs: JobGroup) -> None:
        deadline = time.monotonic() + seconds
        while not done():
            assert time.monotonic() < deadline, f"{what} not read in {seconds} s:\n{jobs['stage'].tail()}"
            for item in self.reader.poll(0.5):
                if isinstance(item, WatermarkAdvanced):
                    assert item.timestamp <= self.bound(), (
                        f"the stage forwarded {item.timestamp - T0} ms, beyond the inputs' minimum "
                        f"{self.bound() - T0} ms")
                    self.watermarks.append(item.timestamp)
                elif isinstance(item, StreamEnded):
                    self.ended = True
                elif hasattr(item, "payload"):
                    self.payloads.append(item.payload)


@pytest.mark.parametrize("how", ["join", "union"])
def test_a_stage_over_two_inputs_runs_on_their_minimum_and_ends_when_both_have_ended(
        how: str, kafka_config: dict[str, Any], bootstrap_servers: str, new_topic: Callable[..., str],
        tmp_path: Path) -> None:
    left_topic, right_topic, out_topic = new_topic(2), new_topic(2), new_topic(2)
    left = Upstream(kafka_config, left_topic, "left-r1", 2)
    right = Upstream(kafka_config, right_topic, "right-r1", 1)
    command = [sys.executable, str(EXAMPLE), "--how", how, "--left", left_topic, "--left-run-id", "left-r1",
               "--right", right_topic, "--right-run-id", "right-r1", "--output", out_topic, "--run-id", "out-r1",
               "--checkpoint", str(tmp_path / "checkpoint"), "--bootstrap-servers", bootstrap_servers]
    jobs = JobGroup(tmp_path)
    # The output topic is created by the stage's first write; the next job waits for it (topic_timeout).
    down: Downstream | None = None
    try:
        left.write(range(0, 20), 0, T0 + 20 * MINUTE)
        right.write(range(0, 20), 30_000, T0 + 10 * MINUTE)
        jobs.start("stage", command)
        down = Downstream(kafka_config, out_topic, "out-r1", lambda: min(left.watermark, right.watermark))
        down.poll_until(lambda: T0 + 10 * MINUTE in down.watermarks, 180, "the inputs' minimum, 10 minutes", jobs)
        # The round is written in the sink's commit, before Spark logs the micro-batch as committed.
        deadline = time.monotonic() + 60
        while not (tmp_path / "checkpoint" / "commits" / "0").exists():
            assert time.monotonic() < deadline, f"micro-batch 0 not committed:\n{jobs['stage'].tail()}"
            time.sleep(0.1)
        kill9(jobs, "stage")
        jobs.start("stage", command)

        left.write(range(20, 40), 0, None, end=True)
        right.write(range(20, 40), 30_000, T0 + 30 * MINUTE)
        down.poll_until(lambda: T0 + 30 * MINUTE in down.watermarks, 180, "the second input's 30 minutes", jobs)
        assert jobs["stage"].running(), f"one input has not ended, the stage must not:\n{jobs['stage'].tail()}"
        assert not down.ended

        right.write(range(40, 45), 30_000, None, end=True)
        codes = jobs.wait(240)
        assert codes == {"stage": 0}, f"the stage ends by itself once both inputs have:\n{jobs['stage'].tail()}"
        down.poll_until(lambda: down.ended, 60, "the end of stream", jobs)
    finally:
        jobs.close()
        left.close()
        right.close()
        if down is not None:
            down.reader.close()
    got = Counter(as_row(how, payload) for payload in down.payloads)
    expected = oracle(how, left.events, right.events)
    assert max(got.values()) == 1, "every result once, across the kill"
    assert got == expected
    assert down.watermarks == sorted(down.watermarks)
    # The program ends right after awaitTermination(): the JVM's last progress events reach no Python gone by then.
    assert "threw an exception" not in (tmp_path / "stage.log").read_text(encoding="utf-8", errors="replace")
