"""The PySpark side of controlmsg (layer 3).

* :func:`write_intermediate` (:mod:`spark_jobs.upstream`): a DataFrame to an intermediate topic, each
  Spark write task one upstream task; retried tasks leave neither duplicates nor early ends.
* the ``controlmsg`` data source and :func:`read_intermediate` (:mod:`spark_jobs.downstream`): an
  intermediate topic to a DataFrame, each Spark task reading its partitions to end of stream.
* :func:`spark_session` (:mod:`spark_jobs.session`): a session whose workers run this interpreter.
"""

from spark_jobs.downstream import RAW_SCHEMA, ControlMsgDataSource, EndOfStreamTimeout, read_intermediate
from spark_jobs.session import register_data_source, spark_session
from spark_jobs.upstream import TaskWriteStats, WriteResult, task_name, transactional_id, write_intermediate

__all__ = [
    "RAW_SCHEMA",
    "ControlMsgDataSource",
    "EndOfStreamTimeout",
    "TaskWriteStats",
    "WriteResult",
    "read_intermediate",
    "register_data_source",
    "spark_session",
    "task_name",
    "transactional_id",
    "write_intermediate",
]
