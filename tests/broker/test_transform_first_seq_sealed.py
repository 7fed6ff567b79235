"""The topic options ``subject_transform``, ``first_seq`` and ``sealed`` on the binary
protocol, through the bundled client (docs/semantics.md, "Stream subject
transforms", "First sequence", "Sealed topics"), and the refused ADR-49/50 headers."""

from __future__ import annotations

import zlib

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from ttl_helpers import advance, all_messages, broker_and_client

from broker.client import Client
from broker.core import TopicConfig, resolve
from broker.core._routing import Router
from broker.core._topics import Stream, Topic
from protocol import BrokerError, ErrorCode, SubjectTransform


async def _refused(coro, code: ErrorCode) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(BrokerError) as exc:
        await coro
    assert exc.value.code == code, exc.value
    return exc.value.message


async def test_subject_transform_stores_the_new_subject(client: Client) -> None:
    await client.create_stream("s")
    t = await client.create_topic(
        "s", "t", partitions=3, subjects=["in.>"], subject_transform={"src": "in.*.*", "dest": "out.$2.$1"},
        max_msgs_per_subject=1,
    )
    assert t.options["subject_transform"] == {"src": "in.*.*", "dest": "out.$2.$1"}
    async with await client.subscribe("in.>") as sub_in, await client.subscribe("out.>") as sub_out:
        a1 = await client.publish("in.x.y", b"1")
        a2 = await client.publish("in.x", b"2")  # src does not match: stored as is
        a3 = await client.publish("in.x.y", b"3")
        with trio.fail_after(5):
            got = [await sub_in.next() for _ in range(3)]
        assert [m.subject for m in got] == ["in.x.y", "in.x", "in.x.y"]
        await client.ping()
        assert sub_out.pending == 0
    # The partition is the stored subject's.
    assert a1.partition == a3.partition == zlib.crc32(b"out.y.x") % 3
    assert a2.partition == zlib.crc32(b"in.x") % 3
    last = await client.get_last("s", "t", "out.y.x")
    assert last.payload == b"3" and last.offset == a3.offset
    # max_msgs_per_subject counted the stored subject: the first copy went.
    fetched = await client.fetch("s", "t", a1.partition, 1, 10)
    assert [m.payload for m in fetched.messages if m.subject == "out.y.x"] == [b"3"]
    await _refused(client.create_topic("s", "u", subjects=["b.>"], subject_transform={"src": "b.*", "dest": "c.$2"}),
                   ErrorCode.INVALID_TRANSFORM)
    await _refused(client.create_topic("s", "u", subjects=["b.>"], subject_transform={"src": "b.*", "to": "x"}),
                   ErrorCode.INVALID_OPTIONS)
    # Removed by update: later messages keep their subject.
    await client.update_topic("s", "t", subject_transform=None)
    a4 = await client.publish("in.p.q", b"4")
    assert (await client.fetch("s", "t", a4.partition, a4.offset, 1)).messages[0].subject == "in.p.q"


async def test_a_transform_giving_an_invalid_subject_refuses_the_message(client: Client) -> None:
    await client.create_stream("s")
    await client.create_topic("s", "t", subjects=["k.>"], subject_transform={"src": "k.*", "dest": "o.{{split(1,-)}}"})
    assert (await client.publish("k.a-b", b"x")).offset == 1
    assert (await client.fetch("s", "t", 0, 1, 1)).messages[0].subject == "o.a.b"
    msg = await _refused(client.publish("k.--", b"x"), ErrorCode.INVALID_SUBJECT)
    assert "subject transform of topic s/t gives 'o.' for 'k.--'" in msg


async def test_first_seq_for_every_partition(client: Client) -> None:
    await client.create_stream("s")
    t = await client.create_topic("s", "t", partitions=2, subjects=["f.>"], first_seq=1000)
    assert t.options["first_seq"] == 1000
    acks = [await client.publish(f"f.{i}", b"x") for i in range(6)]
    for p in (0, 1):
        offsets = [a.offset for a in acks if a.partition == p]
        assert offsets == list(range(1000, 1000 + len(offsets)))
    await _refused(client.create_topic("s", "u", subjects=["g.>"], first_seq=-1), ErrorCode.INVALID_TOPIC_CONFIG)


