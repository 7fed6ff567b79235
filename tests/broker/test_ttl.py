"""Per-message TTL and max age, end to end through the client, in virtual time.

docs/semantics.md §6 and §7.
"""

from __future__ import annotations

import random

import pytest
from ttl_helpers import NS, advance, all_messages, broker_and_client

import protocol as P
from broker import Clock
from broker.client import InvalidMsgTtlError, InvalidTopicConfigError, MsgTtlDisabledError

NEVER = P.TTL_NEVER

# docs/semantics.md §6.1, every form it lists: header value -> stored TTL field.
ACCEPTED = [
    ("1", 1), ("60", 60), ("3600", 3600), ("1s", 1), ("1.5s", 1), ("1500ms", 1), ("2500ms", 2),
    ("1m30s", 90), ("1h", 3600), ("1h30m", 5400), ("+5s", 5), (" 5", 5), ("90s", 90),
    ("never", NEVER), ("NEVER", NEVER), ("Never", NEVER),
    # §6.2: zero is "no TTL of its own" (ADR-43's rule)
    ("0", 0), ("00", 0), ("000", 0), ("0s", 0), ("", 0),
]
REFUSED = ["500ms", "999ms", "-1s", "-10s", "abc", "something", "invalid!", "1d", "5 ", "-1", "+5", "1e3", "1.5", "0.5s"]


async def _ttl_topic(c, **opts):  # type: ignore[no-untyped-def]
    await c.create_stream("s")
    return await c.create_topic("s", "t", subjects=["a.>"], allow_msg_ttl=True, **opts)


async def test_every_ttl_form_accepted_or_refused_with_its_code(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir) as (_, c):
        await _ttl_topic(c)
        for value, expected in ACCEPTED:
            ack = await c.publish("a.ok", b"x", headers={"Nats-TTL": value})
            msg = (await c.fetch("s", "t", 0, ack.offset, 1)).messages[0]
            assert msg.ttl == expected, value
            assert msg.headers["Nats-TTL"] == value, "the header is stored as sent"
        last = ack.offset
        for value in REFUSED:
            with pytest.raises(InvalidMsgTtlError) as exc:
                await c.publish("a.bad", b"x", headers={"Nats-TTL": value})
            assert exc.value.code == P.ErrorCode.INVALID_MSG_TTL == 6005
            assert exc.value.message == "invalid per-message TTL"
        # Refused messages consume no offset.
        assert (await c.publish("a.ok", b"y")).offset == last + 1


async def test_binary_ttl_field_and_header_must_agree(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir) as (_, c):
        await _ttl_topic(c)
        ack = await c.publish("a.x", b"", ttl=30)
        assert (await c.fetch("s", "t", 0, ack.offset, 1)).messages[0].ttl == 30
        ack = await c.publish("a.x", b"", ttl="never")
        assert (await c.fetch("s", "t", 0, ack.offset, 1)).messages[0].never_expires
        ack = await c.publish("a.x", b"", ttl=60, headers={"Nats-TTL": "1m"})
        assert (await c.fetch("s", "t", 0, ack.offset, 1)).messages[0].ttl == 60
        with pytest.raises(InvalidMsgTtlError, match="disagree"):
            await c.publish("a.x", b"", ttl=60, headers={"Nats-TTL": "2m"})


async def test_invalid_ttl_in_a_batch_fails_only_that_message(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir) as (_, c):
        await _ttl_topic(c)
        acks = await c.publish_batch(
            [("a.1", b"1"), ("a.2", b"2", {"Nats-TTL": "500ms"}), ("a.3", b"3", {"Nats-TTL": "5s"}), ("a.4", b"4")]
        )
        assert [a.status for a in acks] == [0, P.ErrorCode.INVALID_MSG_TTL, 0, 0]
        assert [a.offset for a in acks] == [1, 0, 2, 3]
        assert acks[1].error.message == "invalid per-message TTL"
        assert [m.subject for m in await all_messages(c, "s", "t")] == ["a.1", "a.3", "a.4"]


