"""Local clusters, a feature of their own: what ``controlmsg broker ...`` and the tests start on one machine.

* :mod:`controlmsg.clusters.broker`: a Kafka broker (one node, secured, or three KRaft nodes with
  :mod:`controlmsg.clusters.kraft_cluster`) from Apache Kafka's Maven Central jars, fetched through pyspark's
  Ivy (or Maven) and verified against a lock by :mod:`controlmsg.clusters.kafka_jars`; what a KRaft node of
  either runs is :mod:`controlmsg.clusters.kraft`;
* :mod:`controlmsg.clusters.standalone`: a Spark standalone cluster (one or more workers) from the pyspark
  installation;
* :mod:`controlmsg.clusters.hdfs`: a NameNode and a DataNode from Hadoop's minicluster jar;
* :mod:`controlmsg.clusters.s3`: an S3 endpoint (moto's server) and Spark's ``s3a`` settings for it;
* :mod:`controlmsg.clusters.maven_jars`: the pinned jar sets they run from, fetched and verified (the set and its
  lock: :mod:`controlmsg.clusters.jar_sets`; the resolvers: :mod:`controlmsg.clusters.jar_resolvers`);
* :mod:`controlmsg.clusters.connect`: a Spark Connect server from it;
* :mod:`controlmsg.clusters.images`: the images of ``docker-compose.yml`` (Kafka, Spark), built on this
  machine from a Debian base and rebuilt only when their inputs change.

The starters share one shape, :mod:`controlmsg.clusters.starter`: start, status, stop, and a ``main`` that
``controlmsg local PART`` runs; the processes they start are detached and stopped as process groups
(:mod:`controlmsg.clusters.processes`).

These start real processes for development, demos, benchmarks and tests; a production deployment brings its
own cluster and points ``kafka.bootstrap.servers`` (or ``KAFKA_BOOTSTRAP_SERVERS``) at it.

Nothing is imported here: each starter is its own module, imported when it is needed.
"""

__all__: list[str] = []
