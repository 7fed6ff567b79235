"""The publish path's steps over a batch (``broker.core._batch``, ``_admission``,
``_publishing``) against publishing one message, or one request, at a time.

Two brokers set up alike take the same messages (hypothesis): one as a batch, the
other one message (or one request) after the other. Where the batch's semantics are
those of publishing one at a time (no compare-and-set header: those compare against
what the partition held when the batch arrived), the acks are the same, message by
message (place, status and error text), and so is every live message of every
topic. ``publish_frames`` is held to more: its response frames are byte for byte
those the requests get one after the other, also when it declines to join them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ttl_helpers import broker_and_client

import protocol as P
import protocol.nats as PN

SUBJECTS = [
    "t.a", "t.b", "t.c", "two.x", "two.y", "two.z", "ttl.x", "ttl.y", "roll.a", "roll.b", "rp.a",
    "$KV.b.k1", "$KV.b.k2", "$KV.b.a..b", "none.x", "t..bad",
]
#: Headers whose effect does not compare against the partition's state.
HEADERS: list[list[tuple[str, str]]] = [
    [], [], [], [],
    [("Nats-Msg-Id", "m1")], [("Nats-Msg-Id", "m2")], [("Nats-Msg-Id", "m1"), ("Nats-TTL", "5s")],
    [("Nats-TTL", "5s")], [("Nats-TTL", "1s")], [("Nats-TTL", "never")], [("Nats-TTL", "bad")],
    [("Nats-Rollup", "sub")], [("Nats-Rollup", "all")], [("Nats-Rollup", "bogus")],
    [("KV-Operation", "DEL")], [("KV-Operation", "PURGE")], [("Nats-Marker-Reason", "MaxAge")],
    [("X-Other", "v")], [("Nats-TTL", "5s"), ("X-Other", "v")],
]
#: And those that do (only ``publish_frames`` may meet them: it must then decline).
COMPARING: list[list[tuple[str, str]]] = [
    [("Nats-Expected-Last-Sequence", "0")], [("Nats-Expected-Last-Subject-Sequence", "1")],
    [("Nats-Expected-Stream", "t")], [("Nats-Expected-Last-Msg-Id", "m1")],
]
#: TTL field values (0: none); flags (any is refused); payload sizes around the limit.
TTLS = [0, 0, 0, 5, 1, P.TTL_NEVER]
MAX_PAYLOAD = 64


async def setup(c: Any) -> None:
    await c.create_stream("s")
    await c.create_topic("s", "t", subjects=["t.>"], duplicate_window=60)
    await c.create_topic("s", "two", partitions=3, subjects=["two.>"], duplicate_window=60, max_msgs_per_subject=2)
    await c.create_topic(
        "s", "ttl", subjects=["ttl.>"], allow_msg_ttl=True, subject_delete_marker_ttl=3, allow_rollup=True,
    )
    await c.create_topic("s", "roll", partitions=2, subjects=["roll.>"], allow_rollup=True, allow_msg_ttl=True)
    await c.create_topic("s", "copies", subjects=["copy.>"])
    await c.create_topic("s", "rp", subjects=["rp.>"], republish={"src": "rp.>", "dest": "copy.>"})
    await c.kv_create("b")


def body(subject: str, headers: list[tuple[str, str]], payload: bytes, ttl: int = 0, flags: int = 0) -> bytes:
    block = PN.nats_to_record_headers(PN.encode_nats_headers(headers)) if headers else b""
    return P.encode_body(subject, payload, block, ttl=ttl, flags=flags)


def messages(headers: list[list[tuple[str, str]]]) -> st.SearchStrategy[bytes]:
    """Bodies: mostly plain, some with a TTL field, headers, flags or a big payload."""
    return st.builds(
        body,
        st.sampled_from(SUBJECTS),
        st.sampled_from(headers),
        st.binary(max_size=8) | st.binary(min_size=MAX_PAYLOAD - 2, max_size=MAX_PAYLOAD + 2),
        st.sampled_from(TTLS),
        st.sampled_from([0, 0, 0, 0, 0, 0, 0, 1]),
    )


def stored(broker: Any) -> list[tuple[object, ...]]:
    """Every live message of every topic (timestamps aside, and so a republished
    copy's ``Nats-Time-Stamp``: each broker has its own wall clock)."""
    out: list[tuple[object, ...]] = []
    for topic in broker.catalog.topics():
        for part in topic.partitions:
            res = part.read(1, 1_000_000, 1 << 30, None)
            for run, (_, count) in zip(res.records, res.runs):
                raw = bytes(run)
                for m in P.decode_records(raw, 0, len(raw), count):
                    headers = {k: v for k, v in m.headers.items() if k != "Nats-Time-Stamp"}
                    out.append((topic.full_name, part.number, m.offset, m.subject, m.payload, headers, m.ttl, m.flags))
    return out


def acks_of(reply: Any) -> list[tuple[object, ...]]:
    payload = reply[0] if isinstance(reply, tuple) else reply
    return [(a.stream_id, a.topic_id, a.partition, a.offset, a.status, a.error and a.error.message) for a in P.Acks.decode(payload)]


def two_brokers(tmp_path: Path) -> Any:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    config = {"limits.max_payload_bytes": MAX_PAYLOAD}
    return broker_and_client(tmp_path / "a", **config), broker_and_client(tmp_path / "b", **config)


def run_examples(check: Callable[..., None], strategy: st.SearchStrategy[Any], examples: int) -> None:
    given(strategy)(
        settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)(check)
    )()


