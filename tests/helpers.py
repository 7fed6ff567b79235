"""Helpers shared by tests (import as ``from helpers import ...``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, Self, TypeVar

import trio
from conftest import env_with_project

import protocol as P

import protocol.nats as PN

T = TypeVar("T")


async def in_asyncio(fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
    """Run ``await fn(*args, **kwargs)`` on an asyncio event loop in a worker thread
    (for nats-py, an asyncio client) while the test's trio loop runs the broker; its
    result or exception comes back here. The client's tasks left running (a
    connection the scenario did not close, because it failed) get 5 s to end once
    cancelled, so a failure is reported at once rather than at the test's timeout."""
    return await trio.to_thread.run_sync(_run_asyncio, fn, args, kwargs)


async def subscribed(nc: Any) -> None:
    """Return once the server has every SUB nats-py connection ``nc`` sent so far,
    so that another connection's publish reaches them. One ``flush()`` does not
    prove it: nats-py writes a flush's PING straight to the socket, ahead of a SUB
    still in its pending buffer (``Client._send_ping``), and the PONG can come back
    before the SUB is read. By the second PING the buffer has gone out."""
    await nc.flush()
    await nc.flush()


def _run_asyncio(fn: Callable[..., Awaitable[T]], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(fn(*args, **kwargs))
    finally:
        try:
            left = asyncio.all_tasks(loop)
            for task in left:
                task.cancel()
            if left:
                loop.run_until_complete(asyncio.wait(left, timeout=5))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()


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


def server_connection(handshaken: bool) -> P.ProtocolConnection:
    """A server-side connection, fresh or past a handshake (its answer sent)."""
    conn = P.ProtocolConnection(P.Role.SERVER)
    if handshaken:
        conn.receive_data(P.encode_frame(P.Command.HANDSHAKE, 0, 1, 0, P.Handshake(P.PROTOCOL_VERSION, "", "t").encode()))
        assert isinstance(conn.next_event(), P.Request)
        conn.send_raw_response(1, P.Command.HANDSHAKE, b"")
    return conn


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

    #: What the decoder returns when it needs more bytes.
    NEED_DATA: object = P.NEED_DATA
    #: Whether a reset connection reads as the end of the stream (else it raises).
    RESET_IS_EOF = False

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.conn: Any = P.ProtocolConnection(P.Role.CLIENT)
        self.conn.state = P.State.READY  # we decode whatever comes, handshake or not
        self.eof = False

    @classmethod
    async def open(cls, address: str) -> Self:
        host, port = address.removeprefix("nats://").rsplit(":", 1)
        return cls(await trio.open_tcp_stream(host, int(port)))

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def next_event(self, timeout: float = 5) -> object:
        """The next event, or None at end of stream."""
        with trio.fail_after(timeout):
            while True:
                ev = self.conn.next_event()
                if ev is not self.NEED_DATA:
                    return ev
                try:
                    data = await self.stream.receive_some(65536)
                except trio.BrokenResourceError:
                    if not self.RESET_IS_EOF:
                        raise
                    data = b""
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


async def api_request(nc: Any, subject: str, body: dict[str, Any] | bytes) -> dict[str, Any]:
    """A JetStream API request through a nats-py connection ``nc``: ``body`` as JSON
    (or the raw bytes), the answer's JSON."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    msg = await nc.request(subject, data, timeout=5)
    return json.loads(msg.data)  # type: ignore[no-any-return]


class RawNats(RawPeer):
    """A trio TCP connection to a NATS listener that sends raw bytes and parses
    what the server sends (``protocol.NatsParser`` on the client side)."""

    NEED_DATA = PN.NATS_NEED_DATA
    RESET_IS_EOF = True

    def __init__(self, stream: trio.SocketStream) -> None:
        super().__init__(stream)
        self.conn = PN.NatsParser(server=False, max_payload=1 << 30)

    async def connect(self, **options: Any) -> dict[str, Any]:
        """Read INFO, send CONNECT with ``options`` (``verbose`` and ``pedantic`` off
        unless given, as every NATS client library sends them: the server's defaults
        are on); returns the INFO."""
        info = await self.next_event()
        assert isinstance(info, PN.NatsInfo), info
        await self.send(b"CONNECT " + json.dumps({"verbose": False, "pedantic": False, **options}).encode() + b"\r\n")
        return info.info

    async def until_closed(self, timeout: float = 5) -> list[object]:
        """Every event until the server closes the connection."""
        seen = []
        while (ev := await self.next_event(timeout)) is not None:
            seen.append(ev)
        return seen


@contextlib.contextmanager
def held_commit(monkeypatch: Any) -> Iterator[trio.Event]:
    """The group commit waits for the yielded event before each sync (acks that wait
    for durability are held until it is set)."""
    from broker.core._commit import Committer

    gate = trio.Event()
    sync_now = Committer.sync_now

    async def held(self: Committer) -> None:
        await gate.wait()
        await sync_now(self)

    monkeypatch.setattr(Committer, "sync_now", held)
    monkeypatch.setattr(Committer, "sync_if_idle", lambda self: False)  # no sync but the held one
    yield gate



def log_events(caplog: Any, event: str) -> list[dict[str, object]]:
    """The structured fields (and level) of every log line ``event`` that ``caplog``
    captured, in order."""
    return [dict(getattr(r, "fields", {}), level=r.levelname) for r in caplog.records if r.getMessage() == event]


# -- damage on disk (tests of damaged records) -------------------------------------

#: How the errors about a damaged record end (``broker.core._topics``).
REPAIR = "(`ttlbroker repair` writes the damaged record off)"


def record_spans(log: Path) -> dict[int, tuple[int, int]]:
    """Offset -> (position, total length) of every record of a ``.log`` file (read
    with the record layout: u32 length, u32 CRC-32, u64 offset, ...)."""
    raw = log.read_bytes()
    out: dict[int, tuple[int, int]] = {}
    pos = 0
    while pos + 16 <= len(raw):
        length, _, offset = struct.unpack_from("<IIQ", raw, pos)
        if not length:
            break
        out[offset] = (pos, length + 4)
        pos += length + 4
    return out


def flip_last_payload_byte(partition: Path, offset: int) -> Path:
    """Flip the last byte of the record at ``offset`` (its payload's last byte) in
    whichever segment of ``partition`` holds it; returns that ``.log`` file."""
    for log in sorted(partition.glob("*.log")):
        spans = record_spans(log)
        if offset in spans:
            pos, total = spans[offset]
            with open(log, "r+b") as f:
                f.seek(pos + total - 1)
                b = f.read(1)[0]
                f.seek(pos + total - 1)
                f.write(bytes([b ^ 0x01]))
            return log
    raise AssertionError(f"no record {offset} under {partition}")


def partition_dir(handle: Any, stream: str, topic: str) -> Path:
    """The directory of partition 0 of ``stream/topic`` of a running broker."""
    part = handle.broker.catalog.topic(P.Identifier.of(stream), P.Identifier.of(topic)).partitions[0]
    return Path(part.log.path)


class BrokerThread:
    """A broker served in a thread of this process (its own trio loop) on a free
    loopback port, for a module whose tests call the CLI's ``main([...])`` in this
    process: it starts in a fraction of a :class:`conftest.BrokerProcess`'s time
    (no interpreter to start, nothing to import again). ``stop()`` shuts it down
    gracefully."""

    def __init__(self, data_dir: Path, **changes: object) -> None:
        import threading

        from conftest import make_config

        self._config = make_config(data_dir, **{"system.partition.fsync": "never", **changes})
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="broker-thread", daemon=True)
        self._thread.start()
        if not self._ready.wait(60):
            raise RuntimeError("the broker thread did not start within 60 s")
        if self._error is not None:
            raise RuntimeError(f"the broker did not start: {self._error!r}") from self._error

    def _run(self) -> None:
        from broker import serve

        async def main() -> None:
            self._token = trio.lowlevel.current_trio_token()
            self._stop = trio.Event()
            async with trio.open_nursery() as nursery:
                self.handle = await nursery.start(lambda task_status: serve(self._config, task_status=task_status))
                self._ready.set()
                await self._stop.wait()
                nursery.cancel_scope.cancel()

        try:
            trio.run(main)
        except BaseException as exc:  # noqa: BLE001 (reported by __init__ or stop)
            self._error = exc
            self._ready.set()

    @property
    def address(self) -> str:
        return str(self.handle.address)

    def stop(self) -> None:
        if self._thread.is_alive():
            trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
            self._thread.join(30)
        if self._error is not None:
            raise self._error


class MainCLI:
    """``broker.cli.main([...])`` in this process, its output read with pytest's
    ``capsys``: ``cli(*args)`` is stdout of a command that must exit 0 (``status``
    otherwise), ``cli.err(*args, status=N)`` its stderr, ``cli.json(*args)`` the
    JSON Lines of ``--json``. With an ``address``, ``--server ADDRESS`` comes first."""

    def __init__(self, capsys: Any, address: str | None = None) -> None:
        self.capsys = capsys
        self.address = address

    def run(self, *args: str) -> tuple[int, str, str]:
        from broker.cli import main

        self.capsys.readouterr()
        status = main([*(["--server", self.address] if self.address else []), *args])
        out, err = self.capsys.readouterr()
        return status, out, err

    def __call__(self, *args: str, status: int = 0) -> str:
        got, out, err = self.run(*args)
        assert got == status, f"{args} exited {got}: {err}"
        return out

    def json(self, *args: str) -> list[Any]:
        return [json.loads(line) for line in self(*args, "--json").splitlines()]

    def err(self, *args: str, status: int) -> str:
        got, _, err = self.run(*args)
        assert got == status, f"{args} exited {got}, not {status}: {err}"
        return err
