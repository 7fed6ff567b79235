"""kill -9 with limits hit: a topic at its max_msgs with discard old, and one at its
max_msgs with discard new, under load; after the restart the first holds exactly
its newest max_msgs messages, the second exactly the first max_msgs, every
acknowledged message of either that its limit kept is there, and the counts are
exact."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import trio
from conftest import BrokerProcess
from test_kill9_features import read_topic

from broker.client import ConnectionClosedError, connect

LIMIT = 500


@pytest.mark.parametrize("fsync", ["always", "200ms"])
async def test_kill_9_with_limits_hit(data_dir: Path, fsync: str) -> None:
    proc = await trio.to_thread.run_sync(lambda: BrokerProcess(data_dir, "--fsync", fsync))
    acked_old: list[int] = []
    acked_new: list[int] = []
    refused = 0
    try:
        async with connect(proc.address, reconnect=False) as c:
            await c.create_stream("s")
            await c.create_topic("s", "old", subjects=["old.>"], max_msgs=LIMIT, segment_size=16 * 1024)
            await c.create_topic("s", "new", subjects=["new.>"], max_msgs=LIMIT, discard="new", segment_size=16 * 1024)

            async def producer(topic: str, k: int) -> None:
                nonlocal refused
                n = 0
                try:
                    while True:
                        acks = await c.publish_batch([(f"{topic}.{k}.{i % 7}", f"{k}:{n}:{i}".encode()) for i in range(30)])
                        assert acks is not None
                        for a in acks:
                            if a.ok:
                                (acked_old if topic == "old" else acked_new).append(a.offset)
                            else:
                                refused += 1
                        n += 1
                except ConnectionClosedError:
                    return

            async with trio.open_nursery() as nursery:
                for k in range(3):
                    nursery.start_soon(producer, "old", k)
                    nursery.start_soon(producer, "new", k)
                while len(acked_old) < 5000 or refused < 300:
                    await trio.sleep(0.01)
                await trio.to_thread.run_sync(proc.kill9)
    finally:
        if proc.proc.poll() is None:
            proc.kill9()
    assert proc.proc.returncode == -signal.SIGKILL

    proc2 = await trio.to_thread.run_sync(lambda: BrokerProcess(data_dir, "--fsync", fsync))
    try:
        async with connect(proc2.address) as c:
            old = sorted(o for _, o in await read_topic(c, "old", 1))
            top = max(acked_old)
            assert len(old) == LIMIT and old[-1] >= top
            assert old == list(range(old[-1] - LIMIT + 1, old[-1] + 1))  # the newest, none missing
            assert (await c.get_topic("s", "old")).messages_count == LIMIT
            new = sorted(o for _, o in await read_topic(c, "new", 1))
            assert new == list(range(1, LIMIT + 1)) and sorted(acked_new) == new
            assert (await c.get_topic("s", "new")).messages_count == LIMIT
            acks = await c.publish_batch([("new.x", b"1"), ("old.x", b"1")])
            assert acks is not None and not acks[0].ok and acks[1].ok
            stats = await c.stats()
            damage = (stats["corrupt_records"], stats["damage_detected"])
            assert stats["refused_limits"] == 1
    finally:
        await trio.to_thread.run_sync(proc2.stop)
    damaged = [line for line in proc2.stderr.splitlines() if "damage" in line or "corrupt" in line]
    assert damage == (0, 0), damaged
