"""The bookkeeping of a write task that commits as it goes (option ``commitRows``): the digest does not
depend on how the rows are cut into batches, and a resume skips exactly the committed rows, or refuses."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlmsg.errors import ControlMsgError
from controlmsg.spark.writing.chunks import Chunks, digest_of

_rows = st.lists(st.tuples(st.binary(max_size=12), st.one_of(st.none(), st.text(max_size=5))), max_size=40)


def _cut(rows: list[tuple[bytes, str | None]], cuts: list[int]) -> list[list[tuple[bytes, str | None]]]:
    points = sorted({min(c, len(rows)) for c in cuts} | {0, len(rows)})
    return [rows[a:b] for a, b in itertools.pairwise(points)]


@given(_rows, st.lists(st.integers(0, 40), max_size=6))
def test_the_digest_does_not_depend_on_the_batches(rows: list[tuple[bytes, str | None]], cuts: list[int]) -> None:
    whole = digest_of([v for v, _ in rows], [k for _, k in rows])
    digest = (0, 0)
    for part in _cut(rows, cuts):
        digest = digest_of([v for v, _ in part], [k for _, k in part], digest)
    assert digest == whole


@given(_rows, st.integers(0, 40), st.lists(st.integers(0, 40), max_size=6))
def test_a_resume_skips_exactly_the_committed_rows(rows: list[tuple[bytes, str | None]], done: int,
                                                   cuts: list[int]) -> None:
    done = min(done, len(rows))
    prefix = rows[:done]
    marker = {"rows": done, "digest": list(digest_of([v for v, _ in prefix], [k for _, k in prefix]))}
    chunks = Chunks(10, marker)
    kept: list[bytes] = []
    for part in _cut(rows, cuts):
        values, keys = chunks.skip([v for v, _ in part], [k for _, k in part])
        assert keys is not None and len(keys) == len(values)
        kept += values
    chunks.finish_skipping()
    assert kept == [v for v, _ in rows[done:]]
    assert chunks.rows == done


def test_a_resume_over_other_rows_or_too_few_refuses() -> None:
    marker = {"rows": 2, "digest": list(digest_of([b"a", b"b"], ["k", None]))}
    with pytest.raises(ControlMsgError, match="cannot resume exactly once"):
        Chunks(10, marker, "t-p0", "topic").skip([b"b", b"a", b"c"], [None, "k", "k"])
    short = Chunks(10, marker, "t-p0", "topic")
    assert short.skip([b"a"], ["k"]) == ([], [])
    with pytest.raises(ControlMsgError, match="fewer than the 2 committed"):
        short.finish_skipping()

