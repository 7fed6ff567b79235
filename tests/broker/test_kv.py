"""KV buckets with FLIP-25 TTL semantics, end to end through the client, in virtual
time: refresh on read, touch, visibility at the exact deadline, durable refreshes
across a restart, watches, and one pending entry per key."""

from __future__ import annotations

import pytest
import trio
from ttl_helpers import NS, advance, broker_and_client

import protocol as P
from broker import Clock
from broker.client import InvalidKeyError, MessageNotFoundError, NotABucketError, WrongLastSequenceError


async def test_put_get_create_update_delete_purge_keys_history(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir) as (_, c):
        kv = await c.kv_create("Config", history=5)
        assert kv.bucket == "config"
        r1 = await kv.put("app.port", b"80")
        e = await kv.get("app.port")
        assert (e.key, e.value, e.revision, e.operation, e.ttl_remaining) == ("app.port", b"80", r1, "PUT", None)
        r2 = await kv.update("app.port", b"81", r1)
        with pytest.raises(WrongLastSequenceError) as exc:
            await kv.update("app.port", b"82", r1)
        assert exc.value.code == 6012 and exc.value.message == f"wrong last sequence: {r2}"
        with pytest.raises(WrongLastSequenceError):
            await kv.create("app.port", b"x")
        r3 = await kv.create("app.host", b"localhost")
        assert await kv.keys() == ["app.host", "app.port"]
        await kv.delete("app.host")
        with pytest.raises(MessageNotFoundError, match="del"):
            await kv.get("app.host")
        assert await kv.keys() == ["app.port"]
        r5 = await kv.create("app.host", b"example.org")  # create over a tombstone
        assert (await kv.get("app.host")).value == b"example.org"
        assert [(h.operation, h.value) for h in await kv.history("app.host")] == [
            ("PUT", b"localhost"), ("DEL", b""), ("PUT", b"example.org"),
        ]
        assert (await kv.get("app.port", revision=r1)).value == b"80"
        await kv.purge("app.host")
        assert [h.operation for h in await kv.history("app.host")] == ["PURGE"]
        assert await kv.keys("app.*") == ["app.port"]
        assert r3 < r5
        status = await kv.status()
        assert status["history"] == 5 and status["values"] == 1 and status["refresh"] == "on_write"


async def test_bad_keys_and_buckets_are_clear_errors(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir) as (_, c):
        kv = await c.kv_create("b")
        for key in (".a", "a.", "a..b", "a b", "a*", "a>", "", "a\n"):
            with pytest.raises(InvalidKeyError) as exc:
                await kv.put(key, b"")
            assert exc.value.code == 6013 and "invalid key" in exc.value.message
        with pytest.raises(InvalidKeyError):
            await c.kv_create("no.dots")
        with pytest.raises(InvalidKeyError):
            await c.kv_create("newline\n")
        await c.create_topic("kv", "plain", subjects=["plain.>"])
        with pytest.raises(NotABucketError):
            await c.kv("plain")
        with pytest.raises(MessageNotFoundError):
            await kv.get("missing")


async def test_a_bucket_need_not_allow_per_message_ttls_unless_it_has_a_key_ttl(mock_clock, data_dir) -> None:
    """nats.js 2.x makes its buckets without ``allow_msg_ttl``: such a bucket works,
    without key TTLs (a put with one is refused as on any such topic); a key TTL
    needs per-message TTLs."""
    async with broker_and_client(data_dir) as (_, c):
        await c.create_stream("kv")
        with pytest.raises(P.BrokerError) as exc:
            await c.create_topic("kv", "timed", subjects=["$KV.timed.>"], allow_rollup=True, kv={"ttl": 60})
        assert (exc.value.code, exc.value.message) == (
            P.ErrorCode.INVALID_TOPIC_CONFIG, "a KV bucket with a key ttl needs allow_msg_ttl")
        await c.create_topic("kv", "plain", subjects=["$KV.plain.>"], allow_rollup=True, kv={})
        kv = await c.kv("plain")
        r = await kv.put("a", b"1")
        e = await kv.get("a")
        assert (e.value, e.revision, e.ttl_remaining) == (b"1", r, None)
        with pytest.raises(P.BrokerError) as exc:
            await kv.put("a", b"2", ttl=5)
        assert (exc.value.code, exc.value.message) == (P.ErrorCode.MSG_TTL_DISABLED, "per-message TTL is disabled")


