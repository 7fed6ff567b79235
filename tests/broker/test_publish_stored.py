"""``Publisher.publish_stored`` (the NATS listener's publish): when a batch is
stored whole, in order, into one partition the reply is its first offset instead of
its acks; any other outcome replies with the acks ``Publisher.publish`` gives. Two
brokers set up alike take the same batches, one through each (hypothesis): the
offsets are what the acks say, every other reply is the same bytes and epoch, and the
PubAcks made from either are equal."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ttl_helpers import broker_and_client

import protocol as P

import protocol.nats as PN

SUBJECTS = ["t.a", "t.b", "two.x", "two.y", "ttl.x", "$KV.b.k1", "$KV.b.k2", "$KV.b.a..b", "none.x"]
HEADERS: list[list[tuple[str, str]]] = [
    [], [], [],
    [("Nats-Msg-Id", "m1")], [("Nats-Msg-Id", "m2")],
    [("Nats-TTL", "5s")], [("Nats-TTL", "bad")],
    [("Nats-Expected-Last-Sequence", "0")], [("Nats-Expected-Last-Subject-Sequence", "1")],
    [("Nats-Rollup", "sub")], [("X-Other", "v")],
]


async def setup(c: Any) -> None:
    await c.create_stream("s")
    await c.create_topic("s", "t", subjects=["t.>"], duplicate_window=60)
    await c.create_topic("s", "two", partitions=2, subjects=["two.>"])
    await c.create_topic("s", "ttl", subjects=["ttl.>"], allow_msg_ttl=True)
    await c.kv_create("b")


def body(subject: str, headers: list[tuple[str, str]], payload: bytes) -> bytes:
    block = PN.nats_to_record_headers(PN.encode_nats_headers(headers)) if headers else b""
    return P.encode_body(subject, payload, block)


def pub_acks(reply: Any, n: int, topic_of: list[Any], js: Any) -> list[bytes]:
    """The PubAcks ``NatsSession._flush`` makes of a publish reply (of
    ``publish_stored``, or the ``Reply`` of ``publish``)."""
    payload, epoch = reply if isinstance(reply, tuple) else (reply, 0)
    if payload.__class__ is int:
        return [js.pub_ack(topic_of[k], payload + k, False) for k in range(n)]
    out = []
    for k, ack in enumerate(P.Acks.decode(payload)):
        if ack.error is not None:
            out.append(js.pub_error(ack.error, topic_of[k]))
        else:
            out.append(js.pub_ack(topic_of[k], ack.offset, ack.status == P.ErrorCode.DUPLICATE_MESSAGE))
    return out


async def test_stored_replies_the_first_offset_of_what_the_acks_say(mock_clock: Any, tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    async with broker_and_client(tmp_path / "a") as (ha, ca), broker_and_client(tmp_path / "b") as (hb, cb):
        await setup(ca)
        await setup(cb)
        a, b = ha.broker, hb.broker
        ja, jb = ha.services.jetstream, hb.services.jetstream
        seen = {"offsets": 0, "other": 0}

        message = st.tuples(st.sampled_from(SUBJECTS), st.sampled_from(HEADERS), st.binary(max_size=8))
        # Half of the batches into one topic (the whole batch stored: offsets), half mixed.
        one_topic = st.sampled_from(["t", "two", "ttl", "$KV.b"]).flatmap(
            lambda t: st.lists(st.tuples(st.sampled_from([s for s in SUBJECTS if s.startswith(t + ".")]),
                                         st.sampled_from(HEADERS), st.binary(max_size=8)), min_size=1, max_size=6))

        @given(one_topic | st.lists(message, min_size=1, max_size=6))
        @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
        def check(batch: list[tuple[str, list[tuple[str, str]], bytes]]) -> None:
            bodies = [body(*m) for m in batch]
            cmd = P.Publish.from_bodies(bodies, 0)
            want = a.publisher.publish(None, cmd)
            got = b.publisher.publish_stored(None, cmd)
            payload, want_epoch = want if isinstance(want, tuple) else (want, 0)
            first_or_acks, epoch = got
            assert epoch - b.committer.epoch == want_epoch - a.committer.epoch
            if first_or_acks.__class__ is int:
                seen["offsets"] += 1
                first = first_or_acks
                acks = P.Acks.decode(payload)
                assert [(x.offset, x.status, x.error) for x in acks] == [(first + k, 0, None) for k in range(len(batch))]
                assert len({(x.stream_id, x.topic_id, x.partition) for x in acks}) == 1
            else:
                seen["other"] += 1
                assert first_or_acks == payload
            # What a NATS client gets, made from either reply.
            topics = [b.router.resolve(s.encode()) for s, _, _ in batch]
            topic_of = [getattr(r, "topic", None) for r in topics]
            assert pub_acks(got, len(batch), topic_of, jb) == pub_acks(want, len(batch), topic_of, ja)

        check()
        assert seen["offsets"] >= 10 and seen["other"] >= 10  # both replies were compared
