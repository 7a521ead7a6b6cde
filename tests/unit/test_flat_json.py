"""A read's JSON fields parsed by Arrow's JSON reader (``controlmsg.spark.batches._flat_json``): for a batch it
takes, exactly the columns that Python's own ``json`` module gives; every batch the orjson path would read
differently, or would name a bad record in, it leaves to that path (``None``). No Spark needed."""

from __future__ import annotations

import json
import math
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlmsg.spark.batches import _flat_json

FIELDS = [pa.field("s", pa.string()), pa.field("i", pa.int64()), pa.field("f", pa.float64()),
          pa.field("b", pa.bool_()), pa.field("n", pa.int32())]


def expected(payloads: list[bytes], fields: list[pa.Field]) -> dict[str, pa.Array]:
    """The oracle: Python's json module, then one Arrow array per field (an integer read into a float field
    becomes a float, as JSON numbers do)."""
    objects = [json.loads(p) for p in payloads]
    out = {}
    for field in fields:
        values = [o.get(field.name) for o in objects]
        if pa.types.is_floating(field.type):
            values = [None if v is None else float(v) for v in values]
        out[field.name] = pa.array(values, field.type)
    return out


rows = st.fixed_dictionaries({}, optional={
    "s": st.none() | st.text(),
    "i": st.none() | st.integers(-(2**63), 2**63 - 1),
    "f": st.none() | st.floats(allow_nan=False, allow_infinity=False) | st.integers(-(2**53), 2**53),
    "b": st.none() | st.booleans(),
    "n": st.none() | st.integers(-(2**31), 2**31 - 1),
    "extra": st.none() | st.lists(st.integers()) | st.dictionaries(st.text(max_size=3), st.integers()),
})


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(rows, min_size=1, max_size=20), st.booleans())
def test_a_batch_arrow_reads_is_what_json_reads(batch: list[dict[str, Any]], ascii_only: bool) -> None:
    payloads = [json.dumps(row, ensure_ascii=ascii_only).encode() for row in batch]
    got = _flat_json(payloads, FIELDS)
    assert got is not None
    want = expected(payloads, FIELDS)
    for field in FIELDS:
        assert got[field.name].equals(want[field.name]), (field.name, got[field.name], want[field.name])


GOOD = b'{"s":"a","i":1,"f":1.5,"b":true,"n":2}'
LEFT_TO_ORJSON = {
    "NaN, not JSON": b'{"f":NaN}',
    "Infinity, not JSON": b'{"f":-Infinity}',
    "a string that is not UTF-8": b'{"s":"\xff"}',
    "a blank payload": b"   ",
    "an empty payload": b"",
    "two objects on one line": b'{"i":1} {"i":2}',
    "a payload over two lines": b'{"i":1,\n"s":"x"}',
    "a key twice": b'{"i":1,"i":2}',
    "a number for a string": b'{"s":5}',
    "a fraction for an integer": b'{"i":2.5}',
    "2.0 for an integer": b'{"i":2.0}',
    "true for an integer": b'{"i":true}',
    "an integer beyond int32": b'{"n":2147483648}',
    "an integer beyond int64": b'{"i":9223372036854775808}',
    "an object for a string": b'{"s":{"a":1}}',
    "an array, not an object": b"[1,2]",
    "not JSON at all": b"{'i':1}",
}


@pytest.mark.parametrize("payload", LEFT_TO_ORJSON.values(), ids=LEFT_TO_ORJSON.keys())
def test_a_batch_the_orjson_path_reads_otherwise_is_left_to_it(payload: bytes) -> None:
    assert _flat_json([GOOD, payload, GOOD], FIELDS) is None


def test_not_null_fields_missing_and_types_it_does_not_take_are_left_to_orjson() -> None:
    assert _flat_json([GOOD, b'{"s":"x"}'], [pa.field("i", pa.int64(), nullable=False)]) is None
    assert _flat_json([GOOD], [pa.field("i", pa.int64(), nullable=False)]) is not None
    for dtype in (pa.timestamp("us", "UTC"), pa.date32(), pa.decimal128(10, 2), pa.binary(), pa.list_(pa.int64()),
                  pa.struct([("a", pa.int64())])):
        assert _flat_json([GOOD], [pa.field("i", dtype)]) is None, dtype
    assert _flat_json([], FIELDS) is None and _flat_json([GOOD], []) is None


def test_what_it_takes_matches_json_on_a_hand_made_batch() -> None:
    payloads = [GOOD, b'{ "i" : -3 , "f" : 3, "other": {"x": [1, null]} }', b'{"s":"\\u00e9\\n\\"q\\"","b":false}',
                b"{}", b'{"f":1e308,"n":-2147483648}']
    got = _flat_json(payloads, FIELDS)
    assert got is not None
    want = expected(payloads, FIELDS)
    assert all(got[f.name].equals(want[f.name]) for f in FIELDS)
    assert got["f"].to_pylist() == [1.5, 3.0, None, None, 1e308] and math.isfinite(got["f"][4].as_py())
