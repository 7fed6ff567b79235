"""``Nats-Msg-Id`` de-duplication (JetStream's duplicate window), end to end through
the client, in virtual time (docs/semantics.md, "De-duplication")."""

from __future__ import annotations

import zlib

import pytest
from ttl_helpers import advance, all_messages, broker_and_client

import protocol as P
from broker import Clock
from broker.core._topic_config import TopicConfig
from broker.client import InvalidMsgTtlError, InvalidTopicConfigError

ID = "Nats-Msg-Id"
DUP = P.ErrorCode.DUPLICATE_MESSAGE


async def _topic(c, partitions: int = 1, **opts):  # type: ignore[no-untyped-def]
    await c.create_stream("s")
    return await c.create_topic("s", "t", partitions=partitions, subjects=["a.>"], **opts)


async def test_a_duplicate_inside_the_window_is_acked_with_the_original_and_not_stored(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir) as (_, c):
        t = await _topic(c, allow_rollup=True)
        assert t.options["duplicate_window"] == 120  # the default
        first = await c.publish("a.x", b"one", headers={ID: "order-1"})
        assert (first.partition, first.offset, first.duplicate) == (0, 1, False)
        await advance(119)
        again = await c.publish("a.y", b"other body, other subject", headers={ID: "order-1"})
        assert again.duplicate and again.ok and again.error is None
        assert (again.stream_id, again.topic_id, again.partition, again.offset) == (1, 1, 0, 1)
        assert again.status == DUP == 6014
        assert [(m.subject, m.payload) for m in await all_messages(c, "s", "t")] == [("a.x", b"one")]
        # Another id is no duplicate; the next offset is 2 (the duplicate consumed none).
        assert (await c.publish("a.x", b"two", headers={ID: "order-2"})).offset == 2
        stats = await c.stats()
        assert stats["duplicates"] == 1 and stats["publish_errors"] == 0
        t = await c.get_topic("s", "t")
        assert t.extra["duplicates"] == 1 and t.extra["dedup_ids"] == 2
        # The id table is independent of the messages (as JetStream's): removing the
        # original, by delete or by a rollup, does not forget its id.
        await c.delete_message("s", "t", 0, 1)
        assert (await c.publish("a.x", b"one", headers={ID: "order-1"})).duplicate
        await c.publish("a.x", b"rollup", headers={"Nats-Rollup": "sub"})
        dup = await c.publish("a.x", b"two", headers={ID: "order-2"})
        assert dup.duplicate and dup.offset == 2
        assert [m.payload for m in await all_messages(c, "s", "t")] == [b"rollup"]


async def test_after_the_window_the_id_is_stored_again(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir) as (_, c):
        await _topic(c, duplicate_window=10)
        assert (await c.publish("a.x", b"", headers={ID: "k"})).offset == 1
        await advance(9.9)
        assert (await c.publish("a.x", b"", headers={ID: "k"})).duplicate
        await advance(0.2)  # 10.1 s after the original
        stored = await c.publish("a.x", b"", headers={ID: "k"})
        assert not stored.duplicate and stored.offset == 2
        await advance(5)
        dup = await c.publish("a.x", b"", headers={ID: "k"})
        assert dup.duplicate and dup.offset == 2  # the window runs from the new original
        assert len(await all_messages(c, "s", "t")) == 2
        # Expired ids are pruned as later publishes come (memory bounded by the window).
        await advance(11)
        await c.publish("a.x", b"", headers={ID: "other"})
        assert (await c.get_topic("s", "t")).extra["dedup_ids"] == 1


async def test_window_zero_is_off_and_the_window_can_be_changed(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir) as (_, c):
        await _topic(c, duplicate_window=0)
        acks = [await c.publish("a.x", b"", headers={ID: "k"}) for _ in range(2)]
        assert [(a.offset, a.duplicate) for a in acks] == [(1, False), (2, False)]
        t = await c.update_topic("s", "t", duplicate_window=30)
        assert t.options["duplicate_window"] == 30
        # Nothing was recorded while it was off.
        assert (await c.publish("a.x", b"", headers={ID: "k"})).offset == 3
        assert (await c.publish("a.x", b"", headers={ID: "k"})).duplicate
        await c.update_topic("s", "t", duplicate_window=0)
        assert (await c.publish("a.x", b"", headers={ID: "k"})).offset == 4
        await c.update_topic("s", "t", duplicate_window=30)  # turning it off forgot every id
        assert (await c.publish("a.x", b"", headers={ID: "k"})).offset == 5
        assert (await c.stats())["duplicates"] == 1


