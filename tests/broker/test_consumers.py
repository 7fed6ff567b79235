"""Durable consumers, end to end through a real broker on loopback (docs/semantics.md §16).

Virtual time (``mock_clock``, moved only by ``advance``) drives ack waits, backoffs
and pull expiry, so every timing check is exact. These tests speak the consumer
commands through the client's request path; the client's own consumer API is tested
in ``tests/client``.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import trio
import trio.testing
from ttl_helpers import advance, broker_and_client

import protocol as P
from broker import Clock
from protocol import AckKind

I = P.Identifier.of
S, T = "shop", "orders"


async def setup(c: Any, partitions: int = 1, **opts: Any) -> None:
    await c.create_stream(S)
    await c.create_topic(S, T, partitions=partitions, subjects=["orders.>"], **opts)


async def create(c: Any, name: str = "work", **config: Any) -> Any:
    return await c.create_consumer(S, T, name, **config)


async def info(c: Any, name: str = "work") -> Any:
    return await c.consumer_info(S, T, name)


async def pull(c: Any, batch: int = 10, name: str = "work", expires_ms: int = 0, no_wait: bool = True, max_bytes: int = 0) -> list[Any]:
    if no_wait:
        return await c.pull(S, T, name, batch, no_wait=True, max_bytes=max_bytes)  # type: ignore[no-any-return]
    return await c.pull(S, T, name, batch, expires=expires_ms / 1000, max_bytes=max_bytes)  # type: ignore[no-any-return]


async def settle(c: Any, msgs: Any, kind: AckKind = AckKind.ACK, delay_ms: int = 0, name: str = "work") -> None:
    for m in msgs:
        if kind == AckKind.ACK:
            await m.ack(sync=True)
        elif kind == AckKind.TERM:
            await m.term(sync=True)
        elif kind == AckKind.NAK:
            await m.nak(delay=delay_ms / 1000 if delay_ms else None, sync=True)
        else:
            await m.in_progress(sync=True)


def payloads(msgs: Any) -> list[bytes]:
    return [m.payload for m in msgs]


async def publish(c: Any, n: int, subject: str = "orders.a", start: int = 0) -> None:
    for i in range(start, start + n):
        await c.publish(subject, b"m%d" % i)


# -- configuration --------------------------------------------------------------------


async def test_create_is_idempotent_and_refuses_another_config(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir, Clock()) as (_, c):
        await setup(c)
        first = await create(c, ack_wait=10)
        again = await create(c, ack_wait=10)
        assert first["config"] == again["config"] and again["name"] == "work"
        with pytest.raises(P.ConsumerExistsError, match="consumer already exists"):
            await create(c, ack_wait=20)
        with pytest.raises(P.ConsumerNotFoundError, match="consumer not found"):
            await info(c, "nobody")
        with pytest.raises(P.ConsumerFiltersOverlapError, match="consumer subject filters cannot overlap"):
            await create(c, "f", filter_subjects=["orders.*", "orders.a"])
        with pytest.raises(P.InvalidConsumerConfigError, match="max deliver is required to be > length of backoff values"):
            await create(c, "b", backoff=[1, 2], max_deliver=2)
        with pytest.raises(P.InvalidOptionsError, match="unknown consumer option 'nope'"):
            await create(c, "n", nope=1)
        listed = await c.list_consumers(S, T)
        assert [x["name"] for x in listed] == ["work"]
        with pytest.raises(P.ConsumerUpdateDeniedError) as denied:
            await c.update_consumer(S, T, "work", deliver_policy="new", ack_wait=10)
        assert denied.value.message == "deliver policy can not be updated"
        updated = await c.update_consumer(S, T, "work", ack_wait=5)
        assert updated["config"]["ack_wait"] == 5
        await c.delete_consumer(S, T, "work")
        with pytest.raises(P.ConsumerNotFoundError):
            await info(c)


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({}, [b"m0", b"m1", b"m2", b"x0", b"m3"]),
        ({"deliver_policy": "new"}, []),
        ({"deliver_policy": "last"}, [b"m3"]),
        ({"deliver_policy": "last_per_subject"}, [b"x0", b"m3"]),
        ({"deliver_policy": "by_start_offset", "opt_start_offset": 3}, [b"m2", b"x0", b"m3"]),
        ({"deliver_policy": "by_start_offset", "opt_start_offset": {0: 4}}, [b"x0", b"m3"]),
        ({"filter_subjects": ["orders.b"]}, [b"x0"]),
        ({"filter_subjects": ["orders.b", "orders.a"], "deliver_policy": "last_per_subject"}, [b"x0", b"m3"]),
    ],
)
async def test_deliver_policies_and_filters(mock_clock, data_dir, config, expected) -> None:
    async with broker_and_client(data_dir, Clock()) as (_, c):
        await setup(c)
        await publish(c, 3)
        await c.publish("orders.b", b"x0")
        await publish(c, 1, start=3)
        created = await create(c, **config)
        assert created["num_pending"] == len(expected)
        got = await pull(c, 100)
        assert payloads(got) == expected
        # Everything stored later is delivered, whatever the policy (if it matches).
        await c.publish("orders.b", b"late")
        assert payloads(await pull(c, 100)) == [b"late"]
        assert (await info(c))["num_pending"] == 0


async def test_by_start_time(mock_clock, data_dir) -> None:
    clock = Clock()
    async with broker_and_client(data_dir, clock) as (_, c):
        await setup(c)
        await publish(c, 2)
        await advance(10)
        middle = clock.now_ns()
        await publish(c, 2, start=2)
        await create(c, "t", deliver_policy="by_start_time", opt_start_time=middle)
        assert payloads(await pull(c, 10, "t")) == [b"m2", b"m3"]
        await create(c, "future", deliver_policy="by_start_time", opt_start_time=middle + 3600 * 10**9)
        await publish(c, 1, start=4)
        assert payloads(await pull(c, 10, "future")) == [b"m4"]


# -- pulls ------------------------------------------------------------------------------


async def test_waiting_pull_is_answered_by_a_publish_at_once_and_expires_otherwise(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir, Clock()) as (_, c):
        await setup(c)
        await create(c)
        got: list[Any] = []
        async with trio.open_nursery() as n:
            n.start_soon(_collect, got, pull(c, 1, expires_ms=5000, no_wait=False))
            await waiting(c, 1)
            await advance(1)
            before = trio.current_time()
            await c.publish("orders.a", b"now")
        assert trio.current_time() == before  # no virtual time passed: no polling interval
        assert payloads(got[0]) == [b"now"]
        # Nothing arrives: the pull ends when it expires, not before.
        late: list[Any] = []
        async with trio.open_nursery() as n:
            n.start_soon(_collect, late, pull(c, 5, expires_ms=2000, no_wait=False))
            await waiting(c, 1)
            await advance(1.995)
            assert not late and (await info(c))["num_waiting"] == 1
            await advance(0.02)  # within the timer's 10 ms bucket (and trio's wake-up margin)
        assert late == [[]]
        assert (await info(c))["num_waiting"] == 0


async def waiting(c: Any, n: int, name: str = "work") -> None:
    """Until the broker holds ``n`` waiting pulls (they travel on real sockets)."""
    while (await info(c, name))["num_waiting"] != n:
        await trio.testing.wait_all_tasks_blocked()


async def _collect(out: list[Any], aw: Any) -> None:
    out.append(await aw)


async def test_concurrent_pulls_get_disjoint_messages_and_max_waiting(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir, Clock()) as (_, c):
        await setup(c, partitions=3)
        await create(c, max_waiting=3)
        got: list[Any] = []
        async with trio.open_nursery() as n:
            for _ in range(3):
                n.start_soon(_collect, got, pull(c, 4, expires_ms=1000, no_wait=False))
            await waiting(c, 3)
            with pytest.raises(P.MaxWaitingExceededError, match="Exceeded MaxWaiting"):
                await pull(c, 1, expires_ms=1000, no_wait=False)
            for i in range(12):
                await c.publish(f"orders.{i}", b"%d" % i)
        seen = [m.payload for b in got for m in b]
        assert sorted(seen) == sorted(b"%d" % i for i in range(12))
        assert len(set(seen)) == 12


async def test_max_ack_pending_caps_what_is_outstanding(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir, Clock()) as (_, c):
        await setup(c)
        await publish(c, 10)
        await create(c, max_ack_pending=3)
        first = await pull(c, 10)
        assert payloads(first) == [b"m0", b"m1", b"m2"]
        assert payloads(await pull(c, 10)) == []
        await settle(c, first[:2])
        assert payloads(await pull(c, 10)) == [b"m3", b"m4"]
        i = await info(c)
        assert (i["num_pending"], i["num_ack_pending"]) == (5, 3)


# -- acknowledgements -------------------------------------------------------------------------


async def test_ack_kinds_redelivery_and_counters(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir, Clock()) as (_, c):
        await setup(c)
        await publish(c, 5)
        await create(c, ack_wait=10)
        m = (await pull(c, 5))
        assert [x.num_delivered for x in m] == [1] * 5 and [x.pending for x in m] == [4, 3, 2, 1, 0]
        await settle(c, m[:1])  # ack m0
        await settle(c, m[:1])  # twice: harmless
        await settle(c, m[1:2], AckKind.TERM)  # m1 never again
        await settle(c, m[2:3], AckKind.NAK)  # m2 now, ahead of anything new
        await c.publish("orders.a", b"new")
        again = await pull(c, 1)
        assert payloads(again) == [b"m2"] and again[0].num_delivered == 2
        await settle(c, m[3:4], AckKind.NAK, delay_ms=3000)  # m3 after 3 s
        i = await info(c)
        assert (i["num_pending"], i["num_ack_pending"], i["num_redelivered"]) == (1, 3, 1)
        assert i["ack_floor"]["stream_seq"] == 2
        await advance(2.9)
        assert payloads(await pull(c, 1)) == [b"new"]
        await advance(0.11)
        assert payloads(await pull(c, 1)) == [b"m3"]
        # m4: in progress at 9 s moves its deadline to 19 s.
        await advance(6)
        await settle(c, m[4:5], AckKind.IN_PROGRESS)
        await advance(1.5)  # 10.5 s after its delivery: not yet
        assert b"m4" not in payloads(await pull(c, 10))
        await advance(9)
        assert b"m4" in payloads(await pull(c, 10))


async def test_redelivery_is_never_early_and_gives_up_after_max_deliver(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir, Clock()) as (_, c):
        await setup(c)
        await publish(c, 1)
        await create(c, backoff=[1, 4], max_deliver=3)
        assert [x.num_delivered for x in (await pull(c))] == [1]
        await advance(0.99)
        assert not (await pull(c))
        await advance(0.02)
        assert [x.num_delivered for x in (await pull(c))] == [2]
        await advance(3.99)
        assert not (await pull(c))
        await advance(0.02)
        assert [x.num_delivered for x in (await pull(c))] == [3]
        await advance(10)
        assert not (await pull(c))
        i = await info(c)
        assert (i["num_ack_pending"], i["num_redelivered"]) == (0, 0)
        stats = await c.stats()
        assert stats["consumer_given_up"] == 1


async def test_ack_policy_all_and_none(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir, Clock()) as (_, c):
        await setup(c)
        await publish(c, 4)
        await create(c, "all", ack_policy="all")
        m = (await pull(c, 4, "all"))
        await settle(c, m[2:3], name="all")
        assert (await info(c, "all"))["num_ack_pending"] == 1
        await create(c, "none", ack_policy="none")
        assert len((await pull(c, 3, "none"))) == 3
        i = await info(c, "none")
        assert (i["num_pending"], i["num_ack_pending"]) == (1, 0)
        assert await c.get_offset(S, T, "none", 0) == 3  # Iggy's auto-commit


# -- removals --------------------------------------------------------------------------------


async def test_removals_before_and_during_delivery_keep_counters_exact(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir, Clock()) as (_, c):
        await setup(c, allow_msg_ttl=True)
        await publish(c, 6)
        await create(c, ack_wait=30)
        out = (await pull(c, 2))  # m0, m1 outstanding
        await c.delete_message(S, T, 0, out[0].offset)  # outstanding: dropped as terminated
        await c.delete_message(S, T, 0, 4)  # m3, not delivered yet: never delivered
        i = await info(c)
        assert (i["num_pending"], i["num_ack_pending"]) == (3, 1)
        await c.publish("orders.a", b"short", ttl=1)
        assert (await info(c))["num_pending"] == 4
        await advance(1.2)  # the TTL removes it before delivery
        assert (await info(c))["num_pending"] == 3
        assert payloads(await pull(c, 10)) == [b"m2", b"m4", b"m5"]
        await settle(c, out[:1])  # late ack of a removed message: no effect
        await c.purge(S, T)
        i = await info(c)
        assert (i["num_pending"], i["num_ack_pending"]) == (0, 0)
        assert i["ack_floor"]["stream_seq"] == i["partitions"][0]["cursor"] - 1
        await advance(60)
        assert payloads(await pull(c, 10)) == []


async def test_markers_are_delivered_like_any_message(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir, Clock()) as (_, c):
        await setup(c, allow_msg_ttl=True, subject_delete_marker_ttl=1)
        await create(c)
        await c.publish("orders.a", b"x", ttl=1)
        assert payloads(await pull(c)) == [b"x"]
        await advance(1.2)
        got = (await pull(c))
        assert len(got) == 1 and got[0].is_marker and got[0].headers["Nats-Marker-Reason"] == "MaxAge"


# -- durability -----------------------------------------------------------------------------


async def test_restart_keeps_acks_and_brings_outstanding_back_after_ack_wait(mock_clock, data_dir) -> None:
    clock = Clock()
    async with broker_and_client(data_dir, clock) as (_, c):
        await setup(c)
        await publish(c, 5)
        await create(c, ack_wait=10)
        m = (await pull(c, 3))
        await settle(c, m[:2])
    async with broker_and_client(data_dir, clock) as (_, c):
        i = await info(c)
        assert (i["num_pending"], i["num_ack_pending"]) == (2, 1)
        later = await pull(c, 10)
        assert payloads(later) == [b"m3", b"m4"]
        await settle(c, later)
        await advance(9.9)
        assert payloads(await pull(c, 10)) == []
        await advance(0.2)
        again = (await pull(c, 10))
        assert payloads_of(again) == [b"m2"] and again[0].num_delivered == 2


def payloads_of(msgs: Any) -> list[bytes]:
    return [m.payload for m in msgs]


async def test_damaged_consumer_journal_is_reported_and_loses_nothing(mock_clock, data_dir) -> None:
    clock = Clock()
    async with broker_and_client(data_dir, clock) as (_, c):
        await setup(c)
        await publish(c, 4)
        await create(c, ack_wait=10)
        first = (await pull(c, 2))
        await settle(c, first)
        assert payloads(await pull(c, 2)) == [b"m2", b"m3"]
    journals = [os.path.join(r, f) for r, _, fs in os.walk(data_dir) for f in fs if f.startswith("consumers.journal")]
    assert len(journals) == 2
    for path in journals:  # the same bytes damaged in both copies: the last delivery's event
        raw = bytearray(open(path, "rb").read())
        raw[-6] ^= 0xFF
        open(path, "wb").write(bytes(raw))
    async with broker_and_client(data_dir, clock) as (_, c):
        stats = await c.stats()
        assert stats["damage_detected"] >= 1
        # The lost event delivered m2 and m3: they are delivered again, never lost.
        assert payloads(await pull(c, 10)) == [b"m2", b"m3"]
        assert (await info(c))["num_pending"] == 0


# -- consumer groups ------------------------------------------------------------------------------


async def test_partitioned_consumer_gives_each_partition_to_one_member(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir, Clock()) as (handle, c):
        from broker.client import connect

        await setup(c, partitions=4)
        await create(c, mode="partitioned", ack_wait=30)
        with pytest.raises(P.NotAMemberError, match="join its group"):
            await pull(c)
        for i in range(40):
            await c.publish(f"orders.{i}", b"%d" % i)
        async with connect(handle.address, timeout=None) as c2:
            a = await c.join_group(S, T, "work", "a")
            assert a["partitions"] == [0, 1, 2, 3]
            got_a = (await pull(c, 100))
            assert {m.partition for m in got_a} == {0, 1, 2, 3}
            b = await c2.join_group(S, T, "work", "b")
            # a holds messages of every partition: nothing moves until they are settled.
            assert b["partitions"] == []
            assert (await pull(c2, 100)) == []
            await settle(c, [m for m in got_a if m.partition in (1, 3)])
            await c.publish("orders.0", b"more")
            owned = {p["partition"]: p["owner"] for p in (await info(c))["partitions"]}
            assert owned[1] == "b" and owned[3] == "b"
            got_b = (await pull(c2, 100))
            assert {m.partition for m in got_b} <= {1, 3}
            # b disconnects: its partitions come back to a.
        await advance(0.1)
        owned = {p["partition"]: p["owner"] for p in (await info(c))["partitions"]}
        assert set(owned.values()) == {"a"}


async def test_group_leave_and_member_timeout_move_partitions(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir, Clock()) as (handle, c):
        from broker.client import connect

        await setup(c, partitions=2)
        await create(c, mode="partitioned", member_timeout=5)
        async with connect(handle.address, timeout=None) as c2:
            await c.join_group(S, T, "work", "a")
            b = await c2.join_group(S, T, "work", "b")
            assert b["partitions"] == [1]
            for i in range(20):
                await c.publish(f"orders.{i}", b"%d" % i)
            held = await pull(c2, 100)
            assert held and {m.partition for m in held} == {1}
            # b leaves holding messages: they come back at once, to a, never to both.
            await c2.leave_group(S, T, "work")
            again = await pull(c, 100)
            assert {m.partition for m in again} == {0, 1}
            assert {(m.offset, m.num_delivered) for m in again if m.partition == 1} == {(m.offset, 2) for m in held}
            await settle(c, again)
            # b joins again and gets partition 1 (a holds nothing of it now) ...
            assert (await c2.join_group(S, T, "work", "b"))["partitions"] == [1]
            # ... and loses it when it stops pulling for member_timeout.
            await advance(4.9)
            assert {p["owner"] for p in (await info(c))["partitions"]} == {"a", "b"}
            await c.pull(S, T, "work", 1, no_wait=True)  # a keeps pulling
            await advance(0.2)
            owners = {p["partition"]: p["owner"] for p in (await info(c))["partitions"]}
            assert owners == {0: "a", 1: "a"}
            with pytest.raises(P.NotAMemberError):
                await c2.pull(S, T, "work", 1, no_wait=True)


async def test_a_stopped_consume_loop_ends_its_pulls(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir, Clock()) as (_, c):
        await setup(c)
        await create(c)
        await publish(c, 3)
        seen = []
        async with c.consume(S, T, "work", batch=10) as messages:
            async for m in messages:
                seen.append(m.payload)
                await m.ack()
                if len(seen) == 3:
                    break
        assert seen == [b"m0", b"m1", b"m2"]
        i = await info(c)
        assert (i["num_waiting"], i["num_ack_pending"], i["num_pending"]) == (0, 0, 0)
        await publish(c, 1, start=3)  # nobody pulls: it waits for the next pull
        assert (await info(c))["num_pending"] == 1
        assert payloads(await pull(c)) == [b"m3"]


# -- counters under every kind of removal, and across restarts -------------------------------


def counters(i: Any) -> tuple[int, int, int]:
    return i["num_pending"], i["num_ack_pending"], i["num_redelivered"]


async def test_counters_stay_exact_under_rollup_max_msgs_per_subject_and_max_age(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir, Clock()) as (_, c):
        await setup(c, allow_rollup=True, max_msgs_per_subject=2, message_expiry=60)
        await create(c, ack_wait=10)
        for s in ("a", "b", "c"):
            await publish(c, 2, f"orders.{s}")  # 6 messages, 2 per subject
        out = await pull(c, 1)  # orders.a m0 outstanding
        assert counters(await info(c)) == (5, 1, 0)
        # max_msgs_per_subject: a third orders.b removes the oldest orders.b (not delivered).
        await c.publish("orders.b", b"b3")
        assert counters(await info(c)) == (5, 1, 0)
        # A rollup of orders.a removes m0 (outstanding: dropped as terminated) and m1.
        await c.publish("orders.a", b"a-rollup", headers={"Nats-Rollup": "sub"})
        assert counters(await info(c)) == (5, 0, 0)
        await settle(c, out)  # a late ack of the removed message changes nothing
        assert counters(await info(c)) == (5, 0, 0)
        await advance(20)
        await c.publish("orders.d", b"d1")
        got = await pull(c, 2)
        assert [(m.subject, m.payload) for m in got] == [("orders.b", b"m1"), ("orders.c", b"m0")]
        assert counters(await info(c)) == (4, 2, 0)
        await advance(10.1)  # ack wait: both are due again; redelivered once pulled
        assert counters(await info(c)) == (4, 2, 0)
        again = await pull(c, 2)
        assert [m.num_delivered for m in again] == [2, 2] and counters(await info(c)) == (4, 2, 2)
        # Max age removes everything stored at the start, outstanding or not.
        await advance(30)
        assert counters(await info(c)) == (1, 0, 0)
        last = await pull(c, 10)
        assert payloads(last) == [b"d1"] and counters(await info(c)) == (0, 1, 0)
        await advance(20.1)  # d1 ages out while outstanding: dropped, nothing left
        assert counters(await info(c)) == (0, 0, 0)
        assert payloads(await pull(c, 10)) == []
        t = await c.get_topic(S, T)
        assert [(x["name"], x["num_pending"], x["num_ack_pending"]) for x in t.extra["consumers"]] == [("work", 0, 0)]


async def test_counters_are_exact_after_a_restart_with_a_group_mid_rebalance(mock_clock, data_dir) -> None:
    clock = Clock()
    async with broker_and_client(data_dir, clock, **{"system.partition.fsync": "always"}) as (handle, c):
        from broker.client import connect

        await setup(c, partitions=2, allow_msg_ttl=True)
        await create(c, mode="partitioned", ack_wait=10)
        for i in range(20):
            await c.publish(f"orders.{i}", b"%d" % i)
        async with connect(handle.address, timeout=None) as c2:
            await c.join_group(S, T, "work", "a")
            held = await pull(c, 100, name="work")
            assert {m.partition for m in held} == {0, 1}
            # b joins while a holds both partitions: partition 1 is draining to b.
            assert (await c2.join_group(S, T, "work", "b"))["partitions"] == []
            acked = [m for m in held if m.partition == 0][:3]
            await settle(c, acked)
            before = counters(await info(c))
            assert before == (0, len(held) - 3, 0)
    # Restarted with members gone: nothing acked comes back, everything outstanding
    # does (after its ack wait), and the counters say so exactly.
    async with broker_and_client(data_dir, clock) as (_, c):
        i = await info(c)
        assert counters(i) == before
        assert {p["owner"] for p in i["partitions"]} <= {None, ""}
        await c.join_group(S, T, "work", "a")
        assert await pull(c, 100) == []
        await advance(10.1)
        again = await pull(c, 100)
        assert sorted((m.partition, m.offset) for m in again) == sorted(
            (m.partition, m.offset) for m in held if m not in acked)
        assert all(m.num_delivered == 2 for m in again)
        assert counters(await info(c)) == (0, len(again), len(again))
        await settle(c, again)
        assert counters(await info(c)) == (0, 0, 0)
