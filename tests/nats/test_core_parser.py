"""protocol/_nats.py, the sans-IO NATS parser and writer: round trips, any split of
the byte stream gives the same events, and bad bytes give the protocol's error
(with nats-server's -ERR text), never another exception; the JetStream answers
built from bytes (protocol/_jetstream.py) are what their JSON encoding gives."""

from __future__ import annotations

import re
from collections.abc import Sequence

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import protocol as P

import protocol.nats as PN
from broker.nats._consumer_state import V1_ACK as _V1_ACK
from protocol.nats import (
    ACK_RUN_LIMIT,
    encode_connect,
    encode_err,
    encode_info,
    encode_msg,
    encode_pub,
    encode_sub,
    encode_unsub,
)

TOKEN = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABC0123456789_-$", min_size=1, max_size=8)
SUBJECT = st.lists(TOKEN, min_size=1, max_size=5).map(".".join)
FILTER = st.lists(st.one_of(TOKEN, st.just("*")), min_size=1, max_size=4).map(".".join) | SUBJECT.map(lambda s: s + ".>")
SID = st.integers(1, 10**9).map(str)
NAME = st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126, blacklist_characters=":"), min_size=1, max_size=12)
VALUE = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="\r\n"), max_size=20).map(str.strip)
PAIRS = st.lists(st.tuples(NAME, VALUE), max_size=5)
PAYLOAD = st.binary(max_size=200)


def events_of(data: bytes, *, server: bool = True, splits: list[int] | None = None, **limits: int) -> list[object]:
    parser = PN.NatsParser(server=server, **limits)
    cuts = sorted({0, len(data), *(splits or [])})
    events: list[object] = []
    for a, b in zip(cuts, cuts[1:]):
        parser.receive_data(data[a:b])
        while (ev := parser.next_event()) is not PN.NATS_NEED_DATA:
            events.append(ev)
    return events


@st.composite
def client_ops(draw: st.DrawFn) -> tuple[bytes, object]:
    kind = draw(st.sampled_from(["connect", "pub", "hpub", "sub", "unsub", "ping", "pong"]))
    if kind == "connect":
        opts = draw(st.fixed_dictionaries({"verbose": st.booleans(), "headers": st.booleans(), "name": TOKEN}))
        return encode_connect(opts), PN.NatsConnect(opts)
    if kind in ("pub", "hpub"):
        subject, reply, payload = draw(SUBJECT), draw(st.none() | SUBJECT), draw(PAYLOAD)
        headers = PN.encode_nats_headers(draw(PAIRS), draw(st.none() | st.integers(100, 599))) if kind == "hpub" else None
        return encode_pub(subject, reply, headers, payload), PN.NatsPub(subject, reply, headers, payload)
    if kind == "sub":
        subject, queue, sid = draw(FILTER), draw(st.none() | TOKEN), draw(SID)
        return encode_sub(subject, queue, sid), PN.NatsSub(subject, queue, sid)
    if kind == "unsub":
        sid, n = draw(SID), draw(st.none() | st.integers(1, 10**6))
        return encode_unsub(sid, n), PN.NatsUnsub(sid, n)
    return (b"PING\r\n", PN.NatsPing) if kind == "ping" else (b"PONG\r\n", PN.NatsPong)


@given(st.lists(client_ops(), max_size=8), st.lists(st.integers(0, 4000), max_size=10))
def test_client_operations_round_trip_whatever_the_split(ops: list[tuple[bytes, object]], splits: list[int]) -> None:
    data = b"".join(raw for raw, _ in ops)
    want = [ev for _, ev in ops]
    assert events_of(data) == want
    assert events_of(data, splits=[s % (len(data) + 1) for s in splits]) == want
    assert events_of(data, splits=list(range(len(data)))) == want  # byte by byte


@given(SUBJECT, SID, st.none() | SUBJECT, st.none() | PAIRS, PAYLOAD, st.lists(st.integers(0, 500), max_size=5))
def test_server_messages_round_trip(subject: str, sid: str, reply: str | None, pairs: list[tuple[str, str]] | None,
                                    payload: bytes, splits: list[int]) -> None:
    headers = None if pairs is None else PN.encode_nats_headers(pairs)
    data = (encode_info({"server_id": "x", "proto": 1}) + encode_msg(subject.encode(), sid.encode(), reply.encode() if reply else None, headers, payload)
            + b"+OK\r\n" + encode_err("Stale Connection") + b"PING\r\n")
    want = [PN.NatsInfo({"server_id": "x", "proto": 1}), PN.NatsMsg(subject, sid, reply, headers, payload), PN.NatsOk,
            PN.NatsErr("Stale Connection"), PN.NatsPing]
    assert events_of(data, server=False, splits=[s % (len(data) + 1) for s in splits]) == want


def test_operation_names_in_any_case_and_arguments_split_by_tabs() -> None:
    data = b"pub\ta.b  r\t 2\r\nhi\r\nSuB a.* q 7\nping\r\n"
    assert events_of(data) == [PN.NatsPub("a.b", "r", None, b"hi"), PN.NatsSub("a.*", "q", "7"), PN.NatsPing]


class _GeneralOnly(PN.NatsParser):
    """The parser without its one-step path for plain PUBs."""

    def next_pub(self, known: object = ()) -> None:
        return None