async def test_ttl_needs_allow_msg_ttl_and_the_switch_is_one_way(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir) as (_, c):
        await c.create_stream("s")
        await c.create_topic("s", "t", subjects=["a.>"])
        for headers, ttl in (({"Nats-TTL": "1s"}, None), ({"Nats-TTL": "never"}, None), ({}, 5), ({"Nats-TTL": "abc"}, None)):
            # §6.5: disabled is checked before validity ("abc" too)
            with pytest.raises(MsgTtlDisabledError) as exc:
                await c.publish("a.x", b"", headers=headers, ttl=ttl)
            assert exc.value.code == P.ErrorCode.MSG_TTL_DISABLED == 6006
            assert exc.value.message == "per-message TTL is disabled"
        # Zero is no TTL at all, so it is welcome anywhere.
        assert (await c.publish("a.x", b"", headers={"Nats-TTL": "0"})).offset == 1
        t = await c.update_topic("s", "t", allow_msg_ttl=True)
        assert t.options["allow_msg_ttl"] is True
        assert (await c.publish("a.x", b"", headers={"Nats-TTL": "1s"})).offset == 2
        with pytest.raises(InvalidTopicConfigError) as exc2:
            await c.update_topic("s", "t", allow_msg_ttl=False)
        assert exc2.value.code == P.ErrorCode.INVALID_TOPIC_CONFIG
        assert exc2.value.message == "message TTL status can not be disabled"


async def test_message_expires_at_never_before_its_deadline(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir) as (_, c):
        await _ttl_topic(c)
        await c.publish("a.x", b"x", ttl=10)
        await advance(9.999)
        assert len(await all_messages(c, "s", "t")) == 1
        await advance(0.101)  # §6.8: within 100 ms after the deadline
        assert await all_messages(c, "s", "t") == []
        stats = await c.stats()
        assert stats["expired_ttl"] == 1 and stats["pending_expiries"] == 0
        t = await c.get_topic("s", "t")
        assert t.extra["removed"] == {"ttl": 1} and t.extra["pending_expiries"] == 0


async def test_a_flood_of_long_ttls_never_delays_a_short_one(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir) as (_, c):
        await _ttl_topic(c)
        for _ in range(20):
            await c.publish_batch([(f"a.long.{i}", b"", None, 3600) for i in range(500)])
        await c.publish("a.short", b"", headers={"Nats-TTL": "1s"})
        for _ in range(20):
            await c.publish_batch([(f"a.long.{i}", b"", None, 3600) for i in range(500)])
        assert (await c.stats())["pending_expiries"] == 20_001
        await advance(1.1)
        subjects = {m.subject for m in await all_messages(c, "s", "t")}
        assert "a.short" not in subjects and len(subjects) == 500


async def test_delete_and_purge_take_entries_out_of_the_deadline_structure(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir) as (h, c):
        await _ttl_topic(c)
        ack = await c.publish("a.x", b"", ttl=5)
        await c.publish_batch([("a.y", b"", None, 5), ("a.z", b"", None, 5)])
        assert (await c.stats())["pending_expiries"] == 3
        await c.delete_message("s", "t", 0, ack.offset)
        assert (await c.stats())["pending_expiries"] == 2
        await c.purge("s", "t", "a.y")
        assert (await c.stats())["pending_expiries"] == 1
        await c.purge("s", "t")
        assert (await c.stats())["pending_expiries"] == 0
        await advance(6)
        stats = await c.stats()
        assert stats["expired_ttl"] == 0 and stats["deleted"] == 1 and stats["purged"] == 2


async def test_max_age_removes_messages_and_never_exempts(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir) as (_, c):
        await c.create_stream("s")
        await c.create_topic("s", "t", subjects=["a.>"], message_expiry=10, allow_msg_ttl=True)
        await c.publish("a.never", b"", headers={"Nats-TTL": "never"})
        await c.publish_batch([(f"a.{i}", b"") for i in range(10)])
        await advance(5)
        await c.publish("a.late", b"")
        await advance(5.1)
        assert [m.subject for m in await all_messages(c, "s", "t")] == ["a.never", "a.late"]
        await advance(5.1)
        assert [m.subject for m in await all_messages(c, "s", "t")] == ["a.never"]
        await advance(1000)
        assert [m.subject for m in await all_messages(c, "s", "t")] == ["a.never"]
        assert (await c.stats())["expired_max_age"] == 11


