"""Tools for tests, demos and benchmarks: a local Kafka broker from Maven Central jars
(:mod:`controlmsg.testing.broker`) and a Spark standalone cluster from the pyspark installation
(:mod:`controlmsg.testing.standalone`). Not used on production paths.

Nothing is imported here: each tool is its own module, imported when it is needed.
"""

__all__: list[str] = []
