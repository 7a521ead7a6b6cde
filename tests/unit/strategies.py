"""Shared hypothesis strategies for the pure core: messages, wire bodies and control streams."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from controlmsg.core.messages import (
    MAX_TIMESTAMP,
    MIN_TIMESTAMP,
    ControlMessage,
    EndOfStreamMessage,
    WatermarkMessage,
)

# ------------------------------------------------------------------ messages

INT64_MAX = 2**63 - 1

# Any Unicode text a JSON writer can produce (hypothesis' text() leaves out lone surrogates).
task_names = st.text(min_size=1, max_size=20)
run_ids = st.text(max_size=20)
# taskCount within the signed 64-bit range, which every client (a JVM one too) can represent.
task_counts = st.one_of(st.integers(1, 8), st.integers(1, INT64_MAX))
timestamps = st.one_of(
    st.integers(-5, 5),
    st.integers(MIN_TIMESTAMP, MAX_TIMESTAMP - 1),
    st.sampled_from([MIN_TIMESTAMP, MIN_TIMESTAMP + 1, MAX_TIMESTAMP - 2, MAX_TIMESTAMP - 1]),
)

generations = st.one_of(st.just(0), st.integers(0, 3), st.integers(0, INT64_MAX))
watermark_messages = st.builds(
    WatermarkMessage, task_name=task_names, task_count=task_counts, timestamp=timestamps, run_id=run_ids,
    idle=st.booleans(), generation=generations,
)
eos_messages = st.builds(EndOfStreamMessage, task_name=task_names, task_count=task_counts, run_id=run_ids,
                         generation=generations)
control_messages: st.SearchStrategy[ControlMessage] = st.one_of(watermark_messages, eos_messages)

# Arbitrary JSON values, to put where a field is expected (fuzzing the field checks).
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=10),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=8,
)


@st.composite
def control_bodies(draw: st.DrawFn) -> dict[str, Any]:
    """A JSON object that resembles a control body: each known field present or not, well or ill typed."""
    body: dict[str, Any] = draw(st.dictionaries(st.text(max_size=8), json_values, max_size=3))
    good: dict[str, st.SearchStrategy[Any]] = {
        "version": st.sampled_from([1, 1, 1, 0, 2]),
        "taskName": task_names,
        "taskCount": task_counts,
        "runId": run_ids,
        "timestamp": timestamps,
    }
    for key, strategy in good.items():
        choice = draw(st.sampled_from(["good", "good", "missing", "other"]))
        if choice == "good":
            body[key] = draw(strategy)
        elif choice == "other":
            body[key] = draw(json_values)
    return body


# ------------------------------------------------------------------ control streams

FOLLOWED_RUN = "run-2"
STALE_RUN = "run-1"


@dataclass(frozen=True)
class ControlStream:
    """A valid stream of control messages as one consumer reads them: ``(partition, message)`` pairs.

    Two runs write the topic; within each run ``taskCount`` is the same in every message and at most
    ``taskCount`` distinct tasks speak, so no message of the followed run is a protocol violation.
    ``tracker_run`` is the run the tracker is told to follow (``None``: adopt the first message's run).
    """

    partitions: tuple[int, ...]
    task_counts: dict[str, int]
    tracker_run: str | None
    records: tuple[tuple[int, ControlMessage], ...]


_small_ts = st.integers(0, 12)
_stream_ts = st.one_of(_small_ts, _small_ts, _small_ts, timestamps)


@st.composite
def control_streams(draw: st.DrawFn, max_steps: int = 40) -> ControlStream:
    """Arbitrary interleavings over 1-4 tasks and 1-4 partitions, with duplicates, regressions (small
    timestamps repeat and go back), end of stream, watermarks after a task's end, and an earlier run's
    messages mixed in. A message goes to one partition or, as the writer sends it, to every partition
    in turn; or a whole control round is written. Often ends with every task's end of stream on every
    partition, in any order."""
    partitions = tuple(sorted(draw(st.sets(st.integers(0, 7), min_size=1, max_size=4))))
    counts = {FOLLOWED_RUN: draw(st.integers(1, 4)), STALE_RUN: draw(st.integers(1, 4))}
    # The stale run's task names overlap the followed run's: the run, not the name, tells them apart.
    names = {run: [f"task-{i}" for i in range(n)] for run, n in counts.items()}
    tracker_run = draw(st.sampled_from([None, FOLLOWED_RUN]))

    def message(run: str, task: str, eos: bool, ts: int, idle: bool = False) -> ControlMessage:
        if eos:
            return EndOfStreamMessage(task, counts[run], run)
        return WatermarkMessage(task, counts[run], ts, run, idle=idle)

    step = st.tuples(
        st.sampled_from([FOLLOWED_RUN, FOLLOWED_RUN, FOLLOWED_RUN, STALE_RUN]),
        st.integers(0, 3),  # task index, taken modulo the run's task count
        st.sampled_from(partitions),
        st.sampled_from([False, False, False, True]),  # end of stream?
        _stream_ts,
        st.sampled_from(["one", "one", "one", "all", "all", "round", "repeat"]),
        st.sampled_from([False, False, True]),  # an idle watermark?
    )
    records: list[tuple[int, ControlMessage]] = []
    for run, i, p, eos, ts, kind, idle in draw(st.lists(step, max_size=max_steps)):
        if kind == "repeat" and records:
            records.append(records[-1])
            continue
        if kind == "round":  # a control round: every task of the run, to every partition
            records.extend((q, message(run, task, eos, ts)) for task in names[run] for q in partitions)
            continue
        msg = message(run, names[run][i % counts[run]], eos, ts, idle)
        if kind == "all":  # as the writer does: one control message to every partition
            records.extend((q, msg) for q in partitions)
        else:
            records.append((p, msg))
    if draw(st.booleans()):
        run = draw(st.sampled_from([FOLLOWED_RUN, FOLLOWED_RUN, STALE_RUN]))
        tail = [(p, message(run, task, True, 0)) for p in partitions for task in names[run]]
        records.extend(draw(st.permutations(tail)))
    return ControlStream(partitions, counts, tracker_run, tuple(records))
