"""Subject delete markers, rollup, the topic options' validation, and the segment
cleaner, end to end through the client, in virtual time (docs/semantics.md §9 and §12,
decisions 10.5 to 10.9 and 10.16)."""

from __future__ import annotations

import pytest
from ttl_helpers import advance, all_messages, broker_and_client

import protocol as P
from broker import Clock
from broker.client import (
    InvalidRollupError,
    InvalidTopicConfigError,
    PurgeDeniedError,
    RollupDeniedError,
)

MARKER_HEADERS = {"Nats-Marker-Reason": "MaxAge", "Nats-TTL": "1s", "Nats-Rollup": "sub"}


async def _topic(c, **opts):  # type: ignore[no-untyped-def]
    await c.create_stream("s")
    return await c.create_topic("s", "t", subjects=["a.>"], **opts)


def _view(msgs):  # type: ignore[no-untyped-def]
    return [(m.offset, m.subject, m.marker_reason.header_value or None) for m in msgs]


async def test_ttl_expiry_of_a_subjects_last_message_leaves_one_maxage_marker(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir) as (_, c):
        await _topic(c, subject_delete_marker_ttl=1, max_msgs_per_subject=1)
        async with await c.subscribe("a.>") as sub:
            await c.publish("a.x", b"payload", headers={"Nats-TTL": "2s"})
            assert (await sub.next()).subject == "a.x"
            await advance(1.5)
            assert _view(await all_messages(c, "s", "t")) == [(1, "a.x", None)]
            await advance(0.6)
            marker = (await all_messages(c, "s", "t"))[0]
            assert (marker.offset, marker.subject, marker.payload) == (2, "a.x", b"")
            assert marker.headers == MARKER_HEADERS
            assert list(marker.headers_raw and marker.headers) == list(MARKER_HEADERS)  # order kept
            assert marker.is_marker and marker.marker_reason is P.MarkerReason.MAX_AGE and marker.ttl == 1
            assert (await c.get_last("s", "t", "a.x")).offset == 2
            live = await sub.next()  # watchers see the marker
            assert live.is_marker and live.offset == 2
            # The marker expires in its turn and leaves nothing behind.
            await advance(1.1)
            assert await all_messages(c, "s", "t") == []
            stats = await c.stats()
            assert (stats["markers"], stats["expired_ttl"], stats["messages"]) == (1, 2, 0)
            t = await c.get_topic("s", "t")
            assert t.extra["markers"] == {"MaxAge": 1} and t.extra["removed"] == {"ttl": 2}


async def test_no_marker_while_the_subject_has_a_live_message(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir) as (_, c):
        await _topic(c, subject_delete_marker_ttl=60)
        # Six staggered TTLs on one subject: one marker, after the last (§9.2).
        for k in range(6):
            await c.publish("a.x", str(k).encode(), ttl=60)
            await advance(1)
        await c.publish("a.y", b"stays")
        await advance(54.1)
        assert _view(await all_messages(c, "s", "t")) == [(k, "a.x", None) for k in range(2, 7)] + [(7, "a.y", None)]
        await advance(5.1)
        assert _view(await all_messages(c, "s", "t")) == [(7, "a.y", None), (8, "a.x", "MaxAge")]
        assert (await c.stats())["markers"] == 1


async def test_reverse_order_ttls_and_max_age_with_ttl_both_give_one_marker(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir) as (_, c):
        await _topic(c, subject_delete_marker_ttl=1, message_expiry=2)
        await c.publish("a.x", b"", headers={"Nats-TTL": "3s"})  # max age (2 s) removes it first
        await c.publish("a.x", b"", headers={"Nats-TTL": "1s"})
        await advance(1.1)
        assert _view(await all_messages(c, "s", "t")) == [(1, "a.x", None)]
        await advance(1)
        assert _view(await all_messages(c, "s", "t")) == [(3, "a.x", "MaxAge")]
        t = await c.get_topic("s", "t")
        assert t.extra["removed"] == {"ttl": 1, "max_age": 1} and t.extra["markers"] == {"MaxAge": 1}


