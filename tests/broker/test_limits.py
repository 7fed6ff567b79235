"""A topic's limits and discard policies on the binary protocol, through the bundled
client (``broker/core/_limits.py``): the options, their errors, and the rules
checked against a simple model with hypothesis."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ttl_helpers import advance, all_messages, broker_and_client

import protocol as P
from protocol import BrokerError, ErrorCode

_RECORD = 24 + 14  # a record's header and a body's fixed fields


async def test_topic_options_and_errors(data_dir: Path) -> None:
    async with broker_and_client(data_dir) as (h, c):
        await c.create_stream("s")
        t = await c.create_topic(
            "s", "t", subjects=["t.>"], max_msgs=2, max_bytes=10_000, max_msg_size=8, max_consumers=1,
            discard="new", max_msgs_per_subject=1, discard_new_per_subject=True,
        )
        assert {k: t.options[k] for k in ("max_msgs", "max_bytes", "max_msg_size", "max_consumers", "discard",
                                          "discard_new_per_subject")} == {
            "max_msgs": 2, "max_bytes": 10_000, "max_msg_size": 8, "max_consumers": 1, "discard": "new",
            "discard_new_per_subject": True,
        }
        acks = await c.publish_batch([("t.a", b"1"), ("t.a", b"2"), ("t.b", b"123456789"), ("t.b", b"1"), ("t.c", b"1")])
        assert acks is not None
        assert [a.status for a in acks] == [
            0, ErrorCode.MAX_MSGS_PER_SUBJECT_EXCEEDED, ErrorCode.MESSAGE_TOO_LARGE, 0, ErrorCode.MAX_MSGS_EXCEEDED,
        ]
        assert acks[2].error is not None and "max_msg_size of 8 bytes" in acks[2].error.message
        assert h.broker.counters.refused_limits == 3
        await c.create_consumer("s", "t", "one")
        with pytest.raises(BrokerError) as exc:
            await c.create_consumer("s", "t", "two")
        assert exc.value.code == ErrorCode.MAX_CONSUMERS_REACHED
        # Rules: checked as nats-server checks them.
        with pytest.raises(BrokerError) as exc:
            await c.update_topic("s", "t", discard="old")
        assert exc.value.code == ErrorCode.INVALID_TOPIC_CONFIG
        assert exc.value.message == "discard new per subject requires discard new policy to be set"
        with pytest.raises(BrokerError) as exc:
            await c.update_topic("s", "t", max_msgs=-1)
        assert exc.value.message == "max_msgs must not be negative (0 = unlimited)"
        with pytest.raises(BrokerError) as exc:
            await c.update_topic("s", "t", discard="newest")
        assert exc.value.message == "discard must be old or new, not 'newest'"
        # Discard old with a lower max_msgs: the oldest go at once.
        t = await c.update_topic("s", "t", discard="old", discard_new_per_subject=False, max_msgs=1)
        assert t.messages_count == 1
        assert [m.subject for m in await all_messages(c, "s", "t")] == ["t.b"]
        assert h.broker.counters.removed_limits == 1


def _model(ops: list[tuple[str, int]], max_msgs: int, max_bytes: int, per: int, discard: str, per_new: bool) -> tuple[
    list[bool], list[int]
]:
    """nats-server's store rules (memstore.go storeRawMsg, enforce*Limit) over
    messages of (subject, record size): which are accepted, and the indexes kept."""
    stored: list[tuple[int, str, int]] = []  # (index, subject, size)
    accepted = []
    for i, (subj, size) in enumerate(ops):
        count = sum(1 for _, s, _ in stored if s == subj)
        asl = per > 0 and count >= per
        ok = True
        if discard == "new":
            if (asl and per_new) or (max_msgs and len(stored) >= max_msgs and not asl):
                ok = False
            elif max_bytes and sum(b for *_, b in stored) + size > max_bytes:
                first = next((b for _, s, b in stored if s == subj), 0)
                ok = asl and first >= size
        accepted.append(ok)
        if not ok:
            continue
        stored.append((i, subj, size))
        if per and count + 1 > per:
            j = next(k for k, (_, s, _) in enumerate(stored) if s == subj)
            del stored[j]
        if discard == "old":
            while max_msgs and len(stored) > max_msgs:
                del stored[0]
            while max_bytes and sum(b for *_, b in stored) > max_bytes:
                del stored[0]
    return accepted, [i for i, *_ in stored]


async def test_limits_against_a_model(data_dir: Path) -> None:
    """Random publishes (subjects, sizes, batches) under random limits, against
    :func:`_model`: the same acks and refusals, the same messages kept, exact counts.
    One topic, reconfigured and purged for each example; the publish path called
    directly (as ``bench/publish_cpu.py`` does)."""
    async with broker_and_client(data_dir) as (h, c):
        broker = h.broker
        await c.create_stream("m")
        await c.create_topic("m", "t", subjects=["t.>"])
        topic = broker.catalog.topic(P.Identifier.of("m"), P.Identifier.of("t"))
        (part,) = topic.partitions
        base = topic.config

        @given(
            st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 60)), min_size=1, max_size=30),
            st.integers(0, 6), st.sampled_from([0, 150, 400]), st.integers(0, 3), st.sampled_from(["old", "new"]),
            st.booleans(), st.integers(1, 5),
        )
        @settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
        def check(msgs: list[tuple[str, int]], max_msgs: int, max_bytes: int, per: int, discard: str, per_new: bool,
                  chunk: int) -> None:
            per_new = per_new and discard == "new" and per > 0
            broker.retention.purge_all(part)
            topic.config = replace(
                base, max_msgs=max_msgs, max_bytes=max_bytes, max_msgs_per_subject=per, discard=discard,
                discard_new_per_subject=per_new,
            )
            broker.router.rebuild(broker.catalog.topics())
            bodies = [P.encode_body(f"t.{s}", b"x" * size) for s, size in msgs]
            sizes = [(s, len(b) + 24) for (s, _), b in zip(msgs, bodies)]
            want_ok, want_kept = _model(sizes, max_msgs, max_bytes, per, discard, per_new)
            got_ok: list[bool] = []
            offsets: list[int] = []
            for k in range(0, len(bodies), chunk):  # batches: each message sees those before it
                reply = broker.publisher.publish(None, P.Publish.from_bodies(bodies[k : k + chunk], 0))
                acks = P.Acks.decode(reply[0] if isinstance(reply, tuple) else reply)
                got_ok += [a.status == 0 for a in acks]
                offsets += [a.offset if a.status == 0 else 0 for a in acks]
            assert got_ok == want_ok
            assert part.live_offsets() == [offsets[i] for i in want_kept]
            assert topic.messages_count == len(want_kept)
            assert topic.live_bytes == sum(sizes[i][1] for i in want_kept)

        check()


@pytest.mark.parametrize("discard", ["old", "new"])
async def test_a_marker_under_max_bytes(mock_clock: Any, data_dir: Path, discard: str) -> None:
    """A marker is stored under either policy; under discard old a marker that takes
    the partition past max_bytes removes the oldest (docs/semantics.md 2.9)."""
    async with broker_and_client(data_dir) as (h, c):
        await c.create_stream("s")
        sizes = [_RECORD + 3 + len(b"y" * 40)] * 2 + [_RECORD + 3 + 1]
        await c.create_topic(
            "s", "t", subjects=["a.>"], subject_delete_marker_ttl=1, max_bytes=sum(sizes) + 20, discard=discard,
        )
        await c.publish("a.1", b"y" * 40)
        await c.publish("a.2", b"y" * 40)
        await c.publish("a.x", b"z", ttl=2)
        topic = h.broker.catalog.topic(P.Identifier.of("s"), P.Identifier.of("t"))
        assert topic.live_bytes == sum(sizes)
        await advance(2.5)
        view = [(m.subject, m.is_marker) for m in await all_messages(c, "s", "t")]
        if discard == "old":
            assert view == [("a.2", False), ("a.x", True)]
            assert topic.live_bytes <= sum(sizes) + 20
            assert h.broker.counters.removed_limits == 1
        else:
            assert view == [("a.1", False), ("a.2", False), ("a.x", True)]
            assert topic.live_bytes > sum(sizes) + 20  # the decision: the marker is stored
            assert h.broker.counters.removed_limits == 0


async def test_republished_copies_meet_the_destinations_limits(data_dir: Path) -> None:
    async with broker_and_client(data_dir) as (_, c):
        await c.create_stream("s")
        await c.create_topic("s", "src", subjects=["a.>"], republish={"src": "a.>", "dest": "copy.>"})
        await c.create_topic("s", "new", subjects=["copy.n.>"], max_msgs=2, discard="new")
        await c.create_topic("s", "old", subjects=["copy.o.>"], max_msgs=2)
        for i in range(3):
            assert (await c.publish(f"a.n.{i}", b"x")).ok
            assert (await c.publish(f"a.o.{i}", b"x")).ok
        assert [m.subject for m in await all_messages(c, "s", "new")] == ["copy.n.0", "copy.n.1"]
        assert [m.subject for m in await all_messages(c, "s", "old")] == ["copy.o.1", "copy.o.2"]
        assert len(await all_messages(c, "s", "src")) == 6
        stats = await c.stats()
        assert (stats["refused_limits"], stats["removed_limits"]) == (1, 1)
