"""The jobs' commands, ``analyze``, ``compact`` and ``load``: their arguments
(:func:`add_job_commands`) and running one (:func:`run_job`), for the two command
lines that offer them: ``python -m spark_export`` (``__main__.py``) and
``ttlbroker analyze|compact|load`` (``broker/cli``), which give the same jobs the same
arguments.

Building the arguments imports nothing but the standard library (``ttlbroker
--help`` needs neither pyarrow nor pyspark); pyarrow is imported when a job runs,
pyspark when a Spark job starts.

Spark and Hadoop log at WARN while the JVM starts (the log4j banner, ``NativeCodeLoader:
Unable to load native-hadoop library``, the host's loopback address) and during the
jobs; ``analyze`` and ``compact`` keep those out of the output, errors excepted,
unless ``--verbose`` (``_session.py``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

from ._errors import JobError

if TYPE_CHECKING:
    import ssl

__all__ = ["add_job_commands", "run_job", "JobError", "JOBS", "DEFAULT_SERVER", "EXAMPLES", "EXIT_STATUSES"]

#: The commands, and what each does.
JOBS = {
    "analyze": "volumes, TTLs, removals, markers, largest subjects of an export: Parquet tables and report.md",
    "compact": "the latest live message per subject of an export, as of a cutoff: a snapshot for load",
    "load": "publish a compacted snapshot into a running broker",
}

DEFAULT_SERVER = "127.0.0.1:8090"

EXAMPLES = """examples:
  {prog} analyze --input ./export --output ./analysis
  {prog} compact --input ./export --output ./snapshot --cutoff 2026-11-23T12:00:00Z
  {prog} load --input ./snapshot --server 127.0.0.1:8190 --create-topic
