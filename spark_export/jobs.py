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

Neither job writes into its input or over an output without ``overwrite``; each
writes a temporary folder beside the output and puts it in place only when it has
succeeded (``_outputs.py``). ``compact`` copies the topics' recorded configuration
(the export's manifest, or the input snapshot's marker) into its snapshot's marker,
for ``load --create-topic``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

from ._inputs import check_input, source_topics, write_marker
from ._outputs import staged_output
from ._progress import Display, SparkStages, wait_for_spark_idle

__all__ = ["read_export", "analyze", "compact", "JobProgress", "TTL_BUCKETS", "ANALYZE_STEPS", "COMPACT_STEPS"]

TTL_BUCKETS = ("none", "never", "<1m", "1m-10m", "10m-1h", "1h-1d", ">=1d")
ANALYZE_STEPS = (
    "per_topic", "per_subject", "per_hour", "ttl_distribution", "removals", "markers", "largest_subjects", "totals",
    "report",
)
COMPACT_STEPS = ("select", "write")


class JobProgress:
    """A job's steps: a line on stderr as each one ends and, when stderr is a
    terminal, bars for the steps and for the Spark tasks in flight. ``done`` lists
    the steps completed (what an interrupted job reports)."""

    def __init__(self, job: str, steps: tuple[str, ...], display: Display | None = None, interrupt: Any = None) -> None:
        self.job = job
        self.steps = steps
        self.display = display or Display()
        self.interrupt = interrupt  # a _progress.SparkInterrupt, or None
        self.done: list[str] = []
        self._task = self.display.add(job, len(steps))
        self._started = self._last = time.perf_counter()

    def step(self, name: str, detail: str = "") -> None:
        if self.interrupt is not None and self.interrupt.hit:
            raise KeyboardInterrupt  # Ctrl-C between two Spark jobs
        now = time.perf_counter()
        self.done.append(name)
        self.display.update(self._task, completed=len(self.done))
        self.display.say(f"  {self.job}: {detail or name} ({now - self._last:.1f} s)")
        self._last = now

    @property
    def seconds(self) -> float:
        return round(time.perf_counter() - self._started, 2)


@contextlib.contextmanager
def _settled(spark: Any) -> Iterator[None]:
    """On a failure or an interruption, wait for Spark's cancelled tasks to stop
    before the temporary output is deleted (they could write into it again)."""
    spark.sparkContext.setInterruptOnCancel(True)
    try:
        yield
    except BaseException:
        wait_for_spark_idle(spark)
        raise


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
    root = os.path.abspath(root)  # the JVM's working directory may not be ours
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


def analyze(
    spark: Any, input_dir: str, output_dir: str, top: int = 20, overwrite: bool = False,
    progress: JobProgress | None = None,
) -> dict[str, Any]:
    """Write the analytics tables (Parquet) and ``report.md`` with PNG charts under
    ``output_dir``; return the summary (also written as ``summary.json``).

    Raises:
        JobError: a bad input, or an output the job must not write
            (:func:`_outputs.check_output`; ``overwrite`` replaces a non-empty one).
    """
    progress = progress or JobProgress("analyze", ANALYZE_STEPS)
    with staged_output(input_dir, output_dir, overwrite) as out, progress.display, SparkStages(spark, progress.display), \
            _settled(spark):
        summary = _analyze(spark, input_dir, out, top, progress)
    summary["seconds"] = progress.seconds
    return summary


def _analyze(spark: Any, input_dir: str, output_dir: str, top: int, progress: JobProgress) -> dict[str, Any]:
    from pyspark.sql import functions as F

    from ._report import write_report

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
    collected: dict[str, list[dict[str, Any]]] = {}
    for name, table in tables.items():
        table = table.coalesce(1)
        table.write.mode("overwrite").parquet(os.path.join(output_dir, name))  # into our own temporary folder
        if name != "per_subject":  # the only table that can be large
            collected[name] = [r.asDict() for r in table.collect()]
        progress.step(name)
    totals = df.agg(
        F.count(F.lit(1)).alias("messages"),
        F.sum(F.when(~F.col("removed"), 1).otherwise(0)).alias("live"),
        F.sum("bytes").alias("bytes"),
        F.countDistinct("stream", "topic", "subject").alias("subjects"),
        F.min("timestamp").alias("first"),
        F.max("timestamp").alias("last"),
    ).first().asDict()
    df.unpersist()
    progress.step("totals")
    summary: dict[str, Any] = {
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
    write_marker(output_dir, kind="analysis")
    progress.step("report", "report.md and charts")
    return summary


def compact(
    spark: Any, input_dir: str, output_dir: str, cutoff: dt.datetime | None = None, overwrite: bool = False,
    progress: JobProgress | None = None,
) -> dict[str, Any]:
    """Write the compacted snapshot (same schema, same partitioning) under
    ``output_dir``; return ``{"cutoff", "rows", "seconds"}``.

    Raises:
        JobError: a bad input, or an output the job must not write
            (:func:`_outputs.check_output`; ``overwrite`` replaces a non-empty one).
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    progress = progress or JobProgress("compact", COMPACT_STEPS)
    cutoff = cutoff or dt.datetime.now(dt.timezone.utc)
    if cutoff.tzinfo is None:
        cutoff = cutoff.replace(tzinfo=dt.timezone.utc)
    with staged_output(input_dir, output_dir, overwrite) as out, progress.display, SparkStages(spark, progress.display), \
            _settled(spark):
        df = read_export(spark, input_dir)
        columns = [c for c in df.columns if c not in ("stream", "topic", "partition")]
        at = F.lit(cutoff).cast("timestamp")
        keep = df.where(
            ~F.col("is_marker") & ~F.col("removed") & (F.col("timestamp") <= at)
            & (F.col("expires_at").isNull() | (F.col("expires_at") > at))
        )
        newest = Window.partitionBy("stream", "topic", "subject").orderBy(F.desc("offset"))
        snap = keep.withColumn("_rank", F.row_number().over(newest)).where("_rank = 1").drop("_rank")
        snap = snap.select(*columns, "stream", "topic", "partition").repartition("stream", "topic", "partition").cache()
        rows = snap.count()
        names = sorted((r["stream"], r["topic"]) for r in snap.select("stream", "topic").distinct().collect())
        progress.step("select", f"{rows:,} live subject(s) as of {cutoff.isoformat()}")
        snap.write.mode("overwrite").partitionBy("stream", "topic", "partition").parquet(out)  # our temporary folder
        snap.unpersist()
        recorded = source_topics(input_dir)
        topics = [recorded[n] for n in names if n in recorded]
        write_marker(out, kind="compacted", cutoff=cutoff.isoformat(), topics=topics)
        progress.step("write", f"snapshot written ({len(topics)} of {len(names)} topic configuration(s) recorded)")
    return {"cutoff": cutoff.isoformat(), "rows": rows, "seconds": progress.seconds}
