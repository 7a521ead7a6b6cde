"""controlmsg: in-band watermarks and end of stream across Kafka intermediate topics.

Layers, each importing only the ones before it (docs/DEVELOPMENT.md#layout):

* :mod:`controlmsg.core`: messages, the envelope codec, per-partition bookkeeping. Pure, no I/O. With
  :mod:`controlmsg.errors` and :mod:`controlmsg.paths`.
* :mod:`controlmsg.kafka`: the writer, the reader, topic admin, checkpoints, commit markers and client
  settings, on confluent-kafka.
* :mod:`controlmsg.spark`: the ``controlmsg`` Spark data source (read, readStream, write, writeStream) and
  session helpers; imports pyspark only when used.
* :mod:`controlmsg.streaming`: the long-running-task streaming runtime (the second engine, beside
  Structured Streaming): the ingest and window task bodies, long-running Spark tasks, graceful stop;
  imports pyspark only when its runtime is used. Beside :mod:`controlmsg.spark`: neither imports the other.
* :mod:`controlmsg.clusters`: tools for tests, demos and benchmarks (a local Kafka without Docker, a Spark
  standalone cluster); not on production paths.
* :mod:`controlmsg.cli`: the ``controlmsg`` command.

The example applications (the jobs and the pipeline) live in the ``spark_jobs`` package.
"""

from controlmsg.core import (
    MAX_TIMESTAMP,
    PROTOCOL_VERSION,
    ControlMessage,
    EndOfStreamMessage,
    Event,
    InputTracker,
    MessageType,
    PartitionEnded,
    StreamEnded,
    WatermarkAdvanced,
    WatermarkMessage,
    decode,
    encode_control,
    encode_json,
    encode_user,
)
from controlmsg.errors import (
    BrokerError,
    CheckpointError,
    ControlMsgError,
    DecodeError,
    DeliveryError,
    Location,
    ProtocolError,
    ProtocolViolation,
    ReadError,
    TopicError,
    UnsupportedVersion,
)

__all__ = [
    "MAX_TIMESTAMP",
    "PROTOCOL_VERSION",
    "BrokerError",
    "CheckpointError",
    "ControlMessage",
    "ControlMsgError",
    "DecodeError",
    "DeliveryError",
    "EndOfStreamMessage",
    "Event",
    "InputTracker",
    "Location",
    "MessageType",
    "PartitionEnded",
    "ProtocolError",
    "ProtocolViolation",
    "ReadError",
    "StreamEnded",
    "TopicError",
    "UnsupportedVersion",
    "WatermarkAdvanced",
    "WatermarkMessage",
    "decode",
    "encode_control",
    "encode_json",
    "encode_user",
]