def _outcome(parser: PN.NatsParser, data: bytes) -> tuple[list[object], str | None]:
    parser.receive_data(data)
    events: list[object] = []
    try:
        while (ev := parser.next_event()) is not PN.NATS_NEED_DATA:
            events.append(ev)
    except PN.NatsProtocolError as err:
        return events, err.text
    return events, None


@st.composite
def pub_like(draw: st.DrawFn) -> bytes:
    """A PUB that is usually plain and sometimes not: other whitespace, empty or odd
    tokens, a size that is wrong or too long, a bare LF, a missing CRLF."""

    def sep() -> bytes:
        return draw(st.sampled_from([b" ", b" ", b" ", b"  ", b"\t", b" \x0b", b"\x0c ", b"\r"]))

    def word() -> bytes:
        return b"".join(draw(st.lists(st.sampled_from([b"a", b"a", b"a.b", b"\xff", b"\x0b", b"\t", b"\r", b"\n", b"3"]), max_size=3)))

    payload = draw(st.just(b"") | st.binary(max_size=25))
    n = len(payload)
    size = draw(st.sampled_from([b"%d" % n, b"%d" % n, b"%d" % n, b"%d" % (n + 1), b"0" * 13, b"x"]))
    words = b"".join(sep() + word() for _ in range(draw(st.integers(1, 3))))  # subject, reply, one too many
    head = draw(st.sampled_from([b"PUB", b"PUB", b"pub"])) + words + sep() + size
    return head + draw(st.sampled_from([b"\r\n", b"\r\n", b"\n"])) + payload + draw(st.sampled_from([b"\r\n", b"\r\n", b"", b"x\r\n"]))


@settings(max_examples=300)
@given(st.lists(pub_like(), min_size=1, max_size=4))
@example([b"PUB a\tb 3\r\nabc\r\n"])
@example([b"PUB a 0000000000000\r\n\r\n"])
@example([b"PUB a 3\r\nab", b"c\r\n"])
def test_plain_pubs_parse_as_the_general_path_does(lines: list[bytes]) -> None:
    """The one-step path for ``PUB subject [reply] size`` gives exactly the events
    and the error of the general path, whatever the spacing, sizes and bytes."""
    data = b"".join(lines)
    assert _outcome(PN.NatsParser(max_control_line=40, max_payload=20), data) == _outcome(
        _GeneralOnly(max_control_line=40, max_payload=20), data)


def _outcome_by_runs(parser: PN.NatsParser, data: bytes, same: bool = False,
                     splits: Sequence[int] = ()) -> tuple[list[object], str | None]:
    """As the NATS session reads: ``next_pub`` while it takes something (the
    subjects it gave known; with ``same``, each followed by ``same_pubs``),
    ``next_event`` for the rest; the data fed in pieces cut at ``splits``."""
    cuts = sorted({min(c, len(data)) for c in splits} | {len(data)})
    chunks = [data[a:b] for a, b in zip([0, *cuts], cuts)]
    events: list[object] = []
    known: set[bytes] = set()

    def take(subj: bytes, rep: bytes | None, tail: bytes | bytearray, size: int) -> None:
        payload = PN.pub_payload(tail, size)
        # the tail is what a MSG of it carries after its subject and sid
        assert re.fullmatch(rb"%s0*%d\r\n%s\r\n" % (re.escape(rep + b" " if rep is not None else b""), size, re.escape(payload)),
                            bytes(tail), re.S)
        events.append(PN.NatsPub(subj.decode(), rep.decode() if rep is not None else None, None, payload))

    try:
        for chunk in chunks:
            parser.receive_data(chunk)
            while True:
                pub = parser.next_pub(known)
                if pub is not None:
                    subj, rep, tail, size = pub
                    known.add(subj)
                    take(subj, rep, tail, size)
                    for more in parser.same_pubs() if same else ():
                        take(subj, rep, more, size)
                    while same and (replied := parser.replied_pubs(3)):  # (a few at a time, as a batch's room says)
                        for other, payload in replied:
                            assert len(payload) == size
                            events.append(PN.NatsPub(subj.decode(), other.decode(), None, payload))
                    continue
                ev = parser.next_event()
                if ev is PN.NATS_NEED_DATA:
                    break
                events.append(ev)
    except PN.NatsProtocolError as err:
        return events, err.text
    return events, None


@settings(max_examples=300)
@given(st.lists(pub_like(), min_size=1, max_size=6))
@example([b"PUB a 1\r\nx\r\n", b"PUB a \xff 1\r\nx\r\n"])
def test_runs_of_pubs_parse_as_the_general_path_does(lines: list[bytes]) -> None:
    """Reading PUBs one step each with ``next_pub`` (a subject seen once is not
    checked again, a reply always is) gives the general path's events and error."""
    data = b"".join(lines)
    assert _outcome_by_runs(PN.NatsParser(max_control_line=40, max_payload=20), data) == _outcome(
        _GeneralOnly(max_control_line=40, max_payload=20), data)


