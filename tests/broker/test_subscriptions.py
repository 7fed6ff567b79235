"""Core subscriptions: wildcards, at-most-once delivery of stored and unstored
messages, unsubscribe, and their errors."""

from __future__ import annotations

import pytest
import trio

import protocol as P
from broker.client import Client, connect
from broker.server import ServerHandle


async def _drain(sub, n: int) -> list[P.Message]:  # type: ignore[no-untyped-def]
    return [await sub.next(timeout=5) for _ in range(n)]


async def test_wildcards(server: ServerHandle, client: Client, topic: tuple[str, str]) -> None:
    async with connect(server.address) as listener:
        star = await listener.subscribe("orders.*.new")
        tail = await listener.subscribe("orders.>")
        exact = await listener.subscribe("orders.eu.new")
        await client.publish_batch([("orders.eu.new", b"1"), ("orders.us.new", b"2"), ("orders.eu.old", b"3"), ("orders.eu.new.x", b"4")])
        assert [m.payload for m in await _drain(star, 2)] == [b"1", b"2"]
        assert [m.payload for m in await _drain(tail, 4)] == [b"1", b"2", b"3", b"4"]
        assert [m.payload for m in await _drain(exact, 1)] == [b"1"]
        with pytest.raises(TimeoutError):
            await star.next(timeout=0.2)


async def test_a_published_subject_may_carry_wildcard_tokens_as_literals(
    server: ServerHandle, client: Client, topic: tuple[str, str],
) -> None:
    """As in NATS: ``orders.*.new`` is published and stored as it is; filters match
    its tokens as they are (``orders.>`` and ``orders.*.new`` get it, ``orders.eu.new``
    does not)."""
    async with connect(server.address) as listener:
        tail = await listener.subscribe("orders.>")
        exact = await listener.subscribe("orders.eu.new")
        ack = await client.publish("orders.*.new", b"w")
        assert ack is not None
        got = await tail.next(timeout=5)
        assert (got.subject, got.payload) == ("orders.*.new", b"w")
        with pytest.raises(TimeoutError):
            await exact.next(timeout=0.2)
    f = await client.fetch(*topic, ack.partition, ack.offset, 1)
    assert [m.subject for m in f.messages] == ["orders.*.new"]
    with pytest.raises(P.InvalidSubjectError):  # type: ignore[attr-defined]
        await client.publish("orders..new", b"x")


async def test_delivered_messages_carry_where_they_were_stored(client: Client, topic: tuple[str, str]) -> None:
    sub = await client.subscribe("orders.>")
    ack = await client.publish("orders.k", b"v", headers={"h": "1"})
    m = await sub.next(timeout=5)
    assert ack is not None
    assert (m.stream_id, m.topic_id, m.partition, m.offset) == (ack.stream_id, ack.topic_id, ack.partition, ack.offset)
    assert m.headers == {"h": "1"} and m.payload == b"v"


async def test_a_batch_no_subscription_matches_delivers_nothing_and_a_later_match_its_own_record(
    client: Client, topic: tuple[str, str]
) -> None:
    sub = await client.subscribe("orders.eu.*")
    none = await client.publish_batch([("orders.us.a", b"a"), ("orders.us.b", b"b")])
    some = await client.publish_batch([("orders.us.c", b"c"), ("orders.eu.d", b"d"), ("orders.us.e", b"e")])
    assert none is not None and some is not None
    m = await sub.next(timeout=5)
    assert (m.subject, m.payload, m.offset) == ("orders.eu.d", b"d", some[1].offset)
    with pytest.raises(TimeoutError):
        await sub.next(timeout=0.2)


async def test_unrouted_messages_reach_core_subscribers(client: Client) -> None:
    sub = await client.subscribe("chat.>")
    with pytest.raises(P.NoTopicForSubjectError):  # type: ignore[attr-defined]
        await client.publish("chat.room1", b"hello")
    m = await sub.next(timeout=5)
    assert (m.subject, m.payload, m.offset, m.stream_id, m.partition) == ("chat.room1", b"hello", 0, 0, 0)


async def test_refused_messages_are_not_delivered(client: Client, topic: tuple[str, str]) -> None:
    sub = await client.subscribe(">")
    big = b"x" * (1024 * 1024 + 1)
    acks = await client.publish_batch([("orders.a", big), ("orders.b", b"ok")])
    assert acks is not None and acks[0].status == P.ErrorCode.PAYLOAD_TOO_LARGE
    assert (await sub.next(timeout=5)).subject == "orders.b"


