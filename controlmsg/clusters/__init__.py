"""Local clusters, a feature of their own: what ``controlmsg broker ...`` and the tests start on one machine.

* :mod:`controlmsg.clusters.broker`: a Kafka broker (one node, secured, or three KRaft nodes) from Apache
  Kafka's Maven Central jars, fetched through pyspark's Ivy (or Maven) and verified against a lock by
  :mod:`controlmsg.clusters.kafka_jars`;
* :mod:`controlmsg.clusters.standalone`: a Spark standalone cluster (one or more workers) from the pyspark
  installation;
* :mod:`controlmsg.clusters.hdfs`: a NameNode and a DataNode from Hadoop's minicluster jar;
* :mod:`controlmsg.clusters.s3`: an S3 endpoint (moto's server) and Spark's ``s3a`` settings for it;
* :mod:`controlmsg.clusters.maven_jars`: the pinned jar sets they run from, fetched and verified;
* :mod:`controlmsg.clusters.connect`: a Spark Connect server from it;
* :mod:`controlmsg.clusters.images`: the images of ``docker-compose.yml`` (Kafka, Spark), built on this
  machine from a Debian base and rebuilt only when their inputs change.

These start real processes for development, demos, benchmarks and tests; a production deployment brings its
own cluster and points ``kafka.bootstrap.servers`` (or ``KAFKA_BOOTSTRAP_SERVERS``) at it.

Nothing is imported here: each starter is its own module, imported when it is needed.
"""

__all__: list[str] = []
