"""``controlmsg cleanup``: what a run left behind listed, and with ``--delete`` deleted unless the run is live (or
has not ended and ``--force`` was not given)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from controlmsg.cli.common import EXIT_ERROR, EXIT_OK, EXIT_REFUSED, _bootstrap


def _cmd_cleanup(args: argparse.Namespace) -> int:
    from controlmsg.kafka.cleanup import describe_run, find_run, live_signs, unended

    conf = _bootstrap(args)
    run = args.run_id
    try:
        found = find_run(conf, run, runs_dir=Path(args.runs_dir), timeout=args.timeout)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    if found.empty:
        print(f"run {run}: nothing found (no topic named after it, no consumer group of its writers, no "
              f"{Path(args.runs_dir) / run})", file=sys.stderr)
        return EXIT_OK
    for line in describe_run(found):
        print(line)
    live = live_signs(conf, found, timeout=args.timeout)
    # A live run's topics are still being written: whether it has ended says nothing yet.
    open_ends = [] if live or (args.delete and args.force) else unended(conf, found, timeout=args.timeout)
    counts = (f"{len(found.topics)} topic(s), {len(found.groups)} consumer group(s), "
              f"{len(found.files)} local path(s)")
    if not args.delete:
        for sign in live:
            print(f"live: {sign}")
        for problem in open_ends:
            print(f"not ended: {problem}")
        verdict = ("live: --delete would be refused" if live else
                   "not live, not ended (stopped or failed): --delete --force deletes it" if open_ends else
                   "not live, ended: --delete deletes it")
        print(f"run {run}: {counts}; {verdict}; nothing deleted", file=sys.stderr)
        return EXIT_OK
    if live:
        more = f" (and {len(live) - 1} more: run without --delete to list them)" if len(live) > 1 else ""
        print(f"refused: run {run} is live, nothing deleted: {live[0]}{more}", file=sys.stderr)
        return EXIT_REFUSED
    if open_ends:
        print(f"refused: run {run} has not ended, nothing deleted: {'; '.join(open_ends)} (stopped or failed: its "
              f"jobs started again with --run-id {run} resume it; --force deletes it anyway)", file=sys.stderr)
        return EXIT_REFUSED
    from controlmsg.kafka.cleanup import delete_run

    delete_run(conf, found, timeout=args.timeout)
    print(f"run {run}: deleted {counts} (its writers' transactional ids, named like their marker groups, "
          "cannot be deleted: the brokers expire them after transactional.id.expiration.ms)", file=sys.stderr)
    return EXIT_OK
