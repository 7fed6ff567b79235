"""Bad input never crashes the broker or touches stored data: each case gets its
documented error code (or closes only that connection), and a second client
connected at the same time carries on."""

from __future__ import annotations

import struct

import pytest
import trio
from conftest import make_config, start_server
from helpers import RawPeer, handshake_bytes

import protocol as P
from broker.client import Client, ConnectionClosedError, connect
from broker.server import ServerHandle


async def assert_healthy(client: Client, topic: tuple[str, str]) -> None:
    ack = await client.publish("orders.health", b"still here")
    assert ack is not None
    (m,) = (await client.fetch(*topic, ack.partition, ack.offset, 1)).messages
    assert m.payload == b"still here"


async def test_garbage_bytes_close_only_that_connection(server: ServerHandle, client: Client, topic: tuple[str, str]) -> None:
    raw = await RawPeer.open(server.address)
    await raw.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    events = await raw.wait_closed()
    assert isinstance(events[0], P.ErrorResponse)
    assert events[0].error.code in (P.ErrorCode.MALFORMED_FRAME, P.ErrorCode.FRAME_TOO_LARGE)
    assert isinstance(events[-1], P.Push) and events[-1].kind == P.PushKind.GOODBYE
    await assert_healthy(client, topic)


async def test_oversized_frame(server: ServerHandle, client: Client, topic: tuple[str, str]) -> None:
    raw = await RawPeer.open(server.address)
    await raw.handshake()
    # Only the header: the broker refuses before the 100 MB body arrives.
    await raw.send(P.FRAME_HEADER.pack(100_000_000, P.Command.PUBLISH, 0, 77, 0))  # type: ignore[attr-defined]
    events = await raw.wait_closed()
    err = events[0]
    assert isinstance(err, P.ErrorResponse) and err.correlation_id == 77 and err.code == P.Command.PUBLISH
    assert err.error.code == P.ErrorCode.FRAME_TOO_LARGE and "exceeds the maximum" in err.error.message
    await assert_healthy(client, topic)


async def test_undelimitable_frame(server: ServerHandle, client: Client, topic: tuple[str, str]) -> None:
    raw = await RawPeer.open(server.address)
    await raw.handshake()
    await raw.send(P.FRAME_HEADER.pack(2, 2, 0, 5, 0))  # type: ignore[attr-defined]
    events = await raw.wait_closed()
    assert isinstance(events[0], P.ErrorResponse) and events[0].error.code == P.ErrorCode.MALFORMED_FRAME
    await assert_healthy(client, topic)


async def test_errors_that_keep_the_connection(server: ServerHandle, client: Client, topic: tuple[str, str]) -> None:
    raw = await RawPeer.open(server.address)
    await raw.handshake()
    cases = [
        (P.encode_frame(4321, 0, 10, 0, b"??"), P.ErrorCode.UNKNOWN_COMMAND, "unknown command code 4321"),
        (P.encode_frame(P.Command.FETCH, 0, 11, 0, b"\x02\x05sho"), P.ErrorCode.MALFORMED_PAYLOAD, "FETCH"),
        (P.encode_frame(P.Command.CREATE_STREAM, 0, 12, 0, b"\x00\x00\x00\x00\x03a/b"), P.ErrorCode.INVALID_NAME, "a/b"),
        (P.encode_frame(P.Command.GET_STREAM, 0, 13, 0, b"\x05\x01x"), P.ErrorCode.INVALID_IDENTIFIER, "kind"),
        (P.encode_frame(P.Command.GET_STREAM, 0, 14, 0, P.Identifier.of("nope").encode()), P.ErrorCode.STREAM_NOT_FOUND, "nope"),
        (
            P.encode_frame(P.Command.GET_TOPIC, 0, 15, 0, P.Identifier.of("shop").encode() + P.Identifier.of("x").encode()),
            P.ErrorCode.TOPIC_NOT_FOUND, "'x'",
        ),
        (P.encode_frame(P.Command.PUBLISH, 0, 16, 0, b"\x00\x02\x00\x00\x00" + b"\x00" * 20), P.ErrorCode.MALFORMED_PAYLOAD, "PUBLISH"),
        (
            P.encode_frame(P.Command.PUBLISH, 0, 17, 0, b"\x00\x01\x00\x00\x00" + P.encode_body("orders.a", b"abc")[:-1]),
            P.ErrorCode.MALFORMED_PAYLOAD, "truncated",
        ),
        (P.encode_frame(P.Command.HANDSHAKE, 0, 18, 0, handshake_bytes()[16:]), P.ErrorCode.MALFORMED_PAYLOAD, "already"),
        (
            P.encode_frame(P.Command.CREATE_TOPIC, 0, 19, 0, P.CreateTopic(P.Identifier.of("shop"), 0, 1, 0, "t", {}).encode()[:-4] + b"\x05\x00\x00\x00\xc1\xc1\xc1\xc1\xc1"),
            P.ErrorCode.INVALID_OPTIONS, "msgpack",
        ),
        (
            P.encode_frame(P.Command.CREATE_TOPIC, 0, 20, 0, P.CreateTopic(P.Identifier.of("shop"), 0, 1, 0, "t", {}).encode()[:-4] + b"\x01\x00\x00\x00\x90"),
            P.ErrorCode.INVALID_OPTIONS, "must be a msgpack map",
        ),
    ]
    for frame, code, fragment in cases:
        await raw.send(frame)
        ev = await raw.next_event()
        assert isinstance(ev, P.ErrorResponse), ev
        assert ev.error.code == code, (code, ev.error)
        assert fragment in ev.error.message, ev.error.message
    await raw.send(P.encode_frame(P.Command.PING, 0, 99, 0))
    ev = await raw.next_event()
    assert isinstance(ev, P.Response) and ev.correlation_id == 99
    await raw.aclose()
    await assert_healthy(client, topic)


