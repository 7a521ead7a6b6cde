"""``python -m spark_jobs.generate``: realistic raw click events into a Kafka source topic, at a rate.

The source topic of a streaming pipeline holds raw events, not envelopes: one JSON object per record with
the fields a file input has (``id``, unique per seed; ``user``; ``event_time`` ISO-8601 UTC; ``amount``;
``items``), keyed by user. Event time follows the wall clock (times ``--speedup``) from ``--start``;
each event is out of order by up to ``--disorder``, and a ``--late-fraction`` of events is ``--late-by``
older than the clock, so a pipeline with a smaller allowed lateness sees them as late. Users are skewed.

It ends its stream after ``--events`` events (or ``--duration`` seconds), flushes, and prints the topic's
end offsets as JSON, so a bounded streaming run (``--until-source-end``) knows where the input ends.
"""

from __future__ import annotations

import argparse
import itertools
import random
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
from confluent_kafka import Producer

from controlmsg.kafka.settings import for_client
from spark_jobs import description

__all__ = ["GeneratorConfig", "events", "generate", "main"]


@dataclass(frozen=True)
class GeneratorConfig:
    events: int | None = 10_000
    duration_s: float | None = None
    rate: float = 5_000.0
    keys: int = 100
    disorder_ms: int = 5_000
    late_fraction: float = 0.0
    late_by_ms: int = 600_000
    start_ms: int | None = None
    speedup: float = 1.0
    seed: int = 1


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def events(cfg: GeneratorConfig, clock0_ms: int) -> Iterator[tuple[str, int, dict[str, Any]]]:
    """The events :func:`generate` writes with ``cfg`` and its event clock starting at ``clock0_ms``, in
    order, endless (``cfg.events`` and ``cfg.duration_s`` are not looked at): ``(user, event time in epoch
    ms, the record's value)``. Deterministic for a given ``cfg.seed``; what a topic holds can be
    recomputed from the configuration and the number of events written."""
    rng = random.Random(cfg.seed)
    for sent in itertools.count():
        clock = clock0_ms + int(sent / cfg.rate * 1000 * cfg.speedup)
        if rng.random() < cfg.late_fraction:
            event_time = clock - cfg.late_by_ms
        else:
            event_time = clock - rng.randint(0, cfg.disorder_ms)
        user = f"user-{min(int(rng.paretovariate(1.1)) - 1, cfg.keys - 1):04d}"
        yield user, event_time, {"id": f"{cfg.seed}-{sent}", "user": user, "event_time": _iso(event_time),
                                 "amount": round(rng.uniform(1, 100), 2), "items": rng.randint(1, 5)}


def generate(config: dict[str, Any], topic: str, cfg: GeneratorConfig) -> dict[int, int]:
    """Write the events; block until delivered; return the topic's end offsets per partition.
    Raises ``RuntimeError`` if records were not delivered."""
    if cfg.events is None and cfg.duration_s is None:
        raise ValueError("give events or duration_s, or the stream never ends")
    # Idempotent: a batch retried (a fresh topic's leader not known yet) must not land after later ones:
    # the events are in event-time order with bounded disorder, and consumers rely on that bound.
    producer = Producer({"linger.ms": 5, "enable.idempotence": True, **for_client(config, "producer")})
    failed: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            failed.append(str(err))

    started = time.monotonic()
    stream = events(cfg, cfg.start_ms if cfg.start_ms is not None else int(time.time() * 1000))
    sent = 0
    while (cfg.events is None or sent < cfg.events) and (
        cfg.duration_s is None or time.monotonic() - started < cfg.duration_s
    ):
        # Pace: never ahead of rate x elapsed time.
        due = int((time.monotonic() - started) * cfg.rate) + 1
        batch = min(due - sent, 1000) if cfg.events is None else min(due - sent, 1000, cfg.events - sent)
        if batch <= 0:
            time.sleep(min(0.01, 1 / cfg.rate))
            continue
        for user, _, value in itertools.islice(stream, batch):
            while True:
                try:
                    producer.produce(topic, orjson.dumps(value), user.encode(), on_delivery=on_delivery)
                    break
                except BufferError:
                    producer.poll(0.05)
            sent += 1
        producer.poll(0)
    left = producer.flush(60)
    if failed or left:
        raise RuntimeError(f"{len(failed) + left} event(s) to {topic!r} not delivered: {failed[:3]}")
    from controlmsg.kafka.admin import end_offsets

    return end_offsets(config, topic)


def main(argv: Sequence[str] | None = None) -> int:
    from controlmsg.clusters.local_address import local_bootstrap_servers
    from controlmsg.errors import ControlMsgError
    from controlmsg.kafka.admin import add_topic_options, create_topic, partition_count, topic_settings_from_args
    from controlmsg.kafka.settings import STARTS_LOCAL_BROKER_HELP, add_client_options, client_config_from_args
    from spark_jobs.events import parse_duration

    p = argparse.ArgumentParser(prog="python -m spark_jobs.generate", description=description(__doc__))
    p.add_argument("--topic", required=True)
    add_client_options(p, bootstrap_help=STARTS_LOCAL_BROKER_HELP)
    p.add_argument("--partitions", type=int, default=4, help="create the topic with this many if missing")
    add_topic_options(p)
    p.add_argument("--events", type=int, help="end the stream after this many events (default 10000)")
    p.add_argument("--duration", type=float, help="end the stream after this many seconds")
    p.add_argument("--rate", type=float, default=5000.0, help="events per second")
    p.add_argument("--keys", type=int, default=100, help="distinct users")
    p.add_argument("--disorder", default="5s", help="events are out of order by up to this")
    p.add_argument("--late-fraction", type=float, default=0.0, help="share of events that are late")
    p.add_argument("--late-by", default="10m", help="how much older than the clock a late event is")
    p.add_argument("--start", help="event time of the first event, ISO-8601 (default: now)")
    p.add_argument("--speedup", type=float, default=1.0, help="event time runs this much faster than wall time")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    try:
        config: dict[str, Any] = dict(client_config_from_args(  # as the pipeline does
            args, default_servers=lambda: local_bootstrap_servers(start=True)))
        if partition_count(config, args.topic) is None:
            topics = topic_settings_from_args(args)
            create_topic(config, args.topic, args.partitions, replication_factor=topics.replication_factor,
                         topic_config=topics.config)
    except ControlMsgError as exc:  # settings, or a cluster that cannot be reached or refuses: one line, no trace
        print(f"generate: {exc}", file=sys.stderr)
        return 1
    start_ms = None
    if args.start:
        start_ms = int(datetime.fromisoformat(args.start.replace("Z", "+00:00")).timestamp() * 1000)
    events = args.events if args.events is not None or args.duration is not None else 10_000
    cfg = GeneratorConfig(events=events, duration_s=args.duration, rate=args.rate, keys=args.keys,
                          disorder_ms=parse_duration(args.disorder), late_fraction=args.late_fraction,
                          late_by_ms=parse_duration(args.late_by), start_ms=start_ms, speedup=args.speedup,
                          seed=args.seed)
    ends = generate(config, args.topic, cfg)
    print(orjson.dumps({"topic": args.topic, "endOffsets": {str(k): v for k, v in ends.items()}}).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
