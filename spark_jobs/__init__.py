"""The example applications of controlmsg: each its own Spark application (or process), each using the
library's public API (``format("controlmsg")`` from :mod:`controlmsg.spark`, the Kafka layer) like any
user's job would.

Backfill: :mod:`~spark_jobs.ingest` (file -> topic), :mod:`~spark_jobs.window_aggregate` (topic -> windows
-> topic), :mod:`~spark_jobs.sink` (topic -> file), chained by :mod:`~spark_jobs.pipeline`. Streaming:
:mod:`~spark_jobs.stream_ingest`, :mod:`~spark_jobs.stream_window`, :mod:`~spark_jobs.stream_sink`, fed by
:mod:`~spark_jobs.generate`. Shared by them: :mod:`~spark_jobs.common` (the CLIs' options) and
:mod:`~spark_jobs.events` (files, event time, the plain-Spark oracle). Importing this package imports
nothing else.
"""
