"""The README's five-minute tour, run as written against a real broker, so that it
cannot rot: every shell line and every complete Python program of the section
"A five-minute tour", in order, must succeed and show what the README says it shows.

The runner changes only what a test must: the broker listens on free ports instead
of 8090 (and the restore broker's 8190 and 8191), so those numbers are rewritten in
the commands; ``.venv`` is the environment running the tests; a command put in the
background with ``&`` is waited for until the broker reports its subscription (as a
reader of the README would wait for it to start) and must have ended, with output,
by the end of the tour. The ``python -m spark_export`` lines run in this process, on
the session's SparkSession (``spark_export.__main__.main`` with the same arguments;
a JVM per line would triple the test's time).
"""

from __future__ import annotations

from conftest import require_extra

require_extra("spark", "the README tour")  # before the imports it guards

import json
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
import trio
from conftest import BrokerProcess, env_with_project

from broker.client import connect

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
TIMEOUT = 480


def tour_blocks() -> list[tuple[str, str]]:
    """(language, code) of every fenced block of the tour section, in order."""
    text = (ROOT / "README.md").read_text()
    start = text.index("\n## A five-minute tour")
    end = text.find("\n## ", start + 1)
    section = text[start:end if end != -1 else None]
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^```(\w+)\n(.*?)^```", section, re.M | re.S)]


def shell_commands(code: str) -> list[str]:
    """The commands of a shell block: comments, blank lines and the ``alias`` line
    dropped, lines ending in a backslash joined."""
    out: list[str] = []
    for line in code.replace("\\\n", " ").splitlines():
        line = _strip_comment(line).strip()
        if line and not line.startswith("alias "):
            out.append(line)
    return out


