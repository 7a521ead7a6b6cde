"""Tools for tests, demos and benchmarks: a local Kafka broker from Maven Central jars
(:mod:`controlmsg.testing.broker`; the jars are fetched through pyspark's Ivy or Maven and verified against
a lock by :mod:`controlmsg.testing.kafka_jars`), a Spark standalone cluster from the pyspark installation
(:mod:`controlmsg.testing.standalone`) and a Spark Connect server from it (:mod:`controlmsg.testing.connect`).
Not used on production paths.

Nothing is imported here: each tool is its own module, imported when it is needed.
"""

__all__: list[str] = []