async def test_duplicates_inside_one_batch_and_refused_messages_record_no_id(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir) as (_, c):
        subjects = [f"a.{i}" for i in range(12)]
        await _topic(c, partitions=3)
        part = [zlib.crc32(s.encode()) % 3 for s in subjects]
        # Two subjects in different partitions, so the batch's two copies of one id
        # land in different partitions: the later one is the duplicate.
        s1 = subjects[0]
        s2 = next(s for s, p in zip(subjects, part) if p != part[0])
        acks = await c.publish_batch(
            [
                (s2, b"1", {ID: "a"}),
                (s1, b"2", {ID: "b"}),
                (s1, b"3", {ID: "a"}),
                (s1, b"4"),
                (s2, b"5", {ID: "b"}),
                (s1, b"6", {ID: "c", "Nats-TTL": "5s"}),  # refused: the topic has no TTLs
                (s1, b"7", {ID: "c"}),  # so "c" is new here
                (s2, b"8", {ID: ""}),  # an empty id is no id
                (s2, b"9", {ID: ""}),
            ]
        )
        assert acks is not None and acks.ok is False and len(acks.failed) == 1 and len(acks.duplicates) == 2
        assert [a.status for a in acks] == [0, 0, DUP, 0, DUP, P.ErrorCode.MSG_TTL_DISABLED, 0, 0, 0]
        assert (acks[2].partition, acks[2].offset) == (acks[0].partition, acks[0].offset) == (part[subjects.index(s2)], 1)
        assert (acks[4].partition, acks[4].offset) == (acks[1].partition, acks[1].offset)
        assert acks[2].error is None and acks[5].error is not None
        assert len(await all_messages(c, "s", "t", 3)) == 6
        # A later batch sees the ids of an earlier one.
        again = await c.publish_batch([(s1, b"x", {ID: "c"}), (s2, b"y", {ID: "a"})])
        assert [(a.duplicate, a.partition, a.offset) for a in again] == [
            (True, acks[6].partition, acks[6].offset),
            (True, acks[0].partition, acks[0].offset),
        ]
        again.raise_for_errors()  # duplicates are not errors


async def test_an_id_refused_for_an_invalid_ttl_is_not_recorded(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir) as (_, c):
        await _topic(c, allow_msg_ttl=True)
        with pytest.raises(InvalidMsgTtlError):
            await c.publish("a.x", b"", headers={ID: "k", "Nats-TTL": "invalid!"})
        ok = await c.publish("a.x", b"", headers={ID: "k", "Nats-TTL": "10s"})
        assert not ok.duplicate and ok.offset == 1
        # A message that would be refused is refused, even with a known id.
        with pytest.raises(InvalidMsgTtlError):
            await c.publish("a.x", b"", headers={ID: "k", "Nats-TTL": "invalid!"})
        # An expired original still makes its id a duplicate inside the window.
        await advance(11)
        assert await all_messages(c, "s", "t") == []
        assert (await c.publish("a.x", b"", headers={ID: "k"})).duplicate


async def test_ids_survive_a_restart(mock_clock, data_dir) -> None:
    clock = Clock()
    async with broker_and_client(data_dir, clock) as (_, c):
        await _topic(c, partitions=3, duplicate_window=60)
        old = await c.publish("a.0", b"", headers={ID: "old"})
        await advance(30)
        acks = await c.publish_batch([(f"a.{i}", b"", {ID: f"id-{i}"}) for i in range(6)])
        assert acks is not None and acks.ok and not acks.duplicates
        await c.delete_message("s", "t", acks[5].partition, acks[5].offset)
    await advance(40)  # "old" leaves the window while the broker is down
    async with broker_and_client(data_dir, clock) as (_, c):
        assert (await c.get_topic("s", "t")).extra["dedup_ids"] == 5
        again = await c.publish_batch([(f"a.{i}", b"", {ID: f"id-{i}"}) for i in range(5)])
        assert [(a.duplicate, a.partition, a.offset) for a in again] == [(True, a.partition, a.offset) for a in list(acks)[:5]]
        # The id of a message removed before the restart is gone with it (the table
        # is rebuilt from the stored messages, as the NATS server does).
        assert not (await c.publish("a.5", b"", headers={ID: "id-5"})).duplicate
        stored = await c.publish("a.0", b"", headers={ID: "old"})
        assert not stored.duplicate and stored.offset > old.offset
        await advance(21)  # 61 s after the batch
        assert not (await c.publish("a.1", b"", headers={ID: "id-1"})).duplicate


