"""A write task's record values made column by column in Arrow, for flat rows of strings, numbers and booleans.

The default payload of a ``format("controlmsg")`` write is each row as a JSON object, made by orjson from a
Python dict per row (:func:`controlmsg.core.codec.encode_json_rows`). For a batch whose every column is a
string, an integer, a floating-point number or a boolean, :func:`flat_json_envelopes` makes the same
envelopes with Arrow's compute kernels instead: each column becomes its JSON text at once, the texts are
joined row by row, and only the finished values become Python objects. No dict or value object per cell.

**The same JSON as orjson, value for value.** Parsed, each value equals the orjson path's (the bytes
equal too, but for some integral doubles that Arrow writes with an exponent, ``1e+10``, and orjson in
full, ``10000000000.0``). Strings: ``\\`` and ``"``
escaped, UTF-8 as it is (as orjson); a batch with a control character (U+0000-U+001F) in a string column
is left to orjson. Doubles: shortest round-trip digits, a ``.0`` where Arrow writes an integral value as an
integer (``100`` -> ``100.0``, ``-0`` -> ``-0.0``, so a reader still sees a double), NaN and infinities as
``null`` (orjson's rule). ``float32`` is widened to ``float64`` first, as ``to_pylist`` does. Nulls are
``null``; every column is kept, in order. Any other type, or a repeated column name, returns ``None``:
the caller uses the orjson path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["flat_json_envelopes"]

_CONTROL_CHARACTER = "[\\x00-\\x1f]"


def flat_json_envelopes(batch: pa.RecordBatch, prefix: bytes) -> list[bytes] | None:
    """Each row of ``batch`` as ``prefix`` + its JSON object (see the module docstring), or ``None`` when
    the batch has a column this path does not make (the caller then encodes the rows with orjson)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    names = batch.schema.names
    if not names or len(set(names)) != len(names):
        return None
    pieces: list[pa.Array | bytes] = [prefix]
    for position, (name, column) in enumerate(zip(names, batch.columns, strict=True)):
        dtype = column.type
        if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
            if column.null_count < len(column) and pc.any(pc.match_substring_regex(column, _CONTROL_CHARACTER)).as_py():
                return None
            strings = column.cast(pa.string()) if pa.types.is_large_string(dtype) else column
            text = pc.replace_substring(pc.replace_substring(strings, "\\", "\\\\"), '"', '\\"')
            text = pc.binary_join_element_wise('"', text, '"', "")
        elif pa.types.is_integer(dtype) or pa.types.is_boolean(dtype):
            text = column.cast(pa.string())
        elif pa.types.is_floating(dtype):
            doubles = column.cast(pa.float64()) if not pa.types.is_float64(dtype) else column
            text = doubles.cast(pa.string())
            integral = pc.equal(pc.floor(doubles), doubles)  # the only values Arrow may write as integers
            if pc.any(integral).as_py():
                bare = pc.and_(integral, pc.invert(pc.match_substring(text, "e")))
                text = pc.if_else(bare, pc.binary_join_element_wise(text, ".0", ""), text)
            text = pc.if_else(pc.is_finite(doubles), text, pa.scalar(None, pa.string()))
        else:
            return None
        pieces += [(b"{" if position == 0 else b",") + orjson.dumps(name) + b":",
                   pc.fill_null(text, "null").cast(pa.binary())]
    joined = pc.binary_join_element_wise(*pieces, b"}", b"")
    values: list[bytes] = joined.to_pylist()
    return values
