"""``python -m spark_export analyze|compact|load ...`` (see ``--help``)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys

from ._inputs import JobError

USAGE = """examples:
  python -m spark_export analyze --input ./export --output ./analysis
  python -m spark_export compact --input ./export --output ./snapshot --cutoff 2026-11-23T12:00:00Z
  python -m spark_export load --input ./snapshot --server 127.0.0.1:8090 --stream shop --topic restored
  spark-submit --master spark://host:7077 spark_export/submit.py analyze --input ... --output ...
"""


def _cutoff(text: str) -> dt.datetime:
    try:
        value = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO-8601 time: {text!r}") from None
    return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m spark_export", description="Spark jobs over a ttlbroker Parquet export.",
                                epilog=USAGE, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="job", required=True)
    for name, helptext in (("analyze", "volumes, TTLs, removals, markers, largest subjects; Parquet tables and report.md"),
                           ("compact", "the latest live message per subject as of a cutoff")):
        q = sub.add_parser(name, help=helptext)
        q.add_argument("--input", required=True, metavar="EXPORT_DIR")
        q.add_argument("--output", required=True, metavar="OUT_DIR")
        q.add_argument("--master", default=None, help="any Spark master URL (default: local[*], or spark-submit's)")
        if name == "compact":
            q.add_argument("--cutoff", type=_cutoff, default=None, help="ISO-8601 time (default: now)")
    q = sub.add_parser("load", help="publish a compacted snapshot into a topic of a running broker")
    q.add_argument("--input", required=True, metavar="SNAPSHOT_DIR")
    q.add_argument("--server", required=True, metavar="HOST:PORT")
    q.add_argument("--stream", required=True)
    q.add_argument("--topic", required=True)
    return p


def main(argv: list[str] | None = None, default_master: str | None = "local[*]") -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.job == "load":
            import trio

            from .load import load

            result = trio.run(load, args.input, args.server, args.stream, args.topic)
            print(json.dumps(result))
            return 1 if result["errors"] else 0
        from . import jobs
        from ._inputs import check_input
        from ._session import spark_session

        check_input(args.input)  # a bad input fails before the JVM starts
        spark = spark_session(args.master or default_master, f"ttlbroker-{args.job}")
        try:
            if args.job == "analyze":
                summary = jobs.analyze(spark, args.input, args.output)
                print(
                    f"{summary['messages']:,} messages ({summary['live']:,} live, {summary['bytes']:,} payload bytes) "
                    f"on {summary['subjects']:,} subjects; removed: {summary['removals'] or 'none'}; "
                    f"markers: {summary['markers'] or 'none'}; report: {args.output}/report.md"
                )
            else:
                result = jobs.compact(spark, args.input, args.output, args.cutoff)
                print(json.dumps(result))
        finally:
            spark.stop()
    except JobError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
