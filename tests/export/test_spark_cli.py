"""``python -m spark_export`` as users run it: jobs that never destroy their input or
an output, ``load`` into an empty broker (token, TLS, ``--create-topic``), progress
and Ctrl-C, the README's export, restore and cluster commands, no FutureWarning, and
Spark tests that skip when Java is missing.

Jobs run in this process on the session's SparkSession (``main(..., spark=spark)``)
except where the subprocess is the point (the warnings a job prints, ``spark-submit``
from the virtual environment); brokers that ``load`` talks to run as subprocesses.
"""

from __future__ import annotations

from conftest import require_extra

require_extra("spark", "the export and Spark tests")  # before the imports it guards

import datetime as dt
import json
import os
import pty
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
import trio
from conftest import ROOT, BrokerProcess, env_with_project, java_missing, make_config, start_server

from broker.client import connect
from spark_export import SCHEMA
from spark_export.__main__ import main
from spark_export._inputs import MARKER_FILE, find_java

FAR = "2100-01-01T00:00:00Z"


def _rows(root: Path) -> list[dict[str, Any]]:
    return ds.dataset(str(root), format="parquet", partitioning="hive").to_table().to_pylist()


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _siblings(out: Path) -> list[str]:
    """Temporary folders a job left beside its output."""
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}."))


async def _tour_data(address: str) -> None:
    """The README tour's topics and messages."""
    async with connect(address) as c:
        await c.create_stream("shop")
        await c.create_topic("shop", "orders", partitions=3, subjects=["orders.>"])
        await c.create_topic("shop", "sessions", subjects=["session.>"], message_expiry=3600, allow_msg_ttl=True,
                             subject_delete_marker_ttl=10)
        await c.update_topic("shop", "sessions", republish={"src": "session.*", "dest": "audit.{{wildcard(1)}}"})
        await c.publish("orders.eu.42", b'{"qty": 3}', headers={"Content-Type": "application/json"})
        await c.publish("orders.us.7", b"hello")
        await c.publish_batch([("orders.eu.42", b"x")] * 50 + [(f"orders.eu.{i}", str(i).encode()) for i in range(20)])
        await c.publish("session.alice", b"logged in", headers={"Nats-TTL": "30s"})
        await c.publish("session.bob", b"logged in", headers={"Nats-TTL": "never"})
        await c.publish("session.carol", b"hi")


@pytest.fixture(scope="module")
def tour_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An export of the README tour's data (shop/orders, shop/sessions)."""
    root = tmp_path_factory.mktemp("tour")
    (root / "data").mkdir()

    async def run() -> None:
        cfg = make_config(root / "data", **{"export.dir": str(root / "export"), "system.partition.fsync": "never"})
        async with start_server(cfg) as server:
            await _tour_data(server.address)
            async with connect(server.address) as c:
                await c.export(seal=True)

    trio.run(run)
    return root / "export"


