"""Restarts: clean, after kill -9 under load, after a torn write, and with a flipped
bit on disk. Every acknowledged message must be there afterwards, and damage must be
reported, never served and never allowed to hide what follows it."""

from __future__ import annotations

import logging
import signal
import zlib
from pathlib import Path

import pytest
import trio
from conftest import BrokerProcess, start_server

import protocol as P
from broker.client import Client, ConnectionClosedError, connect, encode_msg


async def read_all(c: Client, stream: str, topic: str, partitions: int) -> dict[tuple[int, int], bytes]:
    out: dict[tuple[int, int], bytes] = {}
    for p in range(partitions):
        offset = 1
        while True:
            try:
                f = await c.fetch(stream, topic, p, offset, 5000)
            except P.CorruptedRecordError:  # type: ignore[attr-defined]
                offset += 1
                continue
            for m in f.messages:
                out[(p, m.offset)] = m.payload
            if f.next_offset >= f.last_offset + 1 or not f.messages and f.next_offset == offset:
                if f.next_offset > f.last_offset:
                    break
            offset = f.next_offset
    return out


async def test_clean_restart_keeps_everything(config) -> None:  # type: ignore[no-untyped-def]
    async with start_server(config) as h, connect(h.address) as c:
        await c.create_stream("s")
        await c.create_topic("s", "t", partitions=4, subjects=["t.>"], segment_size=64 * 1024)
        sent: dict[tuple[int, int], bytes] = {}
        for b in range(50):
            msgs = [(f"t.{i % 37}", f"{b}:{i}".encode()) for i in range(100)]
            acks = await c.publish_batch(msgs)
            assert acks is not None and acks.ok
            for (_, payload), a in zip(msgs, acks):
                sent[(a.partition, a.offset)] = payload
        before = await c.get_topic("s", "t")
    async with start_server(config) as h, connect(h.address) as c:
        assert await read_all(c, "s", "t", 4) == sent
        after = await c.get_topic("s", "t")
        assert after.messages_count == before.messages_count == 5000
        assert after.extra["partitions"] == before.extra["partitions"]
        ack = await c.publish("t.0", b"next")
        assert ack is not None and ack.offset == max(o for (p, o) in sent if p == ack.partition) + 1


@pytest.mark.parametrize("fsync", ["always", "never"])
async def test_kill_9_under_publish_load_loses_no_acknowledged_message(data_dir: Path, fsync: str) -> None:
    proc = await trio.to_thread.run_sync(lambda: BrokerProcess(data_dir, "--fsync", fsync))
    acked: dict[tuple[int, int], bytes] = {}
    try:
        async with connect(proc.address, reconnect=False) as c:  # the workers end at the kill
            await c.create_stream("s")
            await c.create_topic("s", "t", partitions=3, subjects=["t.>"], segment_size=256 * 1024)

            async def producer(k: int) -> None:
                n = 0
                try:
                    while True:
                        msgs = [(f"t.{k}.{i % 10}", f"{k}:{n}:{i}".encode()) for i in range(50)]
                        acks = await c.publish_batch(msgs)
                        assert acks is not None and acks.ok
                        for (_, payload), a in zip(msgs, acks):
                            acked[(a.partition, a.offset)] = payload
                        n += 1
                except ConnectionClosedError:
                    return

            async with trio.open_nursery() as n:
                for k in range(4):
                    n.start_soon(producer, k)
                while len(acked) < 20_000:
                    await trio.sleep(0.01)
                await trio.to_thread.run_sync(proc.kill9)
    finally:
        if proc.proc.poll() is None:
            proc.kill9()
    assert proc.proc.returncode == -signal.SIGKILL
    proc2 = await trio.to_thread.run_sync(lambda: BrokerProcess(data_dir, "--fsync", fsync))
    try:
        async with connect(proc2.address) as c:
            stored = await read_all(c, "s", "t", 3)
            missing = [k for k in acked if stored.get(k) != acked[k]]
            assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {missing[:5]}"
            # Offsets continue after the last one stored in every partition.
            for p in range(3):
                subject = next(f"t.after.{i}" for i in range(100) if zlib.crc32(f"t.after.{i}".encode()) % 3 == p)
                last = (await c.fetch("s", "t", p, 1, 1)).last_offset
                assert last >= max((o for (q, o) in acked if q == p), default=0)
                ack = await c.publish(subject, b"after")
                assert ack is not None and ack.partition == p and ack.offset == last + 1
            stats = await c.stats()
            assert stats["corrupt_records"] == 0
    finally:
        await trio.to_thread.run_sync(proc2.stop)


