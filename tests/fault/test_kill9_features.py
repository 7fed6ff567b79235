"""kill -9 under load with TTLs, deletes, republish and KV: after the restart every
acknowledged message is there (with its TTL still pending), no acknowledged delete
came back, every republished copy points at a stored message exactly once, every
acknowledged KV put is readable, and nothing is reported damaged."""

from __future__ import annotations

import random
import signal
from pathlib import Path

import pytest
import trio
from conftest import BrokerProcess

import protocol as P
from broker.client import Client, ConnectionClosedError, connect


async def read_topic(c: Client, topic: str, partitions: int) -> dict[tuple[int, int], P.Message]:
    out: dict[tuple[int, int], P.Message] = {}
    for p in range(partitions):
        offset = 1
        while True:
            f = await c.fetch("s", topic, p, offset, 5000)
            for m in f.messages:
                out[(p, m.offset)] = m
            if f.next_offset > f.last_offset or f.next_offset == offset:
                break
            offset = f.next_offset
    return out


@pytest.mark.slow
@pytest.mark.parametrize("fsync", ["always", "200ms"])
async def test_kill_9_with_ttls_deletes_republish_and_kv(data_dir: Path, fsync: str) -> None:
    proc = await trio.to_thread.run_sync(lambda: BrokerProcess(data_dir, "--fsync", fsync))
    acked: dict[tuple[int, int], tuple[bytes, bool]] = {}  # (partition, offset) -> (payload, has ttl)
    deleted: set[tuple[int, int]] = set()
    deleting: set[tuple[int, int]] = set()  # asked for; the kill may come before the ack
    kv_acked: dict[str, tuple[int, bytes]] = {}
    rng = random.Random(7)
    try:
        async with connect(proc.address, reconnect=False) as c:  # the workers end at the kill
            await c.create_stream("s")
            await c.create_topic(
                "s", "a", partitions=2, subjects=["a.>"], allow_msg_ttl=True, segment_size=64 * 1024,
                republish={"src": "a.>", "dest": "rp.>"},
            )
            await c.create_topic("s", "rp", subjects=["rp.>"], segment_size=64 * 1024)
            kv = await c.kv_create("cfg")

            async def producer(k: int) -> None:
                n = 0
                try:
                    while True:
                        msgs = []
                        for i in range(40):
                            payload = f"{k}:{n}:{i}".encode()
                            if i % 3 == 0:
                                msgs.append((f"a.{k}.{i % 5}", payload, None, 3600))
                            elif i % 3 == 1:
                                msgs.append((f"a.{k}.{i % 5}", payload, {"Nats-TTL": "2h"}))
                            else:
                                msgs.append((f"a.{k}.{i % 5}", payload))
                        acks = await c.publish_batch(msgs)
                        assert acks is not None and acks.ok
                        for m, a in zip(msgs, acks):
                            acked[(a.partition, a.offset)] = (m[1], len(m) > 2)
                        n += 1
                except ConnectionClosedError:
                    return

            async def deleter() -> None:
                try:
                    while True:
                        await trio.sleep(0.005)
                        if not acked:
                            continue
                        key = rng.choice(list(acked))
                        if key in deleting:
                            continue
                        deleting.add(key)
                        await c.delete_message("s", "a", key[0], key[1])
                        deleted.add(key)
                except ConnectionClosedError:
                    return

            async def kv_writer() -> None:
                n = 0
                try:
                    while True:
                        key = f"k{n % 20}"
                        value = f"v{n}".encode()
                        rev = await kv.put(key, value)
                        kv_acked[key] = (rev, value)
                        n += 1
                except ConnectionClosedError:
                    return

            async with trio.open_nursery() as nursery:
                for k in range(3):
                    nursery.start_soon(producer, k)
                nursery.start_soon(deleter)
                nursery.start_soon(kv_writer)
                while len(acked) < 6000 or len(kv_acked) < 20 or len(deleted) < 20:
                    await trio.sleep(0.01)
                await trio.to_thread.run_sync(proc.kill9)
    finally:
        if proc.proc.poll() is None:
            proc.kill9()
    assert proc.proc.returncode == -signal.SIGKILL

    proc2 = await trio.to_thread.run_sync(lambda: BrokerProcess(data_dir, "--fsync", fsync))
    try:
        async with connect(proc2.address) as c:
            stored = await read_topic(c, "a", 2)
            missing = [k for k in acked if k not in deleting and (k not in stored or stored[k].payload != acked[k][0])]
            assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {missing[:5]}"
            back = [k for k in deleted if k in stored]
            assert not back, f"acknowledged deletes came back: {back[:5]}"
            for k, (_, has_ttl) in acked.items():
                if k in stored and has_ttl:
                    assert stored[k].ttl in (3600, 7200) or stored[k].headers.get("Nats-TTL") == "2h"
            info = await c.get_topic("s", "a")
            with_ttl = sum(1 for k, (_, t) in acked.items() if t and k in stored)
            assert info.extra["pending_expiries"] >= with_ttl
            copies = await read_topic(c, "rp", 1)
            assert copies, "nothing was republished"
            seen: set[tuple[str, int]] = set()
            for m in copies.values():
                origin = (m.headers["Nats-Subject"], int(m.headers["Nats-Sequence"]))
                assert origin not in seen, f"republished twice: {origin}"
                seen.add(origin)
            kv = await c.kv("cfg")
            for key, (rev, value) in kv_acked.items():
                entry = await kv.get(key)
                assert entry.revision >= rev
                if entry.revision == rev:
                    assert entry.value == value
            stats = await c.stats()
            assert stats["corrupt_records"] == 0 and stats["damage_detected"] == 0
    finally:
        await trio.to_thread.run_sync(proc2.stop)


