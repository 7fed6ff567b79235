"""ttlbroker's export to Parquet, and the PySpark jobs over it.

* The broker's export task (``broker/core/_export.py``) snapshots sealed segments on its
  event loop and runs :func:`export_segments` in a worker process
  (:func:`export_in_worker`, ``python -m spark_export.worker``): numpy and pyarrow
  only.
* ``python -m spark_export analyze|compact|load ...``: the PySpark analytics and
  compaction (which never write into their input or over an output unless told to,
  ``_outputs.py``), and loading a compacted snapshot back into a broker, creating
  its topics from the configuration the export's manifest records (``load.py``).
* ``python -m spark_export.submit [SPARK-SUBMIT OPTIONS] analyze|compact ...``: the
  same jobs through the installed pyspark's ``spark-submit``, on any cluster.

Nothing here runs on the broker's event loop, and nothing imports ``pyspark`` until a
Spark job is asked for.
"""

from typing import TYPE_CHECKING

from ._convert import SegmentJob as SegmentJob
from ._exporter import CRASH_ENV as CRASH_ENV
from ._exporter import export_segments as export_segments
from ._manifest import MANIFEST_NAME as MANIFEST_NAME
from ._manifest import Manifest as Manifest
from ._manifest import ManifestUnreadable as ManifestUnreadable
from ._schema import SCHEMA as SCHEMA
from ._schema import SCHEMA_VERSION as SCHEMA_VERSION
from ._schema import VERSION_KEY as VERSION_KEY

#: Imported when first used (PEP 562): they need trio, which the worker does not.
_SPAWN = ("WORKER_COMMAND", "WorkerCrashed", "WorkerFailed", "export_in_worker")

if TYPE_CHECKING:  # what ``__getattr__`` gives, as type checkers should see it
    from ._spawn import WORKER_COMMAND as WORKER_COMMAND
    from ._spawn import WorkerCrashed as WorkerCrashed
    from ._spawn import WorkerFailed as WorkerFailed
    from ._spawn import export_in_worker as export_in_worker
del TYPE_CHECKING

__all__ = [name for name in dir() if not name.startswith("_")] + list(_SPAWN)


def __getattr__(name: str) -> object:
    if name in _SPAWN:
        from . import _spawn

        return getattr(_spawn, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
