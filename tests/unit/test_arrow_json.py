"""A write task's flat rows made JSON in Arrow (controlmsg.spark.writing.arrow_json) against the orjson path it stands
in for: the same envelope and the same values, parsed (the same bytes but for doubles such as 1e10, which
orjson spells out in full), for every type it takes; ``None`` (the orjson path) for anything else."""

from __future__ import annotations

import math
from typing import Any

import orjson
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlmsg.core.codec import encode_json_rows, encode_user
from controlmsg.spark.writing.arrow_json import flat_json_envelopes
from controlmsg.spark.writing.task import _JSON_OPTIONS, _json_default

ENVELOPE = encode_user(b"")
PROPERTY = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def orjson_path(batch: pa.RecordBatch) -> list[bytes]:
    """What the write made of every batch before (and still makes of the batches the Arrow path leaves)."""
    return encode_json_rows(batch.to_pylist(), _json_default, _JSON_OPTIONS)


def parsed(envelopes: list[bytes] | None) -> list[str]:
    """Each record's envelope byte and its values as orjson reads them back, with their types (repr:
    ``-0.0``, ``1.0`` and ``1`` differ)."""
    assert envelopes is not None
    return [repr((e[:1], list(orjson.loads(e[1:]).items()))) for e in envelopes]


def test_every_type_it_takes_is_the_orjson_json() -> None:
    batch = pa.RecordBatch.from_pydict({
        "s": ['a"b\\c', "é✓😀", None, "", "/</script>"],
        "big": pa.array([1, None, -5, 2**63 - 1, -(2**63)], pa.int64()),
        "small": pa.array([1, 2, None, 127, -128], pa.int8()),
        "u": pa.array([0, 1, 2, 2**64 - 1, None], pa.uint64()),
        "d": [0.1, math.nan, None, -0.0, 1e20],
        "integral": [100.0, 1e9, 1e10, 1e15, -3.0],
        "inf": [math.inf, -math.inf, 5e-324, 1.7976931348623157e308, 1 / 3],
        "f32": pa.array([1.0, 0.1, None, 3e38, -0.0], pa.float32()),
        "b": [True, None, False, True, False],
        'we"ird \\ name': pa.array(["x", None, "y", "z", "w"], pa.large_string()),
        "nulls": pa.array([None] * 5, pa.string()),
    })
    made = flat_json_envelopes(batch, ENVELOPE)
    assert parsed(made) == parsed(orjson_path(batch))
    assert made is not None and made[1].startswith(ENVELOPE + b'{"s":"\xc3\xa9')  # UTF-8 kept as it is


@pytest.mark.parametrize("batch", [
    pa.RecordBatch.from_pydict({"s": ["fine", "a\nline"]}),  # a control character: left to orjson's escapes
    pa.RecordBatch.from_pydict({"s": ["\x00"]}),
    pa.RecordBatch.from_pydict({"t": pa.array([1], pa.timestamp("us", tz="UTC"))}),
    pa.RecordBatch.from_pydict({"d": pa.array([1], pa.date32())}),
    pa.RecordBatch.from_pydict({"b": pa.array([b"x"], pa.binary())}),
    pa.RecordBatch.from_pydict({"a": pa.array([[1]], pa.list_(pa.int64()))}),
    pa.RecordBatch.from_arrays([pa.array([1]), pa.array([2])], names=["x", "x"]),  # a repeated name
])
def test_anything_else_is_left_to_orjson(batch: pa.RecordBatch) -> None:
    assert flat_json_envelopes(batch, ENVELOPE) is None


TEXT = st.text(st.characters(codec="utf-8"), max_size=12)
COLUMNS: dict[str, tuple[Any, pa.DataType]] = {
    "text": (TEXT, pa.string()),
    "long": (st.integers(-(2**63), 2**63 - 1), pa.int64()),
    "int": (st.integers(-(2**31), 2**31 - 1), pa.int32()),
    "double": (st.floats(allow_nan=True, allow_infinity=True), pa.float64()),
    "integral double": (st.integers(-(2**60), 2**60).map(float), pa.float64()),
    "float": (st.floats(width=32), pa.float32()),
    "bool": (st.booleans(), pa.bool_()),
}


@st.composite
def batches(draw: st.DrawFn) -> pa.RecordBatch:
    names = draw(st.lists(st.sampled_from(sorted(COLUMNS)), min_size=1, max_size=5, unique=True))
    rows = draw(st.integers(1, 8))
    arrays = [pa.array(draw(st.lists(st.none() | COLUMNS[n][0], min_size=rows, max_size=rows)), COLUMNS[n][1])
              for n in names]
    return pa.RecordBatch.from_arrays(arrays, names=names)


@PROPERTY
@given(batches())
def test_the_same_bytes_as_orjson_or_left_to_it(batch: pa.RecordBatch) -> None:
    made = flat_json_envelopes(batch, ENVELOPE)
    has_control = any(isinstance(v, str) and any(c < " " for c in v) for row in batch.to_pylist() for v in row.values())
    assert (made is None) == has_control
    if made is not None:
        assert parsed(made) == parsed(orjson_path(batch))