async def test_never_message_is_never_age_removed_so_no_marker(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir) as (_, c):
        await _topic(c, subject_delete_marker_ttl=1, message_expiry=1)
        await c.publish("a.x", b"", headers={"Nats-TTL": "never"})
        await advance(10)
        assert _view(await all_messages(c, "s", "t")) == [(1, "a.x", None)]


async def test_delete_leaves_a_remove_marker_and_subject_purge_a_purge_marker(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir) as (_, c):
        await _topic(c, subject_delete_marker_ttl=5)
        a1 = await c.publish("a.x", b"1")
        a2 = await c.publish("a.x", b"2")
        await c.publish("a.y", b"3")
        await c.publish("a.y", b"4")
        await c.publish("a.z.1", b"5")
        await c.delete_message("s", "t", 0, a1.offset)  # a.x still has a live message: none
        assert (await c.stats())["markers"] == 0
        await c.delete_message("s", "t", 0, a2.offset)
        msgs = await all_messages(c, "s", "t")
        assert _view(msgs)[-1] == (6, "a.x", "Remove")
        assert msgs[-1].headers == {"Nats-Marker-Reason": "Remove", "Nats-TTL": "5s", "Nats-Rollup": "sub"}
        assert await c.purge("s", "t", "a.y") == 2
        assert _view(await all_messages(c, "s", "t"))[-1] == (7, "a.y", "Purge")
        # Deleting a marker leaves no marker.
        await c.delete_message("s", "t", 0, 7)
        assert (await c.stats())["markers"] == 2
        # A whole-topic purge leaves none (§9.2).
        await c.purge("s", "t")
        assert await all_messages(c, "s", "t") == []
        assert (await c.stats())["markers"] == 2
        t = await c.get_topic("s", "t")
        assert t.extra["markers"] == {"Remove": 1, "Purge": 1}
        assert t.extra["removed"] == {"delete": 3, "purge": 4}


async def test_minimum_ttl_rewrite_and_its_max_msgs_per_subject_exception(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir) as (_, c):
        await _topic(c, subject_delete_marker_ttl=3)
        ack = await c.publish("a.x", b"", headers={"A": "b", "Nats-TTL": "1s", "C": "d"})
        m = (await c.fetch("s", "t", 0, ack.offset, 1)).messages[0]
        assert m.ttl == 3
        assert P.decode_headers(m.headers_raw) == {"A": "b", "C": "d", "Nats-TTL": "3"}
        assert list(m.headers) == ["A", "C", "Nats-TTL"], "the new header goes at the end"
        await advance(1.5)
        assert len(await all_messages(c, "s", "t")) == 1  # still there at 1.5 s
        await advance(1.6)
        assert _view(await all_messages(c, "s", "t")) == [(2, "a.x", "MaxAge")]
        ack = await c.publish("a.y", b"", ttl="never")  # never is not raised
        assert (await c.fetch("s", "t", 0, ack.offset, 1)).messages[0].never_expires
        await c.update_topic("s", "t", max_msgs_per_subject=1)
        ack = await c.publish("a.z", b"", headers={"Nats-TTL": "1s"})
        m = (await c.fetch("s", "t", 0, ack.offset, 1)).messages[0]
        assert m.ttl == 1 and m.headers["Nats-TTL"] == "1s"


async def test_markers_are_written_for_what_expired_while_the_broker_was_down(mock_clock, data_dir) -> None:
    clock = Clock()
    async with broker_and_client(data_dir, clock) as (_, c):
        await _topic(c, subject_delete_marker_ttl=10, message_expiry=5)
        await c.publish("a.x", b"")
        await c.publish("a.y", b"")
    await advance(7)
    async with broker_and_client(data_dir, clock) as (_, c):
        await advance(0)
        assert _view(await all_messages(c, "s", "t")) == [(3, "a.x", "MaxAge"), (4, "a.y", "MaxAge")]
    async with broker_and_client(data_dir, clock) as (_, c):
        # One marker per emptied subject, however many times the state is rebuilt.
        await advance(0)
        assert _view(await all_messages(c, "s", "t")) == [(3, "a.x", "MaxAge"), (4, "a.y", "MaxAge")]
        await advance(10.2)
        assert await all_messages(c, "s", "t") == []


