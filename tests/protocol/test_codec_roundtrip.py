"""Every request, response and push survives encode -> decode unchanged
(hypothesis), also when the frame arrives one byte at a time."""

from __future__ import annotations

import string

from helpers import feed_bytewise, handshaken_pair
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import protocol as P

name_chars = string.ascii_lowercase + string.digits + "_-"
names = st.text(alphabet=name_chars, min_size=1, max_size=40)
idents = st.one_of(st.integers(1, 2**32 - 1).map(P.Identifier.of), names.map(P.Identifier.of))
tokens = st.text(alphabet=string.ascii_letters + string.digits + "_-", min_size=1, max_size=8)
subjects = st.lists(tokens, min_size=1, max_size=5).map(".".join)
filters = st.lists(st.one_of(tokens, st.just("*")), min_size=1, max_size=4).flatmap(
    lambda ts: st.sampled_from([".".join(ts), ".".join(ts + [">"])])
)
u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)
header_maps = st.dictionaries(
    st.text(alphabet=string.ascii_letters + "-", min_size=1, max_size=12),
    st.text(alphabet=string.printable.replace("\r", "").replace("\n", ""), max_size=30),
    max_size=4,
)
option_maps = st.dictionaries(
    st.sampled_from(["subjects", "max_msgs_per_subject", "deny_purge", "segment_size", "x"]),
    st.one_of(st.integers(0, 2**31), st.booleans(), st.lists(subjects, max_size=3), st.text(max_size=10)),
    max_size=4,
)
bodies = st.builds(
    lambda s, p, h, ttl: P.encode_body(s, p, P.encode_headers(h), ttl),
    subjects, st.binary(max_size=200), header_maps, st.one_of(st.just(0), u32),
)

commands = st.one_of(
    st.builds(P.Handshake, st.integers(0, 65535), st.text(alphabet=name_chars, max_size=20), st.text(alphabet=name_chars, max_size=20)),
    st.builds(P.Ping),
    st.builds(P.GetServerInfo),
    st.builds(P.GetStats),
    st.builds(lambda bs, noack: P.Publish.from_bodies(bs, P.PUBLISH_NO_ACK if noack else 0), st.lists(bodies, max_size=6), st.booleans()),
    st.builds(
        lambda reply, bs, noack: P.PublishWithReply.to(reply, bs, P.PUBLISH_NO_ACK if noack else 0),
        subjects, st.lists(bodies, max_size=6), st.booleans(),
    ),
    st.builds(P.Fetch, idents, idents, u32, u64, u32, u32, st.one_of(st.just(""), filters)),
    st.builds(P.GetLast, idents, idents, subjects),
    st.builds(P.DeleteMessage, idents, idents, u32, u64),
    st.builds(P.Purge, idents, idents, st.one_of(st.just(""), filters)),
    st.builds(P.Subscribe, u32, filters, st.sampled_from([0, P.SUBSCRIBE_REPLIES])),
    st.builds(P.Unsubscribe, u32),
    st.builds(P.StoreConsumerOffset, idents, idents, u32, names, u64),
    st.builds(P.GetConsumerOffset, idents, idents, u32, names),
    st.builds(P.DeleteConsumerOffset, idents, idents, u32, names),
    st.builds(P.GetStream, idents),
    st.builds(P.ListStreams),
    st.builds(P.CreateStream, u32, names),
    st.builds(P.DeleteStream, idents),
    st.builds(P.UpdateStream, idents, names),
    st.builds(P.GetTopic, idents, idents),
    st.builds(P.ListTopics, idents),
    st.builds(P.CreateTopic, idents, u32, u32, u32, names, option_maps),
    st.builds(P.DeleteTopic, idents, idents),
    st.builds(P.UpdateTopic, idents, idents, option_maps),
    st.builds(P.Export, st.sampled_from([0, P.EXPORT_SEAL])),
    st.builds(P.KvGet, idents, idents, subjects, u64),
    st.builds(P.KvTouch, idents, idents, subjects),
    st.builds(P.KvKeys, idents, idents, filters),
)


@given(commands, u32)
@settings(max_examples=400)
def test_every_request_round_trips(command: object, corr: int) -> None:
    frame = P.encode_frame(command.CODE, 0, corr, 0, command.encode())  # type: ignore[attr-defined]
    dec = P.FrameDecoder()
    dec.feed(frame)
    f = dec.next_frame()
    assert f is not None and f.correlation_id == corr and f.code == command.CODE  # type: ignore[attr-defined]
    back = P.COMMAND_TYPES[f.code].decode(f.payload)
    assert back == command
    assert back.encode() == command.encode()  # type: ignore[attr-defined]