@settings(max_examples=300)
@given(st.lists(st.tuples(pub_like(), st.integers(1, 4)), min_size=1, max_size=4), st.lists(st.integers(0, 300), max_size=4))
@example([(b"PUB a 6\r\nPUB a \r\n", 3)], [])  # (a payload that holds the PUB's own line)
@example([(b"PUB a r 1\r\nx\r\n", 3), (b"PUB a r 2\r\nxy\r\n", 2)], [20])
@example([(b"PUB a  r  01\r\nx\r\n", 2)], [])
def test_floods_of_the_same_pub_parse_as_the_general_path_does(runs: list[tuple[bytes, int]], splits: list[int]) -> None:
    """``same_pubs`` after each ``next_pub`` (a client's flood of one PUB line,
    the data cut anywhere) gives the general path's events and error."""
    data = b"".join(line * n for line, n in runs)
    assert _outcome_by_runs(PN.NatsParser(max_control_line=40, max_payload=20), data, True, splits) == _outcome(
        _GeneralOnly(max_control_line=40, max_payload=20), data)


@given(st.binary(max_size=300), st.lists(st.integers(0, 300), max_size=5))
def test_garbage_gives_the_protocol_error_only(data: bytes, splits: list[int]) -> None:
    try:
        events_of(data, splits=[s % (len(data) + 1) for s in splits], max_control_line=64, max_payload=100)
    except PN.NatsProtocolError as err:
        assert err.text in ("Unknown Protocol Operation", "maximum control line exceeded", "Maximum Payload Violation")
        assert isinstance(err, P.RemoteProtocolError)


@given(st.lists(client_ops(), min_size=1, max_size=3), st.binary(min_size=1, max_size=50), st.integers(0, 400))
def test_the_error_does_not_depend_on_the_split(ops: list[tuple[bytes, object]], tail: bytes, split: int) -> None:
    data = b"".join(raw for raw, _ in ops) + tail

    def outcome(splits: list[int]) -> tuple[list[object], str | None]:
        parser = PN.NatsParser(max_control_line=64)
        cuts = sorted({0, len(data), *splits})
        events: list[object] = []
        try:
            for a, b in zip(cuts, cuts[1:]):
                parser.receive_data(data[a:b])
                while (ev := parser.next_event()) is not PN.NATS_NEED_DATA:
                    events.append(ev)
        except PN.NatsProtocolError as err:
            return events, err.text
        return events, None

    whole = outcome([])
    assert outcome([split % (len(data) + 1)]) == whole
    assert outcome(list(range(len(data)))) == whole


@pytest.mark.parametrize(
    ("data", "text"),
    [
        (b"HELLO\r\n", "Unknown Protocol Operation"),
        (b"PUBX a 1\r\n", "Unknown Protocol Operation"),
        (b"PUB a\r\n", "Unknown Protocol Operation"),
        (b"PUB a b c 1\r\n", "Unknown Protocol Operation"),
        (b"PUB a -1\r\n", "Unknown Protocol Operation"),
        (b"PUB a 2\r\nabc\r\n", "Unknown Protocol Operation"),
        (b"HPUB a 40 2\r\n", "Unknown Protocol Operation"),
        (b"SUB a\r\n", "Unknown Protocol Operation"),
        (b"UNSUB 1 x\r\n", "Unknown Protocol Operation"),
        (b"CONNECT [1]\r\n", "Unknown Protocol Operation"),
        (b"CONNECT {\r\n", "Unknown Protocol Operation"),
        (b"PING x\r\n", "Unknown Protocol Operation"),
        (b"MSG a 1 2\r\nhi\r\n", "Unknown Protocol Operation"),  # a server's operation, from a client
        (b"PUB a " + b"1" * 5000, "maximum control line exceeded"),
        (b"PUB a 101\r\n", "Maximum Payload Violation"),
        (b"HPUB a 12 101\r\n", "Maximum Payload Violation"),
    ],
)
def test_violations_and_their_texts(data: bytes, text: str) -> None:
    with pytest.raises(PN.NatsProtocolError) as info:
        events_of(data, max_payload=100)
    assert info.value.text == text


def test_a_control_line_of_exactly_the_maximum_is_accepted() -> None:
    line = b"SUB " + b"a" * 4088 + b" 1"
    assert len(line) == 4094 and events_of(line + b"\r\n", max_control_line=4094) == [PN.NatsSub("a" * 4088, None, "1")]
    with pytest.raises(PN.NatsProtocolError, match="maximum control line exceeded"):
        events_of(line + b"\r\n", max_control_line=4093)


@given(PAIRS, st.none() | st.integers(100, 999), st.text(alphabet="abcXYZ ", max_size=12).map(str.strip))
def test_header_blocks_round_trip(pairs: list[tuple[str, str]], status: int | None, description: str) -> None:
    block = PN.encode_nats_headers(pairs, status, description)
    assert block.startswith(b"NATS/1.0") and block.endswith(b"\r\n\r\n")
    assert PN.decode_nats_headers(block) == (status, description if status is not None else "", pairs)
    ours = P.encode_headers(pairs)
    assert PN.nats_to_record_headers(block) == ours
    assert PN.record_to_nats_headers(ours) == (PN.encode_nats_headers(pairs) if pairs else b"")


