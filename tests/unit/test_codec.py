"""The envelope codec: wire format version 1 (DESIGN.md, "Wire format, version 1") and version 2, its user
messages that name their run (docs/PROTOCOL.md, "Wire format 2")."""

from __future__ import annotations

import contextlib
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlmsg.core.codec import (
    decode,
    decode_json_payload,
    encode_control,
    encode_json,
    encode_json_rows,
    encode_user,
    encode_user_rows,
    run_tag,
    split_run,
    whole_tagged,
)
from controlmsg.core.messages import (
    MAX_TIMESTAMP,
    MIN_TIMESTAMP,
    PROTOCOL_VERSION,
    EndOfStreamMessage,
    MessageType,
    WatermarkMessage,
)
from controlmsg.errors import DecodeError, Location, ProtocolError, UnsupportedVersion

from .strategies import control_bodies, control_messages, json_values

PROPERTY = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def wm_body(**fields: Any) -> bytes:
    """A WATERMARK envelope whose body is the valid one with ``fields`` overridden (``...`` removes)."""
    return b"\x01" + orjson.dumps(_body({"timestamp": 5}, fields))


def eos_body(**fields: Any) -> bytes:
    return b"\x02" + orjson.dumps(_body({}, fields))


def _body(extra: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {"version": 1, "taskName": "t0", "taskCount": 2, "runId": "r1", **extra}
    for key, value in fields.items():
        if value is ...:
            body.pop(key, None)
        else:
            body[key] = value
    return body


# ------------------------------------------------------------------ round trips


@PROPERTY
@given(control_messages)
def test_control_message_round_trip(message: WatermarkMessage | EndOfStreamMessage) -> None:
    encoded = encode_control(message)
    assert encoded[0] == message.type
    assert decode(encoded) == message


@PROPERTY
@given(st.binary())
def test_user_payload_round_trip(payload: bytes) -> None:
    encoded = encode_user(payload)
    assert encoded == b"\x00" + payload
    decoded = decode(encoded)
    assert type(decoded) is bytes
    assert decoded == payload


@PROPERTY
@given(json_values)
def test_json_serde_round_trip(value: Any) -> None:
    decoded = decode(encode_json(value))
    assert isinstance(decoded, bytes)
    assert decode_json_payload(decoded) == value


def test_user_payload_that_looks_like_a_control_message_stays_user_data() -> None:
    control = encode_control(EndOfStreamMessage("t0", 1, "r1"))
    assert decode(encode_user(control)) == control
    assert decode(b"\x00") == b""


def test_json_payload_errors_are_decode_errors() -> None:
    for payload in (b"", b"{", b"\xff\xfe", b"NaN"):
        with pytest.raises(DecodeError, match="not JSON"):
            decode_json_payload(payload)


# ------------------------------------------------------------------ golden vectors


def test_golden_watermark_vector() -> None:
    encoded = encode_control(WatermarkMessage("t0", 2, 5, "r1"))
    assert encoded.startswith(b"\x01")
    assert orjson.loads(encoded[1:]) == {
        "version": 1,
        "taskName": "t0",
        "taskCount": 2,
        "runId": "r1",
        "timestamp": 5,
    }
    # Plain UTF-8 JSON: any JSON library can read it.
    assert encoded[1:].decode("utf-8").startswith("{")


def test_idle_watermark_vector() -> None:
    encoded = encode_control(WatermarkMessage("t0", 2, 5, "r1", idle=True))
    assert orjson.loads(encoded[1:]) == {
        "version": 1, "taskName": "t0", "taskCount": 2, "runId": "r1", "timestamp": 5, "idle": True}
    assert decode(encoded) == WatermarkMessage("t0", 2, 5, "r1", idle=True)
    assert decode(wm_body(idle=False)) == WatermarkMessage("t0", 2, 5, "r1")
    # Only true/false: a number or a string is not taken for a flag.
    for bad in (1, 0, "true", None):
        with pytest.raises(DecodeError, match="'idle' must be bool"):
            decode(wm_body(idle=bad))
    assert decode(eos_body(idle="whatever")) == EndOfStreamMessage("t0", 2, "r1")  # not a field of EOS


def test_generation_vector() -> None:
    encoded = encode_control(WatermarkMessage("t0", 3, 5, "r1", generation=2))
    assert orjson.loads(encoded[1:]) == {
        "version": 1, "taskName": "t0", "taskCount": 3, "runId": "r1", "timestamp": 5, "generation": 2}
    assert decode(encoded) == WatermarkMessage("t0", 3, 5, "r1", generation=2)
    assert decode(encode_control(EndOfStreamMessage("t0", 3, "r1", generation=1))) == EndOfStreamMessage(
        "t0", 3, "r1", generation=1)
    # Generation 0 is not written: what every writer wrote before rescaling existed, byte for byte.
    assert b"generation" not in encode_control(WatermarkMessage("t0", 3, 5, "r1", generation=0))
    assert decode(wm_body(generation=0)) == WatermarkMessage("t0", 2, 5, "r1")
    for bad in (True, -1, 1.5, "2", None):
        with pytest.raises(DecodeError, match="generation"):
            decode(wm_body(generation=bad))
        with pytest.raises(DecodeError, match="generation"):
            decode(eos_body(generation=bad))


def test_golden_end_of_stream_vector() -> None:
    encoded = encode_control(EndOfStreamMessage("t1", 3, "r1"))
    assert encoded.startswith(b"\x02")
    assert orjson.loads(encoded[1:]) == {"version": 1, "taskName": "t1", "taskCount": 3, "runId": "r1"}


def test_type_bytes_are_the_wire_values() -> None:
    assert [int(t) for t in MessageType] == [0, 1, 2, 3]
    assert PROTOCOL_VERSION == 1


def test_envelope_from_an_independent_client_decodes() -> None:
    # Written by hand as another client might: other field order, whitespace, non-ASCII, extra fields.
    watermark = (
        b"\x01"
        + b'{ "timestamp": 1700000000000, "runId": "run-\xc3\xa9", "producer": {"lang": "java"},\n'
        + b'  "taskCount": 4, "seq": 17, "taskName": "job-a/part-3", "version": 1 }'
    )
    assert decode(watermark) == WatermarkMessage("job-a/part-3", 4, 1_700_000_000_000, "run-\u00e9")
    eos = b'\x02{"taskCount":4,"taskName":"job-a/part-3","version":1,"runId":"r","timestamp":"ignored"}'
    assert decode(eos) == EndOfStreamMessage("job-a/part-3", 4, "r")
    escaped = b'\x01{"version":1,"taskName":"\\u00e9\\ud83d\\ude00","taskCount":1,"timestamp":-1}'
    assert decode(escaped) == WatermarkMessage("\u00e9\U0001f600", 1, -1, "")


def test_extra_fields_are_ignored() -> None:
    extra = {"future": [1, {"x": None}], "headers": "h", "TaskName": 5, "": 0}
    assert decode(wm_body(**extra)) == WatermarkMessage("t0", 2, 5, "r1")
    assert decode(eos_body(**extra)) == EndOfStreamMessage("t0", 2, "r1")


def test_run_id_is_optional_on_the_wire() -> None:
    assert decode(wm_body(runId=...)) == WatermarkMessage("t0", 2, 5, "")
    assert decode(eos_body(runId=...)) == EndOfStreamMessage("t0", 2, "")


def test_timestamp_bounds() -> None:
    assert decode(wm_body(timestamp=MIN_TIMESTAMP)).timestamp == MIN_TIMESTAMP  # type: ignore[union-attr]
    assert decode(wm_body(timestamp=MAX_TIMESTAMP - 1)).timestamp == MAX_TIMESTAMP - 1  # type: ignore[union-attr]


# ------------------------------------------------------------------ bad input


BAD_INPUTS: list[tuple[str, bytes | None, str]] = [
    ("none", None, "empty value"),
    ("empty", b"", "empty value"),
    ("type byte 4", b"\x04" + orjson.dumps(_body({}, {})), "unknown MessageType byte 4"),
    ("type byte 3, a run cut short", b"\x03" + orjson.dumps(_body({}, {})), "names a run of 123 bytes but has only"),
    ("type byte 3 alone", b"\x03", "not a user message that names its run"),
    ("type byte 255", b"\xff", "unknown MessageType byte 255"),
    ("type byte ascii", b'{"version":1}', "unknown MessageType byte 123"),
    ("watermark without body", b"\x01", "not valid UTF-8 JSON"),
    ("eos without body", b"\x02", "not valid UTF-8 JSON"),
    ("broken json", b'\x01{"version":1,', "not valid UTF-8 JSON"),
    ("trailing garbage", wm_body() + b"x", "not valid UTF-8 JSON"),
    ("nan", b'\x01{"version":NaN}', "not valid UTF-8 JSON"),
    (
        "invalid utf-8 in string",
        b'\x01{"version":1,"taskName":"t\xff","taskCount":1,"timestamp":1}',
        "not valid UTF-8 JSON",
    ),
    ("invalid utf-8 in key", b'\x02{"version":1,"taskName":"t","taskCount":1,"\xc3":1}', "not valid UTF-8 JSON"),
    ("lone surrogate escape", b'\x02{"version":1,"taskName":"\\ud800","taskCount":1}', "not valid UTF-8 JSON"),
    ("utf-16 body", b"\x02" + '{"version":1,"taskName":"t","taskCount":1}'.encode("utf-16"), "not valid UTF-8 JSON"),
    ("array body", b"\x01[1,2]", "must be a JSON object, got list"),
    ("null body", b"\x02null", "must be a JSON object, got NoneType"),
    ("number body", b"\x011", "must be a JSON object, got int"),
    ("string body", b'\x02"eos"', "must be a JSON object, got str"),
    ("missing version", wm_body(version=...), "'version' must be an integer"),
    ("version string", wm_body(version="1"), "'version' must be an integer"),
    ("version float", wm_body(version=1.0), "'version' must be an integer"),
    ("version bool", eos_body(version=True), "'version' must be an integer"),
    ("version null", eos_body(version=None), "'version' must be an integer"),
    ("missing taskName", wm_body(taskName=...), "missing required field 'taskName'"),
    ("empty taskName", eos_body(taskName=""), "taskName must be a non-empty UTF-8 string"),
    ("taskName int", wm_body(taskName=7), "'taskName' must be str"),
    ("taskName null", eos_body(taskName=None), "'taskName' must be str"),
    ("missing taskCount", eos_body(taskCount=...), "missing required field 'taskCount'"),
    ("taskCount zero", wm_body(taskCount=0), "taskCount must be an integer in [1, 2**63-1]"),
    ("taskCount negative", eos_body(taskCount=-3), "taskCount must be an integer in [1, 2**63-1]"),
    ("taskCount bool", eos_body(taskCount=True), "'taskCount' must be int"),
    ("taskCount float", wm_body(taskCount=2.0), "'taskCount' must be int"),
    ("taskCount string", wm_body(taskCount="2"), "'taskCount' must be int"),
    (
        "taskCount beyond u64",
        b'\x02{"version":1,"taskName":"t","taskCount":18446744073709551616}',
        "'taskCount' must be int",
    ),
    ("runId int", wm_body(runId=1), "'runId' must be str"),
    ("runId null", eos_body(runId=None), "'runId' must be str"),
    ("runId list", eos_body(runId=["r"]), "'runId' must be str"),
    ("missing timestamp", wm_body(timestamp=...), "missing required field 'timestamp'"),
    ("timestamp bool", wm_body(timestamp=False), "'timestamp' must be int"),
    ("timestamp float", wm_body(timestamp=5.0), "'timestamp' must be int"),
    ("timestamp string", wm_body(timestamp="5"), "'timestamp' must be int"),
    ("timestamp null", wm_body(timestamp=None), "'timestamp' must be int"),
    ("timestamp is end of time", wm_body(timestamp=MAX_TIMESTAMP), "timestamp must be an integer in"),
    ("timestamp beyond i64", wm_body(timestamp=2**63), "timestamp must be an integer in"),
    ("timestamp max u64", wm_body(timestamp=2**64 - 1), "timestamp must be an integer in"),
    (
        "timestamp below i64",
        b'\x01{"version":1,"taskName":"t","taskCount":1,"timestamp":-9223372036854775809}',
        "'timestamp' must be int",
    ),
]


@pytest.mark.parametrize(("value", "reason"), [(v, r) for _, v, r in BAD_INPUTS], ids=[i for i, _, _ in BAD_INPUTS])
def test_bad_input_is_a_decode_error(value: bytes | None, reason: str) -> None:
    with pytest.raises(DecodeError) as info:
        decode(value)
    err = info.value
    assert type(err) is DecodeError  # not UnsupportedVersion: these are all version-1 problems
    assert reason in err.reason
    assert err.location == Location()  # the pure codec does not know where the record came from
    assert reason in str(err)


@pytest.mark.parametrize("version", [0, 2, -1, 99, 2**40])
@pytest.mark.parametrize("type_byte", [b"\x01", b"\x02"])
def test_unknown_version_is_unsupported(version: int, type_byte: bytes) -> None:
    value = type_byte + orjson.dumps({"version": version, "taskName": "t0", "taskCount": 1, "timestamp": 1})
    with pytest.raises(UnsupportedVersion) as info:
        decode(value)
    assert isinstance(info.value, DecodeError)
    assert f"version {version}" in info.value.reason
    assert "version 1" in info.value.reason


def test_unknown_version_is_refused_before_its_fields_are_checked() -> None:
    # A later version may change the other fields; the reader must say "version", not "bad field".
    with pytest.raises(UnsupportedVersion):
        decode(b'\x01{"version":2,"taskName":7,"shape":"new"}')


def test_error_location_can_be_filled_in() -> None:
    with pytest.raises(DecodeError) as info:
        decode(wm_body(taskCount=0))
    err = info.value
    located = err.at(Location("topic-a", 3, 42))
    assert type(located) is DecodeError
    assert located.reason == err.reason
    assert located.location == Location("topic-a", 3, 42)
    assert located.__cause__ is err.__cause__
    assert "topic 'topic-a', partition 3, offset 42" in str(located)
    # Fields already known are kept; unknown ones are filled.
    partial = ProtocolError("r", Location(partition=1)).at(Location("t", 9, 7))
    assert partial.location == Location("t", 1, 7)

    with pytest.raises(UnsupportedVersion) as info2:
        decode(eos_body(version=3))
    assert type(info2.value.at(Location("t", 0, 0))) is UnsupportedVersion


def test_third_party_errors_are_chained() -> None:
    with pytest.raises(DecodeError) as info:
        decode(b"\x01{")
    assert isinstance(info.value.__cause__, orjson.JSONDecodeError)


# ------------------------------------------------------------------ fuzz


@PROPERTY
@given(st.binary(max_size=64))
def test_decode_of_arbitrary_bytes_returns_or_raises_decode_error(value: bytes) -> None:
    try:
        result = decode(value)
    except DecodeError:
        return
    assert isinstance(result, bytes | WatermarkMessage | EndOfStreamMessage)


@PROPERTY
@given(st.sampled_from([b"\x01", b"\x02"]), control_bodies())
def test_decode_of_arbitrary_control_bodies(type_byte: bytes, body: dict[str, Any]) -> None:
    value = type_byte + orjson.dumps(body)
    try:
        result = decode(value)
    except UnsupportedVersion:
        assert body.get("version") != 1 and type(body.get("version")) is int
        return
    except DecodeError:
        return
    # Accepted: then it is exactly what the body says.
    assert result.task_name == body["taskName"]  # type: ignore[union-attr]
    assert result.task_count == body["taskCount"]  # type: ignore[union-attr]
    assert result.run_id == body.get("runId", "")  # type: ignore[union-attr]
    if type_byte == b"\x01":
        assert isinstance(result, WatermarkMessage)
        assert result.timestamp == body["timestamp"]
    else:
        assert isinstance(result, EndOfStreamMessage)


@PROPERTY
@given(control_messages, st.data())
def test_decode_of_mutated_control_envelopes(message: WatermarkMessage | EndOfStreamMessage, data: Any) -> None:
    encoded = bytearray(encode_control(message))
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(encoded) - 1))
        encoded[i] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        encoded = encoded[: data.draw(st.integers(0, len(encoded)))]
    with contextlib.suppress(DecodeError):
        decode(bytes(encoded))


