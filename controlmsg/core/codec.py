"""The envelope codec, wire format version 2 (version 1 and one more user-message type). Pure: no I/O.

``value = MessageType byte + MessageData``. User data is the user serde's bytes, untouched (type ``0``), or,
from wire format 2, a user message that names its run: type ``3``, one byte ``n``, the run id's ``n`` UTF-8
bytes, then the payload (:func:`run_tag`, :func:`split_run`; docs/PROTOCOL.md, "Wire format 2"); control data
is a UTF-8 JSON object with camelCase fields (``version``, ``taskName``, ``taskCount``, ``timestamp``,
``runId``, on an idle watermark ``idle``, and from a run's first rescale on ``generation``). Unknown
extra fields are ignored. Everything else that is not exactly this is a
:class:`~controlmsg.errors.DecodeError`, never user data.

orjson is used here and nowhere else in the core; its errors are translated at this boundary.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Final

import orjson

from controlmsg.core.messages import (
    PROTOCOL_VERSION,
    ControlMessage,
    EndOfStreamMessage,
    MessageType,
    WatermarkMessage,
)
from controlmsg.errors import DecodeError, UnsupportedVersion

__all__ = [
    "MAX_RUN_TAG_BYTES",
    "decode",
    "decode_json_payload",
    "encode_control",
    "encode_json",
    "encode_json_rows",
    "encode_user",
    "encode_user_rows",
    "run_tag",
    "split_run",
    "whole_tagged",
]

_USER: Final = bytes([MessageType.USER_MESSAGE])
_WATERMARK: Final = bytes([MessageType.WATERMARK])
_EOS: Final = bytes([MessageType.END_OF_STREAM])
_WATERMARK_BYTE: Final = int(MessageType.WATERMARK)
_EOS_BYTE: Final = int(MessageType.END_OF_STREAM)
_RUN_BYTE: Final = int(MessageType.USER_MESSAGE_OF_RUN)
MAX_RUN_TAG_BYTES: Final = 255
"""The longest run id (in UTF-8 bytes) a user message can name in its envelope: its length is one byte."""
_dumps: Final = orjson.dumps  # bound once: encode_json and decode are the per-record path


def encode_user(payload: bytes) -> bytes:
    """Wrap a user payload (already serialized by the user's serde) in the envelope."""
    return _USER + payload


def run_tag(run_id: str) -> bytes:
    """The first bytes of every user message of run ``run_id`` in wire format 2: the type byte ``3``, the
    run id's length in one byte, the run id in UTF-8; the payload follows. ``run_tag(r) + payload`` is
    such a message, and a reader of run ``r`` knows its own records by this prefix alone (the length byte
    keeps run ``"ab"`` from matching run ``"abc"``). Raises ``ValueError`` for a run id longer than
    :data:`MAX_RUN_TAG_BYTES` UTF-8 bytes."""
    raw = run_id.encode()
    if len(raw) > MAX_RUN_TAG_BYTES:
        raise ValueError(f"run id {run_id[:40]!r}... is {len(raw)} UTF-8 bytes, too long to name in the envelope "
                         f"(at most {MAX_RUN_TAG_BYTES}): shorten it, or name the run in headers instead")
    return bytes((_RUN_BYTE, len(raw))) + raw


def split_run(value: bytes) -> tuple[bytes, bytes]:
    """``(run id as UTF-8 bytes, payload)`` of a user message of wire format 2 (type byte ``3``). Raises
    :class:`DecodeError` when the value is not one, or is shorter than the run id its length byte
    announces."""
    if len(value) < 2 or value[0] != _RUN_BYTE:
        raise DecodeError("not a user message that names its run (MessageType byte 3 and a length byte)")
    end = 2 + value[1]
    if len(value) < end:
        raise DecodeError(f"user message names a run of {value[1]} bytes but has only {len(value) - 2} after its "
                          "length byte")
    return value[2:end], value[end:]


def whole_tagged(value: bytes) -> bool:
    """Whether ``value`` (type byte ``3``) holds the whole run id its length byte announces: what
    :func:`split_run` checks, as a yes or no for a loop that only counts user messages."""
    return len(value) > 1 and len(value) >= 2 + value[1]


def encode_user_rows(payloads: Iterable[bytes], prefix: bytes = _USER) -> list[bytes]:
    """``[encode_user(p) for p in payloads]`` in one loop: payloads serialized already (by the user's serde,
    e.g. Spark's ``to_json`` in the JVM), each wrapped in the envelope as it is. ``prefix``: the envelope's
    first bytes, a :func:`run_tag` for messages that name their run."""
    return [prefix + payload for payload in payloads]


def encode_json(value: Any) -> bytes:
    """Wrap a JSON-serializable value with the default serde (orjson). Raises ``TypeError`` if it is not."""
    return _USER + _dumps(value)


def encode_json_rows(rows: Iterable[Any], default: Callable[[Any], Any] | None = None,
                     option: int | None = None, prefix: bytes = _USER) -> list[bytes]:
    """``[encode_json(row) for row in rows]``, with orjson's ``default`` (called for a value orjson cannot
    serialize itself) and ``option`` flags; ``prefix``, the envelope's first bytes, a :func:`run_tag` for
    messages that name their run. Raises ``TypeError`` for a row that cannot be serialized.

    One loop for many rows, and each row's JSON is wrapped as soon as it is made: a list of orjson's own
    results held until later costs more than the wrapping (orjson over-allocates each result)."""
    dumps = orjson.dumps
    return [prefix + dumps(row, default, option) for row in rows]


def encode_control(message: ControlMessage) -> bytes:
    """Encode a watermark or end-of-stream message as an envelope."""
    body: dict[str, Any] = {
        "version": message.version,
        "taskName": message.task_name,
        "taskCount": message.task_count,
        "runId": message.run_id,
    }
    if message.generation:  # only from a rescale on: generation 0 stays byte for byte what it was
        body["generation"] = message.generation
    if isinstance(message, WatermarkMessage):
        body["timestamp"] = message.timestamp
        if message.idle:  # only when set: an ordinary watermark stays byte for byte what it was
            body["idle"] = True
        return _WATERMARK + orjson.dumps(body)
    return _EOS + orjson.dumps(body)


def decode(value: bytes | None) -> bytes | ControlMessage:
    """Decode one record value.

    Returns the user payload (``bytes``, the serde's bytes without the type byte, and for a message that
    names its run without its run tag: :func:`split_run` gives the run too) for a user message, or the
    control message. Raises :class:`DecodeError` (without location: the caller adds it with
    :meth:`~controlmsg.errors.ProtocolError.at`) for a null or empty value, an unknown type byte, or a
    control body that is not a valid version-1 control message; :class:`UnsupportedVersion` for a
    control message of another version.
    """
    if value and value[0] == 0:  # MessageType.USER_MESSAGE as a literal, first: the per-record path
        return value[1:]
    if not value:
        raise DecodeError("empty value: every record needs at least the MessageType byte")
    kind = value[0]
    if kind == _WATERMARK_BYTE:
        return _decode_control(value, MessageType.WATERMARK)
    if kind == _EOS_BYTE:
        return _decode_control(value, MessageType.END_OF_STREAM)
    if kind == _RUN_BYTE:
        return split_run(value)[1]
    raise DecodeError(f"unknown MessageType byte {kind} (expected 0, 1, 2 or 3): written by a newer controlmsg? "
                      "docs/PROTOCOL.md says which version reads which")


def decode_json_payload(payload: bytes) -> Any:
    """Decode a user payload written with the default JSON serde. Raises :class:`DecodeError`."""
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        raise DecodeError(f"user payload is not JSON: {exc}") from exc


def _decode_control(value: bytes, kind: MessageType) -> ControlMessage:
    name = kind.name
    try:
        body = orjson.loads(value[1:])
    except orjson.JSONDecodeError as exc:
        raise DecodeError(f"{name} body is not valid UTF-8 JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise DecodeError(f"{name} body must be a JSON object, got {type(body).__name__}")
    version = body.get("version")
    if type(version) is not int:
        raise DecodeError(f"{name} field 'version' must be an integer, got {version!r}")
    if version != PROTOCOL_VERSION:
        raise UnsupportedVersion(
            f"{name} has version {version}; this reader understands version {PROTOCOL_VERSION} only"
        )
    task_name = _field(body, "taskName", str, name)
    task_count = _field(body, "taskCount", int, name)
    # runId is optional on the wire (a writer without runs omits it); when present it must be a string.
    run_id = _field(body, "runId", str, name) if "runId" in body else ""
    generation = _field(body, "generation", int, name) if "generation" in body else 0
    try:
        if kind is MessageType.WATERMARK:
            timestamp = _field(body, "timestamp", int, name)
            idle = _field(body, "idle", bool, name) if "idle" in body else False
            return WatermarkMessage(task_name, task_count, timestamp, run_id, version, idle, generation)
        return EndOfStreamMessage(task_name, task_count, run_id, version, generation)
    except ValueError as exc:
        raise DecodeError(f"{name} is invalid: {exc}") from exc


def _field(body: dict[str, Any], key: str, typ: type, name: str) -> Any:
    if key not in body:
        raise DecodeError(f"{name} is missing required field {key!r}")
    got = body[key]
    # bool is an int subclass in Python but not a JSON integer; refuse it.
    if type(got) is not typ:
        raise DecodeError(f"{name} field {key!r} must be {typ.__name__}, got {got!r}")
    return got