async def test_unsubscribe_stops_delivery(server: ServerHandle, client: Client, topic: tuple[str, str]) -> None:
    async with connect(server.address) as listener:
        async with await listener.subscribe("orders.>") as sub:
            await client.publish("orders.a", b"1")
            assert (await sub.next(timeout=5)).payload == b"1"
        await client.publish("orders.a", b"2")
        other = await listener.subscribe("orders.a")
        await client.publish("orders.a", b"3")
        assert (await other.next(timeout=5)).payload == b"3"
        assert sub.closed
        with pytest.raises(StopAsyncIteration):
            await sub.next(timeout=1)
    # The listener's connection is gone: its remaining subscription goes with it.
    with trio.fail_after(5):
        while (await client.stats())["subscriptions"]:
            await trio.sleep(0.01)


async def test_every_subscriber_gets_a_copy(server: ServerHandle, client: Client, topic: tuple[str, str]) -> None:
    got: list[list[bytes]] = []

    async def listen(task_status=trio.TASK_STATUS_IGNORED) -> None:  # type: ignore[no-untyped-def]
        async with connect(server.address) as c:
            sub = await c.subscribe("orders.>")
            task_status.started()
            got.append([m.payload for m in await _drain(sub, 100)])

    async with trio.open_nursery() as n:
        for _ in range(5):
            await n.start(listen)
        for i in range(10):
            await client.publish_batch([("orders.x", f"{i}.{j}".encode()) for j in range(10)])
    expected = [f"{i}.{j}".encode() for i in range(10) for j in range(10)]
    assert got == [expected] * 5


async def test_subscription_errors(client: Client) -> None:
    await client._request(P.Subscribe(77, "a.b"))
    with pytest.raises(P.SubscriptionExistsError) as info:  # type: ignore[attr-defined]
        await client._request(P.Subscribe(77, "c"))
    assert info.value.code == 7001 and "77" in info.value.message
    with pytest.raises(P.SubscriptionNotFoundError) as info2:  # type: ignore[attr-defined]
        await client._request(P.Unsubscribe(78))
    assert info2.value.code == 7002
    with pytest.raises(P.InvalidSubjectFilterError):  # type: ignore[attr-defined]
        await client.subscribe("a..b")


async def test_subscription_limit(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from conftest import make_config, start_server

    cfg = make_config(tmp_path, **{"limits.max_subscriptions_per_connection": 2})
    async with start_server(cfg) as h, connect(h.address) as c:
        await c.subscribe("a")
        await c.subscribe("b")
        with pytest.raises(P.TooManySubscriptionsError) as info:  # type: ignore[attr-defined]
            await c.subscribe("c")
        assert info.value.code == 7003 and "at most 2" in info.value.message


async def test_a_subscriber_that_never_reads_does_not_stall_others(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A client that stops reading fills its socket; past the pending limit the broker
    drops its deliveries (counted) instead of holding publishers or other readers."""
    from conftest import make_config, start_server
    from helpers import RawPeer, handshake_bytes

    cfg = make_config(
        tmp_path,
        **{"limits.max_pending_bytes_per_connection": "1 MiB", "limits.max_frame_bytes": "1 MiB", "limits.max_payload_bytes": "256 KiB"},
    )
    async with start_server(cfg) as h, connect(h.address) as c:
        await c.create_stream("s")
        await c.create_topic("s", "t", subjects=["t.>"])
        stuck = await RawPeer.open(h.address)
        await stuck.send(handshake_bytes() + P.encode_frame(P.Command.SUBSCRIBE, 0, 2, 0, P.Subscribe(1, "t.>").encode()))
        await trio.sleep(0.2)
        healthy = await c.subscribe("t.>", max_pending=1_000_000)
        payload = b"z" * 60_000
        with trio.fail_after(30):
            for _ in range(300):  # 18 MB, far more than the socket buffers hold
                await c.publish_batch([("t.x", payload)] * 1)
            got = 0
            while got < 300:
                await healthy.next(timeout=10)
                got += 1
        stats = await c.stats()
        assert stats["deliveries_dropped"] > 0
        await stuck.aclose()