# ------------------------------------------------------------------ messages


@pytest.mark.parametrize(
    "build",
    [
        lambda: WatermarkMessage("", 1, 0),
        lambda: WatermarkMessage("t", 0, 0),
        lambda: WatermarkMessage("t", True, 0),
        lambda: WatermarkMessage("t", 1, True),
        lambda: WatermarkMessage("t", 1, 1.0),  # type: ignore[arg-type]
        lambda: WatermarkMessage("t", 1, MAX_TIMESTAMP),
        lambda: WatermarkMessage("t", 1, MIN_TIMESTAMP - 1),
        lambda: WatermarkMessage("t", 1, 0, None),  # type: ignore[arg-type]
        lambda: EndOfStreamMessage(None, 1),  # type: ignore[arg-type]
        lambda: EndOfStreamMessage("t", -1),
        lambda: EndOfStreamMessage("t", 1, "r", "1"),  # type: ignore[arg-type]
    ],
)
def test_messages_validate_on_construction(build: Any) -> None:
    with pytest.raises(ValueError):
        build()


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(lambda: WatermarkMessage("t", 2**64, 0), id="taskCount beyond u64"),
        pytest.param(lambda: EndOfStreamMessage("t", 1, run_id="\ud800"), id="lone surrogate runId"),
        pytest.param(lambda: EndOfStreamMessage("\udcff", 1), id="lone surrogate taskName"),
    ],
)
def test_every_constructible_message_encodes(build: Any) -> None:
    """messages.py promises that "an instance that exists is always well-formed": so a message is either
    refused at construction or it encodes and round-trips; orjson's errors never leak out of the codec."""
    try:
        message = build()
    except ValueError:
        return
    assert decode(encode_control(message)) == message


