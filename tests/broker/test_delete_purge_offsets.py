"""Deleting messages, purging topics and subjects, and named consumer offsets; all of
it durable across a restart."""

from __future__ import annotations

import zlib

import pytest
from conftest import start_server

import protocol as P
from broker.client import Client, connect


def part_of(subject: str, n: int = 3) -> int:
    return zlib.crc32(subject.encode()) % n


async def test_delete_message(client: Client, topic: tuple[str, str]) -> None:
    acks = await client.publish_batch([("orders.a", f"{i}".encode()) for i in range(5)])
    assert acks is not None
    p = acks[0].partition
    await client.delete_message(*topic, p, 3)
    assert [m.offset for m in (await client.fetch(*topic, p, 1, 10)).messages] == [1, 2, 4, 5]
    with pytest.raises(P.MessageNotFoundError) as info:  # type: ignore[attr-defined]
        await client.delete_message(*topic, p, 3)
    assert info.value.code == 6004 and "offset 3" in info.value.message
    for bad in (0, 6, 10**12):
        with pytest.raises(P.MessageNotFoundError):  # type: ignore[attr-defined]
            await client.delete_message(*topic, p, bad)
    with pytest.raises(P.PartitionNotFoundError) as info2:  # type: ignore[attr-defined]
        await client.delete_message(*topic, 3, 1)
    assert info2.value.code == 3001 and "0..2" in info2.value.message
    assert (await client.stats())["deleted"] == 1


async def test_purge_topic_and_subjects(client: Client, topic: tuple[str, str]) -> None:
    await client.publish_batch([(f"orders.{r}.{i}", b"x") for r in ("eu", "us") for i in range(10)])
    assert await client.purge(*topic, "orders.eu.3") == 1
    assert await client.purge(*topic, "orders.eu.*") == 9
    assert await client.purge(*topic, "orders.eu.*") == 0
    remaining = sum([len((await client.fetch(*topic, p, 1, 100)).messages) for p in range(3)])
    assert remaining == 10
    assert await client.purge(*topic) == 10
    assert sum([len((await client.fetch(*topic, p, 1, 100)).messages) for p in range(3)]) == 0
    ack = await client.publish("orders.eu.1", b"after")
    assert ack is not None and ack.offset > 1  # offsets never repeat
    t = await client.get_topic(*topic)
    assert t.messages_count == 1
    assert (await client.stats())["purged"] == 20
    with pytest.raises(P.InvalidSubjectFilterError):  # type: ignore[attr-defined]
        await client.purge(*topic, "a..b")


async def test_deny_purge(client: Client) -> None:
    await client.create_stream("s")
    await client.create_topic("s", "audit", subjects=["audit.>"], deny_purge=True)
    ack = await client.publish("audit.x", b"1")
    assert ack is not None
    with pytest.raises(P.PurgeDeniedError) as info:  # type: ignore[attr-defined]
        await client.purge("s", "audit")
    assert info.value.code == 6007 and "deny_purge" in info.value.message
    with pytest.raises(P.PurgeDeniedError):  # type: ignore[attr-defined]
        await client.delete_message("s", "audit", 0, ack.offset)
    with pytest.raises(P.PurgeDeniedError):  # type: ignore[attr-defined]
        await client.purge("s", "audit", "audit.x")


async def test_deletes_and_purges_survive_restart(config) -> None:  # type: ignore[no-untyped-def]
    async with start_server(config) as h, connect(h.address) as c:
        await c.create_stream("s")
        await c.create_topic("s", "t", partitions=2, subjects=["t.>"])
        await c.publish_batch([(f"t.{i % 4}", f"{i}".encode()) for i in range(40)])
        p0 = part_of("t.0", 2)
        await c.delete_message("s", "t", p0, 1)
        await c.purge("s", "t", "t.1")
        p3 = part_of("t.3", 2)
        before = {p: [(m.offset, m.payload) for m in (await c.fetch("s", "t", p, 1, 100)).messages] for p in (0, 1)}
        last = {p: (await c.fetch("s", "t", p, 1, 1)).last_offset for p in (0, 1)}
    async with start_server(config) as h, connect(h.address) as c:
        after = {p: [(m.offset, m.payload) for m in (await c.fetch("s", "t", p, 1, 100)).messages] for p in (0, 1)}
        assert after == before
        assert all([not m.subject.endswith(".1") for p in (0, 1) for m in (await c.fetch("s", "t", p, 1, 100)).messages])
        ack = await c.publish("t.3", b"next")
        assert ack is not None and ack.offset == last[p3] + 1
        await c.purge("s", "t")
    async with start_server(config) as h, connect(h.address) as c:
        assert (await c.get_topic("s", "t")).messages_count == 0
        ack = await c.publish("t.3", b"again")
        assert ack is not None and ack.offset == last[p3] + 2


async def test_consumer_offsets(config) -> None:  # type: ignore[no-untyped-def]
    async with start_server(config) as h, connect(h.address) as c:
        await c.create_stream("s")
        await c.create_topic("s", "t", partitions=2, subjects=["t.>"])
        with pytest.raises(P.ConsumerOffsetNotFoundError) as info:  # type: ignore[attr-defined]
            await c.get_offset("s", "t", "billing", 0)
        assert info.value.code == 7004 and "billing" in info.value.message
        await c.store_offset("s", "t", "billing", 0, 42)
        await c.store_offset("s", "t", "billing", 1, 7)
        await c.store_offset("s", "t", "Audit Job", 0, 1)
        await c.store_offset("s", "t", "billing", 0, 43)
        assert await c.get_offset("s", "t", "billing", 0) == 43
        await c.delete_offset("s", "t", "audit job", 0)
        with pytest.raises(P.PartitionNotFoundError):  # type: ignore[attr-defined]
            await c.store_offset("s", "t", "billing", 2, 1)
        with pytest.raises(P.InvalidNameError):  # type: ignore[attr-defined]
            await c.store_offset("s", "t", "bad/name", 0, 1)
        with pytest.raises(P.ConsumerOffsetNotFoundError):  # type: ignore[attr-defined]
            await c.delete_offset("s", "t", "nobody", 0)
    async with start_server(config) as h, connect(h.address) as c:
        assert await c.get_offset("s", "t", "billing", 0) == 43
        assert await c.get_offset("s", "t", "billing", 1) == 7
        with pytest.raises(P.ConsumerOffsetNotFoundError):  # type: ignore[attr-defined]
            await c.get_offset("s", "t", "audit.job", 0)