async def test_per_message_errors_leave_the_rest_of_the_batch(client: Client, topic: tuple[str, str]) -> None:
    flagged = bytearray(P.encode_body("orders.f", b"x"))
    flagged[4] = 1  # a marker flag: reserved for the broker
    bad_headers = P.BODY.pack(0, 0, 8, 3, 0) + b"orders.h" + b"\x05ab"
    with_ttl = P.encode_body("orders.t", b"x", ttl=30)
    acks = await client.publish_batch(
        [("orders.ok1", b"1"), bytes(flagged), bad_headers, with_ttl, ("orders.big", b"x" * (1024 * 1024 + 1)), ("orders.ok2", b"2")]
    )
    assert acks is not None
    assert [a.status for a in acks] == [
        0,
        P.ErrorCode.INVALID_MESSAGE_FLAGS,
        P.ErrorCode.INVALID_HEADERS,
        P.ErrorCode.MSG_TTL_DISABLED,
        P.ErrorCode.PAYLOAD_TOO_LARGE,
        0,
    ]
    assert acks[3].error is not None and acks[3].error.message == "per-message TTL is disabled"
    assert "1048577 bytes exceeds the maximum of 1048576" in acks[4].error.message  # type: ignore[union-attr]
    assert acks[0].offset and acks[5].offset
    stats = await client.stats()
    assert stats["publish_errors"] == 4 and stats["messages_in"] == 2


async def test_handshake_refusals_close_the_connection(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # (the delay on failed handshakes is tested in test_connections.py)
    cfg = make_config(tmp_path, **{"server.auth_token": "s3cret", "limits.auth_failure_delay": 0})
    async with start_server(cfg) as h:
        raw = await RawPeer.open(h.address)
        await raw.send(handshake_bytes(version=9, token="s3cret"))
        events = await raw.wait_closed()
        assert events[0].error.code == P.ErrorCode.UNSUPPORTED_VERSION  # type: ignore[attr-defined]
        assert "version 1" in events[0].error.message  # type: ignore[attr-defined]
        with pytest.raises(P.UnauthorizedError) as info:  # type: ignore[attr-defined]
            async with connect(h.address, token="wrong"):
                pass
        assert info.value.code == 8
        raw = await RawPeer.open(h.address)
        await raw.send(P.encode_frame(P.Command.HANDSHAKE, 0, 1, 0, b"HTTP/1.1 200"))
        events = await raw.wait_closed()
        assert events[0].error.code == P.ErrorCode.UNSUPPORTED_VERSION  # type: ignore[attr-defined]
        async with connect(h.address, token="s3cret") as c:
            assert await c.ping() >= 0
            assert c.server_info["auth_required"] is True


async def test_connection_limit(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cfg = make_config(tmp_path, **{"limits.max_connections": 2})
    async with start_server(cfg) as h, connect(h.address) as a, connect(h.address) as b:
        with pytest.raises(P.TooManyConnectionsError) as info:  # type: ignore[attr-defined]
            async with connect(h.address):
                pass
        assert "limit of 2 connections" in info.value.message
        await a.ping()
        await b.ping()
        assert (await a.stats())["connections_refused"] == 1


async def test_client_vanishing_mid_frame(server: ServerHandle, client: Client, topic: tuple[str, str]) -> None:
    raw = await RawPeer.open(server.address)
    await raw.handshake()
    frame = P.encode_frame(P.Command.PUBLISH, 0, 5, 0, P.Publish.from_bodies([P.encode_body("orders.half", b"x" * 100)]).encode())
    await raw.send(frame[: len(frame) // 2])
    await raw.aclose()
    await trio.sleep(0.1)
    await assert_healthy(client, topic)
    with pytest.raises(P.MessageNotFoundError):  # type: ignore[attr-defined]
        await client.get_last(*topic, "orders.half")


async def test_client_reports_a_lost_connection(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from broker import serve

    cfg = make_config(tmp_path)
    server_scope = trio.CancelScope()

    async def run_server(task_status=trio.TASK_STATUS_IGNORED) -> None:  # type: ignore[no-untyped-def]
        with server_scope:
            await serve(cfg, task_status=task_status)

    async with trio.open_nursery() as n:
        h = await n.start(run_server)
        async with connect(h.address, reconnect=False) as c:
            server_scope.cancel()  # the broker shuts down; the client is not cancelled
            with trio.fail_after(10):
                while not c.closed:
                    await trio.sleep(0.01)
            with pytest.raises(ConnectionClosedError) as info:
                await c.ping()
            assert info.value.code == P.ErrorCode.SHUTTING_DOWN
            assert "the broker is shutting down" in str(info.value)


def _u32(v: int) -> bytes:
    return struct.pack("<I", v)
