"""Helpers shared by tests (import as ``from helpers import ...``)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio
from conftest import env_with_project

import protocol as P

T = TypeVar("T")


async def in_asyncio(fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
    """Run ``await fn(*args, **kwargs)`` on an asyncio event loop in a worker thread
    (for nats-py, an asyncio client) while the test's trio loop runs the broker; its
    result or exception comes back here."""
    return await trio.to_thread.run_sync(lambda: asyncio.run(fn(*args, **kwargs)))  # type: ignore[arg-type]


def feed_bytewise(conn: P.ProtocolConnection, data: bytes) -> list[object]:
    """Feed ``data`` one byte at a time, collecting every event."""
    events: list[object] = []
    for i in range(len(data)):
        conn.receive_data(data[i : i + 1])
        while True:
            ev = conn.next_event()
            if ev is P.NEED_DATA:
                break
            events.append(ev)
    return events


def handshaken_pair() -> tuple[P.ProtocolConnection, P.ProtocolConnection]:
    """A client and a server protocol object, back to back, past the handshake."""
    client = P.ProtocolConnection(P.Role.CLIENT)
    server = P.ProtocolConnection(P.Role.SERVER)
    server.receive_data(client.send_request(1, P.Handshake(P.PROTOCOL_VERSION, "", "t")))
    ev = server.next_event()
    assert isinstance(ev, P.Request)
    client.receive_data(server.send_response(1, P.Command.HANDSHAKE, P.HandshakeOk(P.PROTOCOL_VERSION)))
    assert isinstance(client.next_event(), P.Response)
    return client, server


def handshake_bytes(corr: int = 1, version: int = P.PROTOCOL_VERSION, token: str = "") -> bytes:
    return P.encode_frame(P.Command.HANDSHAKE, 0, corr, 0, P.Handshake(version, token, "raw").encode())


class RawPeer:
    """A trio TCP connection that sends raw bytes and decodes what comes back."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.conn = P.ProtocolConnection(P.Role.CLIENT)
        self.conn.state = P.State.READY  # we decode whatever comes, handshake or not
        self.eof = False

    @classmethod
    async def open(cls, address: str) -> RawPeer:
        host, port = address.rsplit(":", 1)
        return cls(await trio.open_tcp_stream(host, int(port)))

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def next_event(self, timeout: float = 5) -> object:
        """The next event, or None at end of stream."""
        with trio.fail_after(timeout):
            while True:
                ev = self.conn.next_event()
                if ev is not P.NEED_DATA:
                    return ev
                data = await self.stream.receive_some(65536)
                if not data:
                    self.eof = True
                    return None
                self.conn.receive_data(data)

    async def handshake(self) -> None:
        await self.send(handshake_bytes())
        ev = await self.next_event()
        assert isinstance(ev, P.Response), ev

    async def wait_closed(self, timeout: float = 5) -> list[object]:
        """Read until the broker closes the connection; returns the events seen."""
        seen = []
        while True:
            ev = await self.next_event(timeout)
            if ev is None:
                return seen
            seen.append(ev)

    async def aclose(self) -> None:
        await self.stream.aclose()


def run_cli(address: str, *args: str, stdin: bytes | None = None, check: bool = True,
            json_out: bool = False) -> subprocess.CompletedProcess[str]:
    """``python -m broker ARGS --server ADDRESS`` (``--json`` with ``json_out``), its
    output as text; an exit status other than 0 fails the test unless ``check`` is off."""
    cmd = [sys.executable, "-m", "broker", *args, "--server", address]
    if json_out:
        cmd.append("--json")
    raw = subprocess.run(cmd, input=stdin if stdin is not None else b"", capture_output=True, env=env_with_project(), timeout=60)
    p = subprocess.CompletedProcess(raw.args, raw.returncode, raw.stdout.decode(), raw.stderr.decode())
    if check and p.returncode != 0:
        raise AssertionError(f"{args} exited {p.returncode}: {p.stderr}")
    return p


def json_lines(p: subprocess.CompletedProcess[str]) -> list[Any]:
    """The JSON Lines a command printed."""
    return [json.loads(line) for line in p.stdout.splitlines() if line.strip()]


class RawNats:
    """A trio TCP connection to a NATS listener that sends raw bytes and parses
    what the server sends (``protocol.NatsParser`` on the client side)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.parser = P.NatsParser(server=False, max_payload=1 << 30)

    @classmethod
    async def open(cls, url: str) -> RawNats:
        host, port = url.removeprefix("nats://").rsplit(":", 1)
        return cls(await trio.open_tcp_stream(host, int(port)))

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def next_event(self, timeout: float = 5) -> object:
        """The next event from the server, or None at end of stream."""
        with trio.fail_after(timeout):
            while True:
                ev = self.parser.next_event()
                if ev is not P.NATS_NEED_DATA:
                    return ev
                try:
                    data = await self.stream.receive_some(65536)
                except trio.BrokenResourceError:
                    data = b""
                if not data:
                    return None
                self.parser.receive_data(data)

    async def connect(self, **options: Any) -> dict[str, Any]:
        """Read INFO, send CONNECT with ``options``; returns the INFO."""
        info = await self.next_event()
        assert isinstance(info, P.NatsInfo), info
        await self.send(b"CONNECT " + json.dumps(options).encode() + b"\r\n")
        return info.info

    async def until_closed(self, timeout: float = 5) -> list[object]:
        """Every event until the server closes the connection."""
        seen = []
        while (ev := await self.next_event(timeout)) is not None:
            seen.append(ev)
        return seen