async def test_kv_purge_tombstone_and_publisher_markers_beget_no_marker(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir) as (_, c):
        await _topic(c, subject_delete_marker_ttl=1)
        await c.publish("a.kv", b"", headers={"KV-Operation": "PURGE", "Nats-TTL": "2s"})
        await c.publish("a.m", b"", headers={"Nats-Marker-Reason": "MaxAge", "Nats-TTL": "2s"})
        await advance(2.2)
        assert await all_messages(c, "s", "t") == []
        assert (await c.stats())["markers"] == 0


async def test_rollup_sub_and_all(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir) as (_, c):
        await _topic(c, allow_rollup=True, partitions=1)
        await c.publish_batch([("a.x", b"1"), ("a.y", b"2"), ("a.x", b"3")])
        await c.publish("a.x", b"4", headers={"Nats-Rollup": "sub"})
        assert [m.payload for m in await all_messages(c, "s", "t")] == [b"2", b"4"]
        acks = await c.publish_batch([("a.z", b"5"), ("a.w", b"6", {"Nats-Rollup": "all"}), ("a.v", b"7")])
        assert acks.ok
        assert [m.payload for m in await all_messages(c, "s", "t")] == [b"6", b"7"]
        assert (await c.stats())["removed_rollup"] == 5


async def test_rollup_all_spans_partitions(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir) as (_, c):
        await _topic(c, allow_rollup=True, partitions=4)
        await c.publish_batch([(f"a.{i}", b"old") for i in range(40)])
        await c.publish_batch([("a.r", b"r", {"Nats-Rollup": "all"})] + [(f"a.{i}", b"new") for i in range(8)])
        msgs = await all_messages(c, "s", "t", partitions=4)
        assert sorted(m.payload for m in msgs) == [b"new"] * 8 + [b"r"]


async def test_rollup_errors(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir) as (_, c):
        await _topic(c)
        with pytest.raises(RollupDeniedError) as exc:
            await c.publish("a.x", b"", headers={"Nats-Rollup": "sub"})
        assert exc.value.code == 6008 and exc.value.message == "rollup not permitted"
        await c.update_topic("s", "t", allow_rollup=True)
        with pytest.raises(InvalidRollupError) as exc2:
            await c.publish("a.x", b"", headers={"Nats-Rollup": "everything"})
        assert exc2.value.code == 6011 and exc2.value.message == 'rollup value invalid: "everything"'
        # An empty value is an absent header (§2.6).
        assert (await c.publish("a.x", b"", headers={"Nats-Rollup": ""})).offset == 1


# docs/semantics.md §9.1, the validation matrix: options -> error description (None = accepted).
CONFIG_CASES = [
    ({"deny_purge": True, "allow_rollup": True}, "roll-ups require the purge permission"),
    ({"deny_purge": True, "allow_rollup": True, "subject_delete_marker_ttl": 1}, "roll-ups require the purge permission"),
    ({"subject_delete_marker_ttl": -1}, "subject delete marker TTL must not be negative"),
    ({"subject_delete_marker_ttl": 1, "pedantic": True}, "subject delete marker cannot be set if message TTLs are disabled"),
    (
        {"subject_delete_marker_ttl": 1, "allow_msg_ttl": True, "pedantic": True},
        "subject delete marker cannot be set if roll-ups are disabled",
    ),
    ({"subject_delete_marker_ttl": 1, "allow_msg_ttl": True, "allow_rollup": True, "pedantic": True}, None),
]


@pytest.mark.parametrize(("options", "error"), CONFIG_CASES)
async def test_topic_option_validation(mock_clock, data_dir, options, error) -> None:
    async with broker_and_client(data_dir) as (_, c):
        await c.create_stream("s")
        if error is None:
            t = await c.create_topic("s", "t", subjects=["a.>"], **options)
            assert t.options["subject_delete_marker_ttl"] == 1
            return
        with pytest.raises(InvalidTopicConfigError) as exc:
            await c.create_topic("s", "t", subjects=["a.>"], **options)
        assert exc.value.code == P.ErrorCode.INVALID_TOPIC_CONFIG == 2007
        assert exc.value.message == error


