#!/usr/bin/env python3
"""What the window task's state costs to commit and to restore: the changelog (format 2) vs the whole
snapshot in one record (format 1, the baseline).

    python benchmarks/bench_window_state.py [--sizes 1000,100000,1000000] [--changed 0.01] [--rounds R]

For each number of open windows N (one window per key, a count and one sum):

1. full commit: the first commit, which writes every window (changelog: one record per window, then the
   header; snapshot: one record) in one Kafka transaction, committed;
2. 1% commit: ``--changed`` of the windows got a record since the last commit (changelog: those windows
   and the header; snapshot: everything again);
3. restore: read the task's state partition to its end (``read_committed``) and rebuild the
   ``TumblingWindows``, checked equal to the original.

Time (wall, median of ``--rounds``) and bytes (keys plus values produced) per commit, and the ratio
snapshot / changelog where the snapshot can be written at all: a record larger than the producer's
``message.max.bytes`` (1,000,000 by default) is refused, which the output says instead of a figure.

Kafka: ``--bootstrap-servers`` (default ``$KAFKA_BOOTSTRAP_SERVERS``), otherwise a local broker started for
the run. Topics created here are deleted at the end.
"""

from __future__ import annotations

import argparse
import gc
import platform
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from common import add_cluster_options, delete_topics, kafka_cluster, load_average
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from controlmsg.errors import DeliveryError
from controlmsg.kafka import ControlWriter, create_topic
from controlmsg.streaming.state_topic import read_task_state, state_key, write_task_state
from controlmsg.streaming.windows import TumblingWindows

RUN = "bench"
SIZE_MS = 60_000
MAX_RECORD = 1_000_000  # librdkafka's default message.max.bytes
perf = time.perf_counter


@dataclass
class Figures:
    full_s: float | None = None
    full_bytes: int | None = None
    delta_s: float | None = None
    delta_bytes: int | None = None
    restore_s: float | None = None
    note: str = ""


def make_windows(n: int, rng: random.Random) -> TumblingWindows:
    w = TumblingWindows(SIZE_MS, ("amount",))
    for i in range(n):
        w.add(f"user-{i:08d}", rng.randrange(SIZE_MS), {"amount": rng.randrange(1000) / 10})
    return w


def touch(w: TumblingWindows, n: int, fraction: float, rng: random.Random) -> None:
    for i in rng.sample(range(n), max(1, int(n * fraction))):
        w.add(f"user-{i:08d}", rng.randrange(SIZE_MS), {"amount": 1.5})


def header() -> dict[str, Any]:
    """Stands for the task's own fields (offsets, bookkeeping of 4 upstream tasks, counters)."""
    return {"inputTopic": "events", "partitions": [0, 1], "offsets": {"0": 123456, "1": 654321},
            "bookkeeping": {"tasks": {f"ingest-{RUN}-p{i}": {"watermark": 1_700_000_000_000} for i in range(4)}},
            "emitted_watermark": 1_700_000_000_000, "counters": {"records": 1, "commits": 1}}


def timed(f: Callable[..., Any], *args: Any) -> tuple[float, Any]:
    gc.collect()
    t = perf()
    out = f(*args)
    return perf() - t, out


def log_commit(writer: ControlWriter, topic: str, task: int, w: TumblingWindows) -> int:
    """One commit of the changelog way, as controlmsg.streaming.state_topic makes it; returns the bytes produced."""
    _, size = write_task_state(writer, topic, 0, RUN, task, header(), w)
    writer.commit()
    w.mark_committed()
    return int(size)


def log_restore(config: dict[str, str], topic: str, task: int) -> TumblingWindows:
    log = read_task_state(config, topic, RUN, task, timeout=60)
    assert log is not None
    return log.windows(SIZE_MS, ("amount",))


def snap_commit(writer: ControlWriter, topic: str, key: str, w: TumblingWindows) -> int:
    """One commit of the snapshot way (format 1); ``ValueError`` when the record is too large."""
    value = orjson.dumps({"format": 1, **header(), "windows": w.snapshot()})
    if len(value) > MAX_RECORD:
        raise ValueError(f"one record of {len(value) / 1e6:.1f} MB > message.max.bytes {MAX_RECORD}")
    writer.produce_to(topic, value, key, 0)
    writer.commit()
    return len(key) + len(value)


def snap_restore(config: dict[str, str], topic: str, key: str) -> TumblingWindows:
    value = read_latest(config, topic, key.encode())
    return TumblingWindows.restore(orjson.loads(value)["windows"], size_ms=SIZE_MS, sum_fields=("amount",))


def changelog(config: dict[str, str], topic: str, output: str, n: int, fraction: float, rounds: int,
              seed: int) -> Figures:
    fig = Figures()
    full, delta, restore = [], [], []
    for r in range(rounds):
        rng = random.Random(seed + r)
        w = make_windows(n, rng)
        writer = ControlWriter({**config, "transactional.id": f"bench-state-{uuid.uuid4().hex}"}, output,
                               task_name=f"window-{RUN}-p{r}", task_count=rounds, run_id=RUN)
        try:
            t, fig.full_bytes = timed(log_commit, writer, topic, r, w)
            full.append(t)
            touch(w, n, fraction, rng)
            t, fig.delta_bytes = timed(log_commit, writer, topic, r, w)
            delta.append(t)
        finally:
            writer.close()
        t, back = timed(log_restore, config, topic, r)
        restore.append(t)
        if back.snapshot() != w.snapshot():
            sys.exit(f"changelog restore of {n} windows differs from the original")
        del back, w
    fig.full_s, fig.delta_s, fig.restore_s = (statistics.median(x) for x in (full, delta, restore))
    return fig