async def test_ttl_on_write_restarts_on_put_only(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir) as (_, c):
        kv = await c.kv_create("b", ttl=10)
        await kv.put("k", b"1")
        await advance(8)
        assert (await kv.get("k")).ttl_remaining == pytest.approx(2, abs=0.01)  # a read does not refresh
        await advance(2.1)
        with pytest.raises(MessageNotFoundError):
            await kv.get("k")
        await kv.put("k", b"2", ttl=5)  # a per-key TTL
        await advance(4.9)
        await kv.put("k", b"3")  # the bucket's default again, from now
        await advance(9.9)
        assert (await kv.get("k")).value == b"3"


async def test_a_changed_bucket_ttl_applies_to_the_next_put(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir) as (_, c):
        kv = await c.kv_create("b", ttl=10)
        await kv.put("k", b"1")
        assert (await kv.get("k")).ttl_remaining == pytest.approx(10, abs=0.01)
        await c.update_topic("kv", "b", kv={"ttl": 30, "refresh": "on_write", "visibility": "never_return_expired"})
        await kv.put("k", b"2")
        assert (await kv.get("k")).ttl_remaining == pytest.approx(30, abs=0.01)
        other = await c.kv_create("o", ttl=0)  # no default TTL: a plain put never expires
        await other.put("k", b"3")
        assert (await other.get("k")).ttl_remaining is None


async def test_refresh_on_read_keeps_a_key_alive_and_lets_it_lapse(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir) as (h, c):
        kv = await c.kv_create("b", ttl=10, refresh="on_read_and_write")
        await kv.put("hot", b"v")
        for _ in range(10):  # 90 s of reads every 9 s: far past the first deadline
            await advance(9)
            assert (await kv.get("hot")).ttl_remaining == pytest.approx(10, abs=0.01)
        part = h.broker.catalog.topic(P.Identifier.of("kv"), P.Identifier.of("b")).partitions[0]
        assert part.pending == 1 and len(h.broker.retention.engine.queue) == 1
        await advance(9.9)  # reads stop: it lapses 10 s after the last one
        assert (await kv.touch("hot")) == pytest.approx(10, abs=0.01)  # touch refreshes too
        await advance(10.2)
        with pytest.raises(MessageNotFoundError):
            await kv.get("hot")
        assert await kv.keys() == []
        assert [e.operation for e in await kv.history("hot")] == ["EXPIRED"]


async def test_touch_under_on_write_and_on_a_missing_key(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir) as (_, c):
        kv = await c.kv_create("b", ttl=10)
        await kv.put("k", b"v")
        await advance(8)
        assert await kv.touch("k") == pytest.approx(10, abs=0.01)
        await advance(8)
        assert (await kv.get("k")).value == b"v"  # alive at 16 s
        await advance(2.2)
        with pytest.raises(MessageNotFoundError):
            await kv.touch("k")
        with pytest.raises(MessageNotFoundError):
            await kv.touch("never-was")


@pytest.mark.parametrize("visibility", ["never_return_expired", "return_expired_if_not_cleaned_up"])
async def test_visibility_at_the_exact_deadline(mock_clock, data_dir, visibility: str) -> None:
    async with broker_and_client(data_dir) as (h, c):
        kv = await c.kv_create("b", ttl=10, visibility=visibility)
        await kv.put("k", b"v")
        part = h.broker.catalog.topic(P.Identifier.of("kv"), P.Identifier.of("b")).partitions[0]
        rec = P.read_record_info(part.log.get(1), 0)
        deadline = rec.timestamp + 10 * NS
        # Stop the clock exactly on the deadline (before the expiry pass, which fires
        # at the end of the deadline's 100 ms bucket).
        await advance((deadline - h.broker.clock.now_ns()) / NS)
        assert h.broker.clock.now_ns() >= deadline and part.log.is_live(1)
        if visibility == "never_return_expired":
            with pytest.raises(MessageNotFoundError, match="expired"):
                await kv.get("k")
            assert await kv.keys() == []
        else:
            assert (await kv.get("k")).value == b"v"
            assert await kv.keys() == ["k"]
        await advance(0.2)
        with pytest.raises(MessageNotFoundError):
            await kv.get("k")