def test_encode_json_rows_is_encode_json_per_row() -> None:
    rows = [{"a": 1, "b": None}, {"a": 2.5, "b": "x"}, [1, 2], "s"]
    assert encode_json_rows(rows) == [encode_json(r) for r in rows]
    assert encode_json_rows(iter([{"t": 1}]), None, orjson.OPT_SORT_KEYS) == [b"\x00" + b'{"t":1}']
    assert encode_json_rows([{"d": object()}], lambda v: "fallback") == [b'\x00{"d":"fallback"}']
    with pytest.raises(TypeError):
        encode_json_rows([{"d": object()}])


def test_same_run_takes_the_first_run_header() -> None:
    from controlmsg.kafka.data_records import same_run
    from controlmsg.kafka.writer import HEADER_RUN, HEADER_TASK

    mine = (HEADER_RUN, b"r1")
    assert same_run(None, mine) and same_run([], mine)
    assert same_run([(HEADER_RUN, b"r1"), (HEADER_TASK, b"t")], mine)
    assert not same_run([(HEADER_RUN, b"r2"), (HEADER_TASK, b"t")], mine)
    assert same_run([(HEADER_TASK, b"t"), (HEADER_RUN, b"r1")], mine)  # another order: scanned
    assert not same_run([(HEADER_TASK, b"t"), (HEADER_RUN, b"r2")], mine)
    assert not same_run([(HEADER_TASK, b"t"), (HEADER_RUN, b"r2"), (HEADER_RUN, b"r1")], mine)  # the first
    assert not same_run([(HEADER_TASK, b"t"), (HEADER_RUN, None)], mine)
    assert same_run([(HEADER_TASK, b"t")], mine)  # no run header: the record passes


