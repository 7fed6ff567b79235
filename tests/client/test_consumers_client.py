"""The client's durable-consumer API end to end (``docs/semantics.md`` §16):
management, ``pull`` and the message settle methods, the ``consume`` loop,
reconnections, and the asyncio flavour.

Time-dependent checks run on virtual time (``mock_clock``, moved by ``advance``), so
ack waits and pull expiries are exact and nothing sleeps on the wall clock.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from conftest import BrokerProcess, make_config, start_server
from helpers import held_commit

import protocol as P
from broker import Clock
from broker.client import (
    Client,
    ConnectionLostError,
    ConsumerInfo,
    ConsumerMessage,
    MessageStream,
    ReconnectFailedError,
    aio,
    connect,
)
from broker.client._consumers import consumer_config

S, T = "shop", "orders"
FAST: dict[str, Any] = {"reconnect_wait": 0.01, "reconnect_wait_max": 0.05, "max_reconnect_attempts": -1}


async def advance(seconds: float) -> None:
    """Move virtual time on and let every task that fell due run."""
    trio.lowlevel.current_clock().jump(seconds)  # type: ignore[attr-defined]
    await trio.testing.wait_all_tasks_blocked()


@contextlib.asynccontextmanager
async def broker_and_client(data_dir: Path, **client_options: Any) -> AsyncIterator[tuple[Any, Client]]:
    cfg = make_config(data_dir, **{"system.partition.fsync": "never"})
    async with start_server(cfg, Clock()) as handle:
        async with connect(handle.address, timeout=None, **client_options) as client:
            yield handle, client


async def settled(c: Client) -> None:
    """Let what the broker sent before now reach the tasks waiting for it (a round
    trip on the same connection comes back after it)."""
    await c.ping()
    await trio.testing.wait_all_tasks_blocked()


async def setup(c: Client, partitions: int = 1) -> None:
    await c.create_stream(S)
    await c.create_topic(S, T, partitions=partitions, subjects=["orders.>"])


async def publish(c: Client, n: int, subject: str = "orders.a", start: int = 0) -> None:
    await c.publish_batch([(subject, b"m%d" % i) for i in range(start, start + n)])


# -- configuration ----------------------------------------------------------------------


def test_config_conversions() -> None:
    start = dt.datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=dt.timezone.utc)
    cfg = consumer_config(
        filter_subject="orders.a", ack_wait=dt.timedelta(seconds=90), backoff=[1, dt.timedelta(milliseconds=1500)],
        opt_start_time=start, member_timeout=5, description=None, opt_start_offset={"1": 7},
    )
    assert cfg == {
        "filter_subjects": ["orders.a"], "ack_wait": 90.0, "backoff": [1.0, 1.5],
        "opt_start_time": int(start.timestamp()) * 10**9 + 123456000, "member_timeout": 5.0, "opt_start_offset": {"1": 7},
    }
    with pytest.raises(TypeError):
        consumer_config(ack_wait="30s")


async def test_create_info_list_update_delete(mock_clock: Any, data_dir: Path) -> None:
    async with broker_and_client(data_dir) as (_, c):
        await setup(c, partitions=2)
        info = await c.create_consumer(S, T, "work", filter_subjects=["orders.a", "orders.b"], ack_wait=dt.timedelta(seconds=10))
        assert isinstance(info, ConsumerInfo) and info.name == "work"
        assert info.config["filter_subjects"] == ["orders.a", "orders.b"] and info.config["ack_wait"] == 10
        assert info.num_pending == 0 and info.num_ack_pending == 0 and info.num_waiting == 0 and info.num_redelivered == 0
        assert len(info.partitions) == 2 and info.raw["stream"] == S and info.topic == T
        # idempotent with the same config, refused with another
        again = await c.create_consumer(S, T, "work", filter_subjects=["orders.a", "orders.b"], ack_wait=10)
        assert again.config == info.config
        with pytest.raises(P.ConsumerExistsError) as exc:  # type: ignore[attr-defined]
            await c.create_consumer(S, T, "work", ack_wait=20)
        assert exc.value.code == P.ErrorCode.CONSUMER_EXISTS == 7007
        with pytest.raises(P.ConsumerFiltersOverlapError):  # type: ignore[attr-defined]
            await c.create_consumer(S, T, "o", filter_subjects=["orders.*", "orders.a"])
        await c.create_consumer(S, T, "other")
        assert [i.name for i in await c.list_consumers(S, T)] == ["other", "work"] or \
            sorted(i.name for i in await c.list_consumers(S, T)) == ["other", "work"]
        updated = await c.update_consumer(S, T, "work", filter_subjects=["orders.a", "orders.b"], ack_wait=5)
        assert updated.config["ack_wait"] == 5
        await publish(c, 3)
        assert (await c.consumer_info(S, T, "work")).num_pending == 3
        await c.delete_consumer(S, T, "work")
        with pytest.raises(P.ConsumerNotFoundError):  # type: ignore[attr-defined]
            await c.consumer_info(S, T, "work")
        with pytest.raises(P.ConsumerNotFoundError):  # type: ignore[attr-defined]
            await c.delete_consumer(S, T, "work")
        assert [i.name for i in await c.list_consumers(S, T)] == ["other"]


# -- pull and settle --------------------------------------------------------------------


async def test_pull_no_wait_and_message_fields(mock_clock: Any, data_dir: Path) -> None:
    async with broker_and_client(data_dir) as (_, c):
        await setup(c)
        await c.create_consumer(S, T, "work")
        assert await c.pull(S, T, "work", 10, no_wait=True) == []
        await publish(c, 5)
        got = await c.pull(S, T, "work", 3, no_wait=True)
        assert [m.payload for m in got] == [b"m0", b"m1", b"m2"]
        m = got[0]
        assert isinstance(m, ConsumerMessage)
        assert (m.partition, m.offset, m.num_delivered, m.consumer_seq, m.pending, m.subject) == (0, 1, 1, 1, 4, "orders.a")
        assert [x.pending for x in got] == [4, 3, 2]
        rest = await c.pull(S, T, "work", 10, no_wait=True)
        assert [x.offset for x in rest] == [4, 5]
        with pytest.raises(P.ConsumerNotFoundError):  # type: ignore[attr-defined]
            await c.pull(S, T, "nobody", no_wait=True)


async def test_a_waiting_pull_is_answered_when_a_message_is_published(mock_clock: Any, data_dir: Path) -> None:
    async with broker_and_client(data_dir) as (handle, c), connect(handle.address, timeout=None) as publisher:
        await setup(c)
        await c.create_consumer(S, T, "work")
        got: list[list[ConsumerMessage]] = []
        async with trio.open_nursery() as nursery:

            async def puller() -> None:
                got.append(await c.pull(S, T, "work", 3, expires=60))

            nursery.start_soon(puller)
            await advance(1)
            assert (await c.consumer_info(S, T, "work")).num_waiting == 1
            await publisher.publish("orders.a", b"first")  # arrives in a PULL_MESSAGES push
            await advance(1)
            assert not got
            await publish(publisher, 2, start=1)  # fills the batch: the response ends it
        assert [m.payload for m in got[0]] == [b"first", b"m1", b"m2"]
        # a pull that expires returns what came (here nothing), at its expiry
        async with trio.open_nursery() as nursery:

            async def expiring() -> None:
                got.append(await c.pull(S, T, "work", 5, expires=2.5))

            nursery.start_soon(expiring)
            await trio.testing.wait_all_tasks_blocked()
            await settled(c)  # the pull is at the broker
            await advance(2.4)
            await settled(c)
            assert len(got) == 1
            await advance(0.2)
            await settled(c)
            assert got[1] == []


async def test_ack_nak_term_in_progress(mock_clock: Any, data_dir: Path) -> None:
    async with broker_and_client(data_dir) as (_, c):
        await setup(c)
        await c.create_consumer(S, T, "work", ack_wait=10)
        await publish(c, 6)
        a, b, t, w, d, s = await c.pull(S, T, "work", 6, no_wait=True)
        await a.ack()
        await a.ack()  # twice: harmless
        await b.nak()
        await t.term()
        await w.in_progress()
        await d.nak(delay=dt.timedelta(seconds=5))
        await s.ack(sync=True)  # also carries the queued ones, durably
        info = await c.consumer_info(S, T, "work")
        assert info.num_ack_pending == 3  # b (nak'd, redelivered now), w, d
        again = await c.pull(S, T, "work", 10, no_wait=True)
        assert [(m.offset, m.num_delivered) for m in again] == [(2, 2)]
        await again[0].ack(sync=True)
        await advance(5.5)
        again = await c.pull(S, T, "work", 10, no_wait=True)
        assert [(m.offset, m.num_delivered) for m in again] == [(5, 2)]
        await again[0].term(sync=True)
        await advance(5)  # w's ack wait restarted by in_progress: 10 s from then
        again = await c.pull(S, T, "work", 10, no_wait=True)
        assert [(m.offset, m.num_delivered) for m in again] == [(4, 2)]
        await again[0].in_progress(sync=True)
        await again[0].nak(sync=True)
        again = await c.pull(S, T, "work", 10, no_wait=True)
        assert [(m.offset, m.num_delivered) for m in again] == [(4, 3)]
        await again[0].ack()
        await settled(c)
        info = await c.consumer_info(S, T, "work")
        assert info.num_ack_pending == 0 and info.num_pending == 0


async def test_a_request_goes_out_after_the_acks_queued_before_it(mock_clock: Any, data_dir: Path) -> None:
    """Read your own acks: an ack without sync costs no round trip, but a request
    written after it on the same connection (an info, a pull) goes out after it."""
    async with broker_and_client(data_dir) as (_, c):
        await setup(c)
        await c.create_consumer(S, T, "work")
        await publish(c, 4)
        a, b, d, e = await c.pull(S, T, "work", 4, no_wait=True)
        await a.ack()
        assert (await c.consumer_info(S, T, "work")).num_ack_pending == 3
        await b.ack()
        await d.ack()
        assert await c.pull(S, T, "work", 1, no_wait=True) == []  # e is still out, nothing else
        assert (await c.consumer_info(S, T, "work")).num_ack_pending == 1
        await e.term()
        info = await c.consumer_info(S, T, "work")
        assert info.num_ack_pending == 0 and info.raw["ack_floor"]["stream_seq"] == 4


def test_asyncio_requests_go_out_after_the_acks_queued_before_them(data_dir: Path) -> None:
    proc = BrokerProcess(data_dir)

    async def main() -> list[int]:
        async with aio.connect(proc.address) as c:
            await c.create_stream(S)
            await c.create_topic(S, T, subjects=["orders.>"])
            await c.create_consumer(S, T, "work")
            await c.publish_batch([("orders.a", b"m%d" % i) for i in range(3)])
            out = []
            for m in await c.pull(S, T, "work", 3, no_wait=True):
                await m.ack()
                out.append((await c.consumer_info(S, T, "work")).num_ack_pending)
            return out

    try:
        assert aio.run(main()) == [2, 1, 0]
    finally:
        proc.stop()


async def test_acks_queued_at_close_are_sent(mock_clock: Any, data_dir: Path) -> None:
    cfg = make_config(data_dir, **{"system.partition.fsync": "never"})
    async with start_server(cfg, Clock()) as handle:
        async with connect(handle.address, timeout=None) as c:
            await setup(c)
            await c.create_consumer(S, T, "work")
            await publish(c, 3)
            for m in await c.pull(S, T, "work", 3, no_wait=True):
                await m.ack()
            # leaving the block closes the client right away: the acks still go
        async with connect(handle.address, timeout=None) as c:
            info = await c.consumer_info(S, T, "work")
            assert info.num_ack_pending == 0 and info.raw["ack_floor"]["stream_seq"] == 3


async def test_an_ack_sync_of_settled_messages_waits_for_the_earlier_acks_to_be_durable(
    data_dir: Path, monkeypatch: Any
) -> None:
    """fsync ``always``: acks sent without sync are applied at once; an ack sync of
    the same message afterwards (as ``ttlbroker consumer next`` sends for its last
    message) changes nothing, and is still answered only once they are durable."""
    async with start_server(make_config(data_dir), Clock()) as handle:
        async with connect(handle.address, timeout=None) as c:
            await setup(c)
            await c.create_consumer(S, T, "work")
            await publish(c, 2)
            msgs = await c.pull(S, T, "work", 2, no_wait=True)
            with held_commit(monkeypatch) as gate:
                for m in msgs:
                    await m.ack()
                await trio.testing.wait_all_tasks_blocked()  # the turn's acks are sent
                assert (await c.consumer_info(S, T, "work")).num_ack_pending == 0  # applied, not durable
                done = trio.Event()
                async with trio.open_nursery() as nursery:

                    async def ack_sync() -> None:
                        await msgs[-1].ack(sync=True)
                        done.set()

                    nursery.start_soon(ack_sync)
                    await trio.testing.wait_all_tasks_blocked()
                    assert not done.is_set()  # answered before the acks were durable
                    gate.set()
                assert done.is_set()


async def test_closing_makes_acks_sent_without_sync_durable(data_dir: Path, monkeypatch: Any) -> None:
    """Acks a turn of the loop already sent (no response) are made durable by the
    close (an ACK_SYNC with no entries), not only those still queued."""
    async with start_server(make_config(data_dir), Clock()) as handle:
        acked, closed = trio.Event(), trio.Event()
        gates: list[trio.Event] = []

        async def user() -> None:
            async with connect(handle.address, timeout=None) as c:
                await setup(c)
                await c.create_consumer(S, T, "work")
                await publish(c, 3)
                msgs = await c.pull(S, T, "work", 3, no_wait=True)
                with held_commit(monkeypatch) as gate:
                    gates.append(gate)
                    for m in msgs:
                        await m.ack()
                    await trio.testing.wait_all_tasks_blocked()  # the turn's acks are sent
                    assert (await c.consumer_info(S, T, "work")).num_ack_pending == 0  # applied, not durable
                    acked.set()
                # leaving the block closes the client
            closed.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(user)
            await acked.wait()
            await trio.testing.wait_all_tasks_blocked()
            assert not closed.is_set()  # the close waits for the acks' sync
            gates[0].set()
            await closed.wait()
        async with connect(handle.address, timeout=None) as c2:
            info = await c2.consumer_info(S, T, "work")
            assert info.num_ack_pending == 0 and info.raw["ack_floor"]["stream_seq"] == 3


# -- consume ------------------------------------------------------------------------


async def test_consume_processes_and_acks_everything(mock_clock: Any, data_dir: Path) -> None:
    async with broker_and_client(data_dir) as (handle, c), connect(handle.address, timeout=None) as publisher:
        await setup(c, partitions=3)
        await c.create_consumer(S, T, "work", ack_wait=30)
        n = 2500
        await publish(publisher, 1000)
        seen: list[bytes] = []
        async with c.consume(S, T, "work", batch=100) as messages:
            assert isinstance(messages, MessageStream)
            async for m in messages:
                seen.append(m.payload)
                await m.ack()
                if len(seen) == 1000:
                    # buffering is bounded: at most 2 × batch received
                    assert len(messages._buffer) <= 200
                    await publish(publisher, n - 1000, start=1000)
                if len(seen) == n:
                    break
        assert sorted(seen) == sorted(b"m%d" % i for i in range(n))
        info = await c.consumer_info(S, T, "work")
        assert info.num_ack_pending == 0 and info.num_pending == 0 and info.num_redelivered == 0
        assert info.num_waiting == 0 or True  # pulls left in flight expire on their own


async def test_consume_hands_back_unread_messages_at_exit(mock_clock: Any, data_dir: Path) -> None:
    async with broker_and_client(data_dir) as (_, c):
        await setup(c)
        await c.create_consumer(S, T, "work", ack_wait=30)
        await publish(c, 50)
        async with c.consume(S, T, "work", batch=10) as messages:
            first = await messages.next()
            await first.ack()
        await advance(0.1)
        # the unread (buffered) ones were NAKed: available again at once, not after 30 s
        got = await c.pull(S, T, "work", 100, no_wait=True)
        assert sorted(m.offset for m in got) == list(range(2, 51))
        for m in got:
            await m.ack()
        await c.ping()
        await advance(0.1)
        assert (await c.consumer_info(S, T, "work")).num_ack_pending == 0


async def test_consume_with_a_member_joins_and_leaves(mock_clock: Any, data_dir: Path) -> None:
    async with broker_and_client(data_dir) as (_, c):
        await setup(c, partitions=2)
        await c.create_consumer(S, T, "grp", mode="partitioned", member_timeout=30)
        await c.publish_batch([(f"orders.{i}", b"x") for i in range(20)])
        got = []
        async with c.consume(S, T, "grp", batch=5, member="m1") as messages:
            assert sorted(messages.partitions) == [0, 1]
            info = await c.consumer_info(S, T, "grp")
            assert [m["name"] for m in info.raw["members"]] == ["m1"]
            async for m in messages:
                got.append(m)
                await m.ack()
                if len(got) == 20:
                    break
        info = await c.consumer_info(S, T, "grp")
        assert info.raw.get("members", []) == [] and info.num_ack_pending == 0


async def test_consume_survives_a_broker_restart(data_dir: Path) -> None:
    """Real time here (a restart on the same port); the acked stay acked, the others
    come again, and the loop goes on."""
    port = 0
    seen: list[int] = []
    async with trio.open_nursery() as nursery:
        scope = trio.CancelScope()
        done = trio.Event()

        async def run(task_status: trio.TaskStatus[Any]) -> None:
            cfg = make_config(data_dir, **{"system.partition.fsync": "never", "server.port": port})
            try:
                with scope:
                    async with start_server(cfg) as h:
                        task_status.started(h)
                        await trio.sleep_forever()
            finally:
                done.set()

        handle = await nursery.start(run)
        port = handle.port
        async with connect(handle.address, **FAST) as c:
            await setup(c)
            await c.create_consumer(S, T, "work", ack_wait=1)
            await publish(c, 10)
            with trio.fail_after(30):
                async with c.consume(S, T, "work", batch=4, expires=5) as messages:
                    async for m in messages:
                        seen.append(m.offset)
                        await m.ack(sync=True)
                        if len(seen) == 5:
                            scope.cancel()
                            await done.wait()
                            scope = trio.CancelScope()
                            done = trio.Event()
                            await nursery.start(run)
                            await publish(c, 5, start=10)  # waits for the reconnection
                        if set(seen) >= set(range(1, 16)):
                            break
            assert c.reconnects == 1
            info = await c.consumer_info(S, T, "work")
            assert info.num_pending == 0
        scope.cancel()


async def test_pull_in_flight_at_a_drop_fails_and_consume_raises_when_the_client_gives_up(data_dir: Path) -> None:
    cfg = make_config(data_dir, **{"system.partition.fsync": "never"})
    async with start_server(cfg) as handle, connect(handle.address, **FAST) as admin:
        await setup(admin)
        await admin.create_consumer(S, T, "work")
    # the broker is gone now
    async with trio.open_nursery() as nursery:
        scope = trio.CancelScope()
        done = trio.Event()

        async def run(task_status: trio.TaskStatus[Any]) -> None:
            try:
                with scope:
                    async with start_server(cfg) as h:
                        task_status.started(h)
                        await trio.sleep_forever()
            finally:
                done.set()

        handle = await nursery.start(run)
        async with connect(handle.address, reconnect_wait=0.01, reconnect_wait_max=0.02, max_reconnect_attempts=2) as c:
            with trio.fail_after(20):
                async with trio.open_nursery() as inner:
                    errors: list[BaseException] = []

                    async def puller() -> None:
                        try:
                            await c.pull(S, T, "work", 5, expires=30)
                        except ConnectionLostError as exc:
                            errors.append(exc)

                    inner.start_soon(puller)
                    while (await c.consumer_info(S, T, "work")).num_waiting < 1:
                        await trio.sleep(0.01)
                    async with c.consume(S, T, "work") as messages:
                        scope.cancel()
                        await done.wait()
                        with pytest.raises(ReconnectFailedError):
                            async for _ in messages:
                                pass
                assert len(errors) == 1


# -- asyncio ------------------------------------------------------------------------


def test_asyncio_consumers(data_dir: Path) -> None:
    proc = BrokerProcess(data_dir)

    async def main() -> None:
        async with aio.connect(proc.address) as c:
            await c.create_stream(S)
            await c.create_topic(S, T, subjects=["orders.>"])
            info = await c.create_consumer(S, T, "work", ack_wait=dt.timedelta(seconds=30))
            assert isinstance(info, ConsumerInfo) and info.config["ack_wait"] == 30
            assert [i.name for i in await c.list_consumers(S, T)] == ["work"]
            assert await c.pull(S, T, "work", no_wait=True) == []
            await c.publish_batch([("orders.a", b"m%d" % i) for i in range(300)])
            got = await c.pull(S, T, "work", 2, no_wait=True)
            await got[0].ack(sync=True)
            await got[1].nak()
            seen = []
            async with c.consume(S, T, "work", batch=50) as messages:
                async for m in messages:
                    seen.append(m.offset)
                    await m.ack()
                    if len(set(seen)) == 299:
                        break
            assert sorted(set(seen)) == list(range(2, 301))
            info = await c.consumer_info(S, T, "work")
            assert info.num_ack_pending == 0 and info.num_pending == 0
            await c.delete_consumer(S, T, "work")
            assert await c.list_consumers(S, T) == []

    try:
        aio.run(main())
    finally:
        proc.stop()
