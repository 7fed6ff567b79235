"""A JetStream ``STREAM.MSG.GET`` (and ``DIRECT.GET``) by last subject on a KV
bucket, nats-py's ``kv.get``, is answered from the bucket's read
(``KvReads.read``) without the entry dictionary ``KvReads.get`` makes: the answer
is byte for byte the one built from that entry (subject, revision, headers, value,
creation time), or the same error, whatever the bucket went through (puts with and
without headers, deletes, purges, keys never written, wildcards, other buckets).
``JetStream.request`` answers the common form of that request itself
(``_js_streams.kv_get``): for any stream name and payload, what it answers and
counts is what ``api`` does."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ttl_helpers import broker_and_client

import protocol as P

import protocol.nats as PN
from broker.nats._streams import api
from broker.nats._core import NatsSubscription
from protocol import BrokerError
from protocol.nats import NO_MESSAGE_FOUND, STREAM_NOT_FOUND, api_error, js_error, msg_get_response, rfc3339
from protocol.nats import decode_nats_headers, encode_msg, encode_nats_headers

KEYS = ["k0", "k1", "k2", "a.b", "x"]
NAMES = ["KV_b", "KV_other", "KV_nope", "KV_", "KV_b.x", "kv_b", "KV_B", "S"]
PAYLOADS = [
    *(b'{"last_by_subj":"%s"}' % s for s in [
        b"$KV.b.k0", b"$KV.b.a.b", b"$KV.other.x", b"$KV.b.never", b"", b"$KV.b.*", b"$KV.b.>", b"$KV.b.a*b",
        b"$KV.b.k>", b"$KV.b..k0", b"$KV.b.\xff", rb"$KV.b.\u006b0",
    ]),
    b' \n{ "last_by_subj" : "$KV.b.k1" }\t',
    b'{"last_by_subj":"$KV.b.k0","seq":0}', b'{"last_by_subj":5}', b'{"seq":1}', b'{"next_by_subj":"$KV.b.k0"}',
    b'{"last_by_sub":"$KV.b.k0"}', b"", b"{", b"[]", b"{}",
]
INBOX = "_INBOX.test.*"


class _Inbox:
    """The requester's connection: what reaches its inbox subscription."""

    headers = True

    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self.got: list[bytes] = []
        self.out_msgs = self.out_bytes = 0  # (``NatsClient``'s counts)

    def push_nats(self, data: bytes, epoch: int = 0) -> bool:
        self.got.append(data)
        return True

    def no_responders(self, reply: str, subject: str) -> None:
        """(``NatsSession.no_responders``: the request's origin is this connection.)"""
        self.got.append(b"503 " + reply.encode() + b" " + subject.encode())

    def remove_subscription(self, sub: Any) -> None:
        raise AssertionError("no UNSUB max here")


def _publish(broker: Any, subject: str, value: bytes, headers: list[tuple[str, str]]) -> None:
    block = PN.nats_to_record_headers(encode_nats_headers(headers)) if headers else b""
    cmd = P.Publish.from_bodies([P.encode_body(subject, value, block)], 0)
    broker.publisher.publish(None, cmd)


def _expected_msg_get(kv: Any, topic: Any, subject: str) -> bytes:
    """The answer as built from ``KvReads.get``'s entry (or its refusal)."""
    if topic is None:
        return api_error("stream_msg_get", js_error(STREAM_NOT_FOUND))
    if not P.is_literal(subject):
        # A filter (as on nats-server): the subject of the newest message it matches,
        # read through the bucket's rules.
        ftokens = tuple(subject.split("."))
        part = topic.partitions[0]
        newest = [(st.last, raw.decode()) for raw, st in part.index.subjects.items()
                  if st.count and P.subject_matches(ftokens, raw.decode().split("."))]
        if not newest:
            return api_error("stream_msg_get", js_error(NO_MESSAGE_FOUND))
        subject = max(newest)[1]
    try:
        entry, _ = kv.get(topic, subject, 0, kv.broker.clock.now_ns())
    except BrokerError:
        return api_error("stream_msg_get", js_error(NO_MESSAGE_FOUND))
    headers = encode_nats_headers(list(entry["headers"].items())) if entry["headers"] else None
    return msg_get_response(entry["subject"], entry["revision"], headers, entry["value"], rfc3339(entry["created"]))


