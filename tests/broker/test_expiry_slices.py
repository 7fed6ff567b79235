"""The deadline structure's two levels and the expiry pass in slices (docs/semantics.md §8.1):
entries fire on their 10 ms tick and never before their deadline, and a pass with a
huge batch due lets the event loop run between slices with every counter exact
(§6.8)."""

from __future__ import annotations

import random

import trio
from ttl_helpers import NS, advance, all_messages, broker_and_client

from broker.core._expiry import BUCKET_NS, CHUNK, COLLECT, TICK_NS, DeadlineQueue


class Owner:
    """A stand-in for a partition: the queue only keys on it."""


def test_entries_fire_on_their_tick_never_before_their_deadline() -> None:
    rng = random.Random(7)
    q = DeadlineQueue()
    a, b = Owner(), Owner()
    deadlines: dict[tuple[Owner, int], int] = {}
    for offset in range(1, 3001):
        owner = a if offset % 3 else b
        d = 10 * NS + rng.randrange(2 * NS)  # 20 buckets of 100 ms
        deadlines[owner, offset] = d
        assert q.add(d, owner, offset) == -(-d // TICK_NS) * TICK_NS  # type: ignore[arg-type]
    assert len(q) == q.entries() == 3000
    fired: set[tuple[Owner, int]] = set()
    now = 10 * NS - BUCKET_NS
    while len(fired) < 3000:
        now += 1_000_000  # 1 ms steps
        first = q.first_bucket()
        assert first is not None and first >= now - 1_000_000  # nothing was left behind
        for owner, offsets in q.pop_due(now):
            for o in offsets:
                d = deadlines[owner, o]  # type: ignore[index]
                assert d <= now, "fired before its deadline"
                assert now - d < TICK_NS + 1_000_000, "fired more than a tick late"
                fired.add((owner, o))  # type: ignore[arg-type]
        if now == 10 * NS + BUCKET_NS // 2:  # half-way through an opened bucket: add to it
            d = now + TICK_NS // 2
            deadlines[a, 5000] = d
            q.add(d, a, 5000)  # type: ignore[arg-type]
            deadlines[b, 5001] = now - 5 * TICK_NS  # already due
            q.add(now - 5 * TICK_NS, b, 5001)  # type: ignore[arg-type]
            assert q.first_bucket() == -(-(now - 5 * TICK_NS) // TICK_NS) * TICK_NS
            fired_before = len(fired)
            assert [o for _, offs in q.pop_due(now) for o in offs] == [5001]
            fired.add((b, 5001))
            assert len(fired) == fired_before + 1
            deadlines.pop((b, 5001))
        if len(fired) == 3001:
            break
    assert (a, 5000) in fired and q.first_bucket() is None and q.entries() == 0


def test_dropping_an_owner_forgets_its_entries_in_both_levels() -> None:
    q = DeadlineQueue()
    a, b = Owner(), Owner()
    q.add_many(1 * NS, a, [1, 2, 3])  # type: ignore[arg-type]
    q.add_many(5 * NS, a, [4])  # type: ignore[arg-type]
    q.add_many(5 * NS, b, [9])  # type: ignore[arg-type]
    assert list(q.pop_due(0)) == []  # nothing due yet
    assert list(q.pop_due(1 * NS - TICK_NS)) == []  # the first bucket is open now
    q.drop_partition(a)
    assert q.entries() == 1
    assert [(o, list(offs)) for o, offs in q.pop_due(10 * NS)] == [(b, [9])]


async def test_a_huge_batch_due_at_once_expires_in_slices_never_early(mock_clock, data_dir) -> None:
    n = 5000
    async with broker_and_client(data_dir) as (h, c):
        await c.create_stream("s")
        await c.create_topic("s", "t", subjects=["a.>"], allow_msg_ttl=True, subject_delete_marker_ttl=3600,
                             max_msgs_per_subject=1)
        for start in range(0, n, 1000):  # one virtual instant: one deadline for all
            (await c.publish_batch([(f"a.{i}", b"x", None, 5) for i in range(start, start + 1000)])).raise_for_errors()
        engine = h.broker.retention.engine  # type: ignore[attr-defined]
        counters = h.broker.counters  # type: ignore[attr-defined]
        engine.slice_ns = 0  # a slice per chunk
        published = {m.subject: m.timestamp for m in await all_messages(c, "s", "t")}

        await advance(4.999)
        stats = await c.stats()
        assert (stats["expired_ttl"], stats["pending_expiries"]) == (0, n)

        seen: list[int] = []
        done = trio.Event()

        async def watch() -> None:  # runs whenever the loop gets control
            while counters.expired_ttl < n:
                seen.append(counters.expired_ttl)
                await trio.lowlevel.checkpoint()
            done.set()

        slices = engine.slices
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            await advance(0.011)
            await done.wait()
        partial = {v for v in seen if 0 < v < n}
        assert len(partial) >= n // CHUNK // 2, "the loop did not run between slices"
        assert engine.slices - slices >= n // CHUNK

        stats = await c.stats()
        assert (stats["expired_ttl"], stats["markers"], stats["messages"]) == (n, n, n)
        assert stats["pending_expiries"] == n  # the markers' own TTLs
        markers = await all_messages(c, "s", "t")
        assert len(markers) == n and all(m.is_marker for m in markers)
        for m in markers:
            assert m.timestamp >= published[m.subject] + 5 * NS  # never before the deadline
        assert [m.offset for m in markers] == sorted(m.offset for m in markers)


async def test_a_subject_emptied_over_several_slices_gets_one_marker_after_its_newest(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir) as (h, c):
        await c.create_stream("s")
        await c.create_topic("s", "t", subjects=["a.>"], allow_msg_ttl=True, subject_delete_marker_ttl=1)
        acks = await c.publish_batch([("a.one", b"x", None, 5)] * (3 * CHUNK + 5))
        h.broker.retention.engine.slice_ns = 0  # type: ignore[attr-defined]
        removed: list[list[int]] = []
        retention = h.broker.retention  # type: ignore[attr-defined]
        on_markers = retention.on_markers
        retention.on_markers = lambda part, res, epoch, offs: (removed.append(offs), on_markers(part, res, epoch, offs))
        await advance(5.011)
        msgs = await all_messages(c, "s", "t")
        assert [(m.subject, m.is_marker) for m in msgs] == [("a.one", True)]
        assert removed == [[max(acks.offsets)]]
        stats = await c.stats()
        assert (stats["expired_ttl"], stats["markers"]) == (3 * CHUNK + 5, 1)


async def test_a_backlog_of_many_buckets_is_taken_a_few_ticks_at_a_time(mock_clock, data_dir) -> None:
    n = 5000
    async with broker_and_client(data_dir) as (h, c):
        await c.create_stream("s")
        await c.create_topic("s", "t", subjects=["a.>"], allow_msg_ttl=True, subject_delete_marker_ttl=3600,
                             max_msgs_per_subject=1)
        for start in range(0, n, 1000):  # TTLs of 1 to 50 s: deadlines in 50 buckets
            batch = [(f"a.{i}", b"x", None, 1 + i % 50) for i in range(start, start + 1000)]
            (await c.publish_batch(batch)).raise_for_errors()
        engine = h.broker.retention.engine  # type: ignore[attr-defined]
        counters = h.broker.counters  # type: ignore[attr-defined]
        engine.slice_ns = 0
        published = {m.subject: (m.timestamp, m.ttl) for m in await all_messages(c, "s", "t")}
        seen: list[int] = []
        done = trio.Event()

        async def watch() -> None:
            while counters.expired_ttl < n:
                seen.append(counters.expired_ttl)
                assert engine._queued <= 2 * COLLECT  # never the whole backlog at once
                await trio.lowlevel.checkpoint()
            done.set()

        passes = engine.passes
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            await advance(60)  # everything overdue at once, as after a long stop
            await done.wait()
        assert len({v for v in seen if 0 < v < n}) >= n // CHUNK // 2
        assert engine.passes - passes >= n // COLLECT  # a few ticks at a time
        stats = await c.stats()
        assert (stats["expired_ttl"], stats["markers"], stats["pending_expiries"]) == (n, n, n)
        markers = await all_messages(c, "s", "t")
        assert len(markers) == n
        for m in markers:
            ts, ttl = published[m.subject]
            assert m.timestamp >= ts + ttl * NS