def test_status_line_of_no_responders_and_no_messages() -> None:
    assert PN.encode_nats_headers([], 503) == b"NATS/1.0 503\r\n\r\n"
    assert PN.encode_nats_headers([], 404, "No Messages") == b"NATS/1.0 404 No Messages\r\n\r\n"
    assert PN.decode_nats_headers(b"NATS/1.0 408 Request Timeout\r\nNats-Pending-Messages: 1\r\n\r\n") == (
        408, "Request Timeout", [("Nats-Pending-Messages", "1")])


@pytest.mark.parametrize(
    ("block", "message"),
    [
        (b"HTTP/1.1\r\n\r\n", "starts with NATS/1.0"),
        (b"NATS/1.0\r\nA: b\r\n", "ends with an empty line"),
        (b"NATS/1.0 5x3\r\n\r\n", "bad status"),
        (b"NATS/1.0\r\nno colon\r\n\r\n", "bad NATS header line"),
        (b"NATS/1.0\r\n: empty name\r\n\r\n", "bad NATS header line"),
        (b"NATS/1.0\r\nA: \xff\r\n\r\n", "not UTF-8"),
    ],
)
def test_malformed_header_blocks(block: bytes, message: str) -> None:
    with pytest.raises(P.InvalidHeadersError, match=message) as info:  # type: ignore[attr-defined]
        PN.decode_nats_headers(block)
    assert info.value.code == P.ErrorCode.INVALID_HEADERS


def test_headers_ttlbroker_cannot_carry_are_refused_on_conversion() -> None:
    with pytest.raises(P.BrokerError) as info:
        PN.nats_to_record_headers(b"NATS/1.0\r\nBad\x01Name: v\r\n\r\n")
    assert info.value.code == P.ErrorCode.INVALID_HEADERS


def test_a_stored_record_as_a_nats_message() -> None:
    body = P.encode_body("a.b", b"payload", P.encode_headers({"Nats-TTL": "5s"}))
    subject, headers, payload = PN.nats_message_of_record(P.encode_record(3, 7, body))
    assert (subject, headers, bytes(payload)) == (b"a.b", b"NATS/1.0\r\nNats-TTL: 5s\r\n\r\n", b"payload")
    subject, headers, payload = PN.nats_message_of_record(P.encode_record(3, 7, P.encode_body("x", b"")))
    assert (subject, headers, bytes(payload)) == (b"x", None, b"")


@pytest.mark.parametrize(("subject", "literal", "wildcard"), [
    ("a.b", True, True), ("a.*", False, True), ("a.>", False, True), ("a.>.b", False, False), ("a..b", False, False),
    ("", False, False), ("a b", False, False), (".a", False, False), ("a*.b", True, True),
])
def test_subject_validity_as_nats_server_sees_it(subject: str, literal: bool, wildcard: bool) -> None:
    assert PN.valid_nats_subject(subject) is literal
    assert PN.valid_nats_subject(subject, wildcards=True) is wildcard


def _valid_by_tokens(subject: str, wildcards: bool) -> bool:
    """``valid_nats_subject`` token by token, as nats-server words it (the reference
    for its shortcut when there is no wildcard character)."""
    if not subject or any(c in subject for c in " \t\n\r\f"):
        return False
    tokens = subject.split(".")
    for i, token in enumerate(tokens):
        if not token:
            return False
        if (token == "*" or token == ">") and (not wildcards or (token == ">" and i != len(tokens) - 1)):
            return False
    return True


@given(st.text(alphabet="ab.*> \t\u00e9", max_size=12) | st.text(max_size=12), st.booleans())
def test_subject_validity_is_the_token_by_token_answer(subject: str, wildcards: bool) -> None:
    assert PN.valid_nats_subject(subject, wildcards) is _valid_by_tokens(subject, wildcards)


@given(st.text(max_size=30), st.integers(1, 2**63), st.none() | st.binary(max_size=40), st.binary(max_size=40), st.text(max_size=30))
@example("%d%s%%", 7, None, b"", "")
def test_templated_jetstream_answers_are_the_json_encoders(subject: str, seq: int, headers: bytes | None, payload: bytes,
                                                          time: str) -> None:
    """The PubAck and STREAM.MSG.GET answers built from bytes are byte for byte what
    encoding their dictionaries gives."""
    import base64
    import json

    from protocol.nats import api_response, msg_get_response, pub_ack, pub_ack_format

    def dumps(obj: object) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()

    assert pub_ack(subject, seq) == dumps({"stream": subject, "seq": seq})
    assert pub_ack(subject, seq, True) == dumps({"stream": subject, "seq": seq, "duplicate": True})
    assert pub_ack_format(subject) % seq == pub_ack(subject, seq)  # (a name with a % in it too)
    msg: dict[str, object] = {"subject": subject, "seq": seq}
    if headers:
        msg["hdrs"] = base64.b64encode(headers).decode()
    if payload:
        msg["data"] = base64.b64encode(payload).decode()
    msg["time"] = time
    assert msg_get_response(subject, seq, headers, payload, time) == api_response("stream_msg_get", {"message": msg})