async def test_marker_ttl_auto_fixes_and_update_rules(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir) as (_, c):
        await c.create_stream("s")
        t = await c.create_topic("s", "t", subjects=["a.>"], subject_delete_marker_ttl=2, deny_purge=False)
        assert (t.options["allow_msg_ttl"], t.options["allow_rollup"], t.options["deny_purge"]) == (True, True, False)
        t = await c.update_topic("s", "t", subject_delete_marker_ttl=0)
        assert t.options["subject_delete_marker_ttl"] == 0 and t.options["allow_msg_ttl"] is True
        # With markers on, an update sending allow_msg_ttl=false is silently fixed.
        t = await c.update_topic("s", "t", subject_delete_marker_ttl=5, allow_msg_ttl=False)
        assert t.options["allow_msg_ttl"] is True
        await c.create_topic("s", "d", subjects=["d.>"], deny_purge=True)
        with pytest.raises(InvalidTopicConfigError) as exc:
            await c.update_topic("s", "d", deny_purge=False)
        assert exc.value.message == "stream configuration update can not cancel deny purge"
        with pytest.raises(PurgeDeniedError):
            await c.purge("s", "d")


async def test_cleaner_removes_only_dead_segments_and_seals_an_expired_active_one(mock_clock, data_dir) -> None:
    clock = Clock()
    cfg = {"message_cleaner.interval": 30}
    async with broker_and_client(data_dir, clock, **cfg) as (h, c):
        await _topic(c, segment_size=4096, allow_msg_ttl=True)
        for k in range(10):  # ten segments of ~4 KiB: TTL 10 s for even ones, none for odd
            await c.publish_batch([(f"a.{k}", b"x" * 400, None, 10 if k % 2 == 0 else None)] * 10)
        part = h.broker.catalog.topics()[0].partitions[0]
        assert len(part.log.segments) == 10
        # The rolls' seals finish in a worker thread, out of virtual time's sight
        # (the cleaner waits for them too, but a thread does not block advance()).
        await h.broker.sealer.finish(part.log)
        await advance(10.2)
        assert len(await all_messages(c, "s", "t")) == 50
        await advance(30)
        stats = await c.stats()
        assert stats["segments_reclaimed"] == 5 and stats["bytes_reclaimed"] > 5 * 4000
        assert [s.base for s in part.log.segments] == [11, 31, 51, 71, 91]
        assert [m.payload for m in await all_messages(c, "s", "t")] == [b"x" * 400] * 50
    # A restart sees the holes as holes, not as damage.
    async with broker_and_client(data_dir, clock, **cfg) as (h, c):
        stats = await c.stats()
        assert stats["corrupt_records"] == 0
        msgs = await all_messages(c, "s", "t")
        assert len(msgs) == 50 and {int(m.subject[2:]) % 2 for m in msgs} == {1}
        assert (await c.publish("a.new", b"")).offset == 101
        # The active segment is sealed once everything in it has expired.
        await c.purge("s", "t")
        await c.publish("a.t", b"", ttl=1)
        await advance(2)
        await advance(30)
        part = h.broker.catalog.topics()[0].partitions[0]
        assert [s.base for s in part.log.segments] == [103]
        assert (await c.publish("a.after", b"")).offset == 103


async def test_cleaner_disabled_keeps_files(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir, **{"message_cleaner.enabled": False, "message_cleaner.interval": 1}) as (h, c):
        await _topic(c, segment_size=4096, allow_msg_ttl=True)
        for _ in range(3):
            await c.publish_batch([("a.x", b"x" * 400, None, 1)] * 10)
        await advance(100)
        assert (await c.stats())["segments_reclaimed"] == 0
        assert len(h.broker.catalog.topics()[0].partitions[0].log.segments) == 3