"""

EXIT_STATUSES = """analyze and compact never write into their input, refuse an output folder that is not
empty unless --overwrite is given, and put their output in place only once they have
succeeded. Exit status: 0 done, 1 load had refused messages, 2 cannot run, 130 interrupted.
"""

#: What ``add_subparsers`` returns.
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _cutoff(text: str) -> dt.datetime:
    try:
        value = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO-8601 time: {text!r}") from None
    return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)


def add_job_commands(
    sub: Subparsers, connection: Sequence[argparse.ArgumentParser] | None = None,
) -> dict[str, argparse.ArgumentParser]:
    """Add ``analyze``, ``compact`` and ``load`` to ``sub``; returns their parsers.

    ``connection``: parent parsers that give ``load`` its options to reach the broker
    (``--server``, ``--token``, ``--user``, ``--password``, ``--tls``, ``--tls-ca``,
    ``--tls-cert``, ``--tls-key``), as ``ttlbroker`` gives every command that talks to
    a broker; None: ``load`` gets its own (``--server``, ``--token``, the TLS ones),
    with their defaults from ``$TTLBROKER_SERVER`` and ``$TTLBROKER_TOKEN``.
    """
    parsers = {}
    for name in ("analyze", "compact"):
        q = sub.add_parser(name, help=JOBS[name], description=JOBS[name])
        q.add_argument("--input", required=True, metavar="EXPORT_DIR",
                       help="the export: a broker's --export-dir, or a copy of it (required)")
        q.add_argument("--output", required=True, metavar="OUT_DIR", help="a new or empty folder, outside the input (required)")
        q.add_argument("--overwrite", action="store_true",
                       help="replace a non-empty output (swapped in only when the job has succeeded)")
        q.add_argument("--master", default=None, help="any Spark master URL (default: local[*], or spark-submit's)")
        if name == "compact":
            q.add_argument("--cutoff", type=_cutoff, default=None, metavar="TIME",
                           help="ISO-8601 time, UTC unless it says (default: now)")
        q.add_argument("--verbose", action="store_true",
                       help="show Spark's and Hadoop's own warnings (the log4j banner, NativeCodeLoader, ...)")
        parsers[name] = q
    q = sub.add_parser("load", help=JOBS["load"], description=JOBS["load"], parents=list(connection or ()))
    q.add_argument("--input", required=True, metavar="SNAPSHOT_DIR", help="the output of compact (required)")
    if connection is None:
        q.add_argument("--server", default=os.environ.get("TTLBROKER_SERVER", DEFAULT_SERVER), metavar="HOST:PORT",
                       help=f"the broker (default: $TTLBROKER_SERVER, else {DEFAULT_SERVER})")
        q.add_argument("--token", default=os.environ.get("TTLBROKER_TOKEN", ""),
                       help="auth token (default: $TTLBROKER_TOKEN, else none)")
        q.add_argument("--tls", action="store_true", help="connect over TLS, trusting the system's CAs")
        q.add_argument("--tls-ca", metavar="FILE",
                       help="connect over TLS, trusting the CA(s) in this PEM file (default: none)")
        q.add_argument("--tls-cert", metavar="FILE",
                       help="client certificate (PEM), for a broker that requires one (default: none)")
        q.add_argument("--tls-key", metavar="FILE",
                       help="the client certificate's key, when not in --tls-cert's file (default: none)")
    q.add_argument("--stream", default=None, help="target stream (default: each source topic's own stream)")
    q.add_argument("--topic", default=None, help="target topic (default: each source topic's own name)")
    q.add_argument("--source", default=None, metavar="STREAM/TOPIC",
                   help="load only this topic of the snapshot (default: all)")
    q.add_argument("--create-topic", action="store_true",
                   help="create each target topic (and its stream) with its source topic's configuration, "
                        "recorded at export time; refused if the topic exists")
    parsers["load"] = q
    return parsers


def run_job(args: argparse.Namespace, default_master: str | None = "local[*]", spark: Any = None) -> int:
    """Run the job ``args`` name (``args.job``, else ``args.command``); returns the
    exit status. ``spark``: a session to run the Spark jobs on (left running)
    instead of starting one.

    Raises:
        JobError: the job cannot run (one line for the user).
    """
    job = getattr(args, "job", None) or args.command
    try:
        if job == "load":
            return _load(args)
        return _spark_job(job, args, default_master, spark)
    except ImportError as exc:
        if (exc.name or "").split(".")[0] not in ("pyarrow", "pyspark", "numpy", "pandas", "duckdb", "matplotlib", "py4j"):
            raise
        raise JobError(f"the jobs need the spark extra ({exc}): pip install 'ttlbroker[spark]'") from None


def _tls(args: argparse.Namespace) -> ssl.SSLContext | None:
    tls_ca, tls_cert, tls_key = (getattr(args, f"tls_{k}", None) for k in ("ca", "cert", "key"))
    if tls_key and not tls_cert:
        raise JobError("--tls-key needs --tls-cert")
    if not (getattr(args, "tls", False) or tls_ca or tls_cert):
        return None
    import ssl

    from broker.client import tls_context

    for flag, path in (("--tls-ca", tls_ca), ("--tls-cert", tls_cert), ("--tls-key", tls_key)):
        if path and not os.path.isfile(path):
            raise JobError(f"{flag} {path}: no such file")
    try:
        return tls_context(ca=tls_ca, cert=tls_cert, key=tls_key)
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
        result = trio.run(lambda: load(
            args.input, args.server, args.stream, args.topic, source=args.source, create_topic=args.create_topic,
            token=args.token, user=getattr(args, "user", ""), password=getattr(args, "password", ""), tls=tls,
            state=state,
        ))
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


def _spark_job(job: str, args: argparse.Namespace, default_master: str | None, spark: Any) -> int:
    from . import jobs
    from ._inputs import check_input
    from ._outputs import check_output
    from ._progress import SparkInterrupt, say
    from ._session import spark_session

    # A bad input or output fails before the JVM starts.
    check_input(args.input)
    check_output(args.input, args.output, args.overwrite)
    steps = jobs.ANALYZE_STEPS if job == "analyze" else jobs.COMPACT_STEPS
    progress = None
    interrupt = None
    own = spark is None
    try:
        if own:
            spark = spark_session(args.master or default_master, f"ttlbroker-{job}", verbose=args.verbose)
        try:
            with SparkInterrupt(spark) as interrupt:
                progress = jobs.JobProgress(job, steps, interrupt=interrupt)
                if job == "analyze":
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
        say(f"{job}: interrupted {what}; {args.output} is as it was before")
        return 130
    return 0