@given(
    st.lists(st.tuples(SUBJECT, PAYLOAD, st.dictionaries(st.sampled_from(["A", "Nats-Msg-Id", "x-y"]), st.text("abc", max_size=4)),
                       st.integers(1, 2**40), st.integers(1, 2**62), st.integers(1, 10**6), st.integers(0, 2**40)), max_size=6),
    SID, st.booleans(), st.booleans(),
)
def test_pull_delivery_frames_are_each_deliverys_msg(messages: list[tuple[str, bytes, dict[str, str], int, int, int, int]],
                                                     sid: str, headers_only: bool, headers: bool) -> None:
    """The frames of a pull batch formatted in one pass are, byte for byte, the MSG or
    HMSG ``encode_msg`` gives for each message's ``js_delivery`` (with and without
    headers, headers only, a client without header support)."""
    from protocol.nats import js_delivery, js_delivery_frames

    parts: list[bytes | memoryview] = []
    for i, (subject, payload, hdrs, offset, ts, delivered, pending) in enumerate(messages):
        body = P.encode_body(subject, payload, P.encode_headers(hdrs) if hdrs else b"")
        parts += [P.encode_pull_entry(0, i + 1, delivered, pending), memoryview(P.encode_record(offset, ts, body))]
    frames, size = js_delivery_frames(parts, sid.encode(), "S", "c", headers_only, headers)
    expected = []
    for i in range(0, len(parts), 2):
        s, r, h, p = js_delivery(parts[i], parts[i + 1], "S", "c", headers_only)
        expected.append(encode_msg(s, sid.encode(), r, h if headers else None, p))
    assert frames == b"".join(expected)
    assert size == (0 if headers_only else sum(len(m[1]) for m in messages))


@given(
    st.lists(st.tuples(SUBJECT, PAYLOAD, st.dictionaries(st.sampled_from(["A", "Nats-Msg-Id"]), st.text("abc", max_size=4)),
                       st.integers(1, 2**62)), min_size=1, max_size=6),
    st.lists(st.tuples(st.integers(0, 3), st.integers(1, 2**40), st.integers(-3, 8) | st.integers(0, 2**40)), min_size=1, max_size=3),
    SID, st.booleans(), st.booleans(), st.booleans(),
)
def test_pulled_runs_frame_as_their_entries(messages: list[tuple[str, bytes, dict[str, str], int]],
                                            runs: list[tuple[int, int, int]], sid: str, headers_only: bool,
                                            headers: bool, with_entry: bool) -> None:
    """A ``PulledRun`` and its run (first deliveries taken whole by ``_pulls.collect``
    for a NATS pull) frame, byte for byte, as the entry heads and records
    ``expand_runs`` (``pull_entries``) gives for them, beside ordinary entries."""
    from protocol._consumers import PulledRun, expand_runs
    from protocol.nats import js_delivery_frames

    records = [
        P.encode_record(100 + i, ts, P.encode_body(subject, payload, P.encode_headers(hdrs) if hdrs else b""))
        for i, (subject, payload, hdrs, ts) in enumerate(messages)
    ]
    parts: list[object] = []
    if with_entry:  # a redelivery before the runs
        parts += [P.encode_pull_entry(0, 7, 3, 5), memoryview(records[0])]
    cut = len(records) // len(runs) or 1
    for k, (partition, dseq, pending) in enumerate(runs):
        chunk = records[k * cut : (k + 1) * cut] if k < len(runs) - 1 else records[k * cut :]
        if chunk:
            parts += [PulledRun(partition, dseq, len(chunk), pending), memoryview(b"".join(chunk))]
    entries = expand_runs(parts)
    assert len(entries) == 2 * (len(records) + with_entry)
    frames = js_delivery_frames(parts, sid.encode(), "S", "c", headers_only, headers)
    assert frames == js_delivery_frames(entries, sid.encode(), "S", "c", headers_only, headers)


WS = st.sampled_from(["", " ", "\t", "\n", "\r\n ", "\x0b", "\x0c"])


@given(
    WS, st.text(alphabet="abcdefghijklmnopqrstuvwxyz_AZ0", min_size=0, max_size=12), WS,
    st.text(max_size=20) | st.text(alphabet='ab."\\/\x00\x1f\u00e9', max_size=8), WS, st.booleans(), st.booleans(),
)
@example("", "last_by_subj", " ", "$KV.b.k1", "", False, False)
@example("", "a", "", "\ud800", "", False, False)
def test_api_requests_read_as_json_loads_reads_them(before: str, name: str, middle: str, value: str, after: str,
                                                    raw: bool, latin: bool) -> None:
    """A request of one string member (a KV get's ``{"last_by_subj": ...}``) is read
    without the JSON decoder's layers: whatever the bytes, ``parse_request`` gives
    what ``json.loads`` gives, or the same refusal."""
    import json

    from protocol.nats import JSError, parse_request

    text = f'{before}{{{middle}"{name}"{middle}:{middle}' + (f'"{value}"' if raw else json.dumps(value, ensure_ascii=False)) + f"}}{after}"
    payload = text.encode("latin-1" if latin and all(ord(c) < 256 for c in text) else "utf-8", "surrogatepass")
    try:
        expected: object = json.loads(payload)
    except ValueError:
        expected = ValueError
    try:
        got: object = parse_request(payload)
    except JSError as err:
        assert err.code == 400 and err.err_code == 10025
        got = ValueError
    assert got == expected


