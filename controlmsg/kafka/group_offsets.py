"""A reader's progress as a consumer group's committed offsets, for the tools that read consumer groups
(``kafka-consumer-groups``, Burrow, the lag exporters): :class:`GroupProgress`.

controlmsg readers keep their position elsewhere (a Spark query's offset log, a reader's checkpoint file or
state topic) and read with private groups that commit nothing, so a lag dashboard sees none of their
progress. With a group named, the reader also commits, after each micro-batch or checkpoint, the offsets it
has consumed to that group. Nothing reads from those offsets: they are a report, and moving them moves no
reader. The group is used by no member (the commits are a standalone consumer's, generation -1), so a group
that live consumers use is refused by the broker, and that refusal is raised.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from controlmsg.errors import ControlMsgError
from controlmsg.kafka.settings import for_client

__all__ = ["GroupProgress"]


class GroupProgress:
    """Commits consumed offsets (the next offset to read, Kafka's convention) to the consumer group
    ``group_id``. ``config``: the client settings of the reader (``bootstrap.servers``, security). Not
    thread-safe; :meth:`close` when done."""

    def __init__(self, config: Mapping[str, Any], group_id: str) -> None:
        self.group_id = group_id
        self._conf = {**for_client(config, "consumer"), "group.id": group_id, "enable.auto.commit": False,
                      "client.id": f"controlmsg-progress-{uuid.uuid4().hex[:8]}"}
        self._consumer: Consumer | None = None  # made at the first commit
        self._committed: dict[tuple[str, int], int] = {}

    def commit(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Commit ``offsets`` ((topic, partition) -> next offset to read), synchronously, unless they are what
        was committed last. Raises :class:`~controlmsg.errors.ControlMsgError` naming the group and the
        broker's reason when refused (a group with live members, no authorization)."""
        if not offsets or dict(offsets) == self._committed:
            return
        if self._consumer is None:
            self._consumer = Consumer(self._conf)
        parts = [TopicPartition(topic, partition, offset) for (topic, partition), offset in sorted(offsets.items())]
        try:
            done = self._consumer.commit(offsets=parts, asynchronous=False)
        except KafkaException as exc:
            raise ControlMsgError(f"consumer group {self.group_id!r} (option groupId): committing the offsets read "
                                  f"failed: {exc.args[0] if exc.args else exc}") from exc
        failed = [tp for tp in done or [] if tp.error is not None]
        if failed:
            raise ControlMsgError(f"consumer group {self.group_id!r} (option groupId): the broker refused the "
                                  f"offsets of {failed[0].topic} partition {failed[0].partition}: {failed[0].error}")
        self._committed = dict(offsets)

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