async def test_a_republished_copy_is_not_a_duplicate(mock_clock, data_dir) -> None:
    clock = Clock()
    async with broker_and_client(data_dir, clock) as (_, c):
        await c.create_stream("s")
        await c.create_topic("s", "dest", subjects=["rp.>"])
        await c.create_topic("s", "src", subjects=["a.>"], republish={"dest": "rp.>"})
        ack = await c.publish("a.x", b"", headers={ID: "k"})
        # The copy in "dest" carries the original's Nats-Msg-Id but registers nothing
        # there: a publish with that id on "dest" is stored.
        (copy,) = await all_messages(c, "s", "dest")
        assert copy.headers[ID] == "k" and copy.headers["Nats-Sequence"] == str(ack.offset)
        assert not (await c.publish("rp.y", b"", headers={ID: "k"})).duplicate
        # A duplicate on "src" is not stored, so it is not republished either.
        assert (await c.publish("a.x", b"", headers={ID: "k"})).duplicate
        assert (await c.stats())["republished"] == 1
        assert len(await all_messages(c, "s", "dest")) == 2
    async with broker_and_client(data_dir, clock) as (_, c):
        # Rebuilt from the log: the copy (it carries TTLB-Hops) still registers nothing;
        # the direct publish does.
        assert (await c.get_topic("s", "dest")).extra["dedup_ids"] == 1
        dup = await c.publish("rp.y", b"", headers={ID: "k"})
        assert dup.duplicate and dup.offset == 2
        assert (await c.publish("a.x", b"", headers={ID: "k"})).duplicate


async def test_option_validation(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir) as (_, c):
        await c.create_stream("s")
        for value, cls, code, message in [
            (-1, InvalidTopicConfigError, 2007, "duplicates window can not be negative"),
            ("120", P.InvalidOptionsError, 13, "option 'duplicate_window' must be int, not str"),  # type: ignore[attr-defined]
            (True, P.InvalidOptionsError, 13, "option 'duplicate_window' must be int, not bool"),  # type: ignore[attr-defined]
            (1.5, P.InvalidOptionsError, 13, "option 'duplicate_window' must be int, not float"),  # type: ignore[attr-defined]
            (2**32, InvalidTopicConfigError, 2007, "duplicates window must fit in 32 bits of seconds"),
        ]:
            with pytest.raises(cls) as exc:
                await c.create_topic("s", "t", subjects=["a.>"], duplicate_window=value)
            assert exc.value.code == code and exc.value.message == message, value
        # Larger than the max age: refused when asked for, the default clamped (the server's rules).
        with pytest.raises(InvalidTopicConfigError) as exc:
            await c.create_topic("s", "t", subjects=["a.>"], message_expiry=30, duplicate_window=60)
        assert exc.value.message == "duplicates window can not be larger then max age"
        t = await c.create_topic("s", "t", subjects=["a.>"], message_expiry=30)
        assert t.options["duplicate_window"] == 30
        with pytest.raises(InvalidTopicConfigError) as exc:
            await c.update_topic("s", "t", duplicate_window=-5)
        assert exc.value.code == 2007 and exc.value.message == "duplicates window can not be negative"
        t = await c.update_topic("s", "t", message_expiry=0, duplicate_window=600)
        assert t.options["duplicate_window"] == 600


def test_an_older_catalog_without_the_option_loads_with_the_default() -> None:
    cfg = TopicConfig("t", 1, 0, ("a.>",), 4096)
    old = cfg.to_json()
    del old["duplicate_window"]
    assert TopicConfig.from_json(old).duplicate_window == 120
    assert TopicConfig.from_json({**old, "duplicate_window": 0}).duplicate_window == 0
