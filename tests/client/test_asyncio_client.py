"""The asyncio flavour of the client (on uvloop where installed) against a broker in
its own process: the same methods as the trio client, and the same errors."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from conftest import BrokerProcess

import protocol as P
from broker.client import aio, encode_msg


@pytest.fixture
def proc(data_dir: Path):  # type: ignore[no-untyped-def]
    p = BrokerProcess(data_dir)
    try:
        yield p
    finally:
        p.stop()


def test_uvloop_is_used_when_installed() -> None:
    uvloop = pytest.importorskip("uvloop")
    assert aio.loop_factory() is uvloop.new_event_loop

    async def which() -> str:
        return type(asyncio.get_running_loop()).__module__

    assert aio.run(which()).startswith("uvloop")


def test_asyncio_client_end_to_end(proc: BrokerProcess) -> None:
    async def main() -> None:
        async with aio.connect(proc.address) as c:
            assert await c.ping() >= 0
            await c.create_stream("s")
            await c.create_topic("s", "t", partitions=2, subjects=["t.>"])
            sub = await c.subscribe("t.>")
            ack = await c.publish("t.a", b"one", headers={"k": "v"})
            assert ack is not None and ack.offset == 1
            acks = await c.publish_batch([encode_msg("t.a", b"two"), ("t.b", b"three"), ("nope", b"x")])
            assert acks is not None and [a.status for a in acks] == [0, 0, 6001]
            got = [await sub.next(timeout=5) for _ in range(3)]
            assert [m.payload for m in got] == [b"one", b"two", b"three"]
            f = await c.fetch("s", "t", ack.partition, 1, 10)
            assert [m.payload for m in f.messages][:2] == [b"one", b"two"] and f.messages[0].headers == {"k": "v"}
            assert (await c.get_last("s", "t", "t.a")).payload == b"two"
            with pytest.raises(P.StreamNotFoundError) as info:  # type: ignore[attr-defined]
                await c.get_stream("nope")
            assert info.value.code == 1001
            await c.store_offset("s", "t", "c1", 0, 5)
            assert await c.get_offset("s", "t", "c1", 0) == 5
            await sub.unsubscribe()
            stats = await c.stats()
            assert stats["messages_in"] == 3

    aio.run(main())


def test_asyncio_pipelining(proc: BrokerProcess) -> None:
    async def main() -> None:
        async with aio.connect(proc.address) as c:
            await c.create_stream("s")
            await c.create_topic("s", "t", subjects=["t.>"])
            acks = await asyncio.gather(*(c.publish("t.x", str(i).encode()) for i in range(2000)))
            assert sorted(a.offset for a in acks) == list(range(1, 2001))  # type: ignore[union-attr]

    aio.run(main())


def test_asyncio_timeout_and_closed_connection(proc: BrokerProcess) -> None:
    async def main() -> None:
        async with aio.connect(proc.address, timeout=5) as c:
            sub = await c.subscribe("x")
            with pytest.raises(TimeoutError):
                await sub.next(timeout=0.1)
        with pytest.raises(OSError):
            async with aio.connect("127.0.0.1:1"):
                pass

    aio.run(main())


def test_asyncio_client_kv_and_ttl(proc: BrokerProcess) -> None:
    """KV buckets, TTLs and export errors on the asyncio client."""

    async def main() -> None:
        async with aio.connect(proc.address) as c:
            kv = await c.kv_create("cache", history=2, ttl=60, refresh="on_read_and_write")
            r1 = await kv.put("a", b"1")
            assert (await kv.get("a")).value == b"1"
            with pytest.raises(P.WrongLastSequenceError):  # type: ignore[attr-defined]
                await kv.create("a", b"x")
            r2 = await kv.update("a", b"2", r1)
            assert await kv.touch("a") == pytest.approx(60, abs=1)
            assert await kv.keys() == ["a"]
            assert [e.value for e in await kv.history("a")] == [b"1", b"2"]
            events = []

            async def watch() -> None:
                async for e in kv.watch():
                    events.append((e.key, e.operation, e.revision))
                    if len(events) == 2:
                        return

            task = asyncio.ensure_future(watch())
            await asyncio.sleep(0.2)
            await kv.delete("a")
            await kv.put("b", b"x", ttl=1)
            await asyncio.wait_for(task, 10)
            assert events == [("a", "DEL", r2 + 1), ("b", "PUT", r2 + 2)]
            with pytest.raises(P.MessageNotFoundError):  # type: ignore[attr-defined]
                await kv.get("a")
            with pytest.raises(P.InvalidKeyError):  # type: ignore[attr-defined]
                await kv.put("a b", b"")
            bucket = await c.kv("cache")
            assert (await bucket.status())["refresh"] == "on_read_and_write"
            # Per-message TTLs through the asyncio client (their expiry is tested in
            # virtual time with the trio client).
            await c.create_stream("s2")
            await c.create_topic("s2", "t", subjects=["ttl.>"], allow_msg_ttl=True)
            await c.publish("ttl.x", b"", ttl=30)
            await c.publish("ttl.y", b"", headers={"Nats-TTL": "never"})
            got = (await c.fetch("s2", "t", 0, 1, 10)).messages
            assert [(m.ttl, m.never_expires) for m in got] == [(30, False), (P.TTL_NEVER, True)]
            with pytest.raises(P.InvalidMsgTtlError):  # type: ignore[attr-defined]
                await c.publish("ttl.z", b"", headers={"Nats-TTL": "500ms"})
            with pytest.raises(P.ExportNotConfiguredError):  # type: ignore[attr-defined]
                await c.export()

    aio.run(main())
