"""The pure core of controlmsg: messages, the envelope codec, the bookkeeping and the watermark policy. No
I/O here. (The tumbling windows of the streaming runtime are pure too, and live beside the runtime that
alone uses them: :mod:`controlmsg.streaming.windows`.)

Nothing in this package imports confluent_kafka or pyspark, reads the clock, sleeps or touches files;
offsets and messages come in as arguments and events come out as return values.
"""

from controlmsg.core.bookkeeping import InputTracker
from controlmsg.core.codec import decode, decode_json_payload, encode_control, encode_json, encode_user
from controlmsg.core.events import Counters, Event, PartitionEnded, PartitionStatus, StreamEnded, WatermarkAdvanced
from controlmsg.core.messages import (
    MAX_TIMESTAMP,
    MIN_TIMESTAMP,
    PROTOCOL_VERSION,
    ControlMessage,
    EndOfStreamMessage,
    MessageType,
    WatermarkMessage,
)
from controlmsg.core.watermarks import WatermarkCadence, WatermarkPolicy

__all__ = [
    "MAX_TIMESTAMP",
    "MIN_TIMESTAMP",
    "PROTOCOL_VERSION",
    "ControlMessage",
    "Counters",
    "EndOfStreamMessage",
    "Event",
    "InputTracker",
    "MessageType",
    "PartitionEnded",
    "PartitionStatus",
    "StreamEnded",
    "WatermarkAdvanced",
    "WatermarkCadence",
    "WatermarkMessage",
    "WatermarkPolicy",
    "decode",
    "decode_json_payload",
    "encode_control",
    "encode_json",
    "encode_user",
]
