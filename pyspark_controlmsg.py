"""Spark finds ``format("controlmsg")`` here by itself: it imports every module named ``pyspark_*`` on its
Python path and registers the ``DefaultSource`` it finds. See :mod:`controlmsg.spark`."""

from controlmsg.spark.datasource import ControlMsgDataSource as DefaultSource

__all__ = ["DefaultSource"]
