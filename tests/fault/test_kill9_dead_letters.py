"""kill -9 and dead letters (``broker/consumers/_dead_letters.py``), through the bundled
client: a broker killed after a message's last allowed delivery, before anything
settled it, makes its copy once after the restart; a broker killed right after a copy
(its intent maybe not yet marked done) does not make it again."""

from __future__ import annotations

from pathlib import Path

import trio
from conftest import BrokerProcess

from broker.client import Client, connect


async def dead_letters(c: Client) -> list[tuple[str, str, str]]:
    f = await c.fetch("s", "dlq", 0, 1, 100)
    return sorted((m.payload.decode(), m.headers["Nats-DLQ-Reason"], m.headers["Nats-DLQ-Sequence"]) for m in f.messages)


async def test_kill_9_neither_loses_nor_doubles_a_dead_letter(data_dir: Path) -> None:
    start = lambda: trio.to_thread.run_sync(lambda: BrokerProcess(data_dir, "--fsync", "always", "--no-nats"))  # noqa: E731
    proc = await start()
    try:
        async with connect(proc.address, reconnect=False) as c:
            await c.create_stream("s")
            await c.create_topic("s", "work", subjects=["w.>"], retention="workqueue")
            await c.create_topic("s", "dlq", subjects=["dlq.work"])
            await c.create_consumer("s", "work", "w", ack_wait=3600, max_deliver=1, dead_letter_subject="dlq.work")
            for body in (b"bad", b"poison", b"good"):
                await c.publish("w.x", body)
            got = await c.pull("s", "work", "w", 3)
            assert [m.payload for m in got] == [b"bad", b"poison", b"good"]
            await got[2].ack(sync=True)
            await got[1].term(sync=True)
            assert await dead_letters(c) == [("poison", "Terminated", "2")]
        # At once: bad's last allowed delivery is out, unsettled (its copy not made);
        # poison's copy is made, its intent not marked done yet (or just).
        proc.kill9()
        proc = await start()
        async with connect(proc.address, reconnect=False) as c:
            assert await dead_letters(c) == [("poison", "Terminated", "2")]  # not made twice
            info = await c.consumer_info("s", "work", "w")
            assert info.num_ack_pending == 1  # bad (back when its ack wait ends)
            assert info.dead_lettered == {"MaxDeliveries": 0, "Terminated": 1, "Expired": 0, "Limit": 0}
            # Settled after the restart by offset (what a pulled message's nak sends: a
            # settle names the partition and offset, not the connection).
            await c._acker("s", "work", "w").sync((1, 0, 1, 0))  # NAKed on its last allowed delivery: given up
            assert await dead_letters(c) == [("bad", "MaxDeliveries", "1"), ("poison", "Terminated", "2")]
            info = await c.consumer_info("s", "work", "w")
            assert info.dead_lettered == {"MaxDeliveries": 1, "Terminated": 1, "Expired": 0, "Limit": 0}
            assert info.num_ack_pending == 0
            with trio.fail_after(10):  # the work queue lets the originals go once their copies are stored
                while (await c.get_topic("s", "work")).messages_count:
                    await trio.sleep(0.01)
    finally:
        proc.stop()


async def test_kill_9_right_after_a_limit_copy_does_not_make_it_again(data_dir: Path) -> None:
    """``dead_letter_expired``: a publish past ``max_msgs`` (discard old) removes the
    oldest, undelivered message, whose copy is made in the same group commit; killed
    right after the publish's ack (the intent maybe not yet marked done), the broker
    finds the copy stored after the restart and makes no second one, and the counts
    come back from the journal."""
    start = lambda: trio.to_thread.run_sync(lambda: BrokerProcess(data_dir, "--fsync", "always", "--no-nats"))  # noqa: E731
    proc = await start()
    try:
        async with connect(proc.address, reconnect=False) as c:
            await c.create_stream("s")
            await c.create_topic("s", "work", subjects=["w.>"], max_msgs=1, discard="old")
            await c.create_topic("s", "dlq", subjects=["dlq.work"])
            await c.create_consumer("s", "work", "w", dead_letter_subject="dlq.work", dead_letter_expired=True)
            await c.publish("w.x", b"first")
            await c.publish("w.x", b"second")  # first goes, undelivered: copied (Limit)
            assert await dead_letters(c) == [("first", "Limit", "1")]
        proc.kill9()
        proc = await start()
        async with connect(proc.address, reconnect=False) as c:
            await c.publish("w.x", b"third")  # (after the recovery: second goes, its copy is the next)
            assert await dead_letters(c) == [("first", "Limit", "1"), ("second", "Limit", "2")]
            info = await c.consumer_info("s", "work", "w")
            assert info.dead_lettered == {"MaxDeliveries": 0, "Terminated": 0, "Expired": 0, "Limit": 2}
            assert [m.payload for m in await c.pull("s", "work", "w", 1)] == [b"third"]
    finally:
        proc.stop()
