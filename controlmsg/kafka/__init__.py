"""Kafka adapters on confluent-kafka: topic admin, the upstream writer, the downstream reader, checkpoints,
and where the cluster is (:func:`resolve_bootstrap_servers`).

This is the one layer that talks to Kafka; the bookkeeping it drives lives in :mod:`controlmsg.core`.
librdkafka settings pass through untouched, so security and tuning options are set the usual way.
"""

from controlmsg.kafka.admin import create_topic, partition_count, wait_for_topic
from controlmsg.kafka.checkpoint import Checkpoint, FileCheckpointStore
from controlmsg.kafka.data_records import DataColumns, DataRecord
from controlmsg.kafka.reader import ControlReader, Item
from controlmsg.kafka.settings import resolve_bootstrap_servers
from controlmsg.kafka.writer import ControlWriter

__all__ = [
    "Checkpoint",
    "ControlReader",
    "ControlWriter",
    "DataColumns",
    "DataRecord",
    "FileCheckpointStore",
    "Item",
    "create_topic",
    "partition_count",
    "resolve_bootstrap_servers",
    "wait_for_topic",
]
