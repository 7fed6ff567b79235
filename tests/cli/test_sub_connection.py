"""`ttlbroker sub` when its connection goes: one line on stderr saying why and exit
status 2, or with --reconnect a line for each disconnect and reconnect and on it goes
(until it gives up)."""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import BrokerProcess, env_with_project

GOODBYE = "the broker said goodbye: the broker is shutting down"


class Sub:
    """A `ttlbroker sub` process whose stdout and stderr lines can be awaited."""

    def __init__(self, address: str, *args: str) -> None:
        cmd = [sys.executable, "-m", "broker", "sub", *args, "--server", address]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env_with_project())
        self.out: queue.Queue[str] = queue.Queue()
        self.err: queue.Queue[str] = queue.Queue()
        self.err_lines: list[str] = []
        for pipe, q in ((self.proc.stdout, self.out), (self.proc.stderr, self.err)):
            threading.Thread(target=self._pump, args=(pipe, q), daemon=True).start()

    @staticmethod
    def _pump(pipe, q: queue.Queue[str]) -> None:  # type: ignore[no-untyped-def]
        for line in pipe:
            q.put(line.rstrip("\n"))

    def stdout_line(self, timeout: float = 20) -> str:
        return self.out.get(timeout=timeout)

    def stderr_line(self, timeout: float = 20) -> str:
        line = self.err.get(timeout=timeout)
        self.err_lines.append(line)
        return line

    def wait(self, timeout: float = 30) -> int:
        code = self.proc.wait(timeout)
        while True:
            try:
                self.stderr_line(timeout=1)
            except queue.Empty:
                return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def cli(address: str, *args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "broker", *args, "--server", address], check=True, capture_output=True,
        env=env_with_project(), timeout=60,
    )


@pytest.fixture
def proc(data_dir: Path):  # type: ignore[no-untyped-def]
    p = BrokerProcess(data_dir, "--fsync", "never")
    cli(p.address, "stream", "create", "s")
    cli(p.address, "topic", "create", "s", "t", "--subjects", "t.>")
    try:
        yield p
    finally:
        if p.proc.returncode is None:
            p.stop()


def test_sub_exits_2_with_the_goodbye_when_the_broker_stops(proc: BrokerProcess) -> None:
    sub = Sub(proc.address, "t.>")
    try:
        assert sub.stderr_line() == "subscribed to t.>"
        cli(proc.address, "pub", "t.x", "hello")
        assert sub.stdout_line().endswith("t.x hello")
        proc.stop()  # SIGTERM: the broker says goodbye
        assert sub.wait() == 2
        assert sub.err_lines[1:] == [f"error: CONNECTION_LOST: {GOODBYE} (SHUTTING_DOWN 10)"]
    finally:
        sub.kill()


def test_sub_exits_2_when_the_broker_dies(proc: BrokerProcess) -> None:
    sub = Sub(proc.address, "t.>", "--json")
    try:
        # The ready line comes with --json too (on stderr, beside the JSON Lines), once
        # the broker has the subscription: the one publish after it is delivered.
        assert sub.stderr_line() == "subscribed to t.>"
        cli(proc.address, "pub", "t.x", "hello")
        assert '"payload": "hello"' in sub.stdout_line()
        proc.stop(signal.SIGKILL)  # no goodbye: the kernel closes the socket
        assert sub.wait() == 2
        assert sub.err_lines[1:] == ["error: CONNECTION_LOST: the broker closed the connection"]
    finally:
        sub.kill()


def test_sub_with_reconnect_goes_on_across_a_restart_then_gives_up(proc: BrokerProcess, data_dir: Path) -> None:
    sub = Sub(proc.address, "t.>", "--reconnect", "--max-reconnects", "3")
    again: BrokerProcess | None = None
    try:
        assert sub.stderr_line() == "subscribed to t.>"
        # The sub is paused while the broker stops and starts again, so that its three
        # attempts cannot all be spent before a slow machine has the new broker listening:
        # the goodbye waits in its socket, and the first attempt finds the new broker.
        sub.proc.send_signal(signal.SIGSTOP)
        try:
            proc.stop()
            again = BrokerProcess(data_dir, "--fsync", "never", "--port", proc.address.rsplit(":", 1)[1])
        finally:
            sub.proc.send_signal(signal.SIGCONT)
        assert sub.stderr_line() == f"disconnected: {GOODBYE} (SHUTTING_DOWN 10); reconnecting"
        assert sub.stderr_line() == f"reconnected to {proc.address} after 1 attempt; subscribed again"
        cli(again.address, "pub", "t.x", "after the restart")
        assert sub.stdout_line().endswith("t.x after the restart")
        assert sub.proc.poll() is None  # still going
        again.stop()
        assert sub.stderr_line() == f"disconnected: {GOODBYE} (SHUTTING_DOWN 10); reconnecting"
        assert sub.wait() == 2
        assert sub.err_lines[-1] == (
            f"error: CONNECTION_LOST: gave up reconnecting after 3 attempts ({GOODBYE}; the last one failed: Connection refused)"
        )
        assert len(sub.err_lines) == 5
    finally:
        sub.kill()
        if again is not None and again.proc.returncode is None:
            again.stop()