async def test_sealed(client: Client) -> None:
    await client.create_stream("s")
    msg = await _refused(client.create_topic("s", "t", subjects=["z.>"], sealed=True), ErrorCode.INVALID_TOPIC_CONFIG)
    assert msg == "stream configuration for create can not be sealed"
    await client.create_topic("s", "t", message_expiry=3600, subjects=["z.>"], allow_rollup=True)
    ack = await client.publish("z.1", b"x")
    t = await client.update_topic("s", "t", sealed=True)
    assert t.message_expiry == 0
    assert (t.options["sealed"], t.options["deny_purge"], t.options["allow_rollup"]) == (True, True, False)
    msg = await _refused(client.publish("z.2", b"y"), ErrorCode.TOPIC_SEALED)
    assert msg == "topic s/t is sealed: no message goes in"
    await _refused(client.delete_message("s", "t", 0, ack.offset), ErrorCode.TOPIC_SEALED)
    await _refused(client.purge("s", "t"), ErrorCode.TOPIC_SEALED)
    msg = await _refused(client.update_topic("s", "t", sealed=False), ErrorCode.INVALID_TOPIC_CONFIG)
    assert msg == "stream configuration update can not unseal a sealed stream"
    assert (await client.fetch("s", "t", 0, 1, 10)).messages[0].payload == b"x"


async def test_counter_and_batch_headers_are_refused(client: Client) -> None:
    await client.create_stream("s")
    await client.create_topic("s", "t", subjects=["h.>"])
    await _refused(client.publish("h.1", b"", headers={"Nats-Incr": "1"}), ErrorCode.MSG_COUNTER_DISABLED)
    await _refused(client.publish("h.1", b"", headers={"Nats-Batch-Id": "b"}), ErrorCode.ATOMIC_PUBLISH_DISABLED)
    assert (await client.publish("h.1", b"ok")).offset == 1


# -- the router's stored subject, as a property ------------------------------------

_token = st.text(alphabet="abcxyz019", min_size=1, max_size=4)
_TRANSFORMS = [("in.*.*", "out.$2.$1"), ("in.>", "x.>"), ("in.*.>", "p.{{partition(4,1)}}.>"), ("in.*", "s.{{split(1,b)}}")]


def _topic(transform: tuple[str, str] | None, partitions: int) -> Topic:
    cfg = TopicConfig(name="t", partitions_count=partitions, message_expiry=0, subjects=("in.>",), segment_size=1 << 20)
    if transform is not None:
        cfg = resolve(TopicConfig(**{**cfg.to_json(), "subjects": ("in.>",),
                                    "subject_transform": {"src": transform[0], "dest": transform[1]}}), None, False, 64)
    topic = Topic(Stream(1, "s", 0), 1, cfg, 0)
    topic.partitions = [object() for _ in range(partitions)]  # type: ignore[misc]
    return topic


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(_TRANSFORMS), st.lists(_token, min_size=1, max_size=4), st.integers(1, 5))
def test_route_stored_is_the_transform_of_a_captured_subject(
    transform: tuple[str, str], tokens: list[str], partitions: int
) -> None:
    """Model: the stored subject is ``SubjectTransform.apply`` of the subject (None,
    or the same subject: stored as is); the partition is the stored subject's CRC-32;
    an output that is not a valid subject refuses the message; the cached answer
    equals the first."""
    topic = _topic(transform, partitions)
    router = Router()
    router.rebuild([topic])
    subject = ".".join(["in", *tokens])
    out = SubjectTransform(*transform).apply(subject)
    for _ in range(2):  # the second answer comes from the cache
        route, stored = router.route_stored(subject.encode())
        if out is None or out == subject:
            assert stored is None and route is topic.partitions[zlib.crc32(subject.encode()) % partitions]
        elif "" in out.split("."):
            assert isinstance(route, BrokerError) and route.code == ErrorCode.INVALID_SUBJECT and stored is None
        else:
            assert stored == out.encode() and route is topic.partitions[zlib.crc32(stored) % partitions]


async def test_a_sealed_topic_expires_ttls_and_writes_no_markers(mock_clock, data_dir) -> None:  # type: ignore[no-untyped-def]
    """Virtual time: TTLs keep expiring in a sealed topic (docs/semantics.md §21.3),
    and the subject delete marker the expiry would leave is not written."""
    async with broker_and_client(data_dir) as (_, c):
        await c.create_stream("s")
        await c.create_topic("s", "t", subjects=["a.>"], subject_delete_marker_ttl=1, max_msgs_per_subject=1)
        await c.publish("a.x", b"short", headers={"Nats-TTL": "2s"})
        await c.publish("a.y", b"long")
        await c.update_topic("s", "t", sealed=True)
        await advance(2.5)
        assert [(m.offset, m.subject) for m in await all_messages(c, "s", "t")] == [(2, "a.y")]
        stats = await c.stats()
        assert (stats["markers"], stats["expired_ttl"]) == (0, 1)
