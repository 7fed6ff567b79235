"""natscli's habits in the ``ttlbroker`` command, part 3: ``stream rm``, ``topic
rm``, ``consumer rm``, ``purge`` and ``kv rm`` ask first when stdin is a terminal
(a real pseudo-terminal once, else a stdin that says it is one), never with
``--force``, and go ahead as before when stdin is not a terminal; ``kv rm``
removes a bucket or a key."""

from __future__ import annotations

import io
import os
import pty
import select
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import env_with_project
from helpers import BrokerThread, MainCLI


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    b = BrokerThread(Path(tmp_path_factory.mktemp("confirm-data")))
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def cli(broker: BrokerThread, capsys: pytest.CaptureFixture[str]) -> MainCLI:
    return MainCLI(capsys, broker.address)


class Terminal(io.StringIO):
    """A stdin that is a terminal, with these lines typed in it."""

    def isatty(self) -> bool:
        return True


def answer(monkeypatch: pytest.MonkeyPatch, text: str) -> Terminal:
    stdin = Terminal(text)
    monkeypatch.setattr(sys, "stdin", stdin)
    return stdin


def streams(cli: MainCLI) -> list[str]:
    return [s["name"] for s in cli.json("stream", "list")]


def test_stream_rm_asks_on_a_terminal(cli: MainCLI, monkeypatch: pytest.MonkeyPatch) -> None:
    cli("stream", "create", "keep")
    answer(monkeypatch, "n\n")
    status, out, err = cli.run("stream", "rm", "keep")
    assert (status, out) == (0, "")
    assert err == "Really delete stream keep and all its topics? [y/N] not confirmed: stream keep is left as it was\n"
    assert "keep" in streams(cli)
    for declined in ("\n", "", "no\n", "yess\n"):  # Enter, end of input, anything but y or yes
        answer(monkeypatch, declined)
        assert cli("stream", "rm", "keep") == "" and "keep" in streams(cli)
    answer(monkeypatch, "YES\n")
    assert cli("stream", "rm", "keep") == "deleted stream keep\n" and "keep" not in streams(cli)
    cli("stream", "create", "old")
    answer(monkeypatch, "y\n")
    assert cli("stream", "delete", "old") == "deleted stream old\n"  # the old name asks too


def test_force_never_asks_and_no_terminal_does_not_ask(cli: MainCLI, monkeypatch: pytest.MonkeyPatch) -> None:
    cli("stream", "create", "f1")
    cli("stream", "create", "f2")
    stdin = answer(monkeypatch, "n\n")
    status, out, err = cli.run("stream", "rm", "f1", "-f")
    assert (status, out, err) == (0, "deleted stream f1\n", "") and stdin.tell() == 0  # nothing read
    monkeypatch.setattr(sys, "stdin", io.StringIO("n\n"))  # a pipe or a file: scripts go on as before
    status, out, err = cli.run("stream", "rm", "f2")
    assert (status, out, err) == (0, "deleted stream f2\n", "")
    assert not {"f1", "f2"} & set(streams(cli))


def test_topic_consumer_purge_and_kv_questions(cli: MainCLI, monkeypatch: pytest.MonkeyPatch) -> None:
    cli("stream", "create", "q")
    cli("topic", "create", "q", "t", "--subjects", "q.>")
    cli("pub", "q.a", "x", "--count", "3")
    cli("consumer", "add", "q", "t", "c")
    cli("kv", "add", "b")
    cli("kv", "put", "b", "k", "v")
    cases = [
        (["topic", "rm", "q", "t"], "Really delete topic q/t", "topic q/t"),
        (["topic", "delete", "q", "t"], "Really delete topic q/t", "topic q/t"),
        (["consumer", "rm", "q", "t", "c"], "Really delete consumer q/t/c", "consumer q/t/c"),
        (["purge", "q", "t"], "Really purge topic q/t", "topic q/t"),
        (["purge", "q", "t", "--subject", "q.a"], "Really purge subjects q.a of topic q/t", "topic q/t"),
        (["kv", "rm", "b"], "Really delete bucket b and all its keys", "bucket b"),
        (["kv", "rm", "b", "k"], "Really delete key k of bucket b", "key k"),
    ]
    for argv, question, kept in cases:
        answer(monkeypatch, "n\n")
        assert cli.err(*argv, status=0) == f"{question}? [y/N] not confirmed: {kept} is left as it was\n", argv
    info = cli.json("topic", "info", "q", "t")[0]
    assert info["messages_count"] == 3 and [c["name"] for c in cli.json("consumer", "list", "q", "t")] == ["c"]
    assert cli("kv", "get", "b", "k") == "v\n"
    answer(monkeypatch, "y\n")
    assert cli("purge", "q", "t", "--subject", "q.a") == "purged 3 messages\n"
    answer(monkeypatch, "y\n")
    assert cli("topic", "rm", "q", "t") == "deleted topic q/t\n"
    assert cli.err("topic", "rm", "q", "t", "-f", status=1).startswith("error: TOPIC_NOT_FOUND (")


def test_kv_rm_removes_a_bucket_or_a_key(cli: MainCLI) -> None:
    cli("kv", "add", "carts")
    cli("kv", "put", "carts", "alice", "3 apples")
    cli("kv", "put", "carts", "bob", "2 pears")
    assert cli.json("kv", "rm", "carts", "alice") == [{"bucket": "carts", "key": "alice", "revision": 3, "operation": "DELETE"}]
    assert cli.err("kv", "get", "carts", "alice", status=1) == "error: MESSAGE_NOT_FOUND (6004): key 'alice' not found in bucket 'carts' (deleted)\n"
    assert cli("kv", "get", "carts", "bob") == "2 pears\n"  # the bucket stays
    assert cli("kv", "rm", "carts") == "deleted bucket carts\n"
    assert "carts" not in [b["bucket"] for b in cli.json("kv", "ls")]
    assert cli.err("kv", "get", "carts", "bob", status=1) == "error: TOPIC_NOT_FOUND (2001): no bucket 'carts'\n"
    assert cli.err("kv", "rm", "carts", status=1) == "error: TOPIC_NOT_FOUND (2001): no bucket 'carts'\n"
    assert "kv" in streams(cli)  # the buckets' stream stays
    cli("topic", "create", "kv", "plain", "--subjects", "plain.>")  # a topic of it that is no bucket
    assert cli.err("kv", "rm", "plain", status=1) == (
        "error: NOT_A_BUCKET (2011): no bucket 'plain': kv/plain is a topic that was not created as a KV bucket\n"
    )
    assert "plain" in [t["name"] for t in cli.json("topic", "list", "kv")]


def test_a_real_terminal(broker: BrokerThread) -> None:
    """``stream rm`` in a process of its own whose stdin and stderr are a
    pseudo-terminal: the question comes, ``y`` is typed, the stream goes."""
    from broker.cli import main

    assert main(["--server", broker.address, "stream", "create", "tty"]) == 0
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "broker", "--server", broker.address, "stream", "rm", "tty"],
                            stdin=slave, stderr=slave, stdout=subprocess.PIPE, env=env_with_project())
    os.close(slave)
    seen = b""
    try:
        while b"[y/N] " not in seen:
            ready, _, _ = select.select([master], [], [], 60)
            assert ready, f"no question within 60 s: {seen!r}"
            seen += os.read(master, 4096)
        os.write(master, b"y\n")
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    assert seen.endswith(b"Really delete stream tty and all its topics? [y/N] ")
    assert (proc.returncode, out) == (0, b"deleted stream tty\n")
    assert main(["--server", broker.address, "stream", "rm", "tty", "-f"]) == 1  # gone
