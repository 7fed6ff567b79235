"""Publishing and fetching through the real client and server."""

from __future__ import annotations

import zlib
from collections import defaultdict

import pytest
import trio

import protocol as P
from broker.client import Client, Msg, connect
from broker.server import ServerHandle


async def test_publish_and_fetch_across_partitions(client: Client, topic: tuple[str, str]) -> None:
    subjects = [f"orders.{region}.{i}" for region in ("eu", "us", "ap") for i in range(20)]
    sent: dict[str, list[bytes]] = defaultdict(list)
    for round_ in range(5):
        acks = await client.publish_batch([(s, f"{s}#{round_}".encode()) for s in subjects])
        assert acks is not None and acks.ok
        for s in subjects:
            sent[s].append(f"{s}#{round_}".encode())
        for s, a in zip(subjects, acks):
            # the partition is the stable hash of the subject, every time
            assert a.partition == zlib.crc32(s.encode()) % 3
    got: dict[str, list[bytes]] = defaultdict(list)
    partitions_used = set()
    for part in range(3):
        f = await client.fetch(*topic, part, 1, 10_000)
        for m in f.messages:
            assert m.partition == part and m.stream_id == 1 and m.topic_id == 1
            got[m.subject].append(m.payload)
            partitions_used.add(part)
        assert [m.offset for m in f.messages] == list(range(1, len(f.messages) + 1))
    assert got == sent  # everything back, per-subject order kept
    assert len(partitions_used) == 3


async def test_fetch_paging_and_limits(client: Client, topic: tuple[str, str]) -> None:
    await client.publish_batch([("orders.one", f"m{i}".encode()) for i in range(250)])
    part = zlib.crc32(b"orders.one") % 3
    offset, seen = 1, []
    while True:
        f = await client.fetch(*topic, part, offset, 40)
        if not f.messages:
            break
        seen += [m.payload for m in f.messages]
        offset = f.next_offset
    assert seen == [f"m{i}".encode() for i in range(250)]
    assert f.first_offset == 1 and f.last_offset == 250 and f.next_offset == 251
    small = await client.fetch(*topic, part, 1, 1000, max_bytes=200)
    assert 1 <= len(small.messages) < 5
    none = await client.fetch(*topic, part, 1, 0)
    assert none.messages == []
    beyond = await client.fetch(*topic, part, 10_000, 10)
    assert beyond.messages == [] and beyond.last_offset == 250


async def test_fetch_with_subject_filter(client: Client) -> None:
    await client.create_stream("s")
    await client.create_topic("s", "t", partitions=1, subjects=["t.>"])
    await client.publish_batch([(f"t.{k}.{i}", b"x") for i in range(30) for k in ("a", "b", "c")])
    f = await client.fetch("s", "t", 0, 1, 1000, subject="t.b.*")
    assert len(f.messages) == 30 and all(m.subject.startswith("t.b.") for m in f.messages)
    f = await client.fetch("s", "t", 0, 1, 1000, subject="t.c.7")
    assert [m.subject for m in f.messages] == ["t.c.7"]
    f = await client.fetch("s", "t", 0, 1, 5, subject="t.a.>")
    assert [m.subject for m in f.messages] == [f"t.a.{i}" for i in range(5)]
    assert f.next_offset == f.messages[-1].offset + 1
    with pytest.raises(P.InvalidSubjectFilterError):  # type: ignore[attr-defined]
        await client.fetch("s", "t", 0, 1, 5, subject="t..x")


async def test_headers_and_binary_payloads_round_trip(client: Client, topic: tuple[str, str]) -> None:
    payload = bytes(range(256))
    ack = await client.publish("orders.bin", payload, headers={"Content-Type": "application/x", "Trace": "abc 123"})
    assert ack is not None
    (m,) = (await client.fetch(*topic, ack.partition, ack.offset, 1)).messages
    assert m.payload == payload and m.headers == {"Content-Type": "application/x", "Trace": "abc 123"}
    assert m.subject == "orders.bin" and m.offset == ack.offset and not m.is_marker and m.ttl == 0
    assert m.timestamp > 1_600_000_000 * 10**9


async def test_get_last_follows_deletes(client: Client, topic: tuple[str, str]) -> None:
    acks = await client.publish_batch([("orders.k", b"v1"), ("orders.other", b"o"), ("orders.k", b"v2"), ("orders.k", b"v3")])
    assert acks is not None
    assert (await client.get_last(*topic, "orders.k")).payload == b"v3"
    await client.delete_message(*topic, acks[3].partition, acks[3].offset)
    assert (await client.get_last(*topic, "orders.k")).payload == b"v2"
    await client.delete_message(*topic, acks[2].partition, acks[2].offset)
    await client.delete_message(*topic, acks[0].partition, acks[0].offset)
    with pytest.raises(P.MessageNotFoundError) as info:  # type: ignore[attr-defined]
        await client.get_last(*topic, "orders.k")
    assert info.value.code == P.ErrorCode.MESSAGE_NOT_FOUND and "orders.k" in info.value.message
    await client.publish("orders.k", b"v4")
    assert (await client.get_last(*topic, "orders.k")).payload == b"v4"