async def test_a_refresh_survives_a_restart(mock_clock, data_dir) -> None:
    clock = Clock()
    async with broker_and_client(data_dir, clock, **{"system.partition.fsync": "always"}) as (_, c):
        kv = await c.kv_create("b", ttl=10, refresh="on_read_and_write")
        await kv.put("k", b"v")
        await advance(8)
        await kv.get("k")  # the deadline moves from 10 s to 18 s
    await advance(4)  # down across the original deadline
    async with broker_and_client(data_dir, clock) as (_, c):
        kv = await c.kv("b")
        await advance(0.5)
        e = await kv.get("k")  # alive at 12.5 s, and read again: now 22.5 s
        assert e.value == b"v"
        await advance(9.9)
        assert (await kv.get("k", revision=e.revision)).value == b"v"
    await advance(30)
    async with broker_and_client(data_dir, clock) as (_, c):
        kv = await c.kv("b")
        await advance(0.1)
        with pytest.raises(MessageNotFoundError):
            await kv.get("k")


async def test_watch_sees_put_delete_purge_and_expiry_in_order(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir) as (_, c):
        kv = await c.kv_create("b", history=3, ttl=30, marker_ttl=1)
        await kv.put("before", b"0")
        seen = []

        async def watcher(task_status=trio.TASK_STATUS_IGNORED) -> None:  # type: ignore[no-untyped-def]
            it = kv.watch(include_current=True)
            task_status.started()
            async for e in it:
                seen.append((e.key, e.operation, e.value))
                if len(seen) == 7:
                    return

        async with trio.open_nursery() as n:
            await n.start(watcher)
            await trio.testing.wait_all_tasks_blocked()
            await kv.put("k", b"1")
            await kv.delete("k")
            await kv.put("k", b"2")
            await kv.purge("k")
            await kv.put("short", b"s", ttl=2)
            await advance(2.2)
        assert seen == [
            ("before", "PUT", b"0"), ("k", "PUT", b"1"), ("k", "DEL", b""), ("k", "PUT", b"2"), ("k", "PURGE", b""),
            ("short", "PUT", b"s"), ("short", "EXPIRED", b""),
        ]


async def test_expiry_leaves_a_marker_that_expires_in_turn(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir) as (_, c):
        kv = await c.kv_create("b", ttl=5, marker_ttl=3)
        async with await c.subscribe("$KV.b.>") as sub:
            await kv.put("k", b"v")
            await advance(5.2)
            put, marker = await sub.next(), await sub.next()
            assert put.payload == b"v" and marker.is_marker and marker.headers["Nats-Marker-Reason"] == "MaxAge"
        assert [e.operation for e in await kv.history("k")] == ["EXPIRED"]
        await advance(3.2)
        assert await kv.history("k") == []  # nothing piles up
        t = await c.get_topic("kv", "b")
        assert t.messages_count == 0


async def test_one_pending_entry_per_key_under_100k_reads(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir) as (h, c):
        kv = await c.kv_create("b", ttl=60, refresh="on_read_and_write")
        await kv.put("hot", b"v")
        await kv.put("cold", b"v")
        engine = h.broker.retention.engine
        for i in range(100):
            async with trio.open_nursery() as n:
                for _ in range(1000):
                    n.start_soon(kv.get, "hot")
            if i % 10 == 0:
                await advance(5)
        assert len(engine.queue) == 2 and engine.queue.entries() == 2
        await advance(55)  # cold lapses (60 s after its put); hot, read at 50 s, lives to 110 s
        assert await kv.keys() == ["hot"]
        assert engine.queue.entries() == 2  # hot's entry, re-armed once, and cold's marker


