"""The streaming chain as three ordinary Structured Streaming queries on ``format("controlmsg")``
(docs/STREAMING.md, "The same chain as three Structured Streaming queries").

* :mod:`~spark_jobs.stages.ingest` (job ``stage_ingest``): a plain source topic -> the events topic;
* :mod:`~spark_jobs.stages.window` (job ``stage_window``): the events topic -> windows per key in append
  mode -> the windows topic, and the late records to their own topic;
* :mod:`~spark_jobs.stages.sink` (job ``stage_sink``): the windows topic -> Spark's Parquet file sink;
* :mod:`~spark_jobs.stages.common`: what the three share (options, waiting for the queries, summaries).

Each is started on its own (``python -m spark_jobs.stages.ingest --help``); the pipeline command does not run
this chain.
"""
