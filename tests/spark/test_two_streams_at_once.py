"""Two ``controlmsg`` streams started at the same moment in a fresh JVM cannot corrupt the data source's shared
environment map (issue 38; docs/SPARK_RACE.md).

Spark's stream runner inserts four keys into that map, unlocked, at each query's start; two inserts at once once
left its size counter at 7 over 5 entries, and every later plan failed to serialise. The race itself is rare,
so the test checks the invariant that rules it out, round after round: no query start inserts a key (a runner's
``put`` only replaces a value), and the size counter equals the entries. Without
:func:`controlmsg.spark.session.settle_shared_environment`, round 0 already fails: the first starts insert the
keys."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


def test_two_streams_started_at_once_never_insert_into_the_shared_map(
        bootstrap_servers: str, new_topic: Callable[..., str]) -> None:
    topic = new_topic(2)
    run = subprocess.run([sys.executable, "-m", "tests.spark.two_streams_driver", "--servers", bootstrap_servers,
                          "--topic", topic, "--rounds", "3"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    rounds = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert [r["round"] for r in rounds] == [0, 1, 2]
    for r in rounds:
        assert r["after"] == r["before"], f"round {r['round']}: a query's start inserted into the shared map"
        assert {"SPARK_LOCAL_DIRS", "SPARK_BUFFER_SIZE"} <= set(r["before"])
        assert r["size"] == r["entries"], f"round {r['round']}: size counter {r['size']} over {r['entries']} entries"