@given(st.lists(commands.filter(lambda c: not isinstance(c, P.Handshake)), min_size=1, max_size=5))
@settings(max_examples=100)
def test_requests_fed_one_byte_at_a_time(cmds: list[object]) -> None:
    client, server = handshaken_pair()
    data = b"".join(client.send_request(i + 2, c) for i, c in enumerate(cmds))  # type: ignore[arg-type]
    events = feed_bytewise(server, data)
    assert [e.command for e in events] == cmds  # type: ignore[attr-defined]
    assert [e.correlation_id for e in events] == list(range(2, len(cmds) + 2))  # type: ignore[attr-defined]


def _topic_details() -> st.SearchStrategy[P.TopicDetails]:
    return st.builds(P.TopicDetails, u32, u32, u32, u64, u64, names, option_maps)


messages = st.builds(
    lambda s, p, h, off, ts, ttl, fl, part, sid, tid: P.Message(s, p, P.encode_headers(h), off, ts, ttl, fl, part, sid, tid),
    subjects, st.binary(max_size=100), header_maps, u64, u64, u32, st.integers(0, 3), u32, u32, u32,
)

responses = st.one_of(
    st.just((P.Command.PING, P.Empty())),
    st.builds(lambda v, m: (P.Command.HANDSHAKE, P.HandshakeOk(v, m)), st.integers(0, 65535), option_maps),
    st.builds(lambda m: (P.Command.STATS, P.InfoMap(m)), option_maps),
    st.builds(lambda n: (P.Command.PURGE, P.PurgeResult(n)), u64),
    st.builds(lambda n: (P.Command.GET_CONSUMER_OFFSET, P.ConsumerOffset(n)), u64),
    _topic_details().map(lambda t: (P.Command.GET_TOPIC, t)),
    st.lists(_topic_details(), max_size=3).map(lambda ts: (P.Command.LIST_TOPICS, P.TopicList(tuple(ts)))),
    st.builds(
        lambda i, size, n, name, ts: (P.Command.GET_STREAM, P.StreamDetails(i, len(ts), size, n, name, tuple(ts))),
        u32, u64, u64, names, st.lists(_topic_details(), max_size=3),
    ),
    st.lists(st.builds(P.StreamDetails, u32, u32, u64, u64, names), max_size=3).map(
        lambda ss: (P.Command.LIST_STREAMS, P.StreamList(tuple(ss)))
    ),
)


@given(responses, u32)
@settings(max_examples=300)
def test_every_response_round_trips(pair: tuple[int, object], corr: int) -> None:
    code, resp = pair
    client = P.ProtocolConnection(P.Role.CLIENT)
    client.state = P.State.READY
    server = P.ProtocolConnection(P.Role.SERVER)
    client.receive_data(server.send_response(corr, code, resp))  # type: ignore[arg-type]
    ev = client.next_event()
    assert isinstance(ev, P.Response) and ev.correlation_id == corr
    assert ev.result == resp


@given(st.lists(st.tuples(u32, u32, u32, u64, st.sampled_from([0, 0, 6001, 6002])), max_size=50))
def test_acks_round_trip(rows: list[tuple[int, int, int, int, int]]) -> None:
    cols = list(zip(*rows)) if rows else [(), (), (), (), ()]
    errors = {i: f"error {i}" for i, r in enumerate(rows) if r[4]}
    acks = P.Acks(*cols, errors)  # type: ignore[arg-type]
    back = P.Acks.decode(acks.encode())
    assert back == P.Acks(*(tuple(c) for c in cols), errors)  # type: ignore[arg-type]
    for i, a in enumerate(back):
        assert a.ok == (rows[i][4] == 0)
        if not a.ok:
            assert a.error is not None and a.error.code == rows[i][4] and a.error.message == f"error {i}"


@given(st.lists(messages, max_size=5), u32, st.one_of(st.none(), subjects, st.text(min_size=256, max_size=300)))
def test_delivery_and_fetch_result_round_trip(msgs: list[P.Message], sid: int, reply: str | None) -> None:
    d = P.Delivery(sid, tuple(msgs), reply)
    back = P.Delivery.decode(d.encode())
    assert back == d
    assert [m.reply for m in back.messages] == [reply] * len(msgs)  # every message of the push carries it
    recs = b"".join(
        P.encode_record(m.offset, m.timestamp, P.encode_body(m.subject, m.payload, m.headers_raw, m.ttl, m.flags)) for m in msgs
    )
    fr = P.FetchResult(1, 2, 3, 4, 5, 6, len(msgs), recs)
    back = P.FetchResult.decode(fr.encode())
    assert back == fr
    assert [(m.subject, m.payload, m.offset, m.headers) for m in back.messages()] == [
        (m.subject, m.payload, m.offset, m.headers) for m in msgs
    ]