def _runs_outcome(parser: PN.NatsParser, data: bytes, limit: int) -> tuple[list[object], str | None]:
    """What ``parser`` gives reading ``data`` with :meth:`NatsParser.ack_pubs` first at
    each step (as the NATS session reads ack runs), its tuples as NatsPub events; the
    consumer key and stream sequence of each checked against the broker's ``_V1_ACK``
    reading of the subject."""
    parser.receive_data(data)
    events: list[object] = []
    try:
        while True:
            run = parser.ack_pubs(limit)
            assert len(run) <= limit
            if run:
                for subject, reply, payload, key, seq in run:
                    m = _V1_ACK.fullmatch(subject)
                    assert m is not None and (m.group(1), int(m.group(2))) == (key, seq)
                    events.append(PN.NatsPub(subject, reply, None, payload))
                continue
            ev = parser.next_event()
            if ev is PN.NATS_NEED_DATA:
                break
            events.append(ev)
    except PN.NatsProtocolError as err:
        return events, err.text
    return events, None


@st.composite
def ack_pub_like(draw: st.DrawFn) -> bytes:
    """Mostly PUBs on ``$JS.ACK.`` subjects, plain or not, v1 or not, between other
    operations."""
    kind = draw(st.sampled_from(["v1", "v1", "v1", "ack", "ack", "ack", "other", "ping", "hpub"]))
    if kind == "v1":  # as nats-py sends them
        numbers = b".".join(b"%d" % draw(st.integers(0, 10**19)) for _ in range(5))
        body = draw(st.sampled_from([b"", b"+ACK"]))
        return b"PUB $JS.ACK.S.c." + numbers + draw(st.sampled_from([b"", b" _INBOX.r"])) + b" %d\r\n%s\r\n" % (len(body), body)
    if kind == "ping":
        return b"PING\r\n"
    if kind == "hpub":
        return b"HPUB $JS.ACK.s.c.1.2.3.4.5 12 14\r\nNATS/1.0\r\n\r\nhi\r\n"
    if kind == "other":
        return draw(pub_like())
    name = st.sampled_from([b"S", b"c", b"S", b"", b"\xff", b"\xc3\xa9", b"1"])
    number = st.sampled_from([b"1", b"42", b"0", b"1", b"7", b"1", b"1", b"1", b"3", b"4", b"1", b"5", b"", b"x", b"\xc2\xb2"])
    tokens = [draw(name), draw(name), *(draw(number) for _ in range(5))]
    tokens = tokens[: len(tokens) - draw(st.sampled_from([0, 0, 0, 1]))] + [b"1"] * draw(st.sampled_from([0, 0, 0, 1]))
    subject = b"$JS.ACK." + b".".join(tokens)
    reply = draw(st.sampled_from([b"", b" _INBOX.x", b" \xfe", b"  r"]))
    payload = draw(st.sampled_from([b"", b"+ACK", b"-NAK", b"x" * 30]))
    sep = draw(st.sampled_from([b" ", b" ", b"  ", b"\t"]))
    size = draw(st.sampled_from([b"%d" % len(payload)] * 3 + [b"%d" % (len(payload) + 1)]))
    return b"PUB " + subject + reply + sep + size + b"\r\n" + payload + draw(st.sampled_from([b"\r\n", b"\r\n", b"x"]))


@settings(max_examples=400)
@given(st.lists(ack_pub_like(), min_size=1, max_size=6), st.integers(1, 4), st.lists(st.integers(0, 400), max_size=3))
@example([b"PUB $JS.ACK.s.c.1.2.3.4.5 0\r\n\r\n"] * 3, 2, [])
@example([b"PUB $JS.ACK.s.\xc3\xa9.1.2.3.4.5 _INBOX.x 4\r\n+ACK\r\n"], 1, [])
def test_ack_pub_runs_parse_as_the_general_path_does(lines: list[bytes], limit: int, splits: list[int]) -> None:
    """``ack_pubs`` takes exactly the PUBs ``next_event`` would give (same subject,
    reply and payload, at most ``limit``), reads their consumer and stream sequence
    as the broker's v1 match does, and leaves the rest, errors included, to the
    general path, however the bytes arrive."""
    data = b"".join(lines)
    want = _outcome(_GeneralOnly(max_control_line=60, max_payload=20), data)
    assert _runs_outcome(PN.NatsParser(max_control_line=60, max_payload=20), data, limit) == want
    parser = PN.NatsParser(max_control_line=60, max_payload=20)
    cuts = sorted({0, len(data), *(s % (len(data) + 1) for s in splits)})
    events: list[object] = []
    error = None
    for a, b in zip(cuts, cuts[1:]):
        got, error = _runs_outcome(parser, data[a:b], limit)
        events += got
        if error is not None:
            break
    assert (events, error) == want


def test_ack_pubs_takes_the_v1_acks_nats_py_sends() -> None:
    """The run nats-py writes for ``msg.ack()`` calls is taken whole; an ack subject
    of another form stops it."""
    acks = [b"PUB $JS.ACK.S.c.1.%d.%d.1763937600000000000.0 0\r\n\r\n" % (i, i) for i in range(5)]
    parser = PN.NatsParser()
    parser.receive_data(b"".join(acks) + b"PUB $JS.ACK.S.c.1.9.9.x.0 0\r\n\r\n" + acks[0])
    assert [(k, n) for _, _, _, k, n in parser.ack_pubs()] == [("$JS.ACK.S.c", i) for i in range(5)]
    assert parser.ack_pubs() == []
    assert parser.next_event() == PN.NatsPub("$JS.ACK.S.c.1.9.9.x.0", None, None, b"")
    assert len(parser.ack_pubs()) == 1