def _strip_comment(line: str) -> str:
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_readme_blocks_are_found() -> None:
    blocks = tour_blocks()
    assert [lang for lang, _ in blocks].count("sh") >= 4 and any(lang == "python" for lang, _ in blocks)
    assert shell_commands("alias tb=x\n\ntb pub a 'b # c'   # note\n") == ["tb pub a 'b # c'"]


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(TIMEOUT)
def test_the_five_minute_tour(spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture[str]) -> None:
    from spark_export.__main__ import main as spark_export_main

    # The README's set-up (pip install -e) puts the console script next to the interpreter.
    assert (BIN / "ttlbroker").exists(), f"the ttlbroker console script is not installed next to {sys.executable}"
    if sys.prefix != sys.base_prefix:  # the tests run in a virtual environment: that is the README's .venv
        (tmp_path / ".venv").symlink_to(sys.prefix)
    else:
        (tmp_path / ".venv").mkdir()
        (tmp_path / ".venv" / "bin").symlink_to(BIN)
    broker = BrokerProcess(tmp_path, "--http-port", "0", "--export-dir", str(tmp_path / "export"))
    ports = {"8090": broker.address.rsplit(":", 1)[1], "8190": str(free_port()), "8191": str(free_port()),
             "4222": broker.nats_url.rsplit(":", 1)[1]}
    env = {**env_with_project(), "TTLBROKER_SERVER": broker.address, "COLUMNS": "120"}
    env.pop("TTLBROKER_TOKEN", None)
    background: list[tuple[str, subprocess.Popen[str]]] = []
    outputs: dict[str, str] = {}

    def local(cmd: str) -> str:
        cmd = re.sub(r"\b(8090|8190|8191|4222)\b", lambda m: ports[m.group(1)], cmd)
        return re.sub(r"(^|[;&|]\s*)tb ", r"\1.venv/bin/ttlbroker ", cmd)

    def subscriptions() -> int:
        p = subprocess.run([str(BIN / "ttlbroker"), "--json", "stats"], capture_output=True, text=True, env=env, cwd=tmp_path,
                           timeout=30, check=True)
        return int(json.loads(p.stdout)["subscriptions"])

    try:
        for lang, code in tour_blocks():
            if lang == "python":
                if "trio.run(" not in code and "asyncio.run(" not in code:
                    continue  # a fragment shown inside the text, not a program
                p = subprocess.run([sys.executable, "-c", local(code)], capture_output=True, text=True, env=env, cwd=tmp_path,
                                   timeout=TIMEOUT)
                assert p.returncode == 0, f"the README's Python program failed:\n{code}\n{p.stderr}"
                assert p.stdout.strip(), f"the README's Python program printed nothing:\n{code}"
                outputs[code] = p.stdout
                continue
            if lang != "sh":
                continue
            for cmd in shell_commands(code):
                words = shlex.split(local(cmd))
                if words[:3] == [".venv/bin/python", "-m", "spark_export"]:
                    monkeypatch.chdir(tmp_path)
                    capsys.readouterr()
                    status = spark_export_main(words[3:], spark=spark)
                    out, err = capsys.readouterr()
                    assert status == 0, f"`{cmd}` failed ({status}):\n{out}\n{err}"
                    outputs[cmd] = out
                    continue
                if cmd.endswith("&"):
                    cmd = local(cmd[:-1].strip())
                    before = subscriptions() if " sub " in f" {cmd} " else None
                    proc = subprocess.Popen(["bash", "-c", cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                            env=env, cwd=tmp_path)
                    background.append((cmd, proc))
                    if before is not None:
                        deadline = time.monotonic() + 60
                        while subscriptions() <= before:
                            assert proc.poll() is None, f"`{cmd}` ended early: {proc.communicate()}"
                            assert time.monotonic() < deadline, f"`{cmd}` never subscribed"
                    elif "serve" in cmd:
                        assert proc.stdout is not None
                        line = proc.stdout.readline()
                        assert line.startswith("listening on "), f"`{cmd}`: {line!r} {proc.stderr.read() if proc.stderr else ''}"
                    continue
                p = subprocess.run(["bash", "-c", local(cmd)], capture_output=True, text=True, env=env, cwd=tmp_path,
                                   timeout=TIMEOUT)
                assert p.returncode == 0, f"`{cmd}` failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"
                outputs[cmd] = p.stdout
        for cmd, proc in background:
            if "serve" in cmd:
                continue
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0 and out.strip(), f"`{cmd}` ({proc.returncode}) printed {out!r} {err!r}"
            outputs[cmd] = out
        check_restore(broker.address, f"127.0.0.1:{ports['8190']}", tmp_path / "snapshot")
    finally:
        for cmd, proc in background:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
        broker.stop()

    # What the tour says it shows.
    reads = {cmd: out for cmd, out in outputs.items() if re.search(r"\b(fetch|last|list|info|stats|next)\b", cmd)}
    for cmd, out in reads.items():
        assert out.strip(), f"`{cmd}` printed nothing"
    fetched = [out for cmd, out in outputs.items() if " fetch " in f" {cmd} "]
    assert fetched and all(len(out.splitlines()) == 5 for out in fetched), fetched
    assert any("you will see this" in out for cmd, out in outputs.items() if "sub " in cmd)
    assert any("live:" in out for out in outputs.values())


def check_restore(source: str, restored: str, snapshot: Path) -> None:
    """The restored broker holds every topic of the snapshot with the configuration
    the source topic has, and exactly the snapshot's latest live message per subject.
    A message whose TTL (the tour's ``--ttl 10s`` key) runs out around now may be
    gone already: the tour runs on the wall clock, and a loaded machine takes longer
    than 10 s from the put to here."""
    import datetime as dt

    rows = ds.dataset(str(snapshot), format="parquet", partitioning="hive").to_table().to_pylist()
    latest = {(r["stream"], r["topic"], r["subject"]): r["payload"] for r in rows}
    soon = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=30)
    may_be_gone = {(r["stream"], r["topic"], r["subject"]) for r in rows if r["expires_at"] is not None and r["expires_at"] < soon}
    topics = sorted({(stream, topic) for stream, topic, _ in latest})
    assert ("shop", "orders") in topics and ("shop", "sessions") in topics

    async def main() -> None:
        async with connect(source) as src, connect(restored) as dst:
            for stream, topic in topics:
                a, b = await src.get_topic(stream, topic), await dst.get_topic(stream, topic)
                assert (b.partitions_count, b.message_expiry, b.options) == (a.partitions_count, a.message_expiry, a.options)
                got = {}
                for p in range(b.partitions_count):
                    for m in (await dst.fetch(stream, topic, p, 1, 10_000)).messages:
                        got[(stream, topic, m.subject)] = m.payload
                want = {k: v for k, v in latest.items() if k[:2] == (stream, topic)}
                assert got == {k: v for k, v in want.items() if k in got or k not in may_be_gone}

    trio.run(main)
