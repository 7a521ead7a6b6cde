#!/usr/bin/env python3
"""What the controlmsg envelope costs: controlmsg vs bare orjson / confluent-kafka, on the same records.

    python benchmarks/bench_protocol.py [--records N] [--rounds R] [--partitions P]

Three measures, each printed as absolute rates (records/s) and a ratio (controlmsg / baseline):

1. codec:  ``orjson.loads(decode(encode_json(v)))`` vs ``orjson.loads(orjson.dumps(v))``.
2. writer: ``ControlWriter.send(v, key)`` (plus its watermarks and end of stream) then ``flush()`` vs a bare
   ``Producer.produce(topic, orjson.dumps(v), key)`` then ``flush()``, each into its own fresh topic.
3. reader: ``ControlReader.poll()`` until all data records are read vs a bare ``Consumer.consume()`` loop;
   and ``ControlReader.poll_columns()`` (the batch form the Spark data source reads with: parallel lists,
   no ``DataRecord`` per record) vs the same bare loop.

Kafka: ``$KAFKA_BOOTSTRAP_SERVERS`` when set, otherwise a local broker started for the run (on a free port,
in a temporary directory) and stopped at the end. Topics created here are deleted at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import platform
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import confluent_kafka
import orjson
from common import add_cluster_options, delete_topics, kafka_cluster, load_average
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from controlmsg.core.codec import decode, encode_control, encode_json
from controlmsg.core.messages import EndOfStreamMessage, WatermarkMessage
from controlmsg.kafka import ControlReader, ControlWriter, DataColumns, DataRecord, create_topic

DEFAULT_RECORDS = 400_000
DEFAULT_ROUNDS = 5
WATERMARK_EVERY = 10_000  # data records between two watermarks of a writer
BATCH = 2000  # consume batch size, for ControlReader (its default) and the bare consumer alike
DISTINCT = 50_000  # distinct record dicts; the record list cycles through them
T0_MS = 1_732_200_000_000
perf = time.perf_counter
cpu = time.thread_time  # CPU time of the calling (Python) thread only: librdkafka's own threads excluded

EVENTS = ["purchase", "refund", "view", "add_to_cart", "checkout"]
TAGS = ["mobile", "web", "promo", "returning", "new", "eu", "us", "gift", "express"]
CURRENCIES = ["EUR", "USD", "GBP", "JPY", "CHF"]


# ----------------------------------------------------------------------------------------------- data


def make_records(n: int) -> tuple[list[dict[str, Any]], list[str]]:
    """``n`` realistic event dicts (about 150 bytes of JSON each) and their keys (the user id)."""
    rng = random.Random(20241121)
    pool = []
    for i in range(min(n, DISTINCT)):
        pool.append(
            {
                "user": f"user-{rng.randrange(1_000_000):07d}",
                "event": rng.choice(EVENTS),
                "amount": round(rng.uniform(0.5, 5000.0), 2),
                "currency": rng.choice(CURRENCIES),
                "items": rng.randint(1, 12),
                "ts": T0_MS + 7 * i,
                "tags": rng.sample(TAGS, rng.randint(1, 3)),
            }
        )
    values = [pool[i % len(pool)] for i in range(n)]
    return values, [v["user"] for v in values]


def chunked(values: list[Any], keys: list[str], size: int) -> list[tuple[list[Any], list[str]]]:
    return [(values[s : s + size], keys[s : s + size]) for s in range(0, len(values), size)]


# ----------------------------------------------------------------------------------------------- utils


@dataclass(frozen=True)
class Sample:
    rate: float  # records/s, wall clock
    cpu_ns: float  # CPU time of the Python thread per record, same window (0: not measured)


@dataclass
class Result:
    name: str
    ours: list[float]  # rec/s of each round
    base: list[float]
    goal: float | None
    ours_cpu: list[float] | None = None  # CPU ns/record of each round (Kafka measures)
    base_cpu: list[float] | None = None

    @property
    def ours_best(self) -> float:
        return max(self.ours)

    @property
    def base_best(self) -> float:
        return max(self.base)

    @property
    def ratio(self) -> float:
        return self.ours_best / self.base_best

    @property
    def median_ratio(self) -> float:
        return statistics.median(self.ours) / statistics.median(self.base)


def alternate(rounds: int, a: Callable[[], Sample], b: Callable[[], Sample], label: str) -> tuple[list[Sample], ...]:
    """Run ``a`` and ``b`` ``rounds`` times each, alternating (A B, B A, A B, ...); return both sample lists."""
    ra: list[Sample] = []
    rb: list[Sample] = []
    for r in range(rounds):
        order = [("controlmsg", a, ra), ("baseline", b, rb)]
        if r % 2:
            order.reverse()
        for who, fn, out in order:
            gc.collect()
            got = fn()
            out.append(got)
            cpu = f"  ({got.cpu_ns:,.0f} ns Python-thread CPU/record)" if got.cpu_ns else ""
            print(f"  {label} round {r + 1} {who:<10} {got.rate:>12,.0f} rec/s{cpu}", flush=True)
    return ra, rb


def result(name: str, ra: list[Sample], rb: list[Sample], goal: float | None, cpu: bool) -> Result:
    return Result(name, [s.rate for s in ra], [s.rate for s in rb], goal,
                  [s.cpu_ns for s in ra] if cpu else None, [s.cpu_ns for s in rb] if cpu else None)


def fmt(rate: float) -> str:
    return f"{rate:,.0f}"


class Topics:
    """Creates fresh topics and deletes them all at the end."""

    def __init__(self, config: dict[str, str], partitions: int) -> None:
        self.conf = dict(config)
        self.partitions = partitions
        self.prefix = f"bench-{uuid.uuid4().hex[:8]}"
        self.created: list[str] = []

    def new(self, what: str) -> str:
        name = f"{self.prefix}-{what}-{len(self.created)}"
        create_topic(self.conf, name, self.partitions)
        self.created.append(name)
        return name

    def record_count(self, topic: str) -> int:
        """Sum of the partitions' high-water marks: the records in a fresh, non-transactional topic."""
        c = Consumer({**self.conf, "group.id": f"bench-count-{uuid.uuid4().hex}"})
        try:
            return sum(c.get_watermark_offsets(TopicPartition(topic, p), timeout=10.0)[1]
                       for p in range(self.partitions))
        finally:
            c.close()

    def delete_all(self) -> None:
        delete_topics(self.conf, self.created)


