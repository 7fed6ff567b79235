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

* ``ttlbroker analyze|compact|load``: the same commands, with the same arguments
  (``cli.py``).

Nothing here runs on the broker's event loop, and nothing imports ``pyspark`` until a
Spark job is asked for, nor pyarrow until the export or a job needs it.
"""

import importlib
from typing import TYPE_CHECKING

#: Every public name and the module it comes from, imported when first used (PEP
#: 562): the export needs numpy and pyarrow, its worker process no trio, the
#: commands' arguments (``cli.py``, which ``ttlbroker --help`` builds) none of them.
_FROM = {
    "SegmentJob": "_convert",
    "CRASH_ENV": "_exporter", "export_segments": "_exporter",
    "MANIFEST_NAME": "_manifest", "Manifest": "_manifest", "ManifestUnreadable": "_manifest",
    "SCHEMA": "_schema", "SCHEMA_VERSION": "_schema", "VERSION_KEY": "_schema",
    # export_in_worker's module imports _convert: ``from spark_export import
    # export_in_worker`` fails at once without pyarrow (the broker checks so at start).
    "WORKER_COMMAND": "_spawn", "WorkerCrashed": "_spawn", "WorkerFailed": "_spawn", "export_in_worker": "_spawn",
}

if TYPE_CHECKING:  # what ``__getattr__`` gives, as type checkers should see it
    from ._convert import SegmentJob as SegmentJob
    from ._exporter import CRASH_ENV as CRASH_ENV
    from ._exporter import export_segments as export_segments
    from ._manifest import MANIFEST_NAME as MANIFEST_NAME
    from ._manifest import Manifest as Manifest
    from ._manifest import ManifestUnreadable as ManifestUnreadable
    from ._schema import SCHEMA as SCHEMA
    from ._schema import SCHEMA_VERSION as SCHEMA_VERSION
    from ._schema import VERSION_KEY as VERSION_KEY
    from ._spawn import WORKER_COMMAND as WORKER_COMMAND
    from ._spawn import WorkerCrashed as WorkerCrashed
    from ._spawn import WorkerFailed as WorkerFailed
    from ._spawn import export_in_worker as export_in_worker
del TYPE_CHECKING

__all__ = list(_FROM)


def __getattr__(name: str) -> object:
    module = _FROM.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
