"""No client can stop the broker, and connections cost bounded memory.

Real brokers on loopback sockets. Misbehaving peers are raw sockets (``RawPeer``, or
plain trio sockets where a test needs SO_LINGER or a small receive buffer); the
well-behaved ones are the bundled client. Timeouts and delays run on trio's
``autojump_clock``; the slow-consumer tests use small configured limits instead,
since they need real bytes to pile up in real socket buffers.
"""

from __future__ import annotations

import logging
import random
import re
import socket
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trio
from conftest import make_config, start_server
from helpers import RawPeer, handshake_bytes

import protocol as P
import storage
from storage import _files
from broker.net._limits import FailureThrottle, OutputBudget, sweep
from broker.net import Transport
from broker.client import Client, ConnectionClosedError, connect
from broker.server import ServerHandle

# -- helpers --------------------------------------------------------------------------


def _frame(cmd: P.Command, corr: int, payload: bytes = b"") -> bytes:
    return P.encode_frame(cmd, 0, corr, 0, payload)


PING = _frame(P.Command.PING, 7)


async def open_raw(address: str, rcvbuf: int | None = None) -> trio.SocketStream:
    host, port = address.rsplit(":", 1)
    sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_STREAM)
    if rcvbuf is not None:  # before connect, so the window is small from the start
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    await sock.connect((host, int(port)))
    return trio.SocketStream(sock)


async def _send(stream: trio.SocketStream, data: bytes) -> None:
    """Send, ignoring that the broker may already have closed (the point of a test)."""
    try:
        await stream.send_all(data)
    except trio.BrokenResourceError:
        pass


async def reset(stream: trio.SocketStream) -> None:
    """Close with SO_LINGER 0: the peer gets a RST, whatever is queued is lost."""
    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    await stream.aclose()


def log_events(caplog: pytest.LogCaptureFixture, event: str) -> list[dict[str, object]]:
    return [dict(getattr(r, "fields", {}), level=r.levelname) for r in caplog.records if r.getMessage() == event]


async def assert_healthy(address: str) -> None:
    async with connect(address) as c:
        assert await c.ping() >= 0


# -- the reproduction ---------------------------------------------------------


async def test_pipelined_pings_then_reset_does_not_stop_the_broker(server: ServerHandle, client: Client) -> None:
    """20,000 pipelined PINGs then a close without reading, before
    and after a handshake; the broker used to exit with an ExceptionGroup."""
    for with_handshake in (False, True, False, True):
        s = await open_raw(server.address)
        await _send(s, (handshake_bytes() if with_handshake else b"") + PING * 20_000)
        await reset(s)
    with trio.fail_after(10):
        while (await client.stats())["connections"] > 1:
            await trio.sleep(0.01)
    stats = await client.stats()
    assert stats["connections_failed"] == 4
    assert stats["queued_bytes"] < 1024  # everything the dead connections queued was released
    await assert_healthy(server.address)


# -- the storm -------------------------------------------------------------------------

STORM_CONNECTIONS = 3_000
STORM_CONCURRENCY = 48


async def _reset_with_replies_queued(address: str, rng: random.Random) -> None:
    s = await open_raw(address)
    await _send(s, handshake_bytes() + PING * rng.randint(1, 600))
    if rng.random() < 0.5:
        await trio.sleep(0)
    await reset(s)


async def _close_mid_frame(address: str, rng: random.Random) -> None:
    s = await open_raw(address)
    body = P.Publish.from_bodies([P.encode_body("orders.storm", b"x" * 200)]).encode()
    frame = _frame(P.Command.PUBLISH, 3, body)
    await _send(s, handshake_bytes() + frame[: rng.randint(1, len(frame) - 1)])
    await (reset(s) if rng.random() < 0.5 else s.aclose())


async def _close_mid_handshake(address: str, rng: random.Random) -> None:
    s = await open_raw(address)
    hs = handshake_bytes()
    await _send(s, hs[: rng.randint(1, len(hs) - 1)])
    await (reset(s) if rng.random() < 0.5 else s.aclose())


async def _pings_without_handshake(address: str, rng: random.Random) -> None:
    s = await open_raw(address)
    await _send(s, PING * rng.choice((1, 100, 20_000)))
    await (reset(s) if rng.random() < 0.5 else s.aclose())


