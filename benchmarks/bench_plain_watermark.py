"""What a plain topic's watermark per partition costs: the driver's scan of event times, and a whole query.

    python benchmarks/bench_plain_watermark.py [--records 400000] [--rounds 2]

Writes ``--records`` JSON records (``user``, ``ts`` ISO-8601, ``amount``) over 4 partitions of a new topic,
then runs, ``--rounds`` times each and alternating, an ``availableNow`` query of hourly window counts over
it: with ``with_watermark`` (``maxOutOfOrderness 0s``: the driver reads every record's event time) and with
Spark's ``withWatermark``. Prints each query's wall time, its ``latestOffset`` durations, and the driver
scan's own line (``logPhases``: ms and records). The cluster: ``--bootstrap-servers`` / ``-X`` /
``--kafka-config``, else ``$KAFKA_BOOTSTRAP_SERVERS``, else a broker started for the run.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid

import orjson
from confluent_kafka import Producer

from benchmarks.common import add_cluster_options, kafka_cluster
from controlmsg.kafka.admin import create_topic

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def produce(config: dict[str, str], topic: str, records: int) -> None:
    producer = Producer({**config, "linger.ms": 50, "queue.buffering.max.messages": 1_000_000})
    for i in range(records):
        ms = T0 + (i // 4) * 1000
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + "Z"
        producer.produce(topic, orjson.dumps({"user": f"u{i % 7}", "ts": stamp, "amount": i}), partition=i % 4)
        if i % 50_000 == 0:
            producer.poll(0)
    producer.flush(120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=400_000)
    parser.add_argument("--rounds", type=int, default=2)
    add_cluster_options(parser)
    args = parser.parse_args()
    with kafka_cluster(args) as cluster:
        topic = f"bench-plain-watermark-{uuid.uuid4().hex[:8]}"
        create_topic(cluster.config, topic, 4)
        began = time.monotonic()
        produce(cluster.config, topic, args.records)
        print(f"produced {args.records} records in {time.monotonic() - began:.1f} s", flush=True)

        from pyspark.sql import functions as F

        from controlmsg.spark import spark_session, with_watermark

        spark = spark_session("local[2]", app_name="bench-plain-watermark")
        try:
            for round_ in range(args.rounds):
                for mode in ("with_watermark", "withWatermark"):
                    reader = (spark.readStream.format("controlmsg").option("envelope", "none")
                              .option("subscribe", topic)
                              .options(**{f"kafka.{k}": v for k, v in cluster.config.items()})
                              .option("logPhases", "true").schema("user string, ts timestamp, amount long"))
                    if mode == "with_watermark":
                        events = with_watermark(reader.option("maxOutOfOrderness", "0s").load(), "ts")
                    else:
                        events = reader.load().withWatermark("ts", "0 seconds")
                    hourly = events.groupBy(F.window("ts", "1 hour")).count()
                    started = time.monotonic()
                    query = (hourly.writeStream.outputMode("append").format("memory")
                             .queryName(f"bench_{round_}_{mode.lower()}")
                             .option("checkpointLocation", tempfile.mkdtemp(prefix="bench-ck-"))
                             .trigger(availableNow=True).start())
                    query.awaitTermination()
                    latest = [p["durationMs"].get("latestOffset") for p in query.recentProgress]
                    print(f"round {round_} {mode}: {time.monotonic() - started:.1f} s, latestOffset ms {latest}",
                          flush=True)
        finally:
            spark.stop()


if __name__ == "__main__":
    main()
