"""The streaming chain (two Spark applications, two Kafka hops): window-result latency and records/s.

    python benchmarks/bench_streaming.py [--watermark-interval 200ms] [--window 1s] [--rate 2000]
        [--live-seconds 30] [--prefill-events 300000] [--master local[2]] [--phases latency,throughput]

Runs ``python -m spark_jobs.runtime.ingest`` and ``python -m spark_jobs.runtime.window`` as jobs of this
script (:class:`common.Chain`), each phase on fresh topics, against ``$KAFKA_BOOTSTRAP_SERVERS`` or the
cluster options, else a broker started for the run. Phase A (latency, live): for each window end E, from
the events topic's reconciled watermark reaching E (t0) to E's first result on the windows topic (t1),
both stamped by observer threads of this process (:class:`common.Observer`); the goal is t1 - t0 < 1 s +
one watermark interval. Phase B (throughput, bounded): a prefilled backlog through the chain with
``--until-source-end``, records/s from the first committed event record to the windows topic's end of
stream. What each figure means and how it is taken: benchmarks/README.md, "The streaming chain: window
latency and rate".
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from common import (
    Chain,
    LiveRun,
    Observer,
    add_chain_options,
    kafka_cluster,
    load_average,
    percentile,
    prefill,
    run_live,
)

from controlmsg.core.durations import parse_duration

# ---------------------------------------------------------------------------------------------- phase A


@dataclass
class LatencyResult:
    latencies: list[float]
    complete: list[float]
    own: list[float]
    skew: list[float]
    missing: int
    warmup_left_out: int
    generated: int
    gen_seconds: float
    drain_s: float | None
    wm_catch_up_s: float | None
    lag_early_s: float | None
    lag_late_s: float | None
    wm_step_events_s: float | None
    wm_step_windows_s: float | None
    observer_full_polls: int
    observer_polls: int
    observer_cpu_s: float
    first_half_median: float | None
    second_half_median: float | None
    ready_s: float


def phase_latency(chain: Chain) -> LatencyResult:
    a = chain.args
    drained: list[float] = []  # the last generated event on the events topic, after the generator's exit

    def settle(run: LiveRun) -> Callable[[], bool]:
        """Done once every generated event is on the events topic, every window with a t0 has its result,
        and the windows topic's watermark has caught up with the events topic's."""
        events_obs, windows_obs = run.events, run.windows

        def settled() -> bool:
            if not drained and events_obs.data >= run.records and events_obs.last_data is not None:
                drained.append(events_obs.last_data - run.gen_ended)
            with events_obs.lock, windows_obs.lock:
                closed = [e for e in _window_ends(events_obs, windows_obs, a) if events_obs.reached(e) is not None]
                return (bool(drained) and all(e in windows_obs.result_seen for e in closed)
                        and bool(windows_obs.wm_ts) and bool(events_obs.wm_ts)
                        and windows_obs.wm_ts[-1] >= events_obs.wm_ts[-1])
        return settled

    run = run_live(chain, settle, groups=True, linger_s=1.0)
    events_obs, windows_obs = run.events, run.windows
    generated, gen_started, gen_ended, clock0_ms = run.records, run.gen_started, run.gen_ended, run.clock0_ms
    drain_s = drained[0] if drained else None

    # t0 per window end: the events watermark reaching it; t1: its first result on the windows topic.
    warmup_until = gen_started + a.warmup
    latencies: list[float] = []
    complete: list[float] = []  # windows topic's watermark >= E (every task's results for E visible) - t0
    own: list[float] = []  # first result - the earliest partition group's watermark reaching E
    skew: list[float] = []  # t0 - that: how much later the slowest partition group got there
    missing = left_out = 0
    for end in _window_ends(events_obs, windows_obs, a):
        t0 = events_obs.reached(end)
        if t0 is None:
            continue
        if t0 < warmup_until:
            left_out += 1
            continue
        t1 = windows_obs.result_seen.get(end)
        if t1 is None:
            missing += 1
            continue
        latencies.append(t1 - t0)
        t_all = windows_obs.reached(end)
        if t_all is not None:
            complete.append(t_all - t0)
        groups = [t for t in events_obs.group_reached(end) if t is not None]
        if groups:
            own.append(t1 - min(groups))
            skew.append(t0 - min(groups))
    final_wm = events_obs.wm_ts[-1] if events_obs.wm_ts else None
    caught = windows_obs.reached(final_wm) if final_wm is not None else None
    half = len(latencies) // 2

    def lag(t_from: float, t_to: float) -> float | None:
        """Median wall-clock seconds the windows topic's watermark trails the generator's event clock."""
        lags = [(clock0_ms + (t - gen_started) * 1000 * a.speedup - ts) / (1000 * a.speedup)
                for t, ts in zip(windows_obs.wm_at, windows_obs.wm_ts, strict=True) if t_from <= t <= t_to]
        return statistics.median(lags) if lags else None
    return LatencyResult(
        latencies=latencies, complete=complete, own=own, skew=skew, missing=missing, warmup_left_out=left_out,
        generated=generated,
        gen_seconds=gen_ended - gen_started, drain_s=drain_s,
        wm_catch_up_s=None if caught is None else caught - gen_ended,
        wm_step_events_s=_median_step(events_obs.wm_at, warmup_until, gen_ended),
        wm_step_windows_s=_median_step(windows_obs.wm_at, warmup_until, gen_ended),
        lag_early_s=lag(warmup_until, warmup_until + a.lag_span),
        lag_late_s=lag(gen_ended - a.lag_span, gen_ended),
        observer_full_polls=events_obs.full_polls, observer_polls=events_obs.polls, observer_cpu_s=events_obs.cpu_s,
        first_half_median=statistics.median(latencies[:half]) if half else None,
        second_half_median=statistics.median(latencies[half:]) if half else None,
        ready_s=run.ready_s,
    )


def _median_step(moments: list[float], t_from: float, t_to: float) -> float | None:
    """The median time between successive moments inside [t_from, t_to]."""
    inside = [t for t in moments if t_from <= t <= t_to]
    steps = [b - a for a, b in itertools.pairwise(inside)]
    return statistics.median(steps) if steps else None


def _window_ends(events_obs: Observer, windows_obs: Observer, a: argparse.Namespace) -> list[int]:
    """Every window end the events watermark or the results have passed, in order."""
    size = parse_duration(a.window)
    ends = set(windows_obs.result_seen)
    if events_obs.wm_ts:
        lo = min(ends) if ends else events_obs.wm_ts[0] - events_obs.wm_ts[0] % size
        hi = events_obs.wm_ts[-1]
        ends.update(range(lo - lo % size + size, hi - hi % size + 1, size))
    return sorted(ends)


# ---------------------------------------------------------------------------------------------- phase B


@dataclass
class ThroughputResult:
    events: int
    prefill_s: float
    launch_to_end_s: float
    driver_to_end_s: float
    first_record_to_end_s: float
    ingest_s: float
    eos_propagation_s: float
    window_rows: int
    counted: int
    late: int | None
    observer_cpu_s: float
    observer_full_polls: int
    observer_polls: int
    process_cpu_measured_s: float | None


def phase_throughput(chain: Chain) -> ThroughputResult:
    a = chain.args
    t = time.monotonic()
    prefill(chain)
    prefill_s = time.monotonic() - t
    events_obs, windows_obs = chain.start_observers()
    try:
        launched = time.monotonic()
        ingest_app = chain.start_bounded()
        ingest_driver = ingest_app.wait_for_log("over source partitions", a.startup_timeout, poll_s=0.05)
        deadline = time.monotonic() + a.startup_timeout + a.throughput_timeout
        cpu_at_first: float | None = None  # this process's CPU time when the first event record showed up
        while windows_obs.ended_at is None:
            if cpu_at_first is None and events_obs.first_data is not None:
                cpu_at_first = time.process_time()
            if time.monotonic() > deadline:
                raise RuntimeError("the chain did not reach end of stream on the windows topic in time")
            chain.check_apps(ended_ok=True)
            if windows_obs.error is not None or events_obs.error is not None:
                break
            time.sleep(0.05)
        cpu_measured = None if cpu_at_first is None else time.process_time() - cpu_at_first
        chain.wait_apps(60)
    finally:
        chain.stop(events_obs, windows_obs)
    assert events_obs.first_data is not None and events_obs.ended_at is not None
    assert windows_obs.ended_at is not None
    window_summary = chain.summary("stream_window")
    late = None if window_summary is None else sum(int(t["late"]) for t in window_summary["tasks"])
    return ThroughputResult(
        events=events_obs.data, prefill_s=prefill_s, launch_to_end_s=windows_obs.ended_at - launched,
        driver_to_end_s=windows_obs.ended_at - ingest_driver,
        first_record_to_end_s=windows_obs.ended_at - events_obs.first_data,
        ingest_s=events_obs.ended_at - events_obs.first_data,
        eos_propagation_s=windows_obs.ended_at - events_obs.ended_at,
        window_rows=windows_obs.result_records, counted=windows_obs.counted, late=late,
        observer_cpu_s=events_obs.cpu_s + windows_obs.cpu_s, observer_full_polls=events_obs.full_polls,
        observer_polls=events_obs.polls, process_cpu_measured_s=cpu_measured,
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--phases", default="latency,throughput", help="which phases to run, comma-separated")
    p.add_argument("--watermark-interval", default="200ms",
                   help="ingest's watermark and commit interval, and stream_window's commit interval")
    p.add_argument("--window", default="1s", help="tumbling window length")
    p.add_argument("--rate", type=float, default=2000.0, help="live generator rate, events/s (phase A); "
                   "phase B spaces its event time the same way")
    p.add_argument("--speedup", type=float, default=1.0, help="event time per wall-clock second (phase A)")
    p.add_argument("--live-seconds", type=float, default=30.0, help="how long the generator writes (phase A)")
    p.add_argument("--warmup", type=float, default=5.0, help="seconds of generation left out of the latency")
    p.add_argument("--lag-span", type=float, default=3.0,
                   help="seconds over which the watermark lag is taken, after the warm-up and before the end")
    p.add_argument("--grace", type=float, default=10.0,
                   help="after the generator stops, wait at most this long for the last results (phase A)")
    add_chain_options(p)
    p.add_argument("--startup-timeout", type=float, default=180.0, help="seconds for an application to start")
    p.add_argument("--throughput-timeout", type=float, default=600.0, help="seconds for phase B's chain to end")
    args = p.parse_args(argv)
    phases = [x.strip() for x in args.phases.split(",") if x.strip()]
    if not phases or any(x not in ("latency", "throughput") for x in phases):
        p.error("--phases takes latency and/or throughput")
    for text in (args.watermark_interval, args.window, args.disorder, args.allowed_lateness):
        parse_duration(text)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    interval_s = parse_duration(args.watermark_interval) / 1000
    goal_s = 1.0 + interval_s

    work = Path(tempfile.mkdtemp(prefix="controlmsg-bench-streaming-"))
    with kafka_cluster(args) as cluster:
        print(f"bench_streaming: {os.cpu_count()} cores (load {load_average()}), broker {cluster.servers}, "
              f"master {args.master}, {args.partitions} partitions, {args.tasks} tasks per application; logs in {work}")
        print(f"windows {args.window}, watermark/commit interval {args.watermark_interval}, disorder "
              f"{args.disorder}, allowed lateness {args.allowed_lateness}, {args.keys} keys", flush=True)
        chains: list[Chain] = []
        lat: LatencyResult | None = None
        thr: ThroughputResult | None = None
        try:
            if "latency" in phases:
                chain = Chain(args, cluster, work, "lat")
                chains.append(chain)
                print(f"\nphase A, latency (run {chain.run_id}): live generator {args.rate:,.0f} ev/s, "
                      f"event time x{args.speedup:g}", flush=True)
                lat = phase_latency(chain)
                print_latency(lat, args, interval_s, goal_s)
            if "throughput" in phases:
                chain = Chain(args, cluster, work, "thr")
                chains.append(chain)
                print(f"\nphase B, throughput (run {chain.run_id}): {args.prefill_events:,} events prefilled, "
                      "chain with --until-source-end", flush=True)
                thr = phase_throughput(chain)
                print_throughput(thr)
        finally:
            for chain in chains:
                chain.stop_apps()
                if not args.keep_topics:
                    chain.delete_topics()
        print_summary(lat, thr, args, goal_s)
    return 0


def print_latency(r: LatencyResult, a: argparse.Namespace, interval_s: float, goal_s: float) -> None:
    print(f"  generator wrote {r.generated:,} events in its {a.live_seconds:g} s ({r.generated / a.live_seconds:,.0f} "
          f"ev/s; the process ran {r.gen_seconds:.1f} s with start-up and exit)")
    def fmt(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.2f} s"

    print(f"  windows-topic watermark behind the generator's event clock (wall-clock s; includes the allowed "
          f"lateness): {fmt(r.lag_early_s)} in the {a.lag_span:g} s after the warm-up, {fmt(r.lag_late_s)} in the "
          f"last {a.lag_span:g} s of generation")
    print(f"  watermark advanced every {fmt(r.wm_step_events_s)} on the events topic, every "
          f"{fmt(r.wm_step_windows_s)} on the windows topic (median; interval {a.watermark_interval})")
    drain = "not within the grace period" if r.drain_s is None else f"{r.drain_s:+.2f} s"
    catch = "never" if r.wm_catch_up_s is None else f"{r.wm_catch_up_s:+.2f} s"
    print(f"  relative to the generator's exit (it exits ~0.1-0.5 s after its last write: flush, end offsets): "
          f"last event on the events topic {drain}, windows watermark caught up with the events topic's {catch}")
    behind = "never behind" if not r.observer_full_polls else "it WAS BEHIND: t0 may be late, latency low"
    print(f"  events observer: {r.observer_full_polls} of {r.observer_polls:,} polls came back full "
          f"(batch {a.observer_batch:,}: {behind}), {r.observer_cpu_s:.2f} s CPU")
    print(f"  windows measured: {len(r.latencies)} ({r.warmup_left_out} closed in the {a.warmup:g} s warm-up "
          f"left out, {r.missing} with no result)")
    if r.latencies:
        lat = r.latencies
        print(f"  latency t1 - t0: median {statistics.median(lat):.3f} s, p90 {percentile(lat, 0.9):.3f} s, "
              f"min {min(lat):.3f} s, max {max(lat):.3f} s (interval {interval_s:.3f} s, goal < {goal_s:.3f} s)")
        for label, values in (
                ("windows-topic watermark >= E (every task's results for E committed) - t0", r.complete),
                ("first result - the earliest partition group's watermark >= E", r.own),
                ("t0 - that (slowest partition group behind the fastest)", r.skew)):
            if values:
                print(f"  {label}: median {statistics.median(values):.3f} s, p90 {percentile(values, 0.9):.3f} s, "
                      f"max {max(values):.3f} s")
        if r.first_half_median is not None and r.second_half_median is not None:
            print(f"  median latency, first half / second half of the windows: {r.first_half_median:.3f} s / "
                  f"{r.second_half_median:.3f} s")


def _rate(events: int, seconds: float) -> str:
    """``events / seconds`` as records/s, or ``-`` for a span too short to time (a tiny run)."""
    return f"{events / seconds:,.0f} rec/s" if seconds > 0 else "- rec/s: under the clock's resolution"


def print_throughput(r: ThroughputResult) -> None:
    print(f"  events through the chain: {r.events:,}; window results: {r.window_rows:,}")
    print(f"  first committed event record -> windows end of stream: {r.first_record_to_end_s:.1f} s "
          f"({_rate(r.events, r.first_record_to_end_s)})")
    print(f"  stream_ingest's driver launching its tasks -> windows end of stream (task start-up included): "
          f"{r.driver_to_end_s:.1f} s ({_rate(r.events, r.driver_to_end_s)})")
    print(f"  stream_window launched -> windows end of stream (JVM start-ups included): {r.launch_to_end_s:.1f} s "
          f"({_rate(r.events, r.launch_to_end_s)})")
    print(f"  ingest hop alone, first record -> events end of stream: {r.ingest_s:.1f} s "
          f"({_rate(r.events, r.ingest_s)}); end of stream events -> windows topic: {r.eos_propagation_s:.2f} s")
    late = "?" if r.late is None else f"{r.late:,}"
    check = "ok" if r.late is not None and r.counted + r.late == r.events else "MISMATCH"
    print(f"  check: counts in the window results {r.counted:,} + late {late} = {r.events:,}: {check}")
    cores = os.cpu_count() or 1
    if r.process_cpu_measured_s is not None and r.first_record_to_end_s > 0:
        share = r.process_cpu_measured_s / (r.first_record_to_end_s * cores)
        print(f"  this process (the observers) used {r.process_cpu_measured_s:.2f} s CPU over the "
              f"{r.first_record_to_end_s:.1f} s measured: {share:.0%} of the {cores} cores, taken from the chain")
    behind = ("never behind" if not r.observer_full_polls else
              "it was behind at times: the events topic's end-of-stream moment may be late, so the ingest hop's "
              "rate may be low and the EOS propagation short; the chain figure is not affected")
    print(f"  events observer: {r.observer_full_polls} of {r.observer_polls:,} polls came back full ({behind}); "
          f"observers' CPU over the whole phase {r.observer_cpu_s:.2f} s")


def print_summary(lat: LatencyResult | None, thr: ThroughputResult | None, a: argparse.Namespace,
                  goal_s: float) -> None:
    print()
    print(f"{'measure':<58} value")
    print(f"{'watermark interval (ingest) = commit interval (window)':<58} {a.watermark_interval}")
    if lat is not None:
        n = len(lat.latencies)
        print(f"{'live generator rate (achieved)':<58} {lat.generated / a.live_seconds:,.0f} ev/s "
              f"({lat.generated:,} events)")
        print(f"{'windows measured (after warm-up)':<58} {n}" + (f" ({lat.missing} missing)" if lat.missing else ""))
        verdicts = []
        for label, values in (("window-result latency, events wm >= E -> first result", lat.latencies),
                              ("  all results of E: -> windows-topic wm >= E", lat.complete)):
            if not values:
                continue
            p90 = percentile(values, 0.9)
            print(f"{label:<58} median {statistics.median(values):.3f} s  p90 {p90:.3f} s  max {max(values):.3f} s")
            over = sum(1 for x in values if x >= goal_s)
            verdicts.append("met" if over == 0 and not lat.missing else (
                f"met on the p90, missed by {over} of {len(values)} windows" if p90 < goal_s else
                f"missed ({over} of {len(values)} windows at or above)"))
        if lat.skew:
            print(f"{'  partition groups: slowest behind fastest reaching E':<58} median "
                  f"{statistics.median(lat.skew):.3f} s  max {max(lat.skew):.3f} s")
        if verdicts:
            print(f"{f'goal: latency < 1 s + one interval = {goal_s:.3f} s':<58} first result: {verdicts[0]}"
                  + (f"; all results: {verdicts[1]}" if len(verdicts) > 1 else ""))
    if thr is not None:
        print(f"{'chain records/s, first event record -> windows EOS':<58} "
              f"{thr.events / thr.first_record_to_end_s:,.0f} rec/s "
              f"({thr.events:,} in {thr.first_record_to_end_s:.1f} s)")
        print(f"{'  same, from stream_ingest launching its tasks':<58} "
              f"{thr.events / thr.driver_to_end_s:,.0f} rec/s ({thr.driver_to_end_s:.1f} s)")
        print(f"{'  same, from stream_window process launch (JVMs incl.)':<58} "
              f"{thr.events / thr.launch_to_end_s:,.0f} rec/s ({thr.launch_to_end_s:.1f} s)")
        print(f"{'ingest hop records/s, first record -> events EOS':<58} {thr.events / thr.ingest_s:,.0f} rec/s")
        print(f"{'end of stream, events topic -> windows topic':<58} {thr.eos_propagation_s:.2f} s")
        print(f"{'ratio live rate / sustained chain rate (headroom)':<58} "
              f"{a.rate / (thr.events / thr.first_record_to_end_s):.3f}")


if __name__ == "__main__":
    sys.exit(main())