def _ack_run_outcome(parser: PN.NatsParser, data: bytes) -> tuple[list[object], str | None]:
    """What ``parser`` gives reading ``data`` as the NATS session does: a run of
    nats-py's plain acks (:meth:`NatsParser.ack_run`) first, then ``ack_pubs``, then the
    general path (the first two only where ``at_ack`` says so: elsewhere they give
    nothing); each run's key and sequences checked against the broker's v1 match
    of the subjects the general path reads there."""
    parser.receive_data(data)
    events: list[object] = []
    try:
        while True:
            before = bytes(parser._buf[parser._pos:])
            if not parser.at_ack():  # the session then asks neither
                assert parser.ack_run() is None and parser.ack_pubs() == []
            run = parser.ack_run()
            if run is not None:
                key, acks, end = run
                seqs = acks.seqs()
                assert 1 <= len(seqs) <= ACK_RUN_LIMIT
                # The same bytes read by the general path: the same PUBs, plain acks of key.
                general = _GeneralOnly(max_control_line=parser.max_control_line, max_payload=parser.max_payload)
                general.receive_data(before[: end - parser._pos])
                pubs = []
                while (ev := general.next_event()) is not PN.NATS_NEED_DATA:
                    pubs.append(ev)
                assert len(pubs) == len(seqs)
                for ev, seq in zip(pubs, seqs):
                    assert isinstance(ev, PN.NatsPub) and ev.reply is None and ev.payload in (b"", b"+ACK") and ev.headers is None
                    m = _V1_ACK.fullmatch(ev.subject)
                    assert m is not None and (m.group(1), int(m.group(2))) == (key, seq)
                parser.skip_to(end)
                events += pubs
                continue
            acks = parser.ack_pubs()
            if acks:
                events += [PN.NatsPub(subject, reply, None, payload) for subject, reply, payload, _, _ in acks]
                continue
            ev = parser.next_event()
            if ev is PN.NATS_NEED_DATA:
                break
            events.append(ev)
    except PN.NatsProtocolError as err:
        return events, err.text
    return events, None


@settings(max_examples=400)
@given(st.lists(ack_pub_like() | st.sampled_from([
    b"PUB $JS.ACK.S.c.1.2.3.4.5  0\r\n\r\n", b"PUB $JS.ACK.T.d.1.22.3.4.5 0\r\n\r\n", b"PUB $JS.ACK.1.2.3.4.5.6.7  0\r\n\r\n",
    b"PUB $JS.ACK.S.c.1.2.3.4.5" + b" " * 17 + b"0\r\n\r\n", b"PUB $JS.ACK.S.c.1.2.3.4.5 00\r\n\r\n",
    b"PUB $JS.ACK.S.c.1.%d.3.4.5  0\r\n\r\n" % 10**20, b"PUB $JS.ACK." + b"s" * 40 + b".c.1.2.3.4.5  0\r\n\r\n",
    b"PUB $JS.ACK.S.c.1.2.3.4.5 4\r\n+ACK\r\n", b"PUB $JS.ACK.S.c.1.2.3.4.5 4\r\n+ACKx\r\n", b"PUB $JS.ACK.S.c.1.2.3.4.5 4\r\n+NAK\r\n",
    b"PUB $JS.ACK.S.c.1.2.3.4.5 04\r\n+ACK\r\n", b"PUB $JS.ACK.S.c.1.2.3.4.5 5\r\n+ACK \r\n",
]), min_size=1, max_size=8), st.sampled_from([40, 60, 4096]), st.lists(st.integers(0, 600), max_size=3), st.sampled_from([20, 3]))
@example([b"PUB $JS.ACK.s.c.1.2.3.4.5 0\r\n\r\n"] * 3, 4096, [], 20)
@example([b"PUB $JS.ACK.s.c.1.2.3.4.5 0\r\n\r\n", b"PUB $JS.ACK.s.\xff.1.2.3.4.5 0\r\n\r\n"], 4096, [], 20)
@example([b"PUB $JS.ACK.s.c.1.2.3.4.5 0\r\n\r\n", b"PUB $JS.ACK.s.c.1.3.4.5.6 4\r\n+ACK\r\n"] * 2, 4096, [], 20)
@example([b"PUB $JS.ACK.s.c.1.2.3.4.5 0\r\n\r\n", b"PUB $JS.ACK.s.c.1.3.4.5.6 4\r\n+ACK\r\n"], 4096, [], 3)
def test_ack_runs_parse_as_the_general_path_does(lines: list[bytes], max_line: int, splits: list[int], max_payload: int) -> None:
    """``ack_run`` takes a run of PUBs exactly as ``next_event`` reads them (plain acks
    of one consumer, no reply, an empty or ``+ACK`` payload), with their key and stream
    sequences as the broker's v1 match reads them, and leaves anything else, errors
    included (a control line too long, a payload over the limit), to the other paths,
    however the bytes arrive."""
    data = b"".join(lines)
    want = _outcome(_GeneralOnly(max_control_line=max_line, max_payload=max_payload), data)
    assert _ack_run_outcome(PN.NatsParser(max_control_line=max_line, max_payload=max_payload), data) == want
    parser = PN.NatsParser(max_control_line=max_line, max_payload=max_payload)
    cuts = sorted({0, len(data), *(s % (len(data) + 1) for s in splits)})
    events: list[object] = []
    error = None
    for a, b in zip(cuts, cuts[1:]):
        got, error = _ack_run_outcome(parser, data[a:b])
        events += got
        if error is not None:
            break
    assert (events, error) == want