async def test_torn_write_at_the_tail(config, data_dir: Path, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.WARNING)
    async with start_server(config) as h, connect(h.address) as c:
        await c.create_stream("s")
        await c.create_topic("s", "t", subjects=["t.>"])
        acks = await c.publish_batch([("t.x", f"m{i}".encode()) for i in range(100)])
        assert acks is not None and acks.ok
    active = sorted((data_dir / "streams/1/topics/1/partitions/0").glob("*.log"))[-1]
    record = P.encode_record(101, 123, encode_msg("t.x", b"torn"))
    with open(active, "ab") as f:
        f.write(record[: len(record) // 2])  # the crash came mid-write
    async with start_server(config) as h, connect(h.address) as c:
        f = await c.fetch("s", "t", 0, 1, 1000)
        assert [m.payload for m in f.messages] == [f"m{i}".encode() for i in range(100)]
        stats = await c.stats()
        assert stats["torn_records_truncated"] == 1 and stats["corrupt_records"] == 0
        ack = await c.publish("t.x", b"m100")
        assert ack is not None and ack.offset == 101
    assert any("torn_tail_truncated" in r.getMessage() for r in caplog.records)


async def test_flipped_bit_in_a_sealed_segment(config, data_dir: Path, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.WARNING)
    async with start_server(config) as h, connect(h.address) as c:
        await c.create_stream("s")
        await c.create_topic("s", "t", subjects=["t.>"], segment_size=4096)
        for b in range(20):
            acks = await c.publish_batch([("t.x", f"{b}:{i}".encode().ljust(60, b".")) for i in range(10)])
            assert acks is not None and acks.ok
    part = data_dir / "streams/1/topics/1/partitions/0"
    segments = sorted(part.glob("*.log"))
    assert len(segments) >= 3
    victim_file = segments[1]
    base = int(victim_file.stem)
    positions = P_positions(victim_file.with_suffix(".index"))
    with open(victim_file, "r+b") as f:
        f.seek(positions[2] + 50)
        byte = f.read(1)
        f.seek(positions[2] + 50)
        f.write(bytes([byte[0] ^ 0x04]))
    victim = base + 2
    async with start_server(config) as h, connect(h.address) as c:
        with pytest.raises(P.CorruptedRecordError) as info:  # type: ignore[attr-defined]
            await c.fetch("s", "t", 0, victim, 10)
        assert info.value.code == P.ErrorCode.CORRUPTED_RECORD and f"offset {victim}" in info.value.message
        before = await c.fetch("s", "t", 0, 1, 1000)
        assert before.messages[-1].offset == victim - 1  # served up to the damage, never through it
        everything = await read_all(c, "s", "t", 1)
        assert sorted(o for (_, o) in everything) == [o for o in range(1, 201) if o != victim]
        stats = await c.stats()
        assert stats["corrupt_records"] == 1
        assert (await c.get_topic("s", "t")).messages_count == 199
    assert any("corrupt_record" in r.getMessage() for r in caplog.records)


def P_positions(index: Path) -> list[int]:  # noqa: N802
    import struct

    raw = index.read_bytes()
    return list(struct.unpack(f"<{len(raw) // 4}I", raw))


async def test_graceful_shutdown_on_sigterm(data_dir: Path) -> None:
    proc = await trio.to_thread.run_sync(lambda: BrokerProcess(data_dir, "--fsync", "never"))
    async with connect(proc.address) as c:
        await c.create_stream("s")
        await c.create_topic("s", "t", subjects=["t.>"])
        await c.publish_batch([("t.x", b"x")] * 500)
    code = await trio.to_thread.run_sync(proc.stop)
    assert code == 0
    assert "event=stopped" in proc.stderr and "event=shutting_down" in proc.stderr
    assert not (data_dir / "ttlbroker-data").exists()  # --data was honoured
    proc = await trio.to_thread.run_sync(lambda: BrokerProcess(data_dir))
    try:
        async with connect(proc.address) as c:
            assert (await c.get_topic("s", "t")).messages_count == 500
    finally:
        await trio.to_thread.run_sync(proc.stop)


async def test_a_second_broker_cannot_open_the_same_data(config) -> None:  # type: ignore[no-untyped-def]
    async with start_server(config):
        caught: list[BaseException] = []
        try:
            async with start_server(config):
                pass
        except* P.StorageFailureError as group:  # type: ignore[attr-defined]
            caught.extend(group.exceptions)
        assert len(caught) == 1 and "in use by another broker" in caught[0].message  # type: ignore[attr-defined]


@pytest.mark.slow
async def test_a_million_messages_survive_a_restart(data_dir: Path) -> None:
    """The issue's promise: publish a million messages, restart, read every one back."""
    proc = await trio.to_thread.run_sync(lambda: BrokerProcess(data_dir))
    total = 1_000_000
    try:
        async with connect(proc.address) as c:
            await c.create_stream("s")
            await c.create_topic("s", "t", partitions=2, subjects=["t.>"])
            bodies = [encode_msg(f"t.{i % 64}", f"{i:08d}".encode().ljust(100, b"-")) for i in range(1000)]

            async def batch_sender(k: int) -> None:
                for _ in range(total // 1000 // 8):
                    acks = await c.publish_batch(bodies)
                    assert acks is not None and acks.ok

            async with trio.open_nursery() as n:
                for k in range(8):
                    n.start_soon(batch_sender, k)
    finally:
        await trio.to_thread.run_sync(proc.stop)
    proc = await trio.to_thread.run_sync(lambda: BrokerProcess(data_dir))
    try:
        async with connect(proc.address) as c:
            count = 0
            for p in range(2):
                offset = 1
                while True:
                    f = await c.fetch("s", "t", p, offset, 20_000)
                    if not f.messages:
                        break
                    # every offset, in order, none missing
                    assert [m.offset for m in f.messages] == list(range(offset, offset + len(f.messages)))
                    count += len(f.messages)
                    offset = f.next_offset
                assert offset == f.last_offset + 1 and f.last_offset > 0
            assert count == total
    finally:
        await trio.to_thread.run_sync(proc.stop)

