"""Work-queue and interest retention on the binary protocol (a topic's
``retention`` option), with the bundled client: what a consumer acks goes, what
nobody wants goes, counters stay exact, and the work queue's consumer rules are
refused with INVALID_CONSUMER_CONFIG in nats-server's words. The kill -9 case is in
``tests/fault/test_kill9_features.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import make_config, start_server

import protocol as P
from broker import Clock
from broker.client import connect


async def _setup(c: Any, retention: str, partitions: int = 1) -> None:
    await c.create_stream("s")
    await c.create_topic("s", "t", partitions=partitions, subjects=["t.>"], retention=retention)


async def _live(c: Any) -> int:
    return (await c.get_topic("s", "t")).messages_count


async def test_a_work_queue_topic_removes_what_its_consumer_acks(mock_clock: Any, data_dir: Path) -> None:
    async with start_server(make_config(data_dir), Clock()) as h, connect(h.address) as c:
        await _setup(c, "workqueue", partitions=2)
        assert (await c.get_topic("s", "t")).options["retention"] == "workqueue"
        await c.publish_batch([(f"t.{i}", b"%d" % i) for i in range(10)])
        await c.create_consumer("s", "t", "work")
        got = await c.pull("s", "t", "work", 10, no_wait=True)
        for m in got[:6]:
            await m.ack()
        await got[6].term()
        await got[7].ack(sync=True)
        assert await _live(c) == 2  # two outstanding
        info = await c.consumer_info("s", "t", "work")
        assert (info.num_pending, info.num_ack_pending) == (0, 2)
        await got[8].nak()
        await c.publish("t.x", b"more")
        assert await _live(c) == 3
        assert (await c.stats())["removed_acked"] == 8


async def test_work_queue_consumer_rules(data_dir: Path) -> None:
    async with start_server(make_config(data_dir), Clock()) as h, connect(h.address) as c:
        await _setup(c, "workqueue")
        cases = [
            ({"ack_policy": "none"}, "consumer in pull mode requires explicit ack policy on workqueue stream"),
            ({"ack_policy": "all"}, "workqueue stream requires explicit ack"),
            ({"deliver_policy": "new"}, "consumer must be deliver all on workqueue stream"),
        ]
        for cfg, text in cases:
            with pytest.raises(P.BrokerError) as info:
                await c.create_consumer("s", "t", "x", **cfg)
            assert (info.value.code, info.value.message) == (P.ErrorCode.INVALID_CONSUMER_CONFIG, text)
        await c.create_consumer("s", "t", "eu", filter_subjects=["t.eu.>"])
        for cfg, text in [
            ({}, "multiple non-filtered consumers not allowed on workqueue stream"),
            ({"filter_subjects": ["t.*.x"]}, "filtered consumer not unique on workqueue stream"),
        ]:
            with pytest.raises(P.BrokerError) as info:
                await c.create_consumer("s", "t", "x", **cfg)
            assert (info.value.code, info.value.message) == (P.ErrorCode.INVALID_CONSUMER_CONFIG, text)
        await c.create_consumer("s", "t", "us", filter_subjects=["t.us.>"])
        with pytest.raises(P.BrokerError) as info:
            await c.update_consumer("s", "t", "us", filter_subjects=["t.>"])
        assert info.value.message == "filtered consumer not unique on workqueue stream"
        with pytest.raises(P.BrokerError) as info:
            await c.update_topic("s", "t", retention="limits")
        assert (info.value.code, info.value.message) == (
            P.ErrorCode.INVALID_TOPIC_CONFIG, "stream configuration update can not change retention policy to/from workqueue")
        with pytest.raises(P.BrokerError) as info:
            await c.create_topic("s", "u", subjects=["u.>"], retention="sometimes")
        assert info.value.code == P.ErrorCode.INVALID_TOPIC_CONFIG
        assert info.value.message == "retention must be one of limits, workqueue, interest, not 'sometimes'"


async def test_an_interest_topic_keeps_a_message_while_some_consumer_wants_it(mock_clock: Any, data_dir: Path) -> None:
    async with start_server(make_config(data_dir), Clock()) as h, connect(h.address) as c:
        await _setup(c, "interest")
        await c.publish("t.a", b"unwanted")
        assert await _live(c) == 0  # no consumer: not kept (its offset is used)
        await c.create_consumer("s", "t", "all")
        await c.create_consumer("s", "t", "b", filter_subjects=["t.b"])
        await c.create_consumer("s", "t", "fire", ack_policy="none")  # settles by delivering
        await c.publish("t.a", b"a")
        await c.publish("t.b", b"b")
        assert await _live(c) == 2
        assert len(await c.pull("s", "t", "fire", 10, no_wait=True)) == 2
        (a, b) = await c.pull("s", "t", "all", 10, no_wait=True)
        assert (a.offset, b.offset) == (2, 3)
        await a.ack(sync=True)
        assert await _live(c) == 1  # b is still wanted by "all" and "b"
        await b.ack(sync=True)
        assert await _live(c) == 1  # and by "b"
        await c.delete_consumer("s", "t", "b")
        assert await _live(c) == 0
        # Limits -> interest on a topic with messages: what nobody wants goes.
        await c.create_topic("s", "l", subjects=["l.>"])
        await c.publish_batch([("l.x", b"1"), ("l.y", b"2")])
        await c.create_consumer("s", "l", "y", filter_subjects=["l.y"])
        await c.update_topic("s", "l", retention="interest")
        assert (await c.get_topic("s", "l")).messages_count == 1


async def test_at_start_the_sweep_removes_what_was_settled_but_not_removed(
    mock_clock: Any, data_dir: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A crash between a settle made durable and its removal (here: the removal
    turned off for the first run) leaves settled messages behind; the next start
    removes them, and only them."""
    import broker.consumers._engine as engine_module

    cfg = make_config(data_dir)
    with monkeypatch.context() as m:
        m.setattr(engine_module, "release", lambda *args: 0)
        async with start_server(cfg, Clock()) as h, connect(h.address) as c:
            await _setup(c, "workqueue", partitions=2)
            await c.publish_batch([(f"t.{i}", b"%d" % i) for i in range(10)])
            await c.create_consumer("s", "t", "work")
            got = await c.pull("s", "t", "work", 6, no_wait=True)
            for msg in got[:4]:
                await msg.ack(sync=True)
            assert await _live(c) == 10
    async with start_server(cfg, Clock()) as h, connect(h.address) as c:
        assert await _live(c) == 6  # two outstanding, four never pulled
        info = await c.consumer_info("s", "t", "work")
        assert (info.num_pending, info.num_ack_pending) == (4, 2)
        assert (await c.stats())["removed_acked"] == 4
