"""Streams and topics: create, list, get, update, delete, and every error a user can
hit, each with its exact code and a message that says what went wrong."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import make_config, start_server

import protocol as P
from broker.client import Client, connect
from broker.server import ServerHandle


async def test_stream_lifecycle(client: Client, data_dir: Path) -> None:
    s = await client.create_stream("  My Shop ")
    assert (s.id, s.name, s.topics_count) == (1, "my.shop", 0)
    s2 = await client.create_stream("other", stream_id=10)
    assert s2.id == 10
    assert (await client.create_stream("third")).id == 11
    assert [x.name for x in await client.list_streams()] == ["my.shop", "other", "third"]
    assert (await client.get_stream("my.shop")).id == 1
    assert (await client.get_stream(10)).name == "other"
    renamed = await client.update_stream(10, "renamed")
    assert renamed.name == "renamed" and (await client.get_stream("renamed")).id == 10
    await client.create_topic("renamed", "t", subjects=["r.>"])
    await client.publish("r.x", b"1")
    assert os.path.isdir(data_dir / "streams" / "10" / "topics" / "1")
    await client.delete_stream("renamed")
    assert not os.path.exists(data_dir / "streams" / "10")
    assert [x.name for x in await client.list_streams()] == ["my.shop", "third"]
    with pytest.raises(P.NoTopicForSubjectError):  # type: ignore[attr-defined]
        await client.publish("r.x", b"2")


@pytest.mark.parametrize(
    ("call", "error", "fragment"),
    [
        (lambda c: c.create_stream("shop"), "StreamNameExistsError", "already exists"),
        (lambda c: c.create_stream("SHOP "), "StreamNameExistsError", "already exists"),
        (lambda c: c.create_stream("x", stream_id=1), "StreamIdExistsError", "id 1"),
        (lambda c: c.create_stream("a/b"), "InvalidNameError", "may only contain"),
        (lambda c: c.create_stream("   "), "InvalidNameError", "must not be empty"),
        (lambda c: c.get_stream("nope"), "StreamNotFoundError", "nope"),
        (lambda c: c.get_stream(99), "StreamNotFoundError", "99"),
        (lambda c: c.delete_stream("nope"), "StreamNotFoundError", "nope"),
        (lambda c: c.update_stream("nope", "x"), "StreamNotFoundError", "nope"),
        (lambda c: c.create_topic("nope", "t"), "StreamNotFoundError", "nope"),
        (lambda c: c.create_topic("shop", "orders"), "TopicNameExistsError", "orders"),
        (lambda c: c.create_topic("shop", "t2", topic_id=1, subjects=["z.>"]), "TopicIdExistsError", "id 1"),
        (lambda c: c.create_topic("shop", "t2", partitions=0), "InvalidPartitionsCountError", "1..1024"),
        (lambda c: c.create_topic("shop", "t2", partitions=5000), "InvalidPartitionsCountError", "not 5000"),
        (lambda c: c.create_topic("shop", "t2", subjects=["a..b"]), "InvalidSubjectFilterError", "empty token"),
        (lambda c: c.create_topic("shop", "t2", subjects=["a.>.b"]), "InvalidSubjectFilterError", "last token"),
        (lambda c: c.create_topic("shop", "t2", subjects=["a.*", "a.b"]), "SubjectsOverlapError", "own filters"),
        (lambda c: c.create_topic("shop", "t2", subjects=["orders.eu"]), "SubjectsOverlapError", "shop/orders"),
        (lambda c: c.create_topic("shop", "t2", subjects=["*.eu"]), "SubjectsOverlapError", "orders.>"),
        (lambda c: c.create_topic("shop", "t2", bogus=1), "InvalidOptionsError", "unknown option 'bogus'"),
        (lambda c: c.create_topic("shop", "t2", deny_purge="yes"), "InvalidOptionsError", "must be bool"),
        (lambda c: c.create_topic("shop", "t2", max_msgs_per_subject=True), "InvalidOptionsError", "not bool"),
        (lambda c: c.create_topic("shop", "t2", max_msgs_per_subject=-1, subjects=["q.>"]), "InvalidTopicConfigError", "negative"),
        (lambda c: c.create_topic("shop", "t2", segment_size=10, subjects=["q.>"]), "InvalidTopicConfigError", "segment_size"),
        (lambda c: c.get_topic("shop", "nope"), "TopicNotFoundError", "nope"),
        (lambda c: c.get_topic("shop", 7), "TopicNotFoundError", "7"),
        (lambda c: c.delete_topic("shop", "nope"), "TopicNotFoundError", "nope"),
        (lambda c: c.update_topic("shop", "orders", partitions_count=2), "InvalidOptionsError", "unknown option"),
        (lambda c: c.update_topic("shop", "orders", subjects=[]), "InvalidSubjectFilterError", "at least one"),
        (lambda c: c.list_topics("nope"), "StreamNotFoundError", "nope"),
    ],
)
async def test_admin_errors(client: Client, topic: tuple[str, str], call, error: str, fragment: str) -> None:  # type: ignore[no-untyped-def]
    cls = getattr(P, error)
    with pytest.raises(cls) as info:
        await call(client)
    assert info.value.code == cls.code
    assert fragment in info.value.message, info.value.message


async def test_topic_lifecycle_and_details(client: Client, server: ServerHandle) -> None:
    await client.create_stream("shop")
    t = await client.create_topic("shop", "Orders EU", partitions=4, message_expiry=3600)
    assert (t.id, t.name, t.partitions_count, t.message_expiry) == (1, "orders.eu", 4, 3600)
    assert t.options == {
        "subjects": ["shop.orders.eu.>"], "max_msgs_per_subject": 0, "deny_purge": False, "segment_size": 64 * 1024 * 1024,
        "allow_msg_ttl": False, "subject_delete_marker_ttl": 0, "allow_rollup": False, "retention": "limits",
        "duplicate_window": 120, "republish": None, "kv": None, "nats": None, "allow_msg_schedules": False,
        "storage": "file", "subject_transform": None, "first_seq": 0, "sealed": False, "max_msgs": 0, "max_bytes": 0,
        "max_msg_size": 0, "max_consumers": 0, "discard": "old", "discard_new_per_subject": False,
        "mirror": None, "sources": None,
    }
    assert t.stream_id == 1 and len(t.extra["partitions"]) == 4
    await client.publish_batch([(f"shop.orders.eu.{i}", b"x" * 10) for i in range(40)])
    t = await client.get_topic("shop", "orders.eu")
    assert t.messages_count == 40 and t.size > 40 * 10
    assert sum(p["messages"] for p in t.extra["partitions"]) == 40
    t = await client.update_topic("shop", 1, message_expiry=60, subjects=["eu.>", "shop.orders.eu.>"])
    assert t.message_expiry == 60 and t.options["subjects"] == ["eu.>", "shop.orders.eu.>"]
    assert t.options["duplicate_window"] == 60  # the window not named follows the shorter max age
    await client.publish("eu.new", b"routed by the new filter")
    s = await client.get_stream("shop")
    assert s.topics_count == 1 and s.topics[0].messages_count == 41 and s.messages_count == 41
    assert [x.name for x in await client.list_topics("shop")] == ["orders.eu"]
    await client.delete_topic("shop", "orders.eu")
    assert await client.list_topics("shop") == []
    with pytest.raises(P.NoTopicForSubjectError):  # type: ignore[attr-defined]
        await client.publish("eu.new", b"x")


async def test_message_expiry_defaults_from_the_config(tmp_path: Path) -> None:
    from conftest import make_config, start_server

    from broker.client import connect

    cfg = make_config(tmp_path / "d", **{"system.segment.message_expiry": 86400})
    async with start_server(cfg) as h, connect(h.address) as c:
        await c.create_stream("s")
        assert (await c.create_topic("s", "default", subjects=["a"])).message_expiry == 86400
        assert (await c.create_topic("s", "none", subjects=["b"], message_expiry=0)).message_expiry == 0
        assert (await c.create_topic("s", "own", subjects=["c"], message_expiry=5)).message_expiry == 5


async def test_default_subject_needs_valid_names(client: Client) -> None:
    await client.create_stream("s")
    with pytest.raises(P.InvalidSubjectFilterError) as info:  # type: ignore[attr-defined]
        await client.create_topic("s", ".hidden")
    assert "give the topic's subjects explicitly" in info.value.message
    t = await client.create_topic("s", ".hidden", subjects=["h.>"])
    assert t.options["subjects"] == ["h.>"]


async def test_catalog_survives_restart(config) -> None:  # type: ignore[no-untyped-def]
    from conftest import start_server

    from broker.client import connect

    async with start_server(config) as h, connect(h.address) as c:
        await c.create_stream("a", stream_id=5)
        await c.create_topic("a", "t", partitions=2, subjects=["x.>"], max_msgs_per_subject=3, deny_purge=True)
    async with start_server(config) as h, connect(h.address) as c:
        t = await c.get_topic(5, "t")
        assert t.partitions_count == 2 and t.options["max_msgs_per_subject"] == 3 and t.options["deny_purge"]
        assert (await c.create_stream("b")).id == 6


async def test_a_topic_deleted_with_unsynced_writes_does_not_break_shutdown(data_dir: Path) -> None:
    """fsync ``never``: a deleted topic's logs are closed while the committer still
    lists them as written; the shutdown's final sync skips their closed descriptors
    (a closed file reports -1) instead of failing."""
    cfg = make_config(data_dir, **{"system.partition.fsync": "never"})
    async with start_server(cfg) as handle:
        async with connect(handle.address) as c:
            await c.create_stream("s")
            await c.create_topic("s", "t", subjects=["t.>"])
            await c.publish("t.a", b"x")
            await c.delete_topic("s", "t")
        assert handle.broker.committer._dirty  # the deleted topic's log is still listed
    async with start_server(cfg) as handle:  # and the broker starts again, without it
        async with connect(handle.address) as c:
            assert [t.name for t in (await c.get_stream("s")).topics] == []