def test_the_spark_drivers_messages_are_the_vectors_of_the_protocol_page() -> None:
    """docs/PROTOCOL.md, "One upstream task per Spark write": the driver's messages byte for byte."""
    from controlmsg.core.naming import driver_task_name

    name = driver_task_name("spark", "r1")
    assert encode_control(EndOfStreamMessage(name, 1, "r1")) == (
        b'\x02{"version":1,"taskName":"spark-r1-driver","taskCount":1,"runId":"r1"}')
    assert encode_control(WatermarkMessage(name, 1, 1_767_225_900_000, "r1")) == (
        b'\x01{"version":1,"taskName":"spark-r1-driver","taskCount":1,"runId":"r1","timestamp":1767225900000}')
    assert encode_control(EndOfStreamMessage(name, 1, "r1", generation=1)) == (
        b'\x02{"version":1,"taskName":"spark-r1-driver","taskCount":1,"runId":"r1","generation":1}')


# ------------------------------------------------------------------ wire format 2: the run in the envelope


def test_run_tag_vector() -> None:
    """docs/PROTOCOL.md, "Wire format 2": byte 3, the run id's length in one byte, the run id in UTF-8."""
    assert run_tag("r1") == b"\x03\x02r1"
    assert run_tag("") == b"\x03\x00"
    assert run_tag("run-\u00e9") == b"\x03\x06run-\xc3\xa9"  # the length counts bytes, not characters
    assert run_tag("r1") + b'{"a":1}' == b'\x03\x02r1{"a":1}'


