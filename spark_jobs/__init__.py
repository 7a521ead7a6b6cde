"""The example applications of controlmsg: each its own Spark application (or process), each using the
library's public API (``format("controlmsg")`` from :mod:`controlmsg.spark`, the Kafka layer) like any
user's job would.

One subpackage per chain, named after the engine it runs on; each job is ``python -m`` its module:

* :mod:`spark_jobs.batch`: the backfill on Spark batch queries, ``ingest`` (file -> topic),
  ``window_aggregate`` (topic -> windows -> topic), ``sink`` (topic -> file);
* :mod:`spark_jobs.runtime`: the long-running chain on :mod:`controlmsg.streaming`, ``ingest`` (source
  topic -> topic), ``window`` (topic -> windows as the watermark passes them -> topic), ``sink`` (topic ->
  file, one plain process);
* :mod:`spark_jobs.stages`: the same chain as Structured Streaming queries, ``ingest``, ``window``,
  ``sink`` and what they share (``common``).

At the top, what the chains share and the two commands: :mod:`~spark_jobs.common` (the CLIs' options, how
a job starts and fails), :mod:`~spark_jobs.checks` (argument checks before Spark starts),
:mod:`~spark_jobs.events` (files, event time, rejects, the plain-Spark oracle), :mod:`~spark_jobs.pipeline`
(``python -m spark_jobs.pipeline windowed-count``: runs the batch or the runtime chain, with each job's command
line from :mod:`~spark_jobs.job_commands` and the jobs run by :mod:`~spark_jobs.pipeline_run`) and
:mod:`~spark_jobs.generate` (``python -m spark_jobs.generate``: the raw events a streaming chain reads).

A job keeps its name wherever its module lives: ``ingest``, ``window_aggregate``, ``sink``,
``stream_ingest``, ``stream_window``, ``stream_sink``, ``stage_ingest``, ``stage_window``, ``stage_sink``.
That name is in its log lines, its summary, its log file and its Kafka transactional ids (so a run
resumes across versions). Importing this package, or a chain's, imports nothing else.
"""

__all__ = ["description"]


def description(doc: str | None) -> str:
    """A job's ``--help`` description: the first paragraph of its module's docstring ``doc``, whole, its
    lines joined (argparse wraps it again). The first line alone cut some in mid-sentence."""
    first = (doc or "").strip().split("\n\n", 1)[0]
    return " ".join(first.split())
