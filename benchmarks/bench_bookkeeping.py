"""What the per-partition bookkeeping costs per control message as the number of upstream tasks grows
(issue 12, item 4): ``InputTracker.on_control`` for 10 to 10,000 tasks, pure Python, no Kafka.

Each run feeds one tracker that owns 4 partitions the control messages of ``tasks`` upstream tasks:
first every task's first watermark on every partition (until the watermark is defined), then rounds in
which each task raises its watermark on every partition (the steady state of a streaming run: each
message may move the minimum), some tasks idle and back, and last every task's end of stream. It prints
the time per message of each phase, and the ratio of each task count's steady-state cost to the cost at
10 tasks: flat means the ratio stays near 1.

    .venv/bin/python benchmarks/bench_bookkeeping.py
    .venv/bin/python benchmarks/bench_bookkeeping.py --tasks 10 100 1000 10000 --rounds 5
"""

from __future__ import annotations

import argparse
import gc
import platform
import random
import time
from collections.abc import Callable

from controlmsg.core.bookkeeping import InputTracker
from controlmsg.core.messages import ControlMessage, EndOfStreamMessage, WatermarkMessage

PARTITIONS = 4


def messages(tasks: int, steady_rounds: int, seed: int) -> tuple[list[tuple[int, ControlMessage]], ...]:
    """(start, steady, end) phases of (partition, message), made before timing."""
    rng = random.Random(seed)
    names = [f"ingest-r-p{i}" for i in range(tasks)]
    marks = [rng.randrange(0, 1000) for _ in range(tasks)]
    start = [(p, WatermarkMessage(names[i], tasks, marks[i], "r")) for i in range(tasks) for p in range(PARTITIONS)]
    steady: list[tuple[int, ControlMessage]] = []
    order = list(range(tasks))
    for _ in range(steady_rounds):
        rng.shuffle(order)
        for i in order:
            marks[i] += rng.randrange(1, 2000)
            idle = rng.random() < 0.01
            for p in range(PARTITIONS):
                steady.append((p, WatermarkMessage(names[i], tasks, marks[i], "r", idle=idle)))
    end = [(p, EndOfStreamMessage(names[i], tasks, "r")) for i in order for p in range(PARTITIONS)]
    return start, steady, end


def timed(tracker: InputTracker, phase: list[tuple[int, ControlMessage]]) -> float:
    """Seconds per message of ``phase`` fed to ``tracker``."""
    on_control: Callable[..., object] = tracker.on_control
    began = time.perf_counter()
    for p, message in phase:
        on_control(p, message)
    return (time.perf_counter() - began) / max(1, len(phase))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--tasks", type=int, nargs="+", default=[10, 100, 1000, 10_000])
    ap.add_argument("--messages", type=int, default=200_000,
                    help="steady-state messages per task count (rounds = this / tasks / partitions, at least 2)")
    ap.add_argument("--rounds", type=int, default=3, help="repeats of each task count; the best is kept")
    args = ap.parse_args()
    print(f"Python {platform.python_version()} on {platform.machine()}, {PARTITIONS} partitions per tracker, "
          f"best of {args.rounds}")
    print(f"{'tasks':>7} | {'first watermarks':>17} | {'steady state':>13} | {'ends':>10} | steady vs 10 tasks")
    base = None
    for tasks in args.tasks:
        rounds = max(2, args.messages // (tasks * PARTITIONS))
        start, steady, end = messages(tasks, rounds, seed=tasks)
        best = [float("inf")] * 3
        for _ in range(args.rounds):
            gc.collect()
            tracker = InputTracker(range(PARTITIONS), run_id="r")
            for k, phase in enumerate((start, steady, end)):
                best[k] = min(best[k], timed(tracker, phase))
            assert tracker.is_ended, "every task ended on every partition: the stream must have ended"
        base = base if base is not None else best[1]
        print(f"{tasks:>7,} | {best[0] * 1e6:>14.2f} us | {best[1] * 1e6:>10.2f} us | {best[2] * 1e6:>7.2f} us | "
              f"{best[1] / base:.2f}x")


if __name__ == "__main__":
    main()