async def test_a_batch_gets_the_acks_its_messages_get_alone(mock_clock: Any, tmp_path: Path) -> None:
    """``publish`` of a batch and ``publish`` of each of its messages alone: the same
    acks, message by message, and the same messages stored."""
    one, other = two_brokers(tmp_path)
    async with one as (ha, ca), other as (hb, cb):
        await setup(ca)
        await setup(cb)
        a, b = ha.broker, hb.broker
        seen = {"whole": 0, "general": 0}

        def check(batch: list[bytes]) -> None:
            cmd = P.Publish.from_bodies(batch, 0)
            got = a.publisher.publish(None, cmd)
            alone = [acks_of(b.publisher.publish(None, P.Publish.from_bodies([m], 0)))[0] for m in batch]
            assert acks_of(got) == alone
            parts = {(s, t, p) for s, t, p, _, status, _ in alone if not status}
            seen["whole" if len(parts) == 1 and all(not x[4] for x in alone) else "general"] += 1

        run_examples(check, st.lists(messages(HEADERS), min_size=1, max_size=8), 300)
        assert stored(a) == stored(b)
        assert seen["whole"] >= 10 and seen["general"] >= 10


def corrupted(payload: bytes, how: int) -> bytes:
    """A PUBLISH payload made malformed (``how`` 1: it says one message fewer than
    it holds; 2: its last byte is cut off; 0: as it was), as long as the request
    still decodes as a PUBLISH (what ``take_publish`` lets through)."""
    count = int.from_bytes(payload[1:5], "little")
    if how == 1 and count >= 2:
        bad = payload[:1] + (count - 1).to_bytes(4, "little") + payload[5:]
    elif how == 2:
        bad = payload[:-1]
    else:
        return payload
    try:
        P.Publish.decode(bad)
    except P.BrokerError:
        return payload
    return bad


async def test_joined_requests_get_the_frames_they_get_one_after_the_other(mock_clock: Any, tmp_path: Path) -> None:
    """``publish_frames`` of a run of requests, or (when it declines: None) each
    request through ``publish``, as the session does; and each request through
    ``publish`` on the other broker: the same answers, the frames byte for byte. It
    declines every run with a malformed request in it (which gets its own error)."""
    one, other = two_brokers(tmp_path)
    async with one as (ha, ca), other as (hb, cb):
        await setup(ca)
        await setup(cb)
        a, b = ha.broker, hb.broker
        seen = {"joined": 0, "declined": 0, "malformed": 0}

        def answer(broker: Any, corr: int, payload: bytes) -> bytes | tuple[int, str]:
            """The response frame to one request alone, or its error."""
            try:
                reply = broker.publisher.publish(None, P.Publish.decode(payload))
            except P.BrokerError as err:
                return (int(err.code), err.message)
            payload = reply[0] if isinstance(reply, tuple) else reply
            return P.encode_frame(P.Command.PUBLISH, P.FLAG_RESPONSE, corr, 0, payload)

        def check(requests: list[tuple[list[bytes], int]]) -> None:
            payloads = [corrupted(P.Publish.from_bodies(r, 0).encode(), how) for r, how in requests]
            run = [(corr, p, P.Publish.decode(p).count) for corr, p in enumerate(payloads, 1)]
            want = [answer(b, corr, p) for corr, p, _ in run]
            got = a.publisher.publish_frames(None, run)
            if got is None:
                seen["declined"] += 1
                seen["malformed"] += any(isinstance(w, tuple) for w in want)
                assert [answer(a, corr, p) for corr, p, _ in run] == want
            else:
                seen["joined"] += 1
                assert all(isinstance(w, bytes) for w in want)
                assert got[0] == b"".join(w for w in want if isinstance(w, bytes))

        request = st.tuples(
            st.lists(messages(HEADERS + COMPARING[:1]), min_size=1, max_size=3), st.sampled_from([0] * 8 + [1, 2]),
        )
        run_examples(check, st.lists(request, min_size=2, max_size=5), 250)
        assert stored(a) == stored(b)
        assert seen["joined"] >= 20 and seen["declined"] >= 20 and seen["malformed"] >= 10


async def test_the_brokers_own_bodies_are_stored_as_a_publish_of_them(mock_clock: Any, tmp_path: Path) -> None:
    """``publish_bodies`` (republished copies: no answer, no check of flags, sizes or
    headers, no de-duplication) of bodies that pass those anyway stores what
    ``publish`` of them stores, and counts the same refusals."""
    one, other = two_brokers(tmp_path)
    async with one as (ha, ca), other as (hb, cb):
        await setup(ca)
        await setup(cb)
        a, b = ha.broker, hb.broker
        valid = st.builds(
            body,
            st.sampled_from(SUBJECTS),
            st.sampled_from([h for h in HEADERS if not any(name == "Nats-Msg-Id" for name, _ in h)]),
            st.binary(max_size=8),
            st.sampled_from(TTLS),
        )

        def check(batch: list[bytes]) -> None:
            a.publisher.publish_bodies(batch)
            b.publisher.publish(None, P.Publish.from_bodies(batch, P.PUBLISH_NO_ACK))
            assert a.counters.publish_errors == b.counters.publish_errors
            assert a.counters.messages_unrouted == b.counters.messages_unrouted

        run_examples(check, st.lists(valid, min_size=1, max_size=8), 150)
        assert stored(a) == stored(b)
        assert a.counters.messages_in == b.counters.messages_in > 100