def test_uniform_acks_equal_general_acks() -> None:
    assert P.encode_uniform_acks(3, 4, 5, 100, 7) == P.Acks([3] * 7, [4] * 7, [5] * 7, list(range(100, 107)), [0] * 7).encode()
    assert P.encode_uniform_acks(3, 4, 5, 100, 0) == P.Acks([], [], [], [], []).encode()


def test_a_publish_with_reply_decodes_to_its_own_class_and_a_plain_one_does_not() -> None:
    body = P.encode_body("svc.echo", b"hi")
    request = P.Publish.decode(P.PublishWithReply.to("_INBOX.a.1", [body]).encode())
    assert type(request) is P.PublishWithReply and request.reply == "_INBOX.a.1" and request.count == 1
    assert request.data[request.body_pos :] == body
    assert type(P.Publish.decode(P.Publish.from_bodies([body]).encode())) is P.Publish


def test_a_subscribe_without_flags_keeps_the_old_layout() -> None:
    """What a client that predates the flag sends, and what it is sent back as."""
    assert P.Subscribe(7, "a.>").encode() == P.Subscribe(7, "a.>", 0).encode() == b"\x07\x00\x00\x00\x03a.>"
    assert P.Subscribe.decode(b"\x07\x00\x00\x00\x03a.>") == P.Subscribe(7, "a.>")
    assert P.Subscribe.decode(b"\x07\x00\x00\x00\x03a.>\x01").replies


@pytest.mark.parametrize(("payload", "message"), [
    (b"\x02\x01\x00\x00\x00\x00" + P.encode_body("a", b""), "PUBLISH: the REPLY flag is set but the reply subject is empty"),
    (b"\x04\x00\x00\x00\x00", "PUBLISH: unknown flags 0x4"),
    (b"\x02\x01\x00\x00\x00\x05_INB", "PUBLISH: a field of 5 bytes runs past the end of the payload"),
])
def test_malformed_publish_with_reply(payload: bytes, message: str) -> None:
    with pytest.raises(P.MalformedPayloadError) as info:
        P.Publish.decode(payload)
    assert info.value.code == P.ErrorCode.MALFORMED_PAYLOAD and info.value.message == message


@pytest.mark.parametrize(("tail", "message"), [
    (b"\x02", "SUBSCRIBE: unknown flags 0x2"),
    (b"\x01\x00", "SUBSCRIBE: 1 unexpected bytes after the last field"),
])
def test_malformed_subscribe_flags(tail: bytes, message: str) -> None:
    payload = P.Subscribe(1, "a").encode() + tail
    with pytest.raises(P.MalformedPayloadError) as info:
        P.Subscribe.decode(payload)
    assert info.value.message == message


@pytest.mark.parametrize(("tail", "message"), [
    (b"\x05", "DELIVERY: bytes after the last message"),
    (b"\x05\x00abc", "DELIVERY: bytes after the last message are not one reply subject"),
    (b"\x00\x00", "DELIVERY: bytes after the last message are not one reply subject"),
    (b"\x02\x00\xff\xfe", "DELIVERY: the reply subject is not UTF-8"),
])
def test_malformed_delivery_reply(tail: bytes, message: str) -> None:
    payload = P.Delivery(1, (P.Message("a", b"x", b"", 0, 0),)).encode() + tail
    with pytest.raises(P.MalformedPayloadError) as info:
        P.Delivery.decode(payload)
    assert info.value.message == message


@given(st.integers(P.STAMP_SIZE, 4096), u64)
def test_a_bench_payload_carries_its_stamp(size: int, ns: int) -> None:
    payload = P.stamped_payload(size, ns)
    assert len(payload) == size and P.payload_stamp(payload) == ns


def test_a_payload_too_small_or_unmarked_has_no_stamp() -> None:
    assert P.stamped_payload(P.STAMP_SIZE - 1, 5) == bytes(P.STAMP_SIZE - 1)
    assert P.payload_stamp(bytes(64)) is None and P.payload_stamp(b"TBNC") is None