async def test_pipelining_10000_publishes_on_one_connection(client: Client, topic: tuple[str, str]) -> None:
    acks = []

    async def one(i: int) -> None:
        acks.append((i, await client.publish(f"orders.p.{i % 10}", str(i).encode())))

    async with trio.open_nursery() as n:
        for i in range(10_000):
            n.start_soon(one, i)
    assert len(acks) == 10_000
    by_partition: dict[int, list[int]] = defaultdict(list)
    for _, a in acks:
        by_partition[a.partition].append(a.offset)  # type: ignore[union-attr]
    for offsets in by_partition.values():
        assert sorted(offsets) == list(range(1, len(offsets) + 1))  # no gap, no duplicate
    stats = await client.stats()
    assert stats["messages_in"] == 10_000 and stats["publish_errors"] == 0


async def test_many_concurrent_clients(server: ServerHandle, client: Client, topic: tuple[str, str]) -> None:
    async def producer(k: int) -> None:
        async with connect(server.address) as c:
            for batch in range(4):
                acks = await c.publish_batch([Msg(f"orders.c{k}", f"{k}:{batch}:{i}".encode()) for i in range(50)])
                assert acks is not None and acks.ok

    async with trio.open_nursery() as n:
        for k in range(25):
            n.start_soon(producer, k)
    total = 0
    for part in range(3):
        offset = 1
        while True:
            f = await client.fetch(*topic, part, offset, 1000)
            if not f.messages:
                break
            total += len(f.messages)
            offset = f.next_offset
    assert total == 25 * 4 * 50
    per_client: dict[str, list[str]] = defaultdict(list)
    for part in range(3):
        for m in (await client.fetch(*topic, part, 1, 10_000)).messages:
            per_client[m.subject].append(m.payload.decode())
    for subject, payloads in per_client.items():
        k = subject.removeprefix("orders.c")
        assert payloads == [f"{k}:{b}:{i}" for b in range(4) for i in range(50)]


async def test_fire_and_forget_publish(client: Client, topic: tuple[str, str]) -> None:
    for i in range(100):
        assert await client.publish("orders.ff", str(i).encode(), ack=False) is None
    await client.publish_batch([("orders.ff", b"x")] * 10, ack=False)
    await client.ping()  # ordered after the publishes on this connection
    part = zlib.crc32(b"orders.ff") % 3
    assert len((await client.fetch(*topic, part, 1, 1000)).messages) == 110


async def test_max_msgs_per_subject(client: Client) -> None:
    await client.create_stream("kv")
    await client.create_topic("kv", "t", subjects=["k.>"], max_msgs_per_subject=2)
    for i in range(5):
        await client.publish("k.a", f"a{i}".encode())
    await client.publish_batch([("k.b", f"b{i}".encode()) for i in range(4)] + [("k.a", b"a5")])
    f = await client.fetch("kv", "t", 0, 1, 100)
    assert [(m.subject, m.payload) for m in f.messages] == [("k.a", b"a4"), ("k.b", b"b2"), ("k.b", b"b3"), ("k.a", b"a5")]
    assert (await client.stats())["removed_max_msgs_per_subject"] == 6  # a0..a3, b0, b1
    details = await client.update_topic("kv", "t", max_msgs_per_subject=1)
    assert details.options["max_msgs_per_subject"] == 1
    f = await client.fetch("kv", "t", 0, 1, 100)
    assert [(m.subject, m.payload) for m in f.messages] == [("k.b", b"b3"), ("k.a", b"a5")]


async def test_publishing_to_no_topic_is_an_ack_error(client: Client, topic: tuple[str, str]) -> None:
    with pytest.raises(P.NoTopicForSubjectError) as info:  # type: ignore[attr-defined]
        await client.publish("nobody.listens", b"x")
    assert info.value.code == P.ErrorCode.NO_TOPIC_FOR_SUBJECT and "nobody.listens" in info.value.message
    acks = await client.publish_batch([("orders.a", b"1"), ("nobody.x", b"2"), ("orders.b", b"3"), ("bad..subject", b"4")])
    assert acks is not None
    assert [a.status for a in acks] == [0, 6001, 0, 6002]
    assert acks[1].offset == 0 and acks[1].partition == 0
    with pytest.raises(P.NoTopicForSubjectError):  # type: ignore[attr-defined]
        acks.raise_for_errors()  # the first failure
    assert isinstance(acks[3].error, P.InvalidSubjectError)  # type: ignore[attr-defined]