def _expected_direct_get(kv: Any, topic: Any, subject: str) -> tuple[bytes | None, bytes]:
    """``DIRECT.GET.KV_b.<subject>``'s headers and payload as built from the entry."""
    try:
        entry, _ = kv.get(topic, subject, 0, kv.broker.clock.now_ns())
    except BrokerError:
        return encode_nats_headers([], 404, "Message Not Found"), b""
    stored = encode_nats_headers(list(entry["headers"].items())) if entry["headers"] else None
    pairs = decode_nats_headers(stored)[2] if stored else []
    pairs += [
        ("Nats-Stream", "KV_b"), ("Nats-Subject", subject), ("Nats-Sequence", str(entry["revision"])),
        ("Nats-Time-Stamp", rfc3339(entry["created"])),
    ]
    return encode_nats_headers(pairs), entry["value"]


async def test_kv_msg_get_answers_what_the_entry_gives(mock_clock, data_dir) -> None:  # type: ignore[no-untyped-def]
    async with broker_and_client(data_dir) as (h, c):
        await c.kv_create("b", history=3)
        await c.kv_create("other", history=1)
        broker = h.broker
        js = h.services.jetstream
        inbox = _Inbox(broker)
        sub = NatsSubscription(inbox, "1", INBOX, None)
        broker.subs.add(sub)
        topic = js.topic("KV_b")
        other = js.topic("KV_other")

        value = st.binary(max_size=40)
        header = st.lists(st.tuples(st.sampled_from(["X-A", "X-B"]), st.sampled_from(["1", "two", ""])), max_size=2)
        op = st.one_of(
            st.tuples(st.just("put"), st.sampled_from(["b", "other"]), st.sampled_from(KEYS), value, header),
            st.tuples(st.just("del"), st.sampled_from(["b", "other"]), st.sampled_from(KEYS)),
            st.tuples(st.just("purge"), st.sampled_from(["b", "other"]), st.sampled_from(KEYS)),
            st.tuples(st.just("get"), st.sampled_from(["KV_b", "KV_other", "KV_nope"]),
                      st.sampled_from([*KEYS, "never", "*", ">", "k0.>"])),
            st.tuples(st.just("direct"), st.sampled_from([*KEYS, "never"])),
            st.tuples(st.just("any"), st.sampled_from(NAMES), st.sampled_from(PAYLOADS)),
        )

        @given(st.lists(op, min_size=10, max_size=40))
        @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
        def check(ops: list[Any]) -> None:
            for n, item in enumerate(ops):
                kind = item[0]
                if kind == "put":
                    _, bucket, key, data, headers = item
                    _publish(broker, f"$KV.{bucket}.{key}", data, headers)
                elif kind == "del":
                    _publish(broker, f"$KV.{item[1]}.{item[2]}", b"", [("KV-Operation", "DEL")])
                elif kind == "purge":
                    _publish(broker, f"$KV.{item[1]}.{item[2]}", b"", [("KV-Operation", "PURGE"), ("Nats-Rollup", "sub")])
                elif kind == "get":
                    _, name, key = item
                    bucket = name[3:]
                    subject = f"$KV.{bucket}.{key}"
                    reply = f"_INBOX.test.{n}"
                    inbox.got.clear()
                    js.request(f"$JS.API.STREAM.MSG.GET.{name}", reply, None, b'{"last_by_subj":"%s"}' % subject.encode())
                    where = {"KV_b": topic, "KV_other": other}.get(name)
                    want = _expected_msg_get(h.services.kv, where, subject)
                    assert inbox.got == [encode_msg(reply.encode(), b"1", None, None, want)]
                elif kind == "any":
                    # The fast path (JetStream.request) against api() itself.
                    _, name, payload = item
                    answers = []
                    for path in ("fast", "general"):
                        inbox.got.clear()
                        before = (js.api_total, js.api_errors)
                        subject = f"$JS.API.STREAM.MSG.GET.{name}"
                        if path == "fast":
                            js.request(subject, "_INBOX.test.1", None, payload, inbox)
                        else:
                            js._origin, js._subject = inbox, subject  # as request() sets them
                            api(js, ["STREAM", "MSG", "GET", *name.split(".")], "_INBOX.test.1", None, payload)
                            js._origin = None
                        answers.append((inbox.got[:], js.api_total - before[0], js.api_errors - before[1]))
                    assert answers[0][0]  # an answer, or the no-responders status
                    assert answers[0] == answers[1]
                else:
                    subject = f"$KV.b.{item[1]}"
                    reply = f"_INBOX.test.{n}"
                    inbox.got.clear()
                    js.request(f"$JS.API.DIRECT.GET.KV_b.{subject}", reply, None, b"")
                    headers, payload = _expected_direct_get(h.services.kv, topic, subject)
                    assert inbox.got == [encode_msg(reply.encode(), b"1", None, headers, payload)]

        check()
        broker.subs.remove(sub)
