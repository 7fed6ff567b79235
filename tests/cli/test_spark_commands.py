"""``ttlbroker analyze|compact|load``: the jobs of ``python -m spark_export`` with its
arguments, run by ``main([...], spark=...)`` in this process on the session's
SparkSession (a JVM per command would cost seconds each); errors named as the
CLI's; the JVM the jobs start logs errors only, and its own notice is taken out of
its stderr.

``compact`` and ``load`` run whole; ``analyze`` takes the same path to its job (its
arguments, ``spark_export.cli.run_job``, the session given) and is run whole by
``tests/export`` (``python -m spark_export analyze``): here its refusals only, which
cost no Spark time."""

from __future__ import annotations

from conftest import require_extra

require_extra("spark", "the ttlbroker Spark commands' tests")  # before the imports it guards

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import BrokerProcess, make_config, start_server

from broker.cli import main
from broker.client import connect
from spark_export._session import QUIET_LOG_CONFIG, without_jvm_notices

FAR = "2100-01-01T00:00:00Z"

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An export of two topics: 40 messages on 20 subjects, and 3 on one."""
    root = tmp_path_factory.mktemp("spark-commands")
    (root / "data").mkdir()

    async def run() -> None:
        cfg = make_config(root / "data", **{"export.dir": str(root / "export"), "system.partition.fsync": "never"})
        async with start_server(cfg) as server, connect(server.address) as c:
            await c.create_stream("shop")
            await c.create_topic("shop", "orders", partitions=2, subjects=["orders.>"])
            await c.create_topic("shop", "events", subjects=["ev.>"])
            await c.publish_batch([(f"orders.{i % 20}", str(i).encode()) for i in range(40)])
            await c.publish_batch([("ev.a", b"1"), ("ev.a", b"2"), ("ev.a", b"3")])
            await c.export(seal=True)

    trio.run(run)
    return root / "export"


@pytest.fixture(scope="module")
def restore(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("spark-commands-restore"))
    try:
        yield proc
    finally:
        proc.stop()


def run(capsys: pytest.CaptureFixture[str], *argv: str, spark: Any = None) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main(list(argv), spark=spark)
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.timeout(300)  # the first Spark test of a test process starts the JVM (conftest's ``spark``)
def test_compact_then_load_into_a_broker(spark: Any, export: Path, restore: BrokerProcess, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    snapshot = tmp_path / "snapshot"
    status, out, err = run(capsys, "compact", "--input", str(export), "--output", str(snapshot), "--cutoff", FAR,
                           spark=spark)
    assert status == 0, err
    assert json.loads(out)["rows"] == 21  # the newest message of each subject
    assert "compact: 21 live subject(s) as of " in err
    # load takes the global options, before or after the command
    status, out, err = run(capsys, "--server", restore.address, "load", "--input", str(snapshot), "--create-topic")
    assert status == 0, err
    result = json.loads(out)
    assert (result["published"], result["errors"], sorted(result["created"])) == (
        21, 0, ["shop", "shop/events", "shop/orders"],
    )
    status, out, err = run(capsys, "fetch", "shop", "events", "--server", restore.address, "--json")
    assert status == 0 and [json.loads(line)["payload"] for line in out.splitlines()] == ["3"]


def test_job_errors_are_one_named_line(export: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope"
    assert run(capsys, "analyze", "--input", str(missing), "--output", str(tmp_path / "o")) == (
        2, "", f"error: JOB_FAILED: no such input: {missing} is not a folder\n",
    )
    assert run(capsys, "compact", "--input", str(export), "--output", str(export / "inside")) == (
        2, "", f"error: JOB_FAILED: the output {export / 'inside'} is inside the input ({export}): write the job's "
        "output outside it\n",
    )
    assert run(capsys, "load", "--input", str(missing), "--server", "127.0.0.1:1") == (
        2, "", f"error: JOB_FAILED: no such input: {missing} is not a folder\n",
    )
    with pytest.raises(SystemExit) as usage:
        main(["analyze", "--input", str(export)])
    assert usage.value.code == 2
    assert capsys.readouterr().err == (
        "error: BAD_ARGUMENT: the following arguments are required: --output (see `ttlbroker analyze --help`)\n"
    )

def test_the_jvm_the_jobs_start_logs_errors_only(spark: Any) -> None:
    """The session's JVM was started by ``spark_session`` (conftest's ``spark``), as
    a job starts its own: with the quiet log4j configuration."""
    system = spark.sparkContext._jvm.java.lang.System
    assert system.getProperty("log4j2.configurationFile") == f"file:{QUIET_LOG_CONFIG}"
    root = spark.sparkContext._jvm.org.apache.logging.log4j.LogManager.getRootLogger()
    assert str(root.getLevel().toString()) == "ERROR"


def test_the_jvm_notice_is_taken_out_of_stderr_and_nothing_else(capfd: pytest.CaptureFixture[str]) -> None:
    """A process started inside ``without_jvm_notices`` (the JVM) writes its stderr
    through the copier, which drops the JVM's own notice."""
    script = ("echo 'WARNING: Using incubator modules: jdk.incubator.vector' >&2; "
              "echo '26/01/02 03:04:05 ERROR SparkContext: boom' >&2; echo 'at the end' >&2")
    with without_jvm_notices() as copier:
        subprocess.run(["sh", "-c", script], check=True, timeout=30)
    copier.join(10)
    assert not copier.is_alive()
    assert capfd.readouterr().err == "26/01/02 03:04:05 ERROR SparkContext: boom\nat the end\n"
