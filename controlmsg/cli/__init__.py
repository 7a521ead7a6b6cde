"""The ``controlmsg`` command: a local broker; writing, reading, inspecting and cleaning up after runs.

Exit codes: 0 success (for ``consume``: end of stream, or with ``-e``/``-c`` the end of the partitions/the count; for
``inspect --watch``: interrupted), 1 usage or environment error, 2 protocol error
(stderr names topic, partition, offset and reason), 3 ``consume --timeout`` passed before end of
stream, 4 ``cleanup --delete`` refused (the run is live, or has not ended and ``--force`` was not given;
nothing was deleted), 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import Final, NoReturn

from controlmsg.cli.common import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, EXIT_PROTOCOL, EXIT_REFUSED, EXIT_TIMEOUT
from controlmsg.cli.common import _bootstrap as _bootstrap
from controlmsg.cli.parser import (
    _add_broker_parser,
    _add_cleanup_parser,
    _add_consume_parser,
    _add_create_topic_parser,
    _add_demo_parser,
    _add_inspect_parser,
    _add_metadata_parser,
    _add_produce_parser,
    _version,
)
from controlmsg.errors import ControlMsgError, ProtocolError

# This module: the parser put together, the command line run (main, run) and the `local` sub-command, which runs
# the command line again and so lives beside main. Each sub-command's options are in .parser, its code in the
# module of its subject (.broker, .writing, .consume, .inspecting, .cleanup), what they share in .common.

__all__ = ["EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_PROTOCOL", "EXIT_REFUSED", "EXIT_TIMEOUT", "build_parser",
           "main", "run"]


_LOCAL_PARTS: Final = {"kafka": "", "hdfs": "controlmsg.clusters.hdfs", "s3": "controlmsg.clusters.s3",
                       "spark": "controlmsg.clusters.standalone", "connect": "controlmsg.clusters.connect"}
"""``controlmsg local PART``: the module whose ``main`` takes the rest of the command line (kafka: ``broker``)."""


def _cmd_local(args: argparse.Namespace) -> int:
    """One verb family for every local cluster: the part's own command line, with its own help."""
    if args.part == "kafka":
        return main(["broker", *args.rest])
    module = importlib.import_module(_LOCAL_PARTS[args.part])
    code: int = module.main(list(args.rest))
    return code


def build_parser() -> argparse.ArgumentParser:
    """The ``controlmsg`` command line: a sub-command each, whose ``func`` takes the parsed arguments."""
    parser = argparse.ArgumentParser(prog="controlmsg", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True)
    _add_broker_parser(sub)
    _add_local_parser(sub)
    _add_create_topic_parser(sub)
    _add_produce_parser(sub)
    _add_consume_parser(sub)
    _add_inspect_parser(sub)
    _add_metadata_parser(sub)
    _add_cleanup_parser(sub)
    _add_demo_parser(sub)
    return parser


def _add_local_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    local = sub.add_parser(
        "local", help="the local clusters: kafka (as `broker`), hdfs, s3, spark (standalone), connect",
        description="Start, stop or ask after a local cluster: `controlmsg local PART ACTION [OPTIONS]`, "
                    "PART one of kafka (the options of `controlmsg broker`), hdfs, s3, spark (a standalone "
                    "master and workers) and connect (a Spark Connect server); `controlmsg local PART --help` "
                    "lists each part's actions and options.")
    local.add_argument("part", choices=sorted(_LOCAL_PARTS))
    local.add_argument("rest", nargs=argparse.REMAINDER, help="ACTION [OPTIONS] of the part")
    local.set_defaults(func=_cmd_local)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except ProtocolError as exc:
        print(f"protocol error: {exc}", file=sys.stderr)
        return EXIT_PROTOCOL
    except ControlMsgError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return code


def run() -> NoReturn:
    """The ``controlmsg`` command as a process: :func:`main`, then the exit with its code once the output is
    flushed, without the interpreter's teardown. A librdkafka client that a refused connection left to the
    garbage collector can crash that teardown (seen: SIGSEGV after the refusal's line was printed, in one of
    several runs), which would turn exit code 1 into -11; nothing is left to do by then."""
    code = main()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)
