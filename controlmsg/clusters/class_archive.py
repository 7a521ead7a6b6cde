"""Deprecated: the JVM class-data archive of Spark drivers moved to :mod:`controlmsg.spark.class_archive`,
next to the session code that uses it. This module re-exports its public names (and runs its archive build
as ``python -m``) for code that still imports it here, with a :class:`DeprecationWarning`; import
:mod:`controlmsg.spark.class_archive` instead.
"""

from __future__ import annotations

import sys
import warnings

from controlmsg.spark.class_archive import ENV, KEEP, archive_path, build_archive, driver_java_options

__all__ = ["ENV", "KEEP", "archive_path", "build_archive", "driver_java_options"]

warnings.warn("controlmsg.clusters.class_archive is deprecated: import controlmsg.spark.class_archive",
              DeprecationWarning, stacklevel=2)

if __name__ == "__main__":
    from controlmsg.spark.class_archive import _train

    _train(sys.argv[1], sys.argv[2])