async def _pull_and_ack(clients: list[Client], topic: str, tried: set[tuple[int, int]], sync_acked: set[tuple[int, int]]) -> None:
    """20 pulls of 10 from the consumer ``work``, the clients taking turns: of each
    batch a third is left outstanding, a third acked with sync (recorded in
    ``sync_acked``), a third acked without (both recorded in ``tried``)."""
    for round_ in range(20):
        batch = await clients[round_ % len(clients)].pull("s", topic, "work", 10, no_wait=True)
        for k, m in enumerate(batch):
            key = (m.partition, m.offset)
            if k % 3 == 0:
                continue  # left outstanding
            tried.add(key)
            if k % 3 == 1:
                await m.ack(sync=True)
                sync_acked.add(key)
            else:
                await m.ack()


async def _pull_all(c: Client, topic: str) -> list[P.Message]:
    """Every message the consumer ``work`` delivers now, pulled until none is left."""
    rest: list[P.Message] = []
    while got := await c.pull("s", topic, "work", 100, no_wait=True):
        rest.extend(got)
    return rest


@pytest.mark.slow
async def test_kill_9_with_consumers_mid_flight(data_dir: Path) -> None:
    """Pulls, sync and plain acks, then SIGKILL: after the restart nothing whose sync
    ack was answered comes back, and every other message is still pending or
    outstanding (at least once: nothing lost)."""
    total = 300
    proc = await trio.to_thread.run_sync(lambda: BrokerProcess(data_dir, "--fsync", "always"))
    sync_acked: set[tuple[int, int]] = set()
    tried: set[tuple[int, int]] = set()
    try:
        async with connect(proc.address, reconnect=False) as c:
            await c.create_stream("s")
            await c.create_topic("s", "a", partitions=2, subjects=["a.>"])
            await c.publish_batch([(f"a.{i}", b"%d" % i) for i in range(total)])
            await c.create_consumer("s", "a", "work", ack_wait=3600)
            await _pull_and_ack([c], "a", tried, sync_acked)
    finally:
        await trio.to_thread.run_sync(proc.kill9)
    proc = await trio.to_thread.run_sync(lambda: BrokerProcess(data_dir, "--fsync", "always"))
    try:
        async with connect(proc.address) as c:
            info = await c.consumer_info("s", "a", "work")
            rest = await _pull_all(c, "a")
            keys = {(m.partition, m.offset) for m in rest}
            assert not keys & sync_acked
            outstanding = info["num_ack_pending"]
            assert info["num_pending"] == len(rest) == total - 200
            settled = total - len(rest) - outstanding
            assert len(sync_acked) <= settled <= len(tried)
    finally:
        await trio.to_thread.run_sync(proc.stop)


@pytest.mark.slow
async def test_kill_9_with_work_queue_consumers_mid_flight(data_dir: Path) -> None:
    """A work-queue topic with two workers pulling, sync acks, plain acks and
    messages left outstanding, then SIGKILL: after the restart no message whose sync
    ack was answered is in the topic or comes back, every message not acked is still
    there, and the counters agree: the topic's live messages are exactly those
    pending and outstanding."""
    total = 300
    proc = await trio.to_thread.run_sync(lambda: BrokerProcess(data_dir, "--fsync", "always"))
    sync_acked: set[tuple[int, int]] = set()
    tried: set[tuple[int, int]] = set()
    try:
        async with connect(proc.address, reconnect=False) as c, connect(proc.address, reconnect=False) as c2:
            await c.create_stream("s")
            await c.create_topic("s", "w", partitions=2, subjects=["w.>"], retention="workqueue")
            await c.publish_batch([(f"w.{i}", b"%d" % i) for i in range(total)])
            await c.create_consumer("s", "w", "work", ack_wait=3600)
            await _pull_and_ack([c, c2], "w", tried, sync_acked)
    finally:
        await trio.to_thread.run_sync(proc.kill9)
    proc = await trio.to_thread.run_sync(lambda: BrokerProcess(data_dir, "--fsync", "always"))
    try:
        async with connect(proc.address) as c:
            stored = await read_topic(c, "w", 2)
            assert not set(stored) & sync_acked  # an acked work item never comes back
            info = await c.consumer_info("s", "w", "work")
            details = await c.get_topic("s", "w")
            assert details.messages_count == len(stored) == info["num_pending"] + info["num_ack_pending"]
            rest = await _pull_all(c, "w")
            assert info["num_pending"] == len(rest) == total - 200
            assert not {(m.partition, m.offset) for m in rest} & tried
            assert len(stored) >= total - len(tried)  # every message not acked is still there
            assert (await c.stats())["corrupt_records"] == 0
    finally:
        await trio.to_thread.run_sync(proc.stop)