def machine_info() -> None:
    cpu_model = platform.processor() or "?"
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    ck = confluent_kafka.version()
    ck_version = ck[0] if isinstance(ck, tuple) else ck
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"machine: {platform.platform()}; cpu: {cpu_model}; cores: {os.cpu_count()} (usable {usable}); "
          f"load average {load_average()} (other work on the machine skews every rate)")
    print(f"python {platform.python_version()} ({platform.python_implementation()}); "
          f"confluent-kafka {ck_version}; librdkafka {confluent_kafka.libversion()[0]}; "
          f"orjson {orjson.__version__}")


# ----------------------------------------------------------------------------------------------- 1. codec


def codec_controlmsg(values: list[Any]) -> Sample:
    enc, dec, loads = encode_json, decode, orjson.loads
    c = cpu()
    t = perf()
    for v in values:
        loads(dec(enc(v)))  # type: ignore[arg-type]  # a user message decodes to bytes
    return Sample(len(values) / (perf() - t), (cpu() - c) / len(values) * 1e9)


def codec_orjson(values: list[Any]) -> Sample:
    dumps, loads = orjson.dumps, orjson.loads
    c = cpu()
    t = perf()
    for v in values:
        loads(dumps(v))
    return Sample(len(values) / (perf() - t), (cpu() - c) / len(values) * 1e9)


def codec_floor(values: list[Any]) -> Sample:
    """The envelope's byte work written inline (concatenate the type byte, test it, slice it off), without
    the two function calls: what the codec costs at the least, in Python, over bare orjson."""
    dumps, loads, user = orjson.dumps, orjson.loads, b"\x00"
    c = cpu()
    t = perf()
    for v in values:
        value = user + dumps(v)
        if value[0] == 0:
            loads(value[1:])
    return Sample(len(values) / (perf() - t), (cpu() - c) / len(values) * 1e9)


def codec_control(n: int) -> float:
    """encode_control + decode of prebuilt watermark and end-of-stream messages (construction excluded)."""
    msgs = [
        WatermarkMessage("task-0", 2, T0_MS + i, "run-bench") if i % 8 else EndOfStreamMessage("task-0", 2, "run-bench")
        for i in range(n)
    ]
    enc, dec = encode_control, decode
    gc.collect()
    t = perf()
    for m in msgs:
        dec(enc(m))
    return n / (perf() - t)


# ----------------------------------------------------------------------------------------------- 2. writer