async def _garbage(address: str, rng: random.Random) -> None:
    s = await open_raw(address)
    junk = rng.choice([b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", rng.randbytes(rng.randint(1, 3000)), b"\xff" * 64])
    await _send(s, (handshake_bytes() if rng.random() < 0.5 else b"") + junk)
    await (reset(s) if rng.random() < 0.5 else s.aclose())


async def _oversized_frame(address: str, rng: random.Random) -> None:
    s = await open_raw(address)
    header = P.FRAME_HEADER.pack(rng.choice((50_000, 100_000_000)), P.Command.PUBLISH, 0, 9, 0)  # type: ignore[attr-defined]
    await _send(s, (handshake_bytes() if rng.random() < 0.5 else b"") + header)
    await (reset(s) if rng.random() < 0.5 else s.aclose())


async def _subscribe_then_reset(address: str, rng: random.Random) -> None:
    s = await open_raw(address, rcvbuf=4096)
    await _send(s, handshake_bytes() + _frame(P.Command.SUBSCRIBE, 2, P.Subscribe(1, "orders.>").encode()))
    await trio.sleep(rng.random() * 0.01)  # deliveries pile up unread
    await reset(s)


async def _silent(address: str, rng: random.Random) -> None:
    s = await open_raw(address)
    await s.aclose()


MISBEHAVIOURS: list[Callable[[str, random.Random], Awaitable[None]]] = [
    _reset_with_replies_queued,
    _close_mid_frame,
    _close_mid_handshake,
    _pings_without_handshake,
    _garbage,
    _oversized_frame,
    _subscribe_then_reset,
]


async def _well_behaved(address: str, n: int, done: trio.Event, results: list[tuple[int, int, bytes]]) -> None:
    """Publish and fetch back until the storm is over; every ack and every fetched
    message must be right."""
    async with connect(address) as c:
        sub = await c.subscribe(f"orders.good{n}.>")
        i = 0
        while not done.is_set() or i < 20:
            batch = [(f"orders.good{n}.{i}.{j}", f"{n}:{i}:{j}".encode()) for j in range(5)]
            acks = await c.publish_batch(batch)
            assert acks is not None
            acks.raise_for_errors()
            for ack, (_, payload) in zip(acks, batch):
                page = await c.fetch("shop", "orders", ack.partition, ack.offset, 1)
                assert [m.payload for m in page.messages] == [payload]
                results.append((ack.partition, ack.offset, payload))
            for _ in batch:
                m = await sub.next(timeout=10)
                assert m.subject.startswith(f"orders.good{n}.")
            i += 1


async def test_storm_of_misbehaving_connections(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, **{"system.partition.fsync": "never"})
    rng = random.Random(10)
    kinds = [rng.choice(MISBEHAVIOURS) for _ in range(STORM_CONNECTIONS)]
    silent = 200
    async with start_server(cfg) as h, connect(h.address) as admin:
        await admin.create_stream("shop")
        await admin.create_topic("shop", "orders", partitions=3, subjects=["orders.>"])
        done = trio.Event()
        results: list[tuple[int, int, bytes]] = []
        limiter = trio.CapacityLimiter(STORM_CONCURRENCY)

        async def one(kind: Callable[[str, random.Random], Awaitable[None]], seed: int) -> None:
            async with limiter:
                await kind(h.address, random.Random(seed))

        with trio.fail_after(60):
            async with trio.open_nursery() as good:
                for n in range(4):
                    good.start_soon(_well_behaved, h.address, n, done, results)
                async with trio.open_nursery() as storm:
                    for seed, kind in enumerate(kinds + [_silent] * silent):
                        storm.start_soon(one, kind, seed)
                done.set()
            while (await admin.stats())["connections"] > 1:
                await trio.sleep(0.01)
        stats = await admin.stats()
        # Every misbehaving connection failed, once; the silent ones just closed.
        assert stats["connections_failed"] == STORM_CONNECTIONS
        assert stats["connections_total"] == STORM_CONNECTIONS + silent + 5
        assert stats["handshake_timeouts"] == stats["slow_consumers"] == stats["auth_failures"] == 0
        assert stats["queued_bytes"] < 1024
        # The well-behaved clients got every ack and every message, and still do.
        assert len(results) >= 4 * 20 * 5
        for partition, offset, payload in results:
            page = await admin.fetch("shop", "orders", partition, offset, 1)
            assert [m.payload for m in page.messages] == [payload]
        await assert_healthy(h.address)


# -- before the handshake --------------------------------------------------------------


async def test_a_request_before_the_handshake_is_refused_and_closes(server: ServerHandle, client: Client) -> None:
    for frame, code, message in [
        (PING, P.ErrorCode.HANDSHAKE_REQUIRED, "PING sent before the handshake"),
        (_frame(P.Command.PUBLISH, 7, b"\x00" * 5), P.ErrorCode.HANDSHAKE_REQUIRED, "PUBLISH sent before the handshake"),
        (P.encode_frame(4321, 0, 7, 0, b"??"), P.ErrorCode.UNKNOWN_COMMAND, "unknown command code 4321"),
    ]:
        raw = await RawPeer.open(server.address)
        await raw.send(frame + handshake_bytes())  # a handshake after it is not read
        events = await raw.wait_closed()
        assert len(events) == 1, events
        (err,) = events
        assert isinstance(err, P.ErrorResponse) and err.correlation_id == 7
        assert err.error.code == code and err.error.message == message
    stats = await client.stats()
    assert stats["connections_failed"] == 3 and stats["request_errors"] == 3


async def test_a_large_frame_before_the_handshake_is_refused(server: ServerHandle, client: Client) -> None:
    raw = await RawPeer.open(server.address)
    await raw.send(P.FRAME_HEADER.pack(50_000, P.Command.HANDSHAKE, 0, 1, 0) + b"TTLB" + b"\x00" * 2000)  # type: ignore[attr-defined]
    events = await raw.wait_closed()
    (bye,) = events
    assert isinstance(bye, P.Push) and bye.kind == P.PushKind.GOODBYE
    assert bye.status == P.ErrorCode.FRAME_TOO_LARGE
    assert bye.value.reason == "a frame before the handshake may be at most 1100 bytes"  # type: ignore[attr-defined]
    assert (await client.stats())["connections_failed"] == 1


async def test_handshake_timeout(tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="broker")
    cfg = make_config(tmp_path, **{"system.partition.fsync": "never"})
    async with start_server(cfg) as h:
        idle = await RawPeer.open(h.address)
        slow = await RawPeer.open(h.address)
        start = trio.current_time()
        await trio.sleep(4.5)
        await slow.handshake()  # in time: it stays
        events = await idle.wait_closed(timeout=10)
        assert 5.0 <= trio.current_time() - start < 5.5
        (bye,) = events
        assert isinstance(bye, P.Push) and bye.kind == P.PushKind.GOODBYE
        assert bye.status == P.ErrorCode.HANDSHAKE_TIMEOUT == 14
        assert bye.value.reason == "no handshake within 5 s"  # type: ignore[attr-defined]
        await trio.sleep(60)
        await slow.send(PING)
        assert isinstance(await slow.next_event(), P.Response)
        async with connect(h.address, timeout=None) as c:
            stats = await c.stats()
        assert stats["handshake_timeouts"] == 1 and stats["connections_failed"] == 0
    (logged,) = log_events(caplog, "handshake_timeout")
    assert logged["level"] == "INFO" and str(logged["peer"]).startswith("127.0.0.1:") and logged["seconds"] == 5.0


async def test_the_client_reports_a_handshake_timeout(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    cfg = make_config(tmp_path, **{"system.partition.fsync": "never", "limits.handshake_timeout": "250ms"})
    async with start_server(cfg) as h:
        raw = await RawPeer.open(h.address)
        await raw.send(handshake_bytes()[:10])  # half a handshake, then nothing
        events = await raw.wait_closed()
        assert [(e.kind, e.status, e.value.reason) for e in events] == [  # type: ignore[attr-defined]
            (P.PushKind.GOODBYE, 14, "no handshake within 0.25 s")
        ]


async def test_at_the_limit_a_new_connection_replaces_one_that_has_not_handshaken(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    cfg = make_config(tmp_path, **{"system.partition.fsync": "never", "limits.max_connections": 3})
    async with start_server(cfg) as h, connect(h.address, timeout=None) as admin:
        oldest = await RawPeer.open(h.address)
        await trio.sleep(0.5)
        younger = await RawPeer.open(h.address)
        await trio.sleep(0.2)
        with pytest.raises(P.TooManyConnectionsError):  # type: ignore[attr-defined]
            async with connect(h.address, timeout=None):  # nobody has waited a second yet
                pass
        await trio.sleep(0.4)
        async with connect(h.address, timeout=None) as newcomer:  # takes the oldest idle one's place
            await newcomer.ping()
            (bye,) = await oldest.wait_closed()
            assert isinstance(bye, P.Push) and bye.kind == P.PushKind.GOODBYE
            assert bye.status == P.ErrorCode.TOO_MANY_CONNECTIONS
            assert bye.value.reason == "the broker is at its limit of 3 connections and this one has not handshaken"  # type: ignore[attr-defined]
            await trio.sleep(0.5)
            async with connect(h.address, timeout=None) as another:  # then the younger one's
                await another.ping()
                assert len(await younger.wait_closed()) == 1
                with pytest.raises(P.TooManyConnectionsError) as info:  # type: ignore[attr-defined]
                    async with connect(h.address, timeout=None):  # every connection has handshaken
                        pass
                assert info.value.message == "the broker is at its limit of 3 connections"
                await admin.ping()
        stats = await admin.stats()
        assert stats["connections_refused"] == 4 and stats["connections_failed"] == 0


# -- failed handshakes ----------------------------------------------------------------


async def _timed_connect(address: str, token: str) -> tuple[float, BaseException | None]:
    start = trio.current_time()
    try:
        async with connect(address, token=token, timeout=None) as c:
            await c.ping()
    except (P.BrokerError, ConnectionClosedError) as exc:
        return trio.current_time() - start, exc
    return trio.current_time() - start, None


async def test_failed_handshakes_are_delayed_counted_and_logged_rate_limited(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="broker")
    cfg = make_config(
        tmp_path,
        **{"system.partition.fsync": "never", "server.auth_token": "s3cret-tøken", "limits.auth_failure_delay_max": "3s"},
    )
    async with start_server(cfg) as h:
        delays = []
        for token in ["wrong", "", "s3cret-tøke", "s3cret-tøken!", "S3CRET-TØKEN"]:
            elapsed, err = await _timed_connect(h.address, token)
            assert isinstance(err, P.UnauthorizedError)  # type: ignore[attr-defined]
            assert err.code == 8 and err.message == "the auth token is missing or wrong"
            delays.append(elapsed)
        assert delays == [0.5, 1.0, 2.0, 3.0, 3.0]  # doubling per failure of the host, capped
        elapsed, err = await _timed_connect(h.address, "s3cret-tøken")
        assert err is None and elapsed == 0  # the right token is never delayed
        raw = await RawPeer.open(h.address)
        start = trio.current_time()
        await raw.send(handshake_bytes(version=9, token="s3cret-tøken"))
        (refused,) = await raw.wait_closed()
        assert trio.current_time() - start == 3.0
        assert isinstance(refused, P.ErrorResponse) and refused.error.code == P.ErrorCode.UNSUPPORTED_VERSION
        assert refused.error.message == "this broker speaks protocol version 1, the client asked for 9"
        await trio.sleep(61)  # a minute without failures: the host starts again at the base delay
        elapsed, err = await _timed_connect(h.address, "nope")
        assert isinstance(err, P.UnauthorizedError) and elapsed == 0.5  # type: ignore[attr-defined]
        async with connect(h.address, token="s3cret-tøken", timeout=None) as c:
            stats = await c.stats()
        assert stats["auth_failures"] == 6
        assert stats["connections_failed"] == 1  # the wrong version
    # Logged at most once per host per 10 s: the first failure, then (a minute later)
    # the next, saying how many lines were left out in between (4 tokens, 1 version).
    logged = log_events(caplog, "handshake_failed")
    assert [(e["level"], e["code"], e["delay_seconds"], e["suppressed"]) for e in logged] == [
        ("WARNING", "UNAUTHORIZED", 0.5, 0), ("WARNING", "UNAUTHORIZED", 0.5, 5),
    ]
    assert all(str(e["peer"]).startswith("127.0.0.1:") for e in logged)


async def test_no_token_configured_accepts_any_token(server: ServerHandle) -> None:
    async with connect(server.address, token="anything") as c:
        assert c.server_info["auth_required"] is False


def test_failure_throttle_is_per_host_and_bounded() -> None:
    t = FailureThrottle(0.25, 4.0)
    assert [t.failure("a", 0.0) for _ in range(6)] == [0.25, 0.5, 1.0, 2.0, 4.0, 4.0]
    assert t.failure("b", 0.0) == 0.25
    assert t.failure("a", 100.0) == 0.25  # forgotten after a quiet minute
    for i in range(20_000):
        t.failure(f"h{i}", 1.0)
    assert len(t._hosts) == 10_000
    assert FailureThrottle(0, 4.0).failure("a", 0.0) == 0


# -- slow consumers and the output budget ------------------------------------------------

_SLOW_LIMITS = {
    "system.partition.fsync": "never",
    "limits.max_frame_bytes": "1 MiB",
    "limits.max_payload_bytes": "256 KiB",
    "limits.max_pending_bytes_per_connection": "1 MiB",
}


async def _stuck_subscriber(address: str, subject_filter: str = "t.>") -> RawPeer:
    s = await open_raw(address, rcvbuf=16 * 1024)
    peer = RawPeer(s)
    await peer.send(handshake_bytes() + _frame(P.Command.SUBSCRIBE, 2, P.Subscribe(1, subject_filter).encode()))
    return peer


async def _read_to_the_end(peer: RawPeer) -> list[object]:
    """Everything the broker sent, up to its close (a frame cut short by the close
    is not an event)."""
    seen = []
    with trio.fail_after(20):
        while True:
            ev = peer.conn.next_event()
            if ev is not P.NEED_DATA:
                seen.append(ev)
                continue
            try:
                data = await peer.stream.receive_some(1 << 20)
            except trio.BrokenResourceError:
                return seen
            if not data:
                return seen
            peer.conn.receive_data(data)


async def test_a_slow_consumer_over_its_limit_is_cut_off(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="broker")
    cfg = make_config(tmp_path, **_SLOW_LIMITS, **{"limits.slow_consumer_seconds": "300ms"})
    async with start_server(cfg) as h, connect(h.address) as c:
        await c.create_stream("s")
        await c.create_topic("s", "t", subjects=["t.>"])
        stuck = await _stuck_subscriber(h.address)
        healthy = await c.subscribe("t.>", max_pending=1_000_000)
        payload = b"z" * 60_000
        sent = 0
        with trio.fail_after(30):
            while (await c.stats())["slow_consumers"] == 0:
                await c.publish_batch([("t.x", payload)] * 4)
                sent += 4
        events = await _read_to_the_end(stuck)
        # It got what fitted in its socket and its queue, in order, then the GOODBYE.
        deliveries = [e for e in events if isinstance(e, P.Push) and e.kind == P.PushKind.DELIVERY]
        assert 0 < len(deliveries) < sent
        bye = events[-1]
        assert isinstance(bye, P.Push) and bye.kind == P.PushKind.GOODBYE and bye.status == P.ErrorCode.SLOW_CONSUMER == 15
        reason = bye.value.reason  # type: ignore[attr-defined]
        # Which rule fires first depends on timing: its writes stalled as it filled up.
        assert re.fullmatch(
            r"slow consumer: \d+ bytes queued(, over the connection limit of 1048576 bytes| and none could be sent) for 0.3 s",
            reason,
        ), reason
        for _ in range(sent):  # a subscriber that reads lost nothing
            await healthy.next(timeout=10)
        stats = await c.stats()
        assert stats["slow_consumers"] == 1 and stats["connections"] == 1 and stats["deliveries_dropped"] > 0
    (logged,) = log_events(caplog, "slow_consumer")
    assert logged["level"] == "WARNING" and str(logged["peer"]).startswith("127.0.0.1:")
    assert logged["rule"] in ("connection_limit", "write_stalled") and logged["subscriptions"] == 1


async def test_slow_consumers_never_take_more_than_the_budget(tmp_path: Path) -> None:
    """Twenty subscribers that never read, a budget of 4 MiB: the broker's queued
    output stays within it, and the ones holding the most are cut off."""
    budget = 4 * 1024 * 1024
    cfg = make_config(
        tmp_path, **_SLOW_LIMITS,
        **{"limits.max_pending_bytes_total": budget, "limits.slow_consumer_seconds": "1h"},
    )
    async with start_server(cfg) as h, connect(h.address) as c:
        await c.create_stream("s")
        await c.create_topic("s", "t", subjects=["t.>"])
        stuck = [await _stuck_subscriber(h.address) for _ in range(20)]
        healthy = await c.subscribe("t.>", max_pending=1_000_000)
        payload = b"q" * 30_000
        peak = 0
        with trio.fail_after(60):
            while True:
                stats = await c.stats()
                peak = max(peak, stats["queued_bytes"])
                if stats["slow_consumers"] == 20:
                    break
                await c.publish_batch([("t.y", payload)] * 4)
        assert stats["queued_bytes_budget"] == budget
        # Deliveries never pass the budget; responses (acks, stats) may, by one each.
        assert peak <= budget and stats["queued_bytes_max"] <= budget + 4096
        assert stats["deliveries_dropped"] > 0
        ends = [await _read_to_the_end(p) for p in stuck]
        for events in ends:  # each one was closed; a GOODBYE if it read in time
            if events and isinstance(events[-1], P.Push) and events[-1].kind == P.PushKind.GOODBYE:
                assert events[-1].status == P.ErrorCode.SLOW_CONSUMER
                assert "over its budget of 4194304 bytes" in events[-1].value.reason  # type: ignore[attr-defined]
        got = 0
        while True:  # the healthy subscriber is still served
            with trio.move_on_after(1) as scope:
                await healthy.next()
                got += 1
            if scope.cancelled_caught:
                break
        assert got > 0
        ack = await c.publish("t.z", b"after")
        assert ack is not None and (await healthy.next(timeout=10)).payload == b"after"
        stats = await c.stats()
        assert stats["connections"] == 1 and stats["queued_bytes"] < 1024


async def test_responses_are_backpressured_not_dropped(tmp_path: Path) -> None:
    """A client that pipelines fetches and does not read: the broker stops reading
    its requests at its limit and, once it reads, answers every one."""
    cfg = make_config(tmp_path, **_SLOW_LIMITS)
    async with start_server(cfg) as h, connect(h.address) as c:
        await c.create_stream("s")
        await c.create_topic("s", "t", subjects=["t.>"])
        ack = await c.publish("t.big", b"b" * 200_000)
        assert ack is not None
        raw = RawPeer(await open_raw(h.address, rcvbuf=16 * 1024))
        await raw.handshake()
        n = 300  # 60 MB of responses
        fetch = P.Fetch(P.Identifier.of("s"), P.Identifier.of("t"), ack.partition, ack.offset, 1, 0, "")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(raw.send, b"".join(_frame(P.Command.FETCH, 1000 + i, fetch.encode()) for i in range(n)))
            queued = []
            for _ in range(20):
                await trio.sleep(0.02)
                queued.append((await c.stats())["queued_bytes"])
            assert max(queued) <= 1024 * 1024 + 300_000  # the limit plus the response in hand
            got = set()
            with trio.fail_after(30):
                while len(got) < n:
                    ev = await raw.next_event()
                    assert isinstance(ev, P.Response) and ev.result.count == 1  # type: ignore[attr-defined]
                    got.add(ev.correlation_id)
        assert got == set(range(1000, 1000 + n))
        stats = await c.stats()
        assert stats["slow_consumers"] == 0 and stats["queued_bytes_max"] <= 1024 * 1024 + 300_000


class FakeSession:
    """What ``sweep`` reads of a session."""

    def __init__(self, name: str, pending: int, stalled_since: float | None = None) -> None:
        self.name = name
        self.pending_bytes = pending
        self.over_limit_since: float | None = None
        self.stalled_since = stalled_since
        self.cut: tuple[str, str] | None = None

    @property
    def closing(self) -> bool:
        return self.cut is not None

    def write_stalled_since(self, now: float) -> float:
        return 0.0 if self.stalled_since is None else now - self.stalled_since

    def cut_off(self, reason: str, rule: str) -> None:
        self.cut = (rule, reason)


def test_sweep_cuts_a_connection_over_its_limit_for_too_long() -> None:
    budget = OutputBudget(10_000)
    over, fine = FakeSession("over", 200), FakeSession("fine", 100)
    for t in (0.0, 1.0, 1.9):  # its writes progress: only the time over the limit counts
        sweep({over, fine}, budget, 100, 2.0, t)
        assert over.cut is None
    over.pending_bytes = 50  # back under: the clock starts again
    sweep({over, fine}, budget, 100, 2.0, 2.0)
    over.pending_bytes = 200
    sweep({over, fine}, budget, 100, 2.0, 3.0)
    sweep({over, fine}, budget, 100, 2.0, 4.9)
    assert over.cut is None
    sweep({over, fine}, budget, 100, 2.0, 5.0)
    assert over.cut == ("connection_limit", "slow consumer: 200 bytes queued, over the connection limit of 100 bytes for 2 s")
    assert fine.cut is None


def test_sweep_cuts_a_connection_whose_writes_stall() -> None:
    s = FakeSession("s", 50, stalled_since=10.0)
    sweep({s}, OutputBudget(10_000), 100, 2.0, 11.9)
    assert s.cut is None
    sweep({s}, OutputBudget(10_000), 100, 2.0, 12.0)
    assert s.cut == ("write_stalled", "slow consumer: 50 bytes queued and none could be sent for 2 s")


def test_sweep_cuts_the_largest_stalled_holders_when_the_budget_is_spent() -> None:
    budget = OutputBudget(1000)
    sessions = {
        FakeSession("big", 400, stalled_since=0.0),
        FakeSession("mid", 300, stalled_since=0.0),
        FakeSession("small", 100, stalled_since=0.0),
        FakeSession("busy", 350),  # its writes complete: never cut by the budget
        FakeSession("fresh", 10, stalled_since=4.5),  # stalled for less than a second
    }
    budget.total = 880  # under 90 %: nothing happens
    sweep(sessions, budget, 10_000, 60.0, 5.0)
    assert all(s.cut is None for s in sessions)

    def cut_off(self: FakeSession, reason: str, rule: str) -> None:
        self.cut = (rule, reason)
        budget.sent(self.pending_bytes)

    for s in sessions:
        s.cut_off = cut_off.__get__(s)  # type: ignore[method-assign]
    budget.total = 1160
    sweep(sessions, budget, 10_000, 60.0, 5.0)
    cut = {s.name: s.cut for s in sessions if s.cut}
    assert set(cut) == {"big", "mid"} and budget.total == 460  # until half the budget is free
    assert cut["big"] == ("budget", "slow consumer: the broker's queued output is over its budget of 1000 bytes and "
                                    "this connection holds 400 bytes it does not read")
    budget.total = 700
    budget.refused = True  # a push found no room: spent, whatever the total
    sweep(sessions, budget, 10_000, 60.0, 5.0)
    assert {s.name for s in sessions if s.cut} == {"big", "mid", "small"} and not budget.refused


def test_output_budget_counts() -> None:
    b = OutputBudget(100)
    b.add(60)
    b.add(50)
    assert b.over and b.total == 110 and b.peak == 110
    b.sent(20)
    assert not b.over and b.total == 90 and b.peak == 110


# -- bugs cost one request or one connection ---------------------------------------------


async def test_a_bug_in_a_handler_costs_one_request(server: ServerHandle, client: Client, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="broker")

    def broken(session: object, cmd: object) -> bytes:
        raise ZeroDivisionError("on purpose")

    server.services.dispatch.sync[P.Ping] = broken
    with pytest.raises(P.InternalErrorError) as info:  # type: ignore[attr-defined]
        await client.ping()
    assert info.value.code == 1 and info.value.message == "internal error in PING: ZeroDivisionError: on purpose"
    assert (await client.stats())["connections"] == 1  # the same connection carries on
    assert log_events(caplog, "handler_failed")[0]["level"] == "ERROR"


async def test_a_bug_in_a_connection_task_costs_that_connection(
    server: ServerHandle, client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="broker")
    async with connect(server.address) as victim:
        sessions = server.services.guard.sessions
        (session,) = [s for s in sessions if s.id == max(x.id for x in sessions)]
        assert isinstance(session, Transport)

        def boom() -> bytes:
            raise RuntimeError("a bug in the writer")

        session._take_chunk = boom  # type: ignore[method-assign]
        with pytest.raises(ConnectionClosedError):
            await victim.ping()
    stats = await client.stats()
    assert stats["connections"] == 1 and stats["connections_failed"] == 1
    (logged,) = log_events(caplog, "connection_task_failed")
    assert logged["level"] == "ERROR"
    await assert_healthy(server.address)


# -- file modes ----------------------------------------------------------------------


async def test_serve_sets_the_configured_file_modes(tmp_path: Path) -> None:
    """serve() hands [system] file_mode and dir_mode to the storage package before it
    opens the data directory (storage creates every file through ``_files``)."""
    cfg = make_config(tmp_path, **{"system.file_mode": "0640", "system.dir_mode": "0750"})
    try:
        async with start_server(cfg):
            assert (_files.file_mode(), _files.dir_mode()) == (0o640, 0o750)
    finally:
        storage.set_modes()
    async with start_server(make_config(tmp_path)):
        assert (_files.file_mode(), _files.dir_mode()) == (0o600, 0o700)
