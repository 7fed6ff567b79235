"""``python -m spark_export analyze|compact|load ...`` (see ``--help``)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from typing import Any

from ._inputs import JobError

DEFAULT_SERVER = "127.0.0.1:8090"

USAGE = """examples:
  python -m spark_export analyze --input ./export --output ./analysis
  python -m spark_export compact --input ./export --output ./snapshot --cutoff 2026-11-23T12:00:00Z
  python -m spark_export load --input ./snapshot --server 127.0.0.1:8190 --create-topic
  python -m spark_export.submit --master spark://host:7077 analyze --input ... --output ...

analyze and compact never write into their input, refuse an output folder that is not
empty unless --overwrite is given, and put their output in place only once they have
succeeded. Exit status: 0 done, 1 load had refused messages, 2 cannot run, 130 interrupted.
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
        q.add_argument("--output", required=True, metavar="OUT_DIR", help="a new or empty folder, outside the input")
        q.add_argument("--overwrite", action="store_true",
                       help="replace a non-empty output (swapped in only when the job has succeeded)")
        q.add_argument("--master", default=None, help="any Spark master URL (default: local[*], or spark-submit's)")
        if name == "compact":
            q.add_argument("--cutoff", type=_cutoff, default=None, help="ISO-8601 time (default: now)")
    q = sub.add_parser("load", help="publish a compacted snapshot into a running broker")
    q.add_argument("--input", required=True, metavar="SNAPSHOT_DIR")
    q.add_argument("--server", default=os.environ.get("TTLBROKER_SERVER", DEFAULT_SERVER), metavar="HOST:PORT",
                   help=f"the broker (default: $TTLBROKER_SERVER, else {DEFAULT_SERVER})")
    q.add_argument("--token", default=os.environ.get("TTLBROKER_TOKEN", ""),
                   help="auth token (default: $TTLBROKER_TOKEN, else none)")
    q.add_argument("--tls", action="store_true", help="connect over TLS, trusting the system's CAs")
    q.add_argument("--tls-ca", metavar="FILE", help="connect over TLS, trusting the CA(s) in this PEM file")
    q.add_argument("--tls-cert", metavar="FILE", help="client certificate (PEM), for a broker that requires one")
    q.add_argument("--tls-key", metavar="FILE", help="the client certificate's key, when not in --tls-cert's file")
    q.add_argument("--stream", default=None, help="target stream (default: each source topic's own stream)")
    q.add_argument("--topic", default=None, help="target topic (default: each source topic's own name)")
    q.add_argument("--source", default=None, metavar="STREAM/TOPIC",
                   help="load only this topic of the snapshot (default: all)")
    q.add_argument("--create-topic", action="store_true",
                   help="create each target topic (and its stream) with its source topic's configuration, "
                        "recorded at export time; refused if the topic exists")
    return p


def _tls(args: argparse.Namespace) -> Any:
    if args.tls_key and not args.tls_cert:
        raise JobError("--tls-key needs --tls-cert")
    if not (args.tls or args.tls_ca or args.tls_cert):
        return None
    from broker.client import tls_context

    import ssl

    for flag, path in (("--tls-ca", args.tls_ca), ("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key)):
        if path and not os.path.isfile(path):
            raise JobError(f"{flag} {path}: no such file")
    try:
        return tls_context(ca=args.tls_ca, cert=args.tls_cert, key=args.tls_key)
    except ssl.SSLError as exc:
        raise JobError(f"TLS: a certificate or key file is not usable ({exc.reason or exc})") from None
    except OSError as exc:
        raise JobError(f"cannot read a TLS file: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise JobError(f"TLS: {exc}") from None


def _interrupt(exc: BaseException) -> bool:
    """A KeyboardInterrupt, possibly inside trio's exception groups."""
    if isinstance(exc, KeyboardInterrupt):
        return True
    return isinstance(exc, BaseExceptionGroup) and exc.subgroup(KeyboardInterrupt) is not None


def _load(args: argparse.Namespace) -> int:
    import trio

    from ._progress import say
    from .load import LoadState, load

    state = LoadState()
    tls = _tls(args)
    try:
        result = trio.run(lambda: load(args.input, args.server, args.stream, args.topic, source=args.source,
                                       create_topic=args.create_topic, token=args.token, tls=tls, state=state))
    except BaseException as exc:
        if _interrupt(exc):
            say(state.interrupted())
            return 130
        if isinstance(exc, BaseExceptionGroup):  # a JobError from inside trio's nursery
            jobs = exc.subgroup(JobError)
            if jobs is not None:
                raise _first(jobs) from None
        raise
    say(state.summary())
    print(json.dumps(result))
    return 1 if result["errors"] else 0


def _first(group: BaseException) -> BaseException:
    while isinstance(group, BaseExceptionGroup):
        group = group.exceptions[0]
    return group


def _spark_job(args: argparse.Namespace, default_master: str | None, spark: Any) -> int:
    from . import jobs
    from ._inputs import check_input
    from ._outputs import check_output
    from ._progress import SparkInterrupt, say
    from ._session import spark_session

    # A bad input or output fails before the JVM starts.
    check_input(args.input)
    check_output(args.input, args.output, args.overwrite)
    steps = jobs.ANALYZE_STEPS if args.job == "analyze" else jobs.COMPACT_STEPS
    progress = None
    interrupt = None
    own = spark is None
    try:
        if own:
            spark = spark_session(args.master or default_master, f"ttlbroker-{args.job}")
        try:
            with SparkInterrupt(spark) as interrupt:
                progress = jobs.JobProgress(args.job, steps, interrupt=interrupt)
                if args.job == "analyze":
                    summary = jobs.analyze(spark, args.input, args.output, overwrite=args.overwrite, progress=progress)
                    say(f"analyze: {summary['messages']:,} messages analysed in {summary['seconds']:.1f} s; "
                        f"wrote {args.output}")
                    print(
                        f"{summary['messages']:,} messages ({summary['live']:,} live, {summary['bytes']:,} payload "
                        f"bytes) on {summary['subjects']:,} subjects; removed: {summary['removals'] or 'none'}; "
                        f"markers: {summary['markers'] or 'none'}; report: {args.output}/report.md"
                    )
                else:
                    result = jobs.compact(spark, args.input, args.output, args.cutoff, overwrite=args.overwrite,
                                          progress=progress)
                    say(f"compact: {result['rows']:,} live subject(s) as of {result['cutoff']} in "
                        f"{result['seconds']:.1f} s; wrote {args.output}")
                    print(json.dumps(result))
        finally:
            if own:
                spark.stop()
    except BaseException as exc:
        # Ctrl-C: our handler cancelled the Spark jobs (their call fails with
        # whatever Spark raises), or a KeyboardInterrupt came between them.
        if not (isinstance(exc, KeyboardInterrupt) or (interrupt is not None and interrupt.hit)):
            raise
        done = progress.done if progress is not None else []
        what = f"after {len(done)} of {len(steps)} steps ({', '.join(done)})" if done else "before any step ended"
        say(f"{args.job}: interrupted {what}; {args.output} is as it was before")
        return 130
    return 0


def main(argv: list[str] | None = None, default_master: str | None = "local[*]", spark: Any = None) -> int:
    """Run one command; returns the exit status. ``spark``: a session to run the
    Spark jobs on (left running) instead of starting one."""
    args = build_parser().parse_args(argv)
    try:
        if args.job == "load":
            return _load(args)
        return _spark_job(args, default_master, spark)
    except JobError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