def write_controlmsg(topics: Topics, conf: dict[str, Any], chunks: list[tuple[list[Any], list[str]]], n: int) -> Sample:
    topic = topics.new("writer-controlmsg")
    w = ControlWriter(conf, topic, task_name="task-0", task_count=1, run_id="run-bench", partitions=topics.partitions)
    send = w.send
    wm = T0_MS
    c = cpu()
    t = perf()
    for values, keys in chunks:
        for v, k in zip(values, keys, strict=True):
            send(v, k)
        if len(values) == WATERMARK_EVERY:
            wm += WATERMARK_EVERY
            w.send_watermark(wm)
    w.send_end_of_stream()
    w.flush()
    elapsed = perf() - t
    used = cpu() - c
    w.close()
    controls = (n // WATERMARK_EVERY + 1) * topics.partitions
    got = topics.record_count(topic)
    if got != n + controls:
        raise SystemExit(f"writer check failed: {topic} holds {got} records, expected {n} + {controls}")
    return Sample(n / elapsed, used / n * 1e9)


def produce_when_room(p: Producer, topic: str, value: bytes, key: str) -> None:
    while True:
        p.poll(0.05)
        try:
            p.produce(topic, value, key)
            return
        except BufferError:
            continue


def write_bare(topics: Topics, conf: dict[str, Any], chunks: list[tuple[list[Any], list[str]]], n: int,
               envelope: bool = False) -> Sample:
    """A bare Producer; with ``envelope``, also the least any writer of the format that sees its delivery
    errors does: the type byte before each value and a delivery callback (called on errors only, as
    ControlWriter's), the floor for ControlWriter."""
    topic = topics.new("writer-floor" if envelope else "writer-bare")
    errors: list[Any] = []
    p = Producer({**conf, "on_delivery": lambda err, _msg: errors.append(err)} if envelope else conf)
    produce, dumps, user = p.produce, orjson.dumps, b"\x00"
    c = cpu()
    t = perf()
    for values, keys in chunks:
        for v, k in zip(values, keys, strict=True):
            value = user + dumps(v) if envelope else dumps(v)
            try:
                produce(topic, value, k)
            except BufferError:  # local queue full: let librdkafka drain it (as ControlWriter does)
                produce_when_room(p, topic, value, k)
    left = p.flush(60.0)
    elapsed = perf() - t
    used = cpu() - c
    if left or errors:
        raise SystemExit(f"bare producer: {left} records undelivered, {len(errors)} delivery errors")
    got = topics.record_count(topic)
    if got != n:
        raise SystemExit(f"writer check failed: {topic} holds {got} records, expected {n}")
    return Sample(n / elapsed, used / n * 1e9)


# ----------------------------------------------------------------------------------------------- 3. reader


def prepare_reader_topic(topics: Topics, conf: dict[str, Any], values: list[Any], keys: list[str]) -> tuple[str, int]:
    """Two tasks write the records (alternately), each a watermark every WATERMARK_EVERY of its own records
    and an end of stream at the end. Returns the topic and its total record count."""
    topic = topics.new("reader")
    parts = topics.partitions
    writers = [
        ControlWriter(conf, topic, task_name=f"task-{i}", task_count=2, run_id="run-bench", partitions=parts)
        for i in range(2)
    ]
    sent = [0, 0]
    for i, (v, k) in enumerate(zip(values, keys, strict=True)):
        w = i & 1
        writers[w].send(v, k)
        sent[w] += 1
        if sent[w] % WATERMARK_EVERY == 0:
            writers[w].send_watermark(T0_MS + i)
    for w in writers:
        w.send_end_of_stream()
        w.close()
    return topic, topics.record_count(topic)


class Window:
    """The timed window of a consume loop: from the return of the first non-empty batch (consumer startup and
    the first fetch excluded) to the return of the last full batch. ``consume(n, timeout)`` waits until its
    batch is full, so the final, partial batch only comes back when the timeout expires: that idle second is
    excluded too. The same rule for both readers; the unit is Kafka records (data and control)."""

    def __init__(self) -> None:
        self.start: tuple[float, float, int] | None = None
        self.end: tuple[float, float, int] | None = None

    def mark(self, consumed: int, full: bool) -> None:
        now = (perf(), cpu(), consumed)
        if self.start is None:
            self.start = now
        elif full:
            self.end = now

    def sample(self, who: str) -> Sample:
        if self.start is None or self.end is None:
            raise SystemExit(f"{who}: too few batches to time; use more --records")
        (t0, c0, n0), (t1, c1, n1) = self.start, self.end
        return Sample((n1 - n0) / (t1 - t0), (c1 - c0) / (n1 - n0) * 1e9)


def read_controlmsg(conf: dict[str, Any], topic: str, n: int) -> Sample:
    """ControlReader.poll() until all ``n`` data records are out; Kafka records counted by its positions."""
    reader = ControlReader(conf, topic, batch_size=BATCH)
    try:
        window = Window()
        data = 0
        consumed = 0
        deadline = time.monotonic() + 120
        while data < n:
            items = reader.poll(1.0)
            if not items:
                if time.monotonic() > deadline:
                    raise SystemExit(f"ControlReader: only {data} of {n} data records after 120 s")
                continue
            for item in items:
                if type(item) is DataRecord:
                    item.key  # noqa: B018  # touch them, as the bare consumer does
                    item.payload  # noqa: B018
                    data += 1
            before, consumed = consumed, sum(max(o, 0) for o in reader.positions.values())
            window.mark(consumed, consumed - before == BATCH)
    finally:
        reader.close()
    return window.sample("ControlReader")


def read_columns(conf: dict[str, Any], topic: str, n: int) -> Sample:
    """ControlReader.poll_columns() until all ``n`` data records are out, each batch into fresh columns."""
    reader = ControlReader(conf, topic, batch_size=BATCH)
    try:
        window = Window()
        data = 0
        consumed = 0
        deadline = time.monotonic() + 120
        while data < n:
            columns = DataColumns()
            reader.poll_columns(columns, 1.0)
            if not len(columns):
                if time.monotonic() > deadline:
                    raise SystemExit(f"ControlReader.poll_columns: only {data} of {n} data records after 120 s")
                continue
            data += len(columns)
            before, consumed = consumed, sum(max(o, 0) for o in reader.positions.values())
            window.mark(consumed, consumed - before == BATCH)
    finally:
        reader.close()
    return window.sample("ControlReader.poll_columns")


def read_bare(conf: dict[str, Any], topic: str, partitions: int, total: int, envelope: bool = False) -> Sample:
    """A bare Consumer reading the whole topic; with ``envelope``, also the least any reader of the wire
    format does per record: test the type byte and slice the payload off (the floor for ControlReader)."""
    c = Consumer(conf)
    try:
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        consume = c.consume
        window = Window()
        got = 0
        eof = KafkaError._PARTITION_EOF
        deadline = time.monotonic() + 120
        while got < total:
            msgs = consume(BATCH, 1.0)
            if not msgs:
                if time.monotonic() > deadline:
                    raise SystemExit(f"bare consumer: only {got} of {total} records after 120 s")
                continue
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    if err.code() == eof:
                        continue
                    raise SystemExit(f"bare consumer: {err.str()}")
                value = msg.value()
                msg.key()
                if envelope and value and value[0] == 0:
                    value[1:]
                got += 1
            window.mark(got, len(msgs) == BATCH)
    finally:
        c.close()
    return window.sample("bare consumer")


# ----------------------------------------------------------------------------------------------- main


def parse_args() -> argparse.Namespace:
    """The command line (``--help``); exits 2 on values the measures cannot run with."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--records", type=int, default=DEFAULT_RECORDS, help=f"records per run (default {DEFAULT_RECORDS})")
    ap.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS,
                    help=f"alternating rounds per Kafka measure (default {DEFAULT_ROUNDS})")
    ap.add_argument("--partitions", type=int, default=4, help="partitions of every topic (default 4)")
    ap.add_argument("--no-gc-freeze", action="store_true",
                    help="leave the benchmark's own record lists in the GC's young generations (see the output)")
    add_cluster_options(ap)
    args = ap.parse_args()
    if args.records < 2 * WATERMARK_EVERY or args.rounds < 1 or args.partitions < 1:
        ap.error(f"need --records >= {2 * WATERMARK_EVERY}, --rounds >= 1, --partitions >= 1")
    return args


def freeze_records(no_gc_freeze: bool) -> None:
    """Freeze the record lists out of the GC's sight, unless ``--no-gc-freeze``; say which."""
    if no_gc_freeze:
        print("gc: the record lists stay visible to the GC: the many objects they hold make every full collection "
              "slower, which weighs on the side that allocates more (ControlReader: one DataRecord per record)")
    else:
        gc.collect()
        gc.freeze()
        print(f"gc: the record lists ({gc.get_freeze_count():,} objects, benchmark fixtures) are frozen out of the "
              "GC's sight; a real app with a large heap pays more per allocated object, see --no-gc-freeze")


def measure_codec(values: list[Any], n: int, rounds: int, results: list[Result]) -> float:
    """[1] the codec and its floor (added to ``results``); returns the control messages' rate."""
    print("\n[1] codec: controlmsg loads(decode(encode_json(v))) vs orjson loads(dumps(v)), same records")
    ra, rb = alternate(max(rounds, 7), lambda: codec_controlmsg(values), lambda: codec_orjson(values), "codec")
    results.append(result("codec user msg encode+decode", ra, rb, 0.8, cpu=True))
    print("  the floor: the same byte work inline (type byte added, tested, sliced off), no function calls, vs orjson")
    ra, rb = alternate(max(rounds, 7), lambda: codec_floor(values), lambda: codec_orjson(values), "floor")
    results.append(result("codec floor (inline bytes)", ra, rb, None, cpu=True))
    control_rate = max(codec_control(min(n, 100_000)) for _ in range(3))
    print(f"  control messages encode_control+decode: {fmt(control_rate)} msg/s (informational)")
    return control_rate


def measure_writer(topics: Topics, pconf: dict[str, Any], chunks: list[tuple[list[Any], list[str]]], n: int,
                   partitions: int, rounds: int, results: list[Result]) -> None:
    """[2] the writer and its floor, each run into a fresh topic (added to ``results``)."""
    print(f"\n[2] writer: {n:,} records + flush, each run into a fresh {partitions}-partition topic")
    print(f"  librdkafka config, both: {pconf} (everything else default)")
    print("  controlmsg: ControlWriter.send(v, key); adds on_delivery (called on errors only), a watermark "
          f"to every partition each {WATERMARK_EVERY:,} records and an end of stream at the end "
          f"({(n // WATERMARK_EVERY + 1) * partitions} control records, timed; rate counts data records)")
    print("  baseline:   Producer.produce(topic, orjson.dumps(v), key), no callback, retry on BufferError")
    ra, rb = alternate(
        rounds,
        lambda: write_controlmsg(topics, pconf, chunks, n),
        lambda: write_bare(topics, pconf, chunks, n),
        "writer",
    )
    results.append(result("writer send+flush", ra, rb, 0.9, cpu=True))
    print("  the floor: the bare producer plus the least a writer of the format that sees its delivery "
          "errors does (the type byte, a delivery callback called on errors only), vs the bare producer")
    ra, rb = alternate(
        rounds,
        lambda: write_bare(topics, pconf, chunks, n, envelope=True),
        lambda: write_bare(topics, pconf, chunks, n),
        "floor",
    )
    results.append(result("writer floor (bare + envelope)", ra, rb, None, cpu=True))


def measure_reader(topics: Topics, config: dict[str, Any], pconf: dict[str, Any], values: list[Any],
                   keys: list[str], n: int, partitions: int, rounds: int, results: list[Result]) -> None:
    """[3] the reader (poll, poll_columns) and its floor, on one topic written first (added to ``results``)."""
    print(f"\n[3] reader: one topic, {n:,} data records from 2 tasks (watermark each {WATERMARK_EVERY:,} "
          "records per task, end of stream from each)")
    t = perf()
    topic, total = prepare_reader_topic(topics, pconf, values, keys)
    print(f"  written: {total:,} Kafka records ({total - n} control) in {perf() - t:.1f} s (untimed)")
    # librdkafka postpones a partition's next fetch by fetch.queue.backoff.ms (default 1000) once its
    # prefetch queue is over its thresholds; a reader that then drains the queue in under a second sits
    # idle for the rest of it. That random ~1 s stall would swamp a run of a few hundred ms, so both
    # readers get 10 ms (librdkafka's own advice when such stalls show up).
    rconf = {**config, "fetch.queue.backoff.ms": 10}
    cconf = {
        **rconf,
        "group.id": f"bench-bare-{uuid.uuid4().hex}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "isolation.level": "read_committed",
        "auto.offset.reset": "earliest",
    }
    print(f"  librdkafka config, both: {rconf} (fetch.queue.backoff.ms: see the script)")
    print(f"  controlmsg: ControlReader(config, topic, batch_size={BATCH}).poll(1.0) until all {n:,} data "
          "records are out; touches DataRecord key and payload")
    print("  baseline:   Consumer with the reader's default settings added (private group.id, no auto commit, "
          f"read_committed), assign all partitions from the beginning, consume({BATCH}, 1.0), "
          "check error(), touch value() and key()")
    print("  timed from the return of the first batch to the return of the last full batch, for both: consumer "
          "startup is excluded, and so is the final partial batch, which consume() only returns after its "
          "1 s timeout; rate = Kafka records (data + control) in that window / its duration")
    ra, rb = alternate(
        rounds,
        lambda: read_controlmsg(rconf, topic, n),
        lambda: read_bare(cconf, topic, partitions, total),
        "reader",
    )
    results.append(result("reader poll", ra, rb, 0.8, cpu=True))
    print("  the same, controlmsg side: ControlReader.poll_columns(columns, 1.0), fresh DataColumns a batch")
    ra, rb = alternate(
        rounds,
        lambda: read_columns(rconf, topic, n),
        lambda: read_bare(cconf, topic, partitions, total),
        "columns",
    )
    results.append(result("reader poll_columns", ra, rb, 0.8, cpu=True))
    print("  the floor: the bare loop plus the least the wire format asks per record (test the type byte, "
          "slice the payload off), vs the bare loop")
    ra, rb = alternate(
        rounds,
        lambda: read_bare(cconf, topic, partitions, total, envelope=True),
        lambda: read_bare(cconf, topic, partitions, total),
        "floor",
    )
    results.append(result("reader floor (bare + envelope)", ra, rb, None, cpu=True))


def print_summary(results: list[Result], control_rate: float, n: int, rounds: int, started: float) -> None:
    """The table of rates and ratios against the goals, then the CPU cost per record."""
    print(f"\nsummary ({n:,} records, {rounds} alternating rounds for Kafka, {max(rounds, 7)} for the codec; total "
          f"{perf() - started:.0f} s; load average now {load_average()}). ratio: best rate / best rate; median ratio: "
          "median / median")
    head = f"{'measure':<30} | {'controlmsg rec/s':>16} | {'baseline rec/s':>14} | {'ratio':>5} | " \
           f"{'median ratio':>12} | {'goal':>6} | met?"
    print(head)
    print("-" * len(head))
    for r in results:
        goal = f">={r.goal:.1f}" if r.goal is not None else "-"
        met = ("yes" if r.ratio >= r.goal else "NO") if r.goal is not None else "-"
        print(f"{r.name:<30} | {fmt(r.ours_best):>16} | {fmt(r.base_best):>14} | {r.ratio:>5.2f} | "
              f"{r.median_ratio:>12.2f} | {goal:>6} | {met}")
    print(f"{'control msg encode+decode':<30} | {fmt(control_rate):>16} | {'-':>14} | {'-':>5} | {'-':>12} | "
          f"{'-':>6} | -")
    print("\nCPU cost of the Python thread per record (informational; best of the rounds, librdkafka's threads "
          "excluded). On a small machine that also runs the broker, wall-clock rates are noisy and partly "
          "broker-bound; this is what controlmsg adds on the caller's side, and 'ratio' is the throughput ratio to "
          "expect where that thread is the bottleneck.")
    print(f"{'measure':<30} | {'controlmsg ns/rec':>17} | {'baseline ns/rec':>15} | {'extra ns':>8} | {'ratio':>5}")
    for r in results:
        if r.ours_cpu and r.base_cpu:
            ours, base = min(r.ours_cpu), min(r.base_cpu)
            print(f"{r.name:<30} | {ours:>17,.0f} | {base:>15,.0f} | {ours - base:>+8,.0f} | {base / ours:>5.2f}")


def main() -> None:
    args = parse_args()
    n, rounds = args.records, args.rounds
    machine_info()
    started = perf()
    values, keys = make_records(n)
    sizes = [len(orjson.dumps(v)) for v in values[:DISTINCT]]
    print(f"records: {n:,} dicts ({min(len(values), DISTINCT):,} distinct, cycled), JSON {min(sizes)}-{max(sizes)} "
          f"bytes, mean {statistics.mean(sizes):.0f}; key: the user id (str, 12 chars)")
    chunks = chunked(values, keys, WATERMARK_EVERY)
    freeze_records(args.no_gc_freeze)
    results: list[Result] = []
    control_rate = measure_codec(values, n, rounds, results)
    with kafka_cluster(args) as cluster:
        topics = Topics(cluster.config, args.partitions)
        try:
            pconf = {**cluster.config, "linger.ms": 5, "delivery.report.only.error": True}
            measure_writer(topics, pconf, chunks, n, args.partitions, rounds, results)
            measure_reader(topics, cluster.config, pconf, values, keys, n, args.partitions, rounds, results)
        finally:
            topics.delete_all()
    print_summary(results, control_rate, n, rounds, started)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
