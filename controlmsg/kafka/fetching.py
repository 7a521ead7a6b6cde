"""Taking what a consumer has without waiting for what is not there.

librdkafka's ``Consumer.consume(n, timeout)`` returns once it holds ``n`` messages or ``timeout`` has passed:
a batch shorter than ``n`` (the tail of a topic, a range's last records) always costs the whole timeout.
:func:`consume_ready` returns as soon as there is something to return.

A consumer that learns where a partition ends from librdkafka's end-of-partition event (the last offsets of
a transactional topic are commit markers, never delivered) gets that event only from a fetch that came
back empty, and the broker holds an empty fetch for ``fetch.wait.max.ms`` (librdkafka's default 500 ms):
:data:`EOF_FETCH_WAIT_MS` is what such consumers ask for instead. Measured on a local broker, two
partitions of 2,500 records read to both ends: 0.51 s with the default, 0.11 s with 100 ms, 0.03 s with 20.
"""

from __future__ import annotations

from typing import Any, Final

from confluent_kafka import Consumer

__all__ = ["EOF_FETCH_WAIT_MS", "consume_ready"]

EOF_FETCH_WAIT_MS: Final = 50
"""``fetch.wait.max.ms`` of the consumers that wait for end-of-partition events: an empty fetch comes back
after 50 ms instead of 500. An idle partition costs 20 fetch requests a second instead of 2 while such a
consumer waits on it; the user's own setting wins wherever settings are given."""


def consume_ready(consumer: Consumer, max_messages: int, timeout: float) -> list[Any]:
    """Up to ``max_messages`` messages (and events) of ``consumer``: those it holds already, at once; when it
    holds none, the first to come within ``timeout`` s and those that came with it. ``[]`` when none came.
    Raises what ``Consumer.consume`` raises."""
    msgs: list[Any] = consumer.consume(max_messages, 0)
    if msgs or timeout <= 0:
        return msgs
    msgs = consumer.consume(1, timeout)
    if msgs and max_messages > 1:
        msgs += consumer.consume(max_messages - 1, 0)
    return msgs
