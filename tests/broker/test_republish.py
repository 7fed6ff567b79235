"""Republish (ADR-28) with subject transforms and loop checks, end to end through
the client (docs/semantics.md §13)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from conftest import make_config, start_server

import protocol as P
from broker.client import (
    Client,
    InvalidTopicConfigError,
    InvalidTransformError,
    MsgTtlDisabledError,
    PedanticError,
    RepublishCycleError,
    connect,
)

OURS = ["Nats-Stream", "Nats-Subject", "Nats-Sequence", "Nats-Time-Stamp", "Nats-Last-Sequence"]


async def _drain(sub, n: int):  # type: ignore[no-untyped-def]
    with trio.fail_after(5):
        return [await sub.next() for _ in range(n)]


async def _nothing_more(sub, client: Client) -> None:  # type: ignore[no-untyped-def]
    await client.ping()
    await client.ping()
    assert sub.pending == 0


async def test_republished_copy_has_the_servers_headers_in_order(client: Client) -> None:
    await client.create_stream("s")
    t = await client.create_topic("s", "a", subjects=["a.>"], republish={"src": "a.>", "dest": "rp.>"})
    assert t.options["republish"] == {"src": "a.>", "dest": "rp.>", "headers_only": False}
    async with await client.subscribe("rp.>") as sub:
        ack = await client.publish("a.x", b"body", headers={"Mine": "1"})
        (copy,) = await _drain(sub, 1)
        stored = (await client.fetch("s", "a", 0, ack.offset, 1)).messages[0]
        assert copy.subject == "rp.x" and copy.payload == b"body"
        assert list(copy.headers) == ["Mine", *OURS, "TTLB-Hops"]
        assert copy.headers == {
            "Mine": "1",
            "Nats-Stream": "s/a",
            "Nats-Subject": "a.x",
            "Nats-Sequence": str(ack.offset),
            "Nats-Time-Stamp": P.rfc3339_ns(stored.timestamp),
            "Nats-Last-Sequence": "0",
            "TTLB-Hops": "1",
        }
        assert copy.offset == 0  # no topic captures rp.>: core delivery only
        await _nothing_more(sub, client)
    assert (await client.stats())["republished"] == 1


async def test_last_sequence_follows_each_subject_through_gaps_and_deletes(client: Client) -> None:
    await client.create_stream("s")
    await client.create_topic("s", "a", subjects=["a.>"], republish={"dest": "rp.>"})
    async with await client.subscribe("rp.>") as sub:
        acks = await client.publish_batch([("a.foo", b"1"), ("a.bar", b"2"), ("a.foo", b"3"), ("a.foo", b"4")])
        got = await _drain(sub, 4)
        assert [(m.headers["Nats-Subject"], m.headers["Nats-Sequence"], m.headers["Nats-Last-Sequence"]) for m in got] == [
            ("a.foo", "1", "0"), ("a.bar", "2", "0"), ("a.foo", "3", "1"), ("a.foo", "4", "3"),
        ]
        await client.delete_message("s", "a", 0, acks[3].offset)  # 4 gone: the newest live a.foo is 3
        await client.publish("a.foo", b"5")
        await client.delete_message("s", "a", 0, 5)
        await client.delete_message("s", "a", 0, 3)
        await client.delete_message("s", "a", 0, 1)
        await client.publish("a.foo", b"6")  # every earlier a.foo is gone
        got = await _drain(sub, 2)
        assert [m.headers["Nats-Last-Sequence"] for m in got] == ["3", "0"]


async def test_headers_only_copies_carry_the_size(client: Client) -> None:
    await client.create_stream("s")
    await client.create_topic("s", "a", subjects=["a.>"], republish={"src": "a.*", "dest": "meta.$1", "headers_only": True})
    async with await client.subscribe("meta.*") as sub:
        await client.publish_batch([("a.x", b"y" * 512), ("a.y", b""), ("a.z.deep", b"not matched by src")])
        got = await _drain(sub, 2)
        assert [(m.subject, m.payload, m.headers["Nats-Msg-Size"]) for m in got] == [("meta.x", b"", "512"), ("meta.y", b"", "0")]
        assert list(got[0].headers)[-2:] == ["Nats-Msg-Size", "TTLB-Hops"]
        await _nothing_more(sub, client)


async def test_a_capturing_topic_stores_the_copy_and_a_chain_works(client: Client) -> None:
    await client.create_stream("s")
    await client.create_topic("s", "c", subjects=["c.>"])
    await client.create_topic("s", "b", subjects=["b.>"], republish={"src": "b.>", "dest": "c.from-b.>"})
    await client.create_topic("s", "a", subjects=["a.>"], republish={"src": "a.*.*", "dest": "b.$2.$1"})
    await client.publish("a.one.two", b"payload", headers={"K": "v"})
    with trio.fail_after(5):
        while (await client.get_topic("s", "c")).messages_count < 1:
            await trio.sleep(0.01)
    in_b = (await client.fetch("s", "b", 0, 1, 10)).messages
    in_c = (await client.fetch("s", "c", 0, 1, 10)).messages
    assert [m.subject for m in in_b] == ["b.two.one"] and [m.subject for m in in_c] == ["c.from-b.two.one"]
    assert in_c[0].payload == b"payload"
    # Headers accumulate as on the server (first occurrence wins when read); the hop
    # count is replaced.
    assert in_c[0].headers["K"] == "v" and in_c[0].headers["Nats-Stream"] == "s/a"
    assert P.decode_headers(in_c[0].headers_raw)["TTLB-Hops"] == "2"
    assert (await client.stats())["republished"] == 2


async def test_refused_publishes_are_never_republished(client: Client) -> None:
    await client.create_stream("s")
    await client.create_topic("s", "a", subjects=["a.>"], republish={"dest": "rp.>"})
    async with await client.subscribe("rp.>") as sub:
        with pytest.raises(MsgTtlDisabledError):
            await client.publish("a.x", b"", ttl=5)
        acks = await client.publish_batch([("a.ok", b"1"), ("a.bad", b"", {"Nats-TTL": "1s"}), ("a.ok", b"2")])
        assert [a.status for a in acks] == [0, P.ErrorCode.MSG_TTL_DISABLED, 0]
        got = await _drain(sub, 2)
        assert [m.payload for m in got] == [b"1", b"2"]
        await _nothing_more(sub, client)
    assert (await client.stats())["republished"] == 2


async def test_update_adds_changes_and_removes_the_rule(client: Client) -> None:
    await client.create_stream("s")
    await client.create_topic("s", "a", subjects=["a.>"])
    async with await client.subscribe(">") as sub:
        await client.publish("a.1", b"")
        await client.update_topic("s", "a", republish={"dest": "one.>"})
        await client.publish("a.2", b"")
        t = await client.update_topic("s", "a", republish={"dest": "two.>", "headers_only": True})
        assert t.options["republish"] == {"src": ">", "dest": "two.>", "headers_only": True}
        await client.publish("a.3", b"")
        t = await client.update_topic("s", "a", republish=None)
        assert t.options["republish"] is None
        await client.publish("a.4", b"")
        got = await _drain(sub, 6)
        assert [m.subject for m in got] == ["a.1", "a.2", "one.a.2", "a.3", "two.a.3", "a.4"]
        await _nothing_more(sub, client)


@pytest.mark.parametrize(
    ("dest", "src"),
    [("foo.>", ">"), ("bar.bar", "foo.*"), ("bar.bar", "baz"), ("x.$1", "foo.*"), ("{{wildcard(1)}}.bar", "foo.*")],
)
async def test_a_destination_the_topic_itself_captures_is_a_cycle(client: Client, dest: str, src: str) -> None:
    await client.create_stream("s")
    subjects = ["foo.>", "bar.*", "baz", "x.*"]
    with pytest.raises(RepublishCycleError) as exc:
        await client.create_topic("s", "t", subjects=subjects, republish={"src": src, "dest": dest})
    assert exc.value.code == P.ErrorCode.REPUBLISH_CYCLE == 2009
    assert exc.value.message == "stream configuration for republish destination forms a cycle"


async def test_republish_validation_errors(client: Client) -> None:
    await client.create_stream("s")
    with pytest.raises(InvalidTransformError) as exc:
        await client.create_topic("s", "t", subjects=["a.*"], republish={"src": "a.*", "dest": "rp.$2"})
    assert exc.value.code == 2010
    assert exc.value.message == (
        "stream configuration for republish with transform from 'a.*' to 'rp.$2' not valid: "
        "invalid mapping destination: wildcard index out of range in $2: [2]"
    )
    with pytest.raises(InvalidTopicConfigError) as exc2:
        await client.create_topic("s", "t", subjects=["a.*"], republish={"dest": ""})
    assert exc2.value.message == "republish destination can not be empty"
    with pytest.raises(PedanticError) as exc3:
        await client.create_topic("s", "t", subjects=["a.*"], republish={"dest": "rp.x"}, pedantic=True)
    assert exc3.value.code == 2008 and exc3.value.message == "pedantic mode: republish source can not be empty"
    # Cycle before validity, as the server checks.
    with pytest.raises(RepublishCycleError):
        await client.create_topic("s", "t", subjects=["a.*"], republish={"src": "a.*", "dest": "a.$2"})
    assert await client.list_topics("s") == []


async def test_cycles_through_other_topics_are_refused_at_create_and_update(client: Client) -> None:
    await client.create_stream("s")
    await client.create_topic("s", "a", subjects=["a.>"], republish={"dest": "b.>"})
    with pytest.raises(RepublishCycleError) as exc:
        await client.create_topic("s", "b", subjects=["b.>"], republish={"dest": "a.>"})
    assert exc.value.message == "republish destination forms a cycle through topics: s/b -> s/a -> s/b"
    await client.create_topic("s", "b", subjects=["b.>"], republish={"src": "b.>", "dest": "c.>"})
    await client.create_topic("s", "c", subjects=["c.>"])
    with pytest.raises(RepublishCycleError) as exc:
        await client.update_topic("s", "c", republish={"dest": "a.from-c.>"})
    assert exc.value.message == "republish destination forms a cycle through topics: s/c -> s/a -> s/b -> s/c"
    # A subject change can close a loop too.
    await client.create_topic("s", "d", subjects=["d.>"], republish={"dest": "zz.>"})
    with pytest.raises(RepublishCycleError):
        await client.update_topic("s", "c", subjects=["c.>", "zz.>"], republish={"dest": "d.>"})
    t = await client.get_topic("s", "c")
    assert t.options["republish"] is None and t.options["subjects"] == ["c.>"]
    # Breaking the chain makes room.
    await client.update_topic("s", "b", republish=None)
    await client.update_topic("s", "c", republish={"dest": "a.from-c.>"})


async def test_hop_limit_drops_and_counts(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, **{"limits.max_republish_hops": 2})
    async with start_server(cfg) as server, connect(server.address) as client:
        await client.create_stream("s")
        await client.create_topic("s", "d", subjects=["d.>"])
        await client.create_topic("s", "c", subjects=["c.>"], republish={"dest": "d.>"})
        await client.create_topic("s", "b", subjects=["b.>"], republish={"dest": "c.>"})
        await client.create_topic("s", "a", subjects=["a.>"], republish={"dest": "b.>"})
        await client.publish("a.x", b"")
        # A publisher cannot skip the count either.
        await client.publish("c.y", b"", headers={"TTLB-Hops": "2"})
        with trio.fail_after(5):
            while (await client.stats())["dropped_loops"] < 2:
                await trio.sleep(0.01)
        assert (await client.get_topic("s", "c")).messages_count == 2
        assert (await client.get_topic("s", "d")).messages_count == 0
        stats = await client.stats()
        assert stats["republished"] == 2 and stats["dropped_loops"] == 2


async def test_an_invalid_transformed_subject_is_dropped_and_counted(client: Client) -> None:
    await client.create_stream("s")
    await client.create_topic("s", "a", subjects=["a.*"], republish={"src": "a.*", "dest": "x.{{split(1,-)}}.y"})
    async with await client.subscribe("x.>") as sub:
        await client.publish("a.---", b"")  # split gives nothing: x..y
        await client.publish("a.p-q", b"")
        (m,) = await _drain(sub, 1)
        assert m.subject == "x.p.q.y"
        await _nothing_more(sub, client)
    assert (await client.stats())["dropped_invalid_subject"] == 1


async def test_markers_are_republished(client: Client) -> None:
    await client.create_stream("s")
    await client.create_topic("s", "a", subjects=["a.>"], subject_delete_marker_ttl=60, republish={"dest": "watch.>"})
    async with await client.subscribe("watch.>") as sub:
        ack = await client.publish("a.k", b"v")
        await client.delete_message("s", "a", 0, ack.offset)
        put, marker = await _drain(sub, 2)
        assert put.payload == b"v" and put.headers["Nats-Last-Sequence"] == "0"
        assert marker.subject == "watch.a.k" and marker.payload == b""
        assert marker.headers["Nats-Marker-Reason"] == "Remove" and marker.headers["Nats-Sequence"] == "2"
        # The offset of the message whose removal it marks (docs/semantics.md §13.4), never 0.
        assert marker.headers["Nats-Last-Sequence"] == str(ack.offset)


async def test_under_fsync_always_the_copy_follows_the_group_commit(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, **{"system.partition.fsync": "always"})
    async with start_server(cfg) as server, connect(server.address) as client:
        await client.create_stream("s")
        await client.create_topic("s", "a", subjects=["a.>"], republish={"dest": "rp.>"})
        await client.create_topic("s", "rp", subjects=["rp.>"])
        synced_before = server.broker.committer.synced
        async with await client.subscribe("rp.>") as sub:
            await client.publish("a.x", b"1")
            (copy,) = await _drain(sub, 1)
        assert server.broker.committer.synced > synced_before
        assert copy.headers["Nats-Sequence"] == "1"


async def test_copies_that_reach_nobody_are_counted_not_sent(client: Client) -> None:
    await client.create_stream("s")
    await client.create_topic("s", "a", subjects=["a.*"], republish={"src": "a.*", "dest": "rp.$1"})
    before = await client.stats()
    async with await client.subscribe("rp.x") as sub:
        await client.publish_batch([("a.x", b"1"), ("a.y", b"2"), ("a.x", b"3"), ("a.y", b"4")])
        got = await _drain(sub, 2)
        assert [(m.subject, m.payload, m.headers["Nats-Sequence"], m.headers["Nats-Last-Sequence"]) for m in got] == [
            ("rp.x", b"1", "1", "0"), ("rp.x", b"3", "3", "1"),
        ]
        await _nothing_more(sub, client)
        after = await client.stats()
        # Every copy is republished, and no topic captures any (those on rp.y reach
        # no subscription either: they are counted, as a publish counts them).
        assert after["republished"] - before["republished"] == 4
        assert after["messages_unrouted"] - before["messages_unrouted"] == 4
        # Interest is looked at when a copy is sent, not remembered.
        async with await client.subscribe("rp.y") as later:
            await client.publish("a.y", b"5")
            (m,) = await _drain(later, 1)
            assert (m.subject, m.headers["Nats-Sequence"], m.headers["Nats-Last-Sequence"]) == ("rp.y", "5", "4")
    assert (await client.stats())["messages_unrouted"] - before["messages_unrouted"] == 5


async def test_a_changed_rule_applies_to_the_next_message(client: Client) -> None:
    await client.create_stream("s")
    await client.create_topic("s", "a", subjects=["a.*"], republish={"src": "a.*", "dest": "rp.$1"})
    async with await client.subscribe(">") as sub:
        await client.publish("a.x", b"1")
        await client.update_topic("s", "a", republish={"src": "a.*", "dest": "new.$1", "headers_only": True})
        await client.publish("a.x", b"2")
        got = [m for m in await _drain(sub, 4) if not m.subject.startswith("a.")]
        assert [(m.subject, m.payload) for m in got] == [("rp.x", b"1"), ("new.x", b"")]
        assert got[1].headers["Nats-Msg-Size"] == "1"


async def test_a_random_transform_draws_for_each_publish(client: Client) -> None:
    await client.create_stream("s")
    await client.create_topic("s", "a", subjects=["a"], republish={"src": "a", "dest": "r.{{random(1000)}}"})
    async with await client.subscribe("r.*") as sub:
        for _ in range(20):
            await client.publish("a", b"")
        got = await _drain(sub, 20)
    assert len({m.subject for m in got}) > 1  # not one destination kept for the subject
