"""The backfill chain on Spark batch queries: three Spark applications joined by two topics, each ending
by itself at its input's end of stream (docs/PIPELINE.md).

* :mod:`~spark_jobs.batch.ingest` (job ``ingest``): a file -> the events topic, keyed by a column;
* :mod:`~spark_jobs.batch.window_aggregate` (job ``window_aggregate``): the events topic -> tumbling
  event-time windows per key -> the windows topic;
* :mod:`~spark_jobs.batch.sink` (job ``sink``): the windows topic -> one file.

``python -m spark_jobs.pipeline windowed-count --input FILE`` runs the three together.
"""