@pytest.fixture(scope="module")
def tour_snapshot(spark: Any, tour_export: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tour-snap") / "snapshot"
    assert main(["compact", "--input", str(tour_export), "--output", str(out), "--cutoff", FAR], spark=spark) == 0
    return out


def _run(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout,
                          env={**env_with_project(), **(env or {})}, cwd=str(ROOT))


# -- jobs never destroy their input or an output ------------------------------------------


@pytest.mark.parametrize("job", ["analyze", "compact"])
def test_a_job_refuses_an_output_that_is_in_or_around_its_input(job: str, tour_export: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    export = tour_export
    real = os.path.realpath(export)
    link = tmp_path / "link"
    link.symlink_to(export)
    cases = [
        (export, export, f"the output {export} is the input ({real}): write the job's output to another folder"),
        (export, export / "out", f"the output {export / 'out'} is inside the input ({real}): write the job's output outside it"),
        (export, export / "stream=shop" / "x", f"the output {export / 'stream=shop' / 'x'} is inside the input ({real}): write the job's output outside it"),
        (export, link, f"the output {link} is the input ({real}): write the job's output to another folder"),
        (export, link / "snap", f"the output {link / 'snap'} is inside the input ({real}): write the job's output outside it"),
        (link, export, f"the output {export} is the input ({real}): write the job's output to another folder"),
        (export, export.parent, f"the output {export.parent} holds the input ({real}): write the job's output to another folder"),
    ]
    before = _tree(export)
    for source, out, message in cases:
        for extra in ([], ["--overwrite"]):
            assert main([job, "--input", str(source), "--output", str(out), *extra]) == 2, (out, extra)
            assert capsys.readouterr().err.splitlines() == [f"error: {message}"]
    assert _tree(export) == before and not (export / "out").exists()


@pytest.mark.parametrize("job", ["analyze", "compact"])
def test_a_job_refuses_a_non_empty_output_without_overwrite(job: str, tour_export: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    assert main([job, "--input", str(tour_export), "--output", str(full)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: the output {full} is not empty: pass --overwrite to replace it, or choose a new folder"
    ]
    afile = tmp_path / "a-file"
    afile.write_text("mine")
    for extra in ([], ["--overwrite"]):
        assert main([job, "--input", str(tour_export), "--output", str(afile), *extra]) == 2
        assert capsys.readouterr().err.splitlines() == [f"error: the output {afile} is a file, not a folder"]
    assert (full / "keep.txt").read_text() == afile.read_text() == "mine"


def test_the_python_api_refuses_too(spark: Any, tour_export: Path) -> None:
    from spark_export._inputs import JobError
    from spark_export.jobs import analyze, compact

    with pytest.raises(JobError, match="is the input"):
        analyze(spark, str(tour_export), str(tour_export))
    with pytest.raises(JobError, match="is inside the input"):
        compact(spark, str(tour_export), str(tour_export / "snap"), overwrite=True)


def test_overwrite_swaps_the_output_in_only_after_success(spark: Any, tour_export: Path, tour_snapshot: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import spark_export.jobs as jobs

    out = tmp_path / "snap"
    args = ["compact", "--input", str(tour_export), "--output", str(out)]
    shutil.copytree(tour_snapshot, out)  # what `compact ... --cutoff FAR` wrote
    first = _tree(out)
    n = len(_rows(out))
    assert n > 0 and json.loads(first[MARKER_FILE])["cutoff"].startswith("2100-01-01")
    capsys.readouterr()

    # A job that fails halfway, and one interrupted (Ctrl-C), leave the output as it was.
    real_marker = jobs.write_marker

    def broken(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(jobs, "read_export", broken)
    with pytest.raises(OSError, match="No space left"):
        main([*args, "--cutoff", FAR, "--overwrite"], spark=spark)
    assert _tree(out) == first and _siblings(out) == []

    def interrupted(root: str, **fields: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.undo()
    monkeypatch.setattr(jobs, "write_marker", interrupted)
    capsys.readouterr()
    assert main([*args, "--cutoff", FAR, "--overwrite"], spark=spark) == 130
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"compact: interrupted after 1 of 2 steps (select); {out} is as it was before"
    )
    assert _tree(out) == first and _siblings(out) == []

    # With --overwrite, a job that succeeds replaces the whole folder.
    monkeypatch.setattr(jobs, "write_marker", real_marker)
    first_ts = min(r["timestamp"] for r in _rows(out))
    (out / "stray.txt").write_text("from before")
    cutoff = (first_ts + dt.timedelta(microseconds=1)).isoformat()
    assert main([*args, "--cutoff", cutoff, "--overwrite"], spark=spark) == 0
    after = _tree(out)
    assert "stray.txt" not in after and json.loads(after[MARKER_FILE])["cutoff"] == dt.datetime.fromisoformat(cutoff).isoformat()
    assert 0 < len(_rows(out)) < n and _siblings(out) == []
    err = capsys.readouterr().err.splitlines()
    assert re.fullmatch(rf"compact: \d+ live subject\(s\) as of \S+ in [\d.]+ s; wrote {re.escape(str(out))}", err[-1])


def test_ctrl_c_during_a_spark_job_cancels_it_and_reports_what_was_done(spark: Any, tour_export: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A real SIGINT once the first step of ``analyze`` has ended: the Spark jobs are
    cancelled (not killed mid-call by pyspark's handler), the job exits 130 saying
    which steps ended, and the output and its temporary folder are gone."""
    import spark_export.jobs as jobs

    out = tmp_path / "analysis"
    step = jobs.JobProgress.step

    def step_then_ctrl_c(self: Any, name: str, detail: str = "") -> None:
        step(self, name, detail)
        if name == "per_topic":
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(jobs.JobProgress, "step", step_then_ctrl_c)
    before = signal.getsignal(signal.SIGINT)
    try:
        assert main(["analyze", "--input", str(tour_export), "--output", str(out)], spark=spark) == 130
    finally:
        spark.sparkContext.setLogLevel("ERROR")
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == f"analyze: interrupted after 1 of 9 steps (per_topic); {out} is as it was before"
    assert not any("Traceback" in line or line.startswith("ERROR") for line in err), err
    assert not out.exists() and _siblings(out) == []
    assert signal.getsignal(signal.SIGINT) is before  # the handler is put back


def test_compact_carries_the_topics_configuration_into_the_snapshot(tour_snapshot: Path, tour_export: Path) -> None:
    from spark_export import Manifest

    marker = json.loads((tour_snapshot / MARKER_FILE).read_text())
    recorded = Manifest.load(str(tour_export), readonly=True)
    assert sorted((t["stream"], t["topic"]) for t in marker["topics"]) == [("shop", "orders"), ("shop", "sessions")]
    assert sorted(marker["topics"], key=lambda t: t["topic"]) == sorted(recorded.topics.values(), key=lambda t: t["topic"])
    sessions = next(t for t in marker["topics"] if t["topic"] == "sessions")
    assert sessions["partitions"] == 1 and sessions["message_expiry"] == 3600
    assert sessions["options"]["subject_delete_marker_ttl"] == 10 and sessions["options"]["allow_msg_ttl"] is True
    assert sessions["options"]["republish"] == {"src": "session.*", "dest": "audit.{{wildcard(1)}}", "headers_only": False}


# -- the README's cluster command (the rest of the README is tests/test_readme.py) ------------


def _readme_blocks(start: str) -> list[str]:
    """The shell blocks of the README from ``start`` to the next section."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index(start):]
    section = section[: section.index("\n## ", 1)]
    return re.findall(r"```sh\n(.*?)```", section, re.S)


def test_the_readme_cluster_command_runs_in_local_mode_without_the_venv_on_path(java: None, tour_export: Path, tmp_path: Path) -> None:
    """``.venv/bin/python -m spark_export.submit --master URL compact ...`` from a
    shell whose PATH has Java but not the virtual environment (the venv's own
    ``spark-submit`` fails there): the README's command, on local[2]. The job, in its
    own process as users run it, prints no FutureWarning (pyspark warns at every job
    under pandas 3; the spark extra pins pandas below 3) and no traceback."""
    (block,) = _readme_blocks("## Spark jobs on a cluster")
    (line,) = [w for w in block.splitlines() if w.strip()]
    words = shlex.split(line)
    assert words[:3] == [".venv/bin/python", "-m", "spark_export.submit"]
    out = tmp_path / "snapshot"
    swap = {"spark://host:7077": "local[2]", "/nfs/export": str(tour_export), "/nfs/snapshot": str(out)}
    words = [swap.get(w, w) for w in words]
    env = {
        "PATH": os.pathsep.join([os.path.dirname(find_java()), "/usr/bin", "/bin"]),
        "SPARK_HOME": "", "PYSPARK_PYTHON": "", "PYSPARK_DRIVER_PYTHON": "", "VIRTUAL_ENV": "",
    }
    env_all = {k: v for k, v in {**env_with_project(), **env}.items() if v != ""}
    assert os.path.dirname(sys.executable) not in env_all["PATH"].split(os.pathsep)
    p = subprocess.run([sys.executable, *words[1:]], capture_output=True, text=True, timeout=300, env=env_all, cwd=str(ROOT))
    both = p.stdout + p.stderr  # spark-submit merges the driver's stderr into its stdout
    assert p.returncode == 0, both
    assert "FutureWarning" not in both and "Traceback" not in both
    assert "spark: " in both and " on local[2]" in both
    assert re.search(rf"^compact: [\d,]+ live subject\(s\) as of \S+ in [\d.]+ s; wrote {re.escape(str(out))}$", both, re.M)
    assert json.loads((out / MARKER_FILE).read_text())["kind"] == "compacted" and _rows(out)


def test_submit_errors_are_one_line(tmp_path: Path) -> None:
    p = _run("-m", "spark_export.submit", "--master", "local[1]", "--name", "compact")
    assert p.returncode == 2
    assert p.stderr.splitlines() == [
        "error: name the job, analyze or compact, after spark-submit's options "
        "(usage: python -m spark_export.submit [SPARK-SUBMIT OPTIONS] analyze|compact [JOB OPTIONS])"
    ]
    p = _run("-m", "spark_export.submit", "analyze", "--input", "x", "--output", "y",
             env={"PATH": str(tmp_path), "JAVA_HOME": ""})
    assert p.returncode == 2
    assert p.stderr.splitlines() == ["error: Spark needs Java 17 or newer: no `java` on PATH and JAVA_HOME is not set"]


# -- Java, and the Spark tests without it ------------------------------------------------


def _fake_java(home: Path, script: str) -> Path:
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text("#!/bin/sh\n" + script + "\n")
    java.chmod(0o755)
    return java


def test_the_spark_tests_skip_with_the_reason_when_java_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check behind the ``java`` fixture (which every Spark test depends on),
    with PATH and JAVA_HOME pointing nowhere, at no Java, at an old one, at a stub."""
    nowhere = tmp_path / "nowhere"
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    assert java_missing() == "Spark tests need Java: Spark needs Java 17 or newer: no `java` on PATH and JAVA_HOME is not set"
    monkeypatch.setenv("JAVA_HOME", str(nowhere))
    assert java_missing() == (
        f"Spark tests need Java: Spark needs Java 17 or newer: JAVA_HOME is {nowhere}, which has no bin/java "
        "(point JAVA_HOME at a Java installation, or unset it to use `java` from PATH)"
    )
    old = _fake_java(tmp_path / "jdk8", """echo 'openjdk version "1.8.0_392"' >&2""")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk8"))
    assert java_missing() == f"Spark tests need Java: Spark needs Java 17 or newer: {old} is Java 8"
    stub = _fake_java(tmp_path / "stub", "echo 'The operation couldn’t be completed. Unable to locate a Java Runtime.' >&2; exit 1")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "stub"))
    assert java_missing() == (
        f"Spark tests need Java: Spark needs Java 17 or newer: {stub} -version fails: "
        "The operation couldn’t be completed. Unable to locate a Java Runtime."
    )
    _fake_java(tmp_path / "jdk21", """echo 'openjdk version "21.0.2" 2024-01-16' >&2""")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk21"))
    assert java_missing() is None
    # A JAVA_HOME set (even to a usable Java) wins over PATH, as in Spark's launcher.
    monkeypatch.setenv("PATH", os.environ.get("PATH", "") + os.pathsep + "/usr/bin")
    monkeypatch.setenv("JAVA_HOME", str(nowhere))
    assert java_missing() is not None and "JAVA_HOME is" in java_missing()  # type: ignore[operator]


def test_without_java_a_spark_test_is_skipped_with_the_reason_and_fails_under_ci(tmp_path: Path) -> None:
    """A Spark test run where no Java can be found: skipped, saying why (and why not
    failed); with ``CI`` set, failed instead."""
    test = "tests/export/test_spark_jobs.py::test_analyze_matches_a_plain_python_reference"
    env = {k: v for k, v in env_with_project().items() if k not in ("JAVA_HOME", "CI")}
    env["PATH"] = str(tmp_path)  # no java there
    args = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", test]
    p = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env, cwd=str(ROOT))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "1 skipped" in p.stdout
    assert "Spark tests need Java: Spark needs Java 17 or newer: no `java` on PATH and JAVA_HOME is not set" in p.stdout
    p = subprocess.run(args, capture_output=True, text=True, timeout=120, env={**env, "CI": "true"}, cwd=str(ROOT))
    assert p.returncode == 1 and "1 error" in p.stdout
    assert "JAVA_HOME is not set (CI must run the Spark tests)" in p.stdout


# -- load: token, TLS, --create-topic ----------------------------------------------------------


class _Done:
    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture
def _load(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Any:
    """``python -m spark_export load ARGS`` in this process, with ``env`` set."""

    def run(*args: str, env: dict[str, str] | None = None) -> _Done:
        with monkeypatch.context() as m:
            for k, v in (env or {}).items():
                m.setenv(k, v)
            capsys.readouterr()
            code = main(["load", *args])
            got = capsys.readouterr()
        return _Done(code, got.out, got.err)

    return run


@pytest.fixture
def restore_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    (tmp_path / "restore").mkdir()
    b = BrokerProcess(tmp_path / "restore", "--fsync", "never")
    try:
        yield b
    finally:
        b.stop()


def test_load_without_create_topic_into_an_empty_broker_says_what_to_do(tour_snapshot: Path, restore_broker: BrokerProcess, _load: Any) -> None:
    p = _load("--input", str(tour_snapshot), "--server", restore_broker.address)
    assert p.returncode == 2
    assert p.stderr.splitlines() == ["error: no stream shop on the broker: create it and the topic first, or pass --create-topic"]


def test_load_create_topic_refusals(tour_snapshot: Path, tour_export: Path, restore_broker: BrokerProcess, tmp_path: Path, _load: Any) -> None:
    addr = restore_broker.address
    p = _load("--input", str(tour_export), "--server", addr, "--create-topic")
    assert p.returncode == 2 and p.stderr.splitlines() == [
        f"error: {tour_export} is not a snapshot: load takes the output of `python -m spark_export compact` "
        "(an export also holds removed messages and markers)"
    ]
    p = _load("--input", str(tour_snapshot), "--server", addr, "--create-topic", "--stream", "r", "--topic", "all")
    assert p.returncode == 2 and p.stderr.splitlines() == [
        "error: --create-topic: shop/orders, shop/sessions would all load into r/all, which can be created with one "
        "configuration only: pick one with --source STREAM/TOPIC"
    ]
    p = _load("--input", str(tour_snapshot), "--server", addr, "--source", "shop/nope")
    assert p.returncode == 2 and p.stderr.splitlines() == [
        "error: the snapshot holds no topic shop/nope (it holds shop/orders, shop/sessions)"
    ]
    # One topic under another name, then again: the topic exists now.
    args = ["--input", str(tour_snapshot), "--server", addr, "--source", "shop/orders", "--stream", "r", "--topic", "o", "--create-topic"]
    p = _load(*args)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["created"] == ["r", "r/o"]
    p = _load(*args)
    assert p.returncode == 2 and p.stderr.splitlines() == [
        "error: --create-topic: topic r/o exists already: load into it without --create-topic, or name another --topic"
    ]
    # A snapshot made before topic configurations were recorded.
    old = tmp_path / "old-snapshot"
    old.mkdir()
    for f in tour_snapshot.rglob("*"):
        if f.is_file():
            (old / f.relative_to(tour_snapshot)).parent.mkdir(parents=True, exist_ok=True)
            (old / f.relative_to(tour_snapshot)).write_bytes(f.read_bytes())
    marker = json.loads((old / MARKER_FILE).read_text())
    del marker["topics"]
    (old / MARKER_FILE).write_text(json.dumps(marker))
    p = _load("--input", str(old), "--server", addr, "--source", "shop/sessions", "--stream", "r", "--create-topic")
    assert p.returncode == 2 and p.stderr.splitlines() == [
        "error: --create-topic: the snapshot does not record the configuration of shop/sessions (exported before "
        "ttlbroker recorded it): create r/sessions yourself and load without --create-topic"
    ]


def test_load_with_a_token_from_the_environment_and_tls(tour_snapshot: Path, tmp_path: Path, _load: Any) -> None:
    trustme = pytest.importorskip("trustme")
    from broker.client import tls_context
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    paths = {name: tmp_path / f"{name}.pem" for name in ("ca", "cert", "key", "client")}
    ca.cert_pem.write_to_path(str(paths["ca"]))
    for blob in leaf.cert_chain_pems:
        blob.write_to_path(str(paths["cert"]), append=True)
    leaf.private_key_pem.write_to_path(str(paths["key"]))
    ca.issue_cert("loader@example.com").private_key_and_cert_chain_pem.write_to_path(str(paths["client"]))
    config = tmp_path / "broker.toml"
    config.write_text(
        f'[server]\nauth_token = "s3cret"\ntls_cert = "{paths["cert"]}"\ntls_key = "{paths["key"]}"\ntls_ca = "{paths["ca"]}"\n'
    )
    (tmp_path / "data").mkdir()
    b = BrokerProcess(tmp_path / "data", "--fsync", "never", config_file=config)
    try:
        base = ["--input", str(tour_snapshot), "--server", b.address, "--source", "shop/orders", "--create-topic"]
        tls = ["--tls-ca", str(paths["ca"]), "--tls-cert", str(paths["client"])]
        p = _load(*base, env={"TTLBROKER_TOKEN": "s3cret"})  # no TLS
        assert p.returncode == 2 and len(p.stderr.splitlines()) == 1 and p.stderr.startswith("error: ")
        p = _load(*base, *tls, env={"TTLBROKER_TOKEN": "wrong"})
        assert p.returncode == 2 and p.stderr.startswith("error: UNAUTHORIZED") and len(p.stderr.splitlines()) == 1
        p = _load(*base, "--tls-key", str(paths["key"]), env={"TTLBROKER_TOKEN": "s3cret"})
        assert p.returncode == 2 and p.stderr.splitlines() == ["error: --tls-key needs --tls-cert"]
        p = _load(*base, *tls, env={"TTLBROKER_TOKEN": "s3cret"})
        assert p.returncode == 0, p.stderr
        expected = {r["subject"] for r in _rows(tour_snapshot) if r["topic"] == "orders"}
        assert json.loads(p.stdout)["published"] == len(expected)
        p = _load(*base[:-1], "--stream", "shop", "--topic", "orders", *tls, "--token", "s3cret")  # the option too
        assert p.returncode == 0, p.stderr

        async def count() -> int:
            async with connect(b.address, token="s3cret", tls=tls_context(str(paths["ca"]), str(paths["client"]))) as c:
                return (await c.get_topic("shop", "orders")).messages_count

        assert trio.run(count) == 2 * len(expected)
    finally:
        b.stop()


# -- progress and Ctrl-C ---------------------------------------------------------------------


def _bulk_snapshot(root: Path, rows: int) -> Path:
    """A snapshot of ``rows`` messages on one topic, written with pyarrow."""
    part = root / "stream=bulk" / "topic=data" / "partition=0"
    part.mkdir(parents=True)
    now_ns = time.time_ns()
    cols = {
        "offset": list(range(1, rows + 1)), "timestamp": [now_ns // 1000] * rows, "timestamp_ns": [now_ns] * rows,
        "subject": [f"bulk.{i}" for i in range(rows)], "headers": [[] for _ in range(rows)],
        "payload": [b"x" * 16] * rows, "ttl_seconds": [None] * rows, "ttl_never": [False] * rows,
        "expires_at": [None] * rows, "is_marker": [False] * rows, "marker_reason": [None] * rows,
        "removed": [False] * rows, "removed_reason": [None] * rows,
    }
    pq.write_table(pa.table(cols, schema=SCHEMA), str(part / f"1-{rows}.parquet"))
    topic = {"stream": "bulk", "topic": "data", "generation": 1, "partitions": 1, "message_expiry": 0,
             "options": {"subjects": ["bulk.>"]}}
    (root / MARKER_FILE).write_text(json.dumps({"schema_version": 1, "kind": "compacted", "topics": [topic]}))
    return root


def test_load_shows_progress_on_a_terminal_and_a_count_line_always(tmp_path: Path, restore_broker: BrokerProcess) -> None:
    snap = _bulk_snapshot(tmp_path / "snap", 20_000)
    args = [sys.executable, "-m", "spark_export", "load", "--input", str(snap), "--server", restore_broker.address]
    # Not a terminal: no bar, the count line.
    p = subprocess.run([*args, "--create-topic"], capture_output=True, text=True, timeout=120, env=env_with_project())
    assert p.returncode == 0, p.stderr
    assert p.stderr.splitlines()[:2] == ["load: created bulk", "load: created bulk/data"]
    assert re.fullmatch(r"load: 20,000 published, 0 refused, 0 skipped \(expired\) in [\d.]+ s", p.stderr.splitlines()[-1])
    # stderr a terminal: rich's bar with the rate and ETA, then the same count line.
    leader, follower = pty.openpty()
    proc = subprocess.Popen([*args, "--stream", "bulk", "--topic", "data"], stdout=subprocess.PIPE, stderr=follower,
                            env={**env_with_project(), "TERM": "xterm", "COLUMNS": "120"})
    os.close(follower)
    seen = b""
    while True:
        ready, _, _ = select.select([leader], [], [], 60)
        if not ready:
            break
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    assert proc.wait(60) == 0
    text = re.sub(rb"\x1b\[[0-9;?]*[A-Za-z]", b"", seen).decode(errors="replace")
    assert "load" in text and "20,000" in text and "msg/s" in text and "eta" in text, text
    assert re.search(r"load: 20,000 published, 0 refused, 0 skipped \(expired\) in [\d.]+ s", text)


def test_ctrl_c_during_load_reports_what_was_published(tmp_path: Path, restore_broker: BrokerProcess) -> None:
    total = 300_000
    snap = _bulk_snapshot(tmp_path / "snap", total)

    async def ctrl_c_once_publishing() -> subprocess.Popen[str]:
        """Start the load and interrupt it when its first message arrives (a core
        subscription sees it as it is stored: no polling)."""
        async with connect(restore_broker.address) as c, await c.subscribe("bulk.>") as sub:
            proc = subprocess.Popen(
                [sys.executable, "-m", "spark_export", "load", "--input", str(snap), "--server", restore_broker.address,
                 "--create-topic"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env_with_project(),
            )
            with trio.fail_after(60):
                async for _ in sub:
                    break
            proc.send_signal(signal.SIGINT)
            return proc

    async def stored() -> int:
        async with connect(restore_broker.address) as c:
            return (await c.get_topic("bulk", "data")).messages_count

    proc = trio.run(ctrl_c_once_publishing)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    last = err.splitlines()[-1]
    m = re.fullmatch(
        r"load: interrupted after ([\d,]+) of 300,000 messages published into bulk/data \(0 refused\); "
        r"batches in flight at that moment may have been stored too", last,
    )
    assert m, err
    published = int(m.group(1).replace(",", ""))
    assert 0 < published < total and trio.run(stored) >= published
    assert "Traceback" not in err and out == ""
