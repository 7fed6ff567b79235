"""The PySpark jobs: ``analyze`` and ``compact`` over an export (or a snapshot).

Both take a SparkSession (``_session.spark_session``; the tests share one), read the
Hive-partitioned Parquet of an export folder, and write Parquet under an output
folder. Definitions, which ``docs/operations.md`` repeats:

* *messages* counts every exported record, removed ones and markers included; *live*
  those not removed at export time; *bytes* is the payload's length;
* the TTL buckets are ``none`` (no TTL of its own), ``never``, then ``<1m``,
  ``1m-10m``, ``10m-1h``, ``1h-1d`` and ``>=1d`` by ``ttl_seconds``;
* ``compact`` keeps, for each (stream, topic, subject), the newest message (highest
  offset) stored at or before the cutoff that is not a marker, not removed, and not
  expired by then (``expires_at`` null or after the cutoff).
"""

from __future__ import annotations

import datetime as dt
import os
import sys
import time
from typing import Any

from ._inputs import check_input, write_marker

__all__ = ["read_export", "analyze", "compact", "TTL_BUCKETS"]

TTL_BUCKETS = ("none", "never", "<1m", "1m-10m", "10m-1h", "1h-1d", ">=1d")


def _step(name: str, started: float) -> float:
    now = time.perf_counter()
    print(f"  {name} ({now - started:.1f} s)", file=sys.stderr, flush=True)
    return now


def read_export(spark: Any, root: str) -> Any:
    """The export at ``root`` as a DataFrame with ``stream``, ``topic`` (strings) and
    ``partition`` (int) columns from its folders.

    Raises:
        JobError: see :func:`_inputs.check_input`.
    """
    from pyspark.sql import functions as F

    files = check_input(root)
    size = sum(os.path.getsize(f) for f in files)
    print(f"reading {len(files)} Parquet file(s), {size / 1e6:.1f} MB, from {root}", file=sys.stderr, flush=True)
    df = spark.read.option("basePath", root).parquet(root)
    return df.withColumn("partition", F.col("partition").cast("int"))


def _ttl_bucket(F: Any) -> Any:
    t = F.col("ttl_seconds")
    return (
        F.when(F.col("ttl_never"), "never")
        .when(t.isNull(), "none")
        .when(t < 60, "<1m")
        .when(t < 600, "1m-10m")
        .when(t < 3600, "10m-1h")
        .when(t < 86400, "1h-1d")
        .otherwise(">=1d")
    )


def analyze(spark: Any, input_dir: str, output_dir: str, top: int = 20) -> dict[str, Any]:
    """Write the analytics tables (Parquet) and ``report.md`` with PNG charts under
    ``output_dir``; return the summary (also written as ``summary.json``)."""
    from pyspark.sql import functions as F

    from ._report import write_report

    started = time.perf_counter()
    df = read_export(spark, input_dir).withColumn("bytes", F.length("payload")).cache()
    keys = ["stream", "topic"]
    count_cols = [
        F.count(F.lit(1)).alias("messages"),
        F.sum(F.when(~F.col("removed"), 1).otherwise(0)).alias("live"),
        F.sum("bytes").alias("bytes"),
    ]
    tables = {
        "per_topic": df.groupBy(*keys).agg(*count_cols),
        "per_subject": df.groupBy(*keys, "subject").agg(*count_cols),
        "per_hour": df.groupBy(*keys, F.date_trunc("hour", "timestamp").alias("hour")).agg(*count_cols),
        "ttl_distribution": df.groupBy(*keys, _ttl_bucket(F).alias("ttl_bucket")).agg(F.count(F.lit(1)).alias("messages")),
        "removals": df.where("removed").groupBy(*keys, "removed_reason").agg(F.count(F.lit(1)).alias("messages")),
        "markers": df.where("is_marker").groupBy(*keys, "marker_reason").agg(F.count(F.lit(1)).alias("messages")),
    }
    tables["largest_subjects"] = tables["per_subject"].orderBy(F.desc("bytes"), F.desc("messages"), "subject").limit(top)
    os.makedirs(output_dir, exist_ok=True)
    collected: dict[str, list[dict[str, Any]]] = {}
    step = started
    for name, table in tables.items():
        table = table.coalesce(1)
        table.write.mode("overwrite").parquet(os.path.join(output_dir, name))
        if name != "per_subject":  # the only table that can be large
            collected[name] = [r.asDict() for r in table.collect()]
        step = _step(f"analyze: {name}", step)
    totals = df.agg(
        F.count(F.lit(1)).alias("messages"),
        F.sum(F.when(~F.col("removed"), 1).otherwise(0)).alias("live"),
        F.sum("bytes").alias("bytes"),
        F.countDistinct("stream", "topic", "subject").alias("subjects"),
        F.min("timestamp").alias("first"),
        F.max("timestamp").alias("last"),
    ).first().asDict()
    df.unpersist()
    summary = {
        "input": input_dir,
        "messages": int(totals["messages"]),
        "live": int(totals["live"] or 0),
        "bytes": int(totals["bytes"] or 0),
        "subjects": int(totals["subjects"]),
        "first": totals["first"].isoformat() if totals["first"] else None,
        "last": totals["last"].isoformat() if totals["last"] else None,
        "removals": {r["removed_reason"]: 0 for r in collected["removals"]},
        "markers": {r["marker_reason"]: 0 for r in collected["markers"]},
        "ttl_distribution": {b: 0 for b in TTL_BUCKETS},
        "seconds": 0.0,
    }
    for r in collected["removals"]:
        summary["removals"][r["removed_reason"]] += r["messages"]
    for r in collected["markers"]:
        summary["markers"][r["marker_reason"]] += r["messages"]
    for r in collected["ttl_distribution"]:
        summary["ttl_distribution"][r["ttl_bucket"]] += r["messages"]
    write_report(output_dir, summary, collected)
    summary["seconds"] = round(time.perf_counter() - started, 2)
    write_marker(output_dir, kind="analysis")
    return summary


def compact(spark: Any, input_dir: str, output_dir: str, cutoff: dt.datetime | None = None) -> dict[str, Any]:
    """Write the compacted snapshot (same schema, same partitioning) under
    ``output_dir``; return ``{"cutoff", "input_rows", "rows", "seconds"}``."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    started = time.perf_counter()
    cutoff = cutoff or dt.datetime.now(dt.timezone.utc)
    if cutoff.tzinfo is None:
        cutoff = cutoff.replace(tzinfo=dt.timezone.utc)
    df = read_export(spark, input_dir)
    columns = [c for c in df.columns if c not in ("stream", "topic", "partition")]
    at = F.lit(cutoff).cast("timestamp")
    keep = df.where(
        ~F.col("is_marker") & ~F.col("removed") & (F.col("timestamp") <= at)
        & (F.col("expires_at").isNull() | (F.col("expires_at") > at))
    )
    newest = Window.partitionBy("stream", "topic", "subject").orderBy(F.desc("offset"))
    out = keep.withColumn("_rank", F.row_number().over(newest)).where("_rank = 1").drop("_rank")
    out = out.select(*columns, "stream", "topic", "partition").repartition("stream", "topic", "partition").cache()
    rows = out.count()
    out.write.mode("overwrite").partitionBy("stream", "topic", "partition").parquet(output_dir)
    out.unpersist()
    write_marker(output_dir, kind="compacted", cutoff=cutoff.isoformat())
    result = {"cutoff": cutoff.isoformat(), "rows": rows, "seconds": round(time.perf_counter() - started, 2)}
    _step(f"compact: {rows} live subject(s) as of {cutoff.isoformat()}", started)
    return result
