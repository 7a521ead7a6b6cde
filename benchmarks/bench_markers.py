"""What a write task's commit marker costs since markers moved to the ``controlmsg.marker.`` groups, and what
``kafka-consumer-groups --list`` shows after a backfill of many write tasks.

    python benchmarks/bench_markers.py [--tasks 1000] [--bootstrap-servers HOST:PORT ...]

Each task does what a Spark batch write task does with its marker, without Spark: a transactional producer of
its own (``init_transactions``), the marker lookup (none yet: its first attempt), one record, the marker added
to the transaction, the commit (:func:`controlmsg.kafka.markers.write_control_round`, the one path every writer
takes). Timed per task, in order; the lookup alone twice, side by side on the same missing markers: in
the marker group only (``legacy_lookup=False``: what a lookup cost before the earlier version's groups
were also looked in), and as :class:`~controlmsg.kafka.markers.MarkerStore` looks by default (the marker
group, then the group named the transactional id, where markers were until 2026-11-28). Then Kafka's own
``kafka-consumer-groups --list`` (:mod:`controlmsg.clusters.kafka_tools`): how many groups the run left,
and how many fall outside ``^controlmsg\\.marker\\.``, the pattern lag tools are given.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
import uuid
from typing import Any

from common import add_cluster_options, delete_topics, kafka_cluster

from controlmsg.clusters.kafka_tools import consumer_groups
from controlmsg.core.messages import WatermarkMessage
from controlmsg.core.naming import task_name, transactional_id
from controlmsg.kafka import create_topic
from controlmsg.kafka.markers import MarkerStore, Round, write_control_round

EXCLUDED = re.compile(r"^controlmsg\.marker\.")


def lookup_marker_group_only(config: dict[str, Any], txn: str, topic: str) -> None:
    with MarkerStore(config, txn, topic, legacy_lookup=False) as store:
        store.load()


def lookup_now(config: dict[str, Any], txn: str, topic: str) -> None:
    with MarkerStore(config, txn, topic) as store:
        store.load()


def ms(values: list[float]) -> str:
    p90 = sorted(values)[int(len(values) * 0.9)]
    return f"median {statistics.median(values) * 1000:6.2f} ms, p90 {p90 * 1000:6.2f} ms"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", type=int, default=1000, help="write tasks of the backfill (default 1000)")
    p.add_argument("--lookups", type=int, default=200, help="missing-marker lookups timed each way (default 200)")
    add_cluster_options(p)
    args = p.parse_args()
    with kafka_cluster(args) as cluster:
        config: dict[str, Any] = dict(cluster.config)
        topic = f"bench-markers-{uuid.uuid4().hex[:8]}"
        run = f"r{uuid.uuid4().hex[:6]}"
        create_topic(config, topic, 4)
        try:
            missing = [transactional_id(topic, task_name("lookup", run, i)) for i in range(args.lookups)]
            lookup_marker_group_only(config, missing[0], topic)  # the group coordinator, once
            one: list[float] = []
            both: list[float] = []
            for txn in missing:  # alternating, on the same missing markers
                began = time.perf_counter()
                lookup_marker_group_only(config, txn, topic)
                one.append(time.perf_counter() - began)
                began = time.perf_counter()
                lookup_now(config, txn, topic)
                both.append(time.perf_counter() - began)
            print(f"missing-marker lookup, marker group only:         {ms(one)}")
            print(f"missing-marker lookup, marker group then legacy:  {ms(both)}  "
                  f"(ratio of medians {statistics.median(both) / statistics.median(one):.2f}x)")

            per_task: list[float] = []
            started = time.perf_counter()
            for i in range(args.tasks):
                name = task_name("backfill", run, i)

                def plan(committed: dict[str, Any] | None, name: str = name) -> Round | None:
                    return [WatermarkMessage(name, args.tasks, 1_000, run)], {"batch": 0, "rows": 1}

                began = time.perf_counter()
                write_control_round(config, topic, 4, plan, transactional_id=transactional_id(topic, name))
                per_task.append(time.perf_counter() - began)
            total = time.perf_counter() - started
            print(f"a task's marker round (init, lookup, write, marker, commit), {args.tasks} tasks: {ms(per_task)}; "
                  f"{total:.1f} s in all, {args.tasks / total:.1f} tasks/s")

            listed = [g for g in consumer_groups(cluster.servers, "--list").split() if topic in g]
            left = [g for g in listed if not EXCLUDED.match(g)]
            print(f"kafka-consumer-groups --list after the run: {len(listed)} groups of this topic, "
                  f"{len(listed) - len(left)} under ^controlmsg\\.marker\\. (left out by lag tools), {len(left)} "
                  "outside it" + (f": {left[:5]}" if left else ""))
        finally:
            delete_topics(config, [topic])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