def snapshot_way(config: dict[str, str], topic: str, output: str, n: int, fraction: float, rounds: int,
                 seed: int) -> Figures:
    """Format 1: the whole snapshot, one record, at every commit; restore reads the latest of it."""
    fig = Figures()
    full, delta, restore = [], [], []
    for r in range(rounds):
        rng = random.Random(seed + r)
        w = make_windows(n, rng)
        key = f"{state_key(RUN, r)}-snapshot"
        writer = ControlWriter({**config, "transactional.id": f"bench-snap-{uuid.uuid4().hex}"}, output,
                               task_name=f"window-{RUN}-p{r}", task_count=rounds, run_id=RUN)
        try:
            try:
                t, fig.full_bytes = timed(snap_commit, writer, topic, key, w)
            except (ValueError, DeliveryError) as exc:
                fig.note = f"cannot: {exc}"
                return fig
            full.append(t)
            touch(w, n, fraction, rng)
            t, fig.delta_bytes = timed(snap_commit, writer, topic, key, w)
            delta.append(t)
        finally:
            writer.close()
        t, back = timed(snap_restore, config, topic, key)
        restore.append(t)
        if back.snapshot() != w.snapshot():
            sys.exit(f"snapshot restore of {n} windows differs from the original")
    fig.full_s, fig.delta_s, fig.restore_s = (statistics.median(x) for x in (full, delta, restore))
    return fig


def read_latest(config: dict[str, str], topic: str, key: bytes) -> bytes:
    """The old read_task_state: the latest committed value of ``key`` in partition 0, read to the end."""
    consumer = Consumer({**config, "group.id": f"bench-{uuid.uuid4().hex}", "isolation.level": "read_committed",
                         "enable.partition.eof": True, "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    latest: bytes | None = None
    try:
        while True:
            for msg in consumer.consume(500, 0.5):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        assert latest is not None
                        return latest
                    raise RuntimeError(err.str())
                if msg.key() == key:
                    latest = msg.value()
    finally:
        consumer.close()


def fmt_s(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.1f} ms" if x < 1 else f"{x:.2f} s"


def fmt_b(x: int | None) -> str:
    return "-" if x is None else f"{x / 1e6:.2f} MB" if x >= 1e5 else f"{x / 1e3:.1f} kB"


def ratio(a: float | int | None, b: float | int | None) -> str:
    return "-" if a is None or b is None or not b else f"{a / b:.2f}x"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--sizes", default="1000,100000,1000000", help="open windows, comma-separated")
    ap.add_argument("--changed", type=float, default=0.01, help="fraction of windows changed before the "
                                                                "second commit (default 0.01)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per size, median reported (default 3)")
    ap.add_argument("--seed", type=int, default=1)
    add_cluster_options(ap)
    args = ap.parse_args()
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        ap.error("--sizes: comma-separated integers")
    if min(sizes) < 100 or not 0 < args.changed <= 1 or args.rounds < 1:
        ap.error("need sizes >= 100, 0 < --changed <= 1, --rounds >= 1")
    print(f"python {platform.python_version()} on {platform.machine()}, load average {load_average()}")
    with kafka_cluster(args) as cluster:
        config = cluster.config
        topics: list[str] = []
        try:
            output = f"bench-state-out-{uuid.uuid4().hex[:8]}"
            create_topic(config, output, 1)
            topics.append(output)
            rows = []
            for n in sizes:
                fresh = []
                for way in ("log", "snap"):
                    topic = f"bench-state-{way}-{n}-{uuid.uuid4().hex[:8]}"
                    create_topic(config, topic, 1, topic_config={"cleanup.policy": "compact"})
                    topics.append(topic)
                    fresh.append(topic)
                log = changelog(config, fresh[0], output, n, args.changed, args.rounds, args.seed)
                snap = snapshot_way(config, fresh[1], output, n, args.changed, args.rounds, args.seed)
                rows.append((n, log, snap))
                print(f"{n:>9,} windows: changelog full {fmt_s(log.full_s)} {fmt_b(log.full_bytes)}, "
                      f"{args.changed:.0%} {fmt_s(log.delta_s)} {fmt_b(log.delta_bytes)}, restore "
                      f"{fmt_s(log.restore_s)}; snapshot " + (snap.note or
                      f"{fmt_s(snap.full_s)} {fmt_b(snap.full_bytes)}, restore {fmt_s(snap.restore_s)}"),
                      flush=True)
        finally:
            delete_topics(config, topics)
    pct = f"{args.changed:.0%} changed"
    print()
    print(f"{'open windows':>12} | {'way':<9} | {'full commit':>20} | {pct + ' commit':>20} | {'restore':>9}")
    for n, log, snap in rows:
        print(f"{n:>12,} | {'changelog':<9} | {fmt_s(log.full_s):>9} {fmt_b(log.full_bytes):>10} | "
              f"{fmt_s(log.delta_s):>9} {fmt_b(log.delta_bytes):>10} | {fmt_s(log.restore_s):>9}")
        if snap.note:
            print(f"{'':>12} | {'snapshot':<9} | {snap.note}")
            continue
        print(f"{'':>12} | {'snapshot':<9} | {fmt_s(snap.full_s):>9} {fmt_b(snap.full_bytes):>10} | "
              f"{fmt_s(snap.delta_s):>9} {fmt_b(snap.delta_bytes):>10} | {fmt_s(snap.restore_s):>9}")
        print(f"{'':>12} | {'snap/log':<9} | {ratio(snap.full_s, log.full_s):>9} "
              f"{ratio(snap.full_bytes, log.full_bytes):>10} | {ratio(snap.delta_s, log.delta_s):>9} "
              f"{ratio(snap.delta_bytes, log.delta_bytes):>10} | {ratio(snap.restore_s, log.restore_s):>9}")


if __name__ == "__main__":
    main()
