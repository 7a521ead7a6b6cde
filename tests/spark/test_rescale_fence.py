"""A rescale of the streaming ingest from 4 to 3 tasks whose fence is forced (issue 29, item 5.4a), on the
real broker and Spark.

Task 3 of the 4-task run dies in the middle of a transaction: a real transactional producer with its id
holds records open on the events topic (``transaction.timeout.ms`` :data:`DEAD_TIMEOUT_MS`, 15 minutes).
The 3-task run will never start a task 3 whose ``init_transactions`` would abort it; only
``stream_ingest``'s fence of the retired ids does. The downstream ``read_committed`` reader must get every
record of the run to its end of stream (which it cannot while the transaction is open) and none of the
dead task's; the dead producer must find itself fenced. No wall-clock threshold: the coordinator would
end the transaction only 15 minutes after it opened, far beyond what this test waits for (the rescale
run, then the reader's 60 s), so only the fence can have ended it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from pyspark.sql import SparkSession

from controlmsg.core.codec import decode_json_payload
from controlmsg.core.events import StreamEnded
from controlmsg.core.naming import task_name, transactional_id
from controlmsg.errors import DeliveryError
from controlmsg.kafka import ControlReader, ControlWriter, DataRecord, create_topic
from controlmsg.streaming.ingest import run_ingest_task
from spark_jobs.generate import GeneratorConfig, generate
from spark_jobs.runtime import ingest as stream_ingest
from tests.transactions import held_back

pytestmark = pytest.mark.beside  # make test runs this module in its second lane (tests/lanes.py)

RUN = "fence-4-3"
EVENTS = 3000
DEAD_TIMEOUT_MS = 900_000
"""The dead task's ``transaction.timeout.ms``: Kafka's default ``transaction.max.timeout.ms`` (15 min; the local
broker of controlmsg.clusters.broker keeps the default), the longest a broker with default settings accepts.
A timeout of 120 s let a slow run pass without the fence: the coordinator aborted the transaction itself."""


def test_rescale_4_to_3_fences_the_retired_task_left_mid_transaction(
        spark: SparkSession, kafka_config: dict[str, Any], bootstrap_servers: str,
        new_topic: Callable[..., str]) -> None:
    source = new_topic(4, prefix="raw")
    ends = generate(kafka_config, source, GeneratorConfig(events=EVENTS, rate=1e6, keys=30,
                                                          start_ms=1_767_225_600_000, speedup=60.0, seed=5))
    events = f"{source}-events"
    create_topic(kafka_config, events, 3)
    rejects = f"{events}-rejects"
    create_topic(kafka_config, rejects, 1)

    def first_run(i: int) -> None:  # generation 0: 4 tasks, each stops at a commit after some records
        run_ingest_task(kafka_config, source_topic=source, source_partitions=[i], output_topic=events,
                        rejects_topic=rejects, run_id=RUN, task_index=i, task_count=4, key_field="user",
                        event_time_field="event_time", watermark_interval_s=0.2, until=ends,
                        stop=lambda records: records >= 100)

    threads = [threading.Thread(target=first_run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    # Then task 3 starts again and dies mid-transaction: its records stay in an open transaction.
    dead = ControlWriter({**kafka_config, "transactional.id": transactional_id(events, task_name("ingest", RUN, 3)),
                          "transaction.timeout.ms": DEAD_TIMEOUT_MS}, events, task_name=task_name("ingest", RUN, 3),
                         task_count=4, run_id=RUN, data_headers=True)
    for n in range(6):
        dead.send({"key": "dead", "event_ms": 1_767_225_600_000, "id": f"dead-{n}"}, key="dead", partition=n % 3)
    dead.flush()
    assert held_back(kafka_config, events, 3)[0], "the dead task's transaction should be open"

    args = stream_ingest.build_parser().parse_args(
        ["--source-topic", source, "--topic", events, "--key", "user", "--event-time", "event_time",
         "--tasks", "3", "--partitions", "3", "--until-source-end", "--watermark-interval", "200ms",
         "--run-id", RUN, "--timeout", "60"])
    summary = stream_ingest.run(spark, args, {"bootstrap.servers": bootstrap_servers})
    assert summary["generation"] == 1 and len(summary["tasks"]) == 3  # a rescale, so a fence of ids 0..3

    with ControlReader(kafka_config, events, run_id=RUN) as reader:
        items = list(reader.read_until_end(timeout=60))  # cannot end while the transaction is open
    assert isinstance(items[-1], StreamEnded)
    ids = [decode_json_payload(i.payload)["id"] for i in items if isinstance(i, DataRecord)]
    assert len(ids) == EVENTS and len(set(ids)) == EVENTS  # every record once, none of the dead task's
    assert held_back(kafka_config, events, 3)[0] == {}  # aborted: nothing holds readers back any more
    with pytest.raises(DeliveryError, match="fenced"):  # and the dead producer cannot commit it later
        dead.commit(10)
