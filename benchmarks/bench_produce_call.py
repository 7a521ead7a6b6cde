"""What one confluent-kafka ``Producer.produce()`` call costs the Python thread, by how it is called.

    python benchmarks/bench_produce_call.py [--records 200000] [--rounds 5]

The calls go to a producer whose broker does not exist (``127.0.0.1:1``) with a local queue large enough
for every record, so only the call itself is timed: no network, no broker, no delivery reports. After
each variant the queue is purged. The variants alternate within each round, and the script prints the
minimum and median CPU time per call (``time.process_time``: the calls run on this thread; librdkafka's
own threads are idle without a broker) of each, and each one's ratio to the call without headers.

Why it exists: the writer passes the run and task headers of a data record (``runTag headers``, once
default) to ``produce()`` positionally, not as ``headers=``: CPython hands a C method called with keyword
arguments a dict that ``PyArg_ParseTupleAndKeywords`` looks each keyword up in, which costs more than the
headers themselves (see :mod:`controlmsg.kafka.writer`).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from confluent_kafka import Producer

Header = tuple[str, str | bytes | None]
RUN: Header = ("controlmsg-run", b"bench-run-0001")
TASK: Header = ("controlmsg-task", b"ingest-bench-run-0001-p0")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    n = args.records

    producer = Producer({"bootstrap.servers": "127.0.0.1:1", "queue.buffering.max.messages": n + 1,
                         "queue.buffering.max.kbytes": 2_000_000, "delivery.report.only.error": True,
                         "on_delivery": lambda err, msg: None, "log_level": 0})
    produce, topic = producer.produce, "bench"
    values = [b'\x00{"user":"u%d","event_time":1767225600000,"amount":1.5,"items":3}' % i for i in range(n)]
    keys = [f"u{i % 5000}" for i in range(n)]
    both: list[Header] = [RUN, TASK]

    def no_headers() -> None:
        for v, k in zip(values, keys, strict=True):
            produce(topic, v, k)

    def keyword_headers() -> None:
        for v, k in zip(values, keys, strict=True):
            produce(topic, v, k, headers=both)

    def positional_headers() -> None:
        for v, k in zip(values, keys, strict=True):
            produce(topic, v, k, -1, None, None, 0, both)

    def positional_run_only() -> None:
        run_only: list[Header] = [RUN]
        for v, k in zip(values, keys, strict=True):
            produce(topic, v, k, -1, None, None, 0, run_only)

    def keyword_empty() -> None:
        for v, k in zip(values, keys, strict=True):
            produce(topic, v, k, headers=[])

    variants: dict[str, Callable[[], None]] = {
        "produce(topic, value, key)": no_headers,
        "produce(..., headers=[run, task])  (keyword)": keyword_headers,
        "produce(..., -1, None, None, 0, [run, task])  (positional; the writer)": positional_headers,
        "produce(..., -1, None, None, 0, [run])  (positional, run header only)": positional_run_only,
        "produce(..., headers=[])  (keyword, no header)": keyword_empty,
    }
    per_call: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, run in variants.items():
            started = time.process_time()
            run()
            per_call[name].append((time.process_time() - started) / n * 1e6)
            producer.purge(in_queue=True, in_flight=True)
            producer.poll(0)

    base = statistics.median(per_call["produce(topic, value, key)"])
    print(f"{n:,} calls per variant, {args.rounds} alternating rounds; CPU of the calling thread per call")
    print(f"{'call':<74} {'min us':>7} {'median us':>9} {'median / no headers':>20}")
    for name, samples in per_call.items():
        median = statistics.median(samples)
        print(f"{name:<74} {min(samples):>7.2f} {median:>9.2f} {median / base:>19.2f}x")


if __name__ == "__main__":
    main()
