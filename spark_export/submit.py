"""Run ``analyze`` or ``compact`` through ``spark-submit``, on any cluster.

``python -m spark_export.submit [SPARK-SUBMIT OPTIONS] analyze|compact [JOB OPTIONS]``
runs the ``spark-submit`` of the installed pyspark with this file as the application:
everything before the job's name goes to ``spark-submit`` (``--master URL``,
``--conf K=V``, ``--executor-memory 4g``, ...), the rest to the job. It sets what the
``spark-submit`` script of a virtual environment otherwise finds only with the
environment's ``bin`` on ``PATH``: ``SPARK_HOME`` (the pyspark package, unless
already set), ``PYSPARK_PYTHON`` and ``PYSPARK_DRIVER_PYTHON`` (this interpreter,
unless already set) and ``PATH``. So ``.venv/bin/python -m spark_export.submit ...``
works from any shell, activated or not.

``spark-submit [OPTIONS] spark_export/submit.py analyze|compact ...`` (a Spark
installation's own ``spark-submit``) runs the same application directly; the project
must then be importable on the driver (installed, or on ``PYTHONPATH``).

The driver runs where this command runs (client mode, Spark's default). The jobs use
only DataFrame operations, so executors need Java and Spark but no Python packages;
``--input`` and ``--output`` must be paths the driver and every executor see alike
(a shared file system).
"""

from __future__ import annotations

import os
import sys

JOBS = ("analyze", "compact")
USAGE = "usage: python -m spark_export.submit [SPARK-SUBMIT OPTIONS] analyze|compact [JOB OPTIONS]"


#: spark-submit's options that take no value; every other option takes one.
_FLAGS = {"--verbose", "-v", "--supervise", "--help", "-h", "--version"}


def _job_index(argv: list[str]) -> int | None:
    """Where the job's name is: the first argument that is not a spark-submit
    option or an option's value."""
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in JOBS:
            return i
        i += 2 if a.startswith("-") and a not in _FLAGS and "=" not in a else 1
    return None


def spark_submit_command(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """The ``spark-submit`` command line and environment for ``argv`` (this
    module's arguments).

    Raises:
        JobError: no job named, pyspark missing, or no usable Java.
    """
    from spark_export._inputs import JobError, check_java

    job_at = _job_index(argv)
    if job_at is None:
        raise JobError(f"name the job, analyze or compact, after spark-submit's options ({USAGE})")
    check_java()
    env = dict(os.environ)
    if not env.get("SPARK_HOME"):
        try:
            import pyspark
        except ImportError:
            raise JobError("pyspark is not installed: pip install 'ttlbroker[spark]'") from None
        env["SPARK_HOME"] = os.path.dirname(os.path.abspath(pyspark.__file__))
    python = sys.executable
    env.setdefault("PYSPARK_PYTHON", python)
    env.setdefault("PYSPARK_DRIVER_PYTHON", python)
    env["PATH"] = os.path.dirname(python) + os.pathsep + env.get("PATH", "")
    submit = os.path.join(env["SPARK_HOME"], "bin", "spark-submit")
    if not os.path.isfile(submit):
        raise JobError(f"no spark-submit in SPARK_HOME ({env['SPARK_HOME']}): unset SPARK_HOME to use pyspark's own")
    # Spark's log level from the start (spark-submit's default profile logs at INFO
    # until the job sets it); a --conf spark.log.level=... given after this wins.
    quiet = ["--conf", "spark.log.level=WARN"]
    return [submit, *quiet, *argv[:job_at], os.path.abspath(__file__), *argv[job_at:]], env


def launch(argv: list[str]) -> int:
    """Replace this process with ``spark-submit`` (see :func:`spark_submit_command`);
    returns only on an error (exit status 2)."""
    from spark_export._inputs import JobError

    if argv[:1] in (["-h"], ["--help"]):
        print(USAGE + "\n\n" + (__doc__ or "").split("\n\n", 1)[1])
        return 0
    try:
        command, env = spark_submit_command(argv)
    except JobError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(command[0], command, env)
    return 2  # not reached


def _under_spark_submit() -> bool:
    """True in a driver that spark-submit started (its PythonRunner sets these)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


if __name__ == "__main__":
    if _under_spark_submit():
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from spark_export.__main__ import main

        # No default master: the session keeps the one spark-submit was given.
        sys.exit(main(default_master=None))
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.exit(launch(sys.argv[1:]))
