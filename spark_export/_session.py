"""The SparkSession the jobs run on: local by default, any Spark master by option.

Quiet unless asked (``verbose``): a JVM that pyspark starts here gets
``log4j2-quiet.properties`` (errors only: no log4j banner, none of the warnings
Spark and Hadoop log while they start, such as ``NativeCodeLoader: Unable to load
native-hadoop library``), and the one notice the JVM prints itself
(``WARNING: Using incubator modules``, Spark 4 asks for such a module) is taken out
of its stderr; once it runs, Spark logs errors only. In a driver that
``spark-submit`` started (``submit.py``) the JVM is spark-submit's, already running:
only the last applies.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

from ._inputs import JobError, check_java

__all__ = ["spark_session", "SPARK_CONF", "QUIET_LOG_CONFIG", "quiet_conf", "without_jvm_notices"]

#: Settings every job relies on: UTC everywhere, Hive partition folders read as
#: strings (a stream named "123" stays a name), microsecond timestamps on output,
#: no UI and no console progress bar (the jobs print their own progress).
SPARK_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.sources.partitionColumnTypeInference.enabled": "false",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "8",
}

#: The log4j 2 configuration of a quiet JVM: errors only.
QUIET_LOG_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "log4j2-quiet.properties")

#: Lines the JVM writes to stderr itself, which no log setting turns off.
_JVM_NOTICES = (b"WARNING: Using incubator modules: ",)


def quiet_conf() -> dict[str, str]:
    """The settings that start the driver's JVM with :data:`QUIET_LOG_CONFIG` (pyspark
    passes them to the ``spark-submit`` that starts it)."""
    return {"spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{QUIET_LOG_CONFIG}"}


def spark_session(master: str | None = "local[*]", app: str = "ttlbroker", *, verbose: bool = False) -> Any:
    """A SparkSession on ``master`` (any Spark master URL; None: the one
    ``spark-submit`` was given); ``verbose``: with Spark's and Hadoop's warnings.

    Raises:
        JobError: Java or pyspark is missing, or Spark would not start.
    """
    check_java()
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise JobError("pyspark is not installed: pip install 'ttlbroker[spark]'") from None
    builder = SparkSession.builder.appName(app)
    if master:
        builder = builder.master(master)
    starts_jvm = "PYSPARK_GATEWAY_PORT" not in os.environ  # else spark-submit's JVM runs already
    quiet = not verbose and starts_jvm
    for key, value in {**SPARK_CONF, **(quiet_conf() if quiet else {})}.items():
        builder = builder.config(key, value)
    try:
        with without_jvm_notices() if quiet else contextlib.nullcontext():
            spark = builder.getOrCreate()
    except Exception as exc:  # py4j and the JVM raise many types
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise JobError(f"Spark did not start on {master}: {first}") from None
    if not verbose:
        spark.sparkContext.setLogLevel("ERROR")
    print(f"spark: {spark.version} on {spark.sparkContext.master}", file=sys.stderr)
    return spark


@contextlib.contextmanager
def without_jvm_notices() -> Iterator[threading.Thread]:
    """Inside the block, stderr (file descriptor 2) is a pipe that a thread copies
    to the real stderr, less the lines of :data:`_JVM_NOTICES`: a process started
    inside it (the JVM) keeps writing there for its whole life, through the copier
    (the thread yielded, which ends when the last such process does)."""
    read, write = os.pipe()
    real = os.dup(2)
    copier = threading.Thread(target=_copy_lines, args=(read, real), name="jvm-stderr", daemon=True)
    copier.start()
    os.dup2(write, 2)
    os.close(write)
    try:
        yield copier
    finally:
        sys.stderr.flush()
        os.dup2(real, 2)  # ours again; the copier ends when the last process that has the pipe does


def _copy_lines(read: int, out: int) -> None:
    with open(read, "rb") as lines, open(out, "wb", buffering=0) as dest:
        for line in lines:
            if not line.startswith(_JVM_NOTICES):
                dest.write(line)
