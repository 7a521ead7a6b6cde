"""What the run and task headers on each data record cost a transactional ControlWriter, in CPU.

    python benchmarks/bench_header_cost.py [--records 400000] [--rounds 4] [--bootstrap-servers HOST:PORT ...]

One writer (transactional, as a Spark write task's) sends ``--records`` JSON records of the benchmarks' shape
with keys, through ``send_encoded`` in batches of 10,000, then commits; four ways, alternating within each
round (each round begins with the next way): no headers (``runTag none``), the ``controlmsg-run`` header only,
the two headers of ``runTag headers`` (``controlmsg-run``, ``controlmsg-task``), and the run named in the
envelope instead (``runTag envelope``, the default since wire format 2: no headers, each value begins with the
run's tag). Timed: from the first send to the commit's return. Measured: the CPU of this process (the Python
thread and librdkafka's threads) and of the whole machine (``/proc/stat``: the broker too, when it runs here),
each per record, medians over the rounds. The Python thread's share alone is what ``bench_produce_call.py``
measures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid

from common import add_cluster_options, delete_topics, kafka_cluster

from controlmsg.core.codec import encode_json_rows, run_tag
from controlmsg.kafka import ControlWriter, create_topic
from controlmsg.kafka.writer import HEADER_RUN

RUN = "bench-run-0001"
TASK = f"ingest-{RUN}-p0"
MODES = ("no headers", "run header", "run and task headers", "run in the envelope (the default)")


def machine_cpu_seconds() -> float:
    """CPU seconds every process of the machine has used (all but idle and iowait), from ``/proc/stat``."""
    with open("/proc/stat") as stat:
        ticks = [int(x) for x in stat.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def write_once(config: dict[str, str], topic: str, mode: str, values: list[bytes],
               keys: list[str]) -> tuple[float, ...]:
    """One timed write of every record to ``topic``: (seconds, process CPU s, machine CPU s)."""
    writer = ControlWriter({**config, "transactional.id": f"{topic}-{mode[:3]}"}, topic, task_name=TASK,
                           task_count=1, run_id=RUN, data_headers=mode in MODES[1:3], partitions=4)
    if mode == MODES[1]:
        writer._data_headers = [(HEADER_RUN, RUN.encode())]  # the benchmark's one reach inside: a variant
    started, process, machine = time.monotonic(), time.process_time(), machine_cpu_seconds()
    for i in range(0, len(values), 10_000):
        writer.send_encoded(values[i:i + 10_000], keys[i:i + 10_000])
    writer.commit()
    figures = (time.monotonic() - started, time.process_time() - process, machine_cpu_seconds() - machine)
    writer.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=400_000)
    parser.add_argument("--rounds", type=int, default=4)
    add_cluster_options(parser)
    args = parser.parse_args()
    n = args.records
    rows = [{"user": f"u{i % 5000}", "event_time": 1_764_547_200_000 + i, "amount": 1.5, "items": i % 7}
            for i in range(n)]
    values, keys = encode_json_rows(rows), [str(r["user"]) for r in rows]
    tagged = encode_json_rows(rows, prefix=run_tag(RUN))  # the same records, their run in the envelope
    samples: dict[str, list[tuple[float, ...]]] = {mode: [] for mode in MODES}
    with kafka_cluster(args) as cluster:
        config = dict(cluster.config)
        topics = []
        try:
            for r in range(args.rounds):
                for mode in MODES[r % len(MODES):] + MODES[:r % len(MODES)]:  # each mode first in turn
                    topic = f"bench-headers-{uuid.uuid4().hex[:8]}"
                    create_topic(config, topic, 4)
                    topics.append(topic)
                    samples[mode].append(write_once(config, topic, mode, tagged if mode == MODES[3] else values,
                                                    keys))
        finally:
            delete_topics(config, topics)
    print(f"\n{n:,} records per write, {args.rounds} alternating rounds, medians; us = microseconds per record")
    print(f"{'data records carry':<38} {'records/s':>10} {'process CPU us':>15} {'machine CPU us':>15}")
    base = statistics.median(s[2] for s in samples[MODES[0]])
    for mode, got in samples.items():
        seconds = statistics.median(s[0] for s in got)
        process = statistics.median(s[1] for s in got) / n * 1e6
        machine = statistics.median(s[2] for s in got)
        print(f"{mode:<38} {n / seconds:>10,.0f} {process:>15.2f} {machine / n * 1e6:>15.2f}"
              f"  ({machine / base:.2f}x the machine CPU of no headers)")


if __name__ == "__main__":
    main()
