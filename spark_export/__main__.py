"""``python -m spark_export analyze|compact|load ...`` (see ``--help``; the commands
and their arguments are ``cli.py``'s, which ``ttlbroker analyze|compact|load`` shares)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .cli import EXAMPLES, EXIT_STATUSES, JobError, add_job_commands, run_job

USAGE = EXAMPLES.format(prog="python -m spark_export") + (
    "  python -m spark_export.submit --master spark://host:7077 analyze --input ... --output ...\n\n"
) + EXIT_STATUSES


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m spark_export", description="Spark jobs over a ttlbroker Parquet export.",
                                epilog=USAGE, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_job_commands(p.add_subparsers(dest="job", required=True))
    return p


def main(argv: list[str] | None = None, default_master: str | None = "local[*]", spark: Any = None) -> int:
    """Run one command; returns the exit status. ``spark``: a session to run the
    Spark jobs on (left running) instead of starting one."""
    args = build_parser().parse_args(argv)
    try:
        return run_job(args, default_master, spark)
    except JobError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