def test_ack_run_takes_the_acks_nats_py_sends_in_one_run_per_consumer() -> None:
    acks = [b"PUB $JS.ACK.S.c.1.%d.%d.1763937600000000000.0  0\r\n\r\n" % (i, i) for i in range(300)]
    other = b"PUB $JS.ACK.S.d.1.7.7.1763937600000000000.0  0\r\n\r\n"
    parser = PN.NatsParser()
    parser.receive_data(b"".join(acks) + other + acks[0] + b"PING\r\n")
    key, run, end = parser.ack_run()
    assert (key, run.seqs()) == ("$JS.ACK.S.c", list(range(ACK_RUN_LIMIT)))
    assert parser.ack_run() is not None  # nothing taken before skip_to
    parser.skip_to(end)
    key, run, end = parser.ack_run()
    assert (key, run.seqs()) == ("$JS.ACK.S.c", list(range(ACK_RUN_LIMIT, 300)))
    parser.skip_to(end)
    key, run, end = parser.ack_run()
    assert (key, run.seqs()) == ("$JS.ACK.S.d", [7])
    parser.skip_to(end)
    key, run, end = parser.ack_run()
    assert (key, run.seqs()) == ("$JS.ACK.S.c", [0])
    parser.skip_to(end)
    assert parser.ack_run() is None and parser.next_event() is PN.NatsPing


def test_same_pubs_after_something_else_and_after_more_data() -> None:
    """``same_pubs`` takes the PUBs whose line is the last ``next_pub``'s, whatever
    was read in between, and none once the buffer moved (new data came)."""
    parser = PN.NatsParser()
    parser.receive_data(b"PUB a r 2\r\nxy\r\nPING\r\nPUB a r 2\r\nzz\r\nPUB a r 2\r\nww\r\nPUB a r 3\r\n")
    assert parser.next_pub() == (b"a", b"r", bytearray(b"r 2\r\nxy\r\n"), 2)
    assert parser.next_event() is PN.NatsPing
    assert parser.same_pubs() == [bytearray(b"r 2\r\nzz\r\n"), bytearray(b"r 2\r\nww\r\n")]
    assert parser.same_pubs() == []  # (a PUB of another size: not whole, and not the same)
    parser.receive_data(b"abc\r\nPUB a r 3\r\ndef\r\n")
    assert parser.same_pubs() == []  # (the buffer moved: next_pub first)
    assert parser.next_pub() == (b"a", b"r", bytearray(b"r 3\r\nabc\r\n"), 3)
    assert parser.same_pubs() == [bytearray(b"r 3\r\ndef\r\n")]
    assert parser.next_event() is PN.NATS_NEED_DATA


@st.composite
def replied_flood(draw: st.DrawFn) -> bytes:
    """PUBs on one subject with one size, each with a reply of its own (usually an
    inbox; sometimes odd bytes, another spacing or size, a line too long)."""
    subject = draw(st.sampled_from([b"s", b"s.js", b"a  b"]))
    size = draw(st.integers(0, 3))
    out = []
    for _ in range(draw(st.integers(1, 6))):
        reply = draw(st.sampled_from([b"_I.%d" % draw(st.integers(0, 10**12)), b"_I.1", b"r", b"\xff", b"a\tb", b"x\x0b",
                                      b"r  ", b" r", b"", b"r" * 30]))
        n = draw(st.sampled_from([size, size, size, size + 1]))
        spelled = draw(st.sampled_from([b"%d" % n, b"%d" % n, b"0%d" % n]))
        payload = draw(st.binary(min_size=n, max_size=n))
        out.append(b"PUB " + subject + b" " + reply + b" " + spelled + b"\r\n" + payload
                   + draw(st.sampled_from([b"\r\n", b"\r\n", b"\r\n", b"x\r\n"])))
    return b"".join(out)


@settings(max_examples=400)
@given(st.lists(replied_flood(), min_size=1, max_size=3), st.lists(st.integers(0, 300), max_size=4))
@example([b"PUB s _I.1 1\r\nx\r\nPUB s _I.2 1\r\ny\r\nPUB s _I.3 2\r\nzz\r\n"], [])
@example([b"PUB s r 1\r\nx\r\nPUB s 1\r\nx\r\nPUB s  r 1\r\nx\r\n"], [15])
def test_floods_with_a_reply_each_parse_as_the_general_path_does(floods: list[bytes], splits: list[int]) -> None:
    """``replied_pubs`` after each ``next_pub`` (a client's JetStream publishes: one
    subject, an inbox each; the data cut anywhere) gives the general path's events
    and error."""
    data = b"".join(floods)
    assert _outcome_by_runs(PN.NatsParser(max_control_line=40, max_payload=20), data, True, splits) == _outcome(
        _GeneralOnly(max_control_line=40, max_payload=20), data)
