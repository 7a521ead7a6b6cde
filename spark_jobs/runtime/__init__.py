"""The streaming chain on the long-running-task runtime, :mod:`controlmsg.streaming` (docs/STREAMING.md).

* :mod:`~spark_jobs.runtime.ingest` (job ``stream_ingest``): a raw source topic -> the events topic,
  with a watermark every interval;
* :mod:`~spark_jobs.runtime.window` (job ``stream_window``): the events topic -> tumbling windows, each
  emitted as soon as the reconciled watermark passes its end -> the windows topic;
* :mod:`~spark_jobs.runtime.sink` (job ``stream_sink``, one plain process, no Spark): the windows topic ->
  one file, appended to, exactly once across restarts.

``python -m spark_jobs.pipeline windowed-count --streaming --source-topic TOPIC`` runs the three together.
"""