async def test_large_values_and_many_keys_and_leases_that_go_with_their_key(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir) as (h, c):
        kv = await c.kv_create("big", ttl=600, refresh="on_read_and_write")
        await kv.put("blob", b"x" * 200_000)  # a reply far over the options-map limit
        assert (await kv.get("blob")).value == b"x" * 200_000
        await c.publish_batch([(f"$KV.big.k{i:05d}", b"v") for i in range(20_000)])
        assert len(await kv.keys()) == 20_001
        topic = h.broker.catalog.topic(P.Identifier.of("kv"), P.Identifier.of("big"))
        await advance(1)
        await kv.get("k00001")  # writes a lease
        leases = [n for n, _ in topic.consumers.offsets if n.startswith("$refresh.")]
        assert len(leases) == 2  # blob's (first get) and k00001's
        await kv.put("k00001", b"w")  # overwritten: its lease goes with the old revision
        assert len([n for n, _ in topic.consumers.offsets if n.startswith("$refresh.")]) == 1
        assert (await kv.status())["values"] == 20_001


async def test_get_reads_one_live_record_of_its_own_key_and_refuses_damage(mock_clock, data_dir) -> None:
    """A get finds the record with one storage call (``PartitionLog.read_live``) and
    checks that the record carries the key: a revision of another key, an overwritten
    (removed) revision, a deleted key's revision and offsets no record holds are "not
    found", never another record; a damaged record is refused as corrupted (counted
    once), and stays refused, never "not found" (it is the key's newest revision);
    the other keys are untouched."""
    async with broker_and_client(data_dir) as (h, c):
        kv = await c.kv_create("b", history=1)
        ra = await kv.put("a", b"A" * 50)
        rb = await kv.put("b", b"B" * 50)
        rc1 = await kv.put("c", b"C1")
        rc2 = await kv.put("c", b"C2")  # history 1: rc1 is removed
        assert (await kv.get("a", revision=ra)).value == b"A" * 50
        for key, rev in (("a", rb), ("b", ra), ("c", rc1), ("a", 0xFFFF), ("b", 2**64 - 1)):
            with pytest.raises(MessageNotFoundError) as exc:
                await kv.get(key, revision=rev)
            assert exc.value.code == P.ErrorCode.MESSAGE_NOT_FOUND
            assert exc.value.message == f"revision {rev} of '$KV.b.{key}' not found in bucket 'b'"
        assert (await kv.get("c")).value == b"C2" and (await kv.get("c", revision=rc2)).revision == rc2
        # Damage b's record on disk (what a disk can do after it was written).
        log = h.broker.catalog.topic(P.Identifier.of("kv"), P.Identifier.of("b")).partitions[0].log
        seg = log.segments[-1]
        rel = rb - seg.base
        with open(seg.log_path, "r+b") as f:
            f.seek(seg.positions[rel] + 45)
            byte = f.read(1)
            f.seek(seg.positions[rel] + 45)
            f.write(bytes([byte[0] ^ 0x10]))
        damaged = (
            f"the newest revision of key '$KV.b.b' in bucket 'b' is damaged: revision {rb} cannot be read, and no older "
            "revision is served in its place (`ttlbroker repair` writes the damaged record off)"
        )
        for _ in range(2):  # found damaged by the first read; the second knows
            with pytest.raises(P.CorruptedRecordError) as bad:  # type: ignore[attr-defined]
                await kv.get("b")
            assert (bad.value.code, bad.value.message) == (P.ErrorCode.CORRUPTED_RECORD, damaged)
        with pytest.raises(P.CorruptedRecordError) as bad:  # type: ignore[attr-defined]
            await kv.get("b", revision=rb)
        assert bad.value.message == (
            f"revision {rb} of key '$KV.b.b' in bucket 'b' cannot be read: the record is damaged "
            "(`ttlbroker repair` writes it off)"
        )
        assert (await c.stats())["corrupt_records"] == 1
        assert (await kv.get("a")).value == b"A" * 50 and (await kv.get("c")).value == b"C2"
