"""The SparkSession the jobs run on: local by default, any Spark master by option."""

from __future__ import annotations

import sys
from typing import Any

from ._inputs import JobError, check_java

__all__ = ["spark_session", "SPARK_CONF"]

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


def spark_session(master: str | None = "local[*]", app: str = "ttlbroker") -> Any:
    """A SparkSession on ``master`` (any Spark master URL; None: the one
    ``spark-submit`` was given).

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
    for key, value in SPARK_CONF.items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except Exception as exc:  # py4j and the JVM raise many types
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise JobError(f"Spark did not start on {master}: {first}") from None
    spark.sparkContext.setLogLevel("ERROR")
    print(f"spark: {spark.version} on {spark.sparkContext.master}", file=sys.stderr)
    return spark
