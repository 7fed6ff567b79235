"""Long commands: progress with rate and ETA on stderr when it is a terminal (a
pseudo-terminal here), nothing there otherwise, a final line on stdout always, and
Ctrl-C during ``pub --count`` saying how many were published."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import BrokerProcess, env_with_project, extra_missing, require

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def cli(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "broker", "--server", address, *args], capture_output=True, text=True,
                          env=env_with_project(), timeout=120)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    require(extra_missing("spark"), "the CLI's progress tests (their broker exports)")
    root = tmp_path_factory.mktemp("progress")
    (root / "data").mkdir()
    proc = BrokerProcess(root / "data", "--fsync", "never", "--export-dir", str(root / "export"))
    try:
        for args in (("stream", "create", "p"), ("topic", "create", "p", "t", "--subjects", "p.>")):
            assert cli(proc.address, *args).returncode == 0
        yield proc
    finally:
        proc.stop()


class Terminal:
    """A command whose stderr is a pseudo-terminal (stdout stays a pipe)."""

    def __init__(self, address: str, *args: str) -> None:
        master, slave = pty.openpty()
        self.master = master
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "broker", "--server", address, *args], stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=slave, env={**env_with_project(), "TERM": "xterm"},
        )
        os.close(slave)
        self.seen = b""

    def read(self, timeout: float = 30) -> bool:
        """Read what is there (waiting up to ``timeout``); False at the end."""
        ready, _, _ = select.select([self.master], [], [], timeout)
        assert ready, f"no output within {timeout} s: {self.text!r}"
        try:
            chunk = os.read(self.master, 65536)
        except OSError:  # EIO: the process closed its end
            return False
        self.seen += chunk
        return bool(chunk)

    def wait_for(self, pattern: str) -> None:
        while not re.search(pattern, self.text):
            assert self.read(), f"ended before {pattern!r}: {self.text!r}"

    def finish(self) -> tuple[int, str]:
        while self.read():
            pass
        out = self.proc.stdout.read().decode()  # type: ignore[union-attr]
        self.proc.stdout.close()  # type: ignore[union-attr]
        os.close(self.master)
        return self.proc.wait(30), out

    @property
    def text(self) -> str:
        return ANSI.sub("", self.seen.decode(errors="replace"))

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def messages_in(address: str, topic: str) -> int:
    return int(json.loads(cli(address, "--json", "topic", "info", "p", topic).stdout)["messages_count"])


def test_pub_count_prints_a_final_line_and_no_progress_into_a_pipe(broker: BrokerProcess) -> None:
    p = cli(broker.address, "pub", "p.final", "x", "--count", "5000")
    assert p.returncode == 0 and p.stderr == ""
    assert re.fullmatch(r"published 5,000 messages on p\.final in \d+\.\d s \([\d,]+ msgs/s\)\n", p.stdout), p.stdout
    summary = json.loads(cli(broker.address, "pub", "p.final", "x", "--count", "3", "--json").stdout)
    assert summary["published"] == 3 and summary["errors"] == 0 and summary["seconds"] >= 0


def test_pub_count_shows_progress_on_a_terminal(broker: BrokerProcess) -> None:
    t = Terminal(broker.address, "pub", "p.tty", "x", "--count", "20000")
    try:
        status, out = t.finish()
    finally:
        t.kill()
    assert status == 0
    assert re.search(r"publishing p\.tty .* [\d,]+/20,000 ", t.text), t.text
    assert re.fullmatch(r"published 20,000 messages on p\.tty in \d+\.\d s \([\d,]+ msgs/s\)\n", out), out


def test_ctrl_c_during_pub_count_says_how_many_were_published(broker: BrokerProcess) -> None:
    assert cli(broker.address, "topic", "create", "p", "stopped", "--subjects", "stop.>").returncode == 0
    t = Terminal(broker.address, "pub", "stop.x", "m", "--count", "100000000")
    try:
        t.wait_for(r"[\d,]+ msgs/s")  # the progress line, with a rate: messages have been acked
        t.proc.send_signal(signal.SIGINT)
        status, out = t.finish()
    finally:
        t.kill()
    assert status == 130 and out == ""
    m = re.search(r"interrupted: published ([\d,]+) of 100,000,000\r?\n", t.text)
    assert m, t.text
    published = int(m.group(1).replace(",", ""))
    assert 0 < published < 100_000_000
    assert messages_in(broker.address, "stopped") == published  # the count is exact: the batch in flight was awaited


def test_export_shows_progress_on_a_terminal_and_a_final_line(broker: BrokerProcess, tmp_path: Path) -> None:
    assert cli(broker.address, "pub", "p.exp", "x", "--count", "100").returncode == 0
    t = Terminal(broker.address, "export", "--seal")
    try:
        status, out = t.finish()
    finally:
        t.kill()
    assert status == 0 and "exporting (sealing first)" in t.text, t.text
    assert re.search(r"^exported \d+ segments? \([\d,]+ rows, [\d.]+ [KM]iB\) to .+ in \d+\.\d s \([\d,]+ rows/s\); "
                     r"\d+ sealed first, \d+ in the export$", out, re.MULTILINE), out


def test_export_error_on_a_terminal_is_one_line(tmp_path: Path) -> None:
    plain = BrokerProcess(tmp_path)  # no --export-dir
    try:
        t = Terminal(plain.address, "export")
        try:
            status, out = t.finish()
        finally:
            t.kill()
    finally:
        plain.stop()
    assert (status, out) == (1, "")
    assert "error: EXPORT_NOT_CONFIGURED (5001): the broker has no export directory" in t.text and "Traceback" not in t.text