@PROPERTY
@given(st.text(max_size=60), st.binary(max_size=40))
def test_tagged_user_message_round_trip(run: str, payload: bytes) -> None:
    if len(run.encode()) > 255:
        return
    tag = run_tag(run)
    value = tag + payload
    assert split_run(value) == (run.encode(), payload)
    assert decode(value) == payload
    assert whole_tagged(value)
    assert not whole_tagged(tag[:-1])  # one byte of the run id short (or the length byte itself missing)


def test_a_run_too_long_for_the_envelope_is_refused_in_one_line() -> None:
    assert len(run_tag("r" * 255)) == 257
    with pytest.raises(ValueError, match="256 UTF-8 bytes, too long to name in the envelope") as info:
        run_tag("r" * 256)
    assert "\n" not in str(info.value)


def test_prefixed_rows_are_the_tag_and_each_payload() -> None:
    tag = run_tag("r1")
    assert encode_user_rows([b"a", b""], tag) == [b"\x03\x02r1a", b"\x03\x02r1"]
    assert encode_json_rows([{"t": 1}], prefix=tag) == [b'\x03\x02r1{"t":1}']
    assert encode_user_rows([b"a"]) == [encode_user(b"a")]


def test_a_reader_takes_its_own_runs_records_by_the_tag() -> None:
    from controlmsg.kafka.data_records import own_run_tag, tagged_payload

    mine, theirs, longer = run_tag("ab") + b"x", run_tag("b") + b"y", run_tag("abc") + b"z"
    own = own_run_tag("ab")
    assert tagged_payload(mine, own) == b"x"
    assert tagged_payload(theirs, own) is None
    assert tagged_payload(longer, own) is None  # the length byte keeps "ab" from matching "abc"
    assert [tagged_payload(v, None) for v in (mine, theirs, longer)] == [b"x", b"y", b"z"]  # no run given
    with pytest.raises(DecodeError, match="names a run of 5 bytes"):
        tagged_payload(b"\x03\x05ab", own)
    too_long = own_run_tag("r" * 300)  # no record can name it: every tagged record is of another run
    assert too_long is not None and tagged_payload(mine, too_long) is None
    assert own_run_tag(None) is None