async def test_the_earlier_of_ttl_and_max_age_wins(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir) as (_, c):
        await c.create_stream("s")
        await c.create_topic("s", "t", subjects=["a.>"], message_expiry=10, allow_msg_ttl=True)
        await c.publish("a.short", b"", ttl=3)  # TTL first
        await c.publish("a.long", b"", ttl=60)  # max age first
        await advance(3.1)
        assert [m.subject for m in await all_messages(c, "s", "t")] == ["a.long"]
        await advance(7)
        assert await all_messages(c, "s", "t") == []
        t = await c.get_topic("s", "t")
        assert t.extra["removed"] == {"ttl": 1, "max_age": 1}
        assert t.extra["pending_expiries"] == 0


async def test_max_age_change_by_update_takes_effect(mock_clock, data_dir) -> None:
    async with broker_and_client(data_dir) as (_, c):
        await c.create_stream("s")
        await c.create_topic("s", "t", subjects=["a.>"])
        await c.publish("a.x", b"")
        await advance(30)
        await c.update_topic("s", "t", message_expiry=10)
        await advance(0.1)
        assert await all_messages(c, "s", "t") == []


async def test_ttls_survive_a_restart_and_what_fell_due_meanwhile_expires_at_once(mock_clock, data_dir) -> None:
    clock = Clock()
    async with broker_and_client(data_dir, clock) as (_, c):
        await _ttl_topic(c, subject_delete_marker_ttl=30, max_msgs_per_subject=1)
        await c.publish("a.soon", b"", ttl=5)
        await c.publish("a.later", b"", ttl=100)
        await c.publish("a.kept", b"")
    await advance(50)  # the broker is down while a.soon falls due
    async with broker_and_client(data_dir, clock) as (_, c):
        await advance(0)
        msgs = await all_messages(c, "s", "t")
        assert [(m.subject, m.offset, m.is_marker) for m in msgs] == [("a.later", 2, False), ("a.kept", 3, False), ("a.soon", 4, True)]
        assert (await c.stats())["pending_expiries"] == 2  # a.later and the marker
        await advance(50.2)
        msgs = await all_messages(c, "s", "t")
        assert [(m.subject, m.offset, m.is_marker) for m in msgs] == [("a.kept", 3, False), ("a.later", 5, True)]
    # There is no expiry file to lose: the state is rebuilt from the log every time.
    assert not [p for p in data_dir.rglob("*") if "ttl" in p.name or "expiry" in p.name]
    async with broker_and_client(data_dir, clock) as (_, c):
        assert (await c.stats())["pending_expiries"] == 1
        await advance(31)
        assert [m.subject for m in await all_messages(c, "s", "t")] == ["a.kept"]


@pytest.mark.slow
async def test_100k_random_ttls_each_removed_at_and_never_before_its_deadline(mock_clock, data_dir) -> None:
    rng = random.Random(43)
    async with broker_and_client(data_dir) as (h, c):
        await c.create_stream("s")
        await c.create_topic("s", "t", subjects=["a.>"], partitions=4, allow_msg_ttl=True)
        broker = h.broker
        clock = broker.clock
        sent: list[tuple[int, int, int]] = []  # (deadline ns, partition, offset)
        for batch in range(100):
            msgs = [(f"a.{rng.randrange(5000)}", b"", None, rng.randint(1, 60)) for _ in range(1000)]
            acks = await c.publish_batch(msgs)
            now = clock.now_ns()
            for (_, _, _, ttl), a in zip(msgs, acks):
                sent.append((now + ttl * NS, a.partition, a.offset))
            await advance(rng.random() * 0.05)
        sent.sort()
        topic = broker.catalog.topics()[0]
        live = lambda p, o: topic.partitions[p].log.is_live(o)  # noqa: E731
        lag = int(0.1 * NS)
        lo = 0  # sent[:lo] have deadlines at least `lag` in the past: all must be gone
        while lo < len(sent):
            await advance(0.037)
            now = clock.now_ns()
            while lo < len(sent) and sent[lo][0] + lag <= now:
                assert not live(sent[lo][1], sent[lo][2]), "removed more than 100 ms late"
                lo += 1
            hi = lo
            while hi < len(sent) and sent[hi][0] <= now:
                hi += 1  # due, inside the 100 ms window: either is fine
            # Nothing whose deadline is still ahead may be gone.
            for d, p, o in sent[hi : hi + 400]:
                assert live(p, o), "removed before its deadline"
            assert topic.messages_count == len(sent) - lo - sum(1 for d, p, o in sent[lo:hi] if not live(p, o))
        assert topic.messages_count == 0
        assert (await c.stats())["expired_ttl"] == 100_000
        assert len(broker.retention.engine.queue) == 0
