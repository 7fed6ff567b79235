"""docs/protocol.md is normative: its byte-exact examples and its tables must agree
with the code.

Each example (``<!-- example: NAME -->`` followed by a ```hex block) is decoded with
the real decoder and compared with an expectation written here by hand, then the
expectation is encoded again and must give the very same bytes. The command, push,
option and error-code tables must list exactly what the code defines.
"""

from __future__ import annotations

import re
import zlib
from pathlib import Path
from typing import Any, NamedTuple

import pytest

import protocol as P
from broker.core._topic_config import OPTION_TYPES

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
TEXT = DOC.read_text(encoding="utf-8")

T = 1_735_689_600_000_000_000  # 2025-01-01T00:00:00Z, the examples' timestamp
PART = 1  # CRC-32("orders.eu.1") % 3, where the examples' messages go


# -- reading the document ------------------------------------------------------------


def doc_examples() -> dict[str, bytes]:
    """NAME -> bytes of every ``<!-- example: NAME -->`` + ```hex block."""
    out: dict[str, bytes] = {}
    for m in re.finditer(r"<!-- example: ([\w-]+) -->\n```hex\n(.*?)```", TEXT, re.S):
        name, block = m.group(1), m.group(2)
        assert name not in out, f"example {name} appears twice"
        out[name] = bytes.fromhex("".join(line.split("#", 1)[0] for line in block.splitlines()))
    return out


def doc_table(name: str) -> list[list[str]]:
    """The body rows of the table(s) between ``<!-- table: name -->`` and
    ``<!-- /table -->``, cells stripped of spaces and backticks."""
    m = re.search(rf"<!-- table: {name} -->\n(.*?)<!-- /table -->", TEXT, re.S)
    assert m, f"no table {name!r} in {DOC}"
    lines = [line for line in m.group(1).splitlines() if line.startswith("|")]
    rows = []
    for line, after in zip(lines, lines[1:] + [""]):
        if line.startswith("| ---") or after.startswith("| ---"):  # separator, or a header row
            continue
        rows.append([c.strip().strip("`") for c in line.strip().strip("|").split("|")])
    return rows


EXAMPLES = doc_examples()


# -- the expectations, written independently of the document -----------------------


class Expect(NamedTuple):
    kind: str  # "request", "response", "error" or "push"
    code: int  # Command, or PushKind for a push
    correlation_id: int
    value: Any  # the decoded object; for "error" the message text
    status: int = 0


BODY_PLAIN = P.encode_body("orders.eu.1", b'{"qty":2}')
BODY_TTL = P.encode_body("orders.eu.2", b'{"qty":5}', P.encode_headers({"source": "web"}), ttl=60)
STORED = P.Message("orders.eu.1", b'{"qty":2}', b"", offset=1, timestamp=T, partition=PART, stream_id=1, topic_id=1)

EXPECTED: dict[str, Expect] = {
    "handshake-request": Expect("request", P.Command.HANDSHAKE, 1, P.Handshake(1, "s3cret", "demo-client")),
    "handshake-response": Expect(
        "response", P.Command.HANDSHAKE, 1,
        P.HandshakeOk(
            1, {"name": "ttlbroker", "protocol_version": 1, "max_frame_bytes": 16 * 1024 * 1024, "auth_required": True}
        ),
    ),
    "ping-request": Expect("request", P.Command.PING, 2, P.Ping()),
    "ping-response": Expect("response", P.Command.PING, 2, P.Empty()),
    "create-stream-request": Expect("request", P.Command.CREATE_STREAM, 3, P.CreateStream(0, "shop")),
    "create-stream-response": Expect("response", P.Command.CREATE_STREAM, 3, P.StreamDetails(1, 0, 0, 0, "shop")),
    "create-topic-request": Expect(
        "request", P.Command.CREATE_TOPIC, 4,
        P.CreateTopic(P.Identifier.of("shop"), 0, 3, 0, "orders", {"subjects": ["orders.>"]}),
    ),
    "create-topic-response": Expect(
        "response", P.Command.CREATE_TOPIC, 4,
        P.TopicDetails(
            1, 3, 0, 0, 0, "orders",
            {"stream_id": 1, "stream": "shop", "options": {"subjects": ["orders.>"], "allow_msg_ttl": False}},
        ),
    ),
    "subscribe-request": Expect("request", P.Command.SUBSCRIBE, 5, P.Subscribe(1, "orders.>")),
    "delivery-push": Expect("push", P.PushKind.DELIVERY, 0, P.Delivery(1, (STORED,))),
    "publish-request": Expect("request", P.Command.PUBLISH, 6, P.Publish.from_bodies([BODY_PLAIN, BODY_TTL])),
    "publish-response": Expect(
        "response", P.Command.PUBLISH, 6,
        P.Acks((1, 0), (1, 0), (PART, 0), (1, 0), (0, P.ErrorCode.MSG_TTL_DISABLED), {1: "per-message TTL is disabled"}),
    ),
    "fetch-request": Expect(
        "request", P.Command.FETCH, 7, P.Fetch(P.Identifier.of(1), P.Identifier.of("orders"), PART, 1, 10, 0, "orders.eu.*")
    ),
    "fetch-response": Expect(
        "response", P.Command.FETCH, 7, P.FetchResult(1, 1, PART, 2, 1, 1, 1, P.encode_record(1, T, BODY_PLAIN))
    ),
    "subscribe-replies-request": Expect("request", P.Command.SUBSCRIBE, 9, P.Subscribe(2, "svc.>", P.SUBSCRIBE_REPLIES)),
    "request-publish": Expect(
        "request", P.Command.PUBLISH, 10, P.PublishWithReply.to("_INBOX.abc.1", [P.encode_body("svc.echo", b"hi")]),
    ),
    "request-delivery-push": Expect(
        "push", P.PushKind.DELIVERY, 0, P.Delivery(2, (P.Message("svc.echo", b"hi", b"", 0, T),), "_INBOX.abc.1"),
    ),
    "get-stream-request": Expect("request", P.Command.GET_STREAM, 8, P.GetStream(P.Identifier.of("nope"))),
    "error-response": Expect("error", P.Command.GET_STREAM, 8, "no stream 'nope'", P.ErrorCode.STREAM_NOT_FOUND),
    "goodbye-push": Expect(
        "push", P.PushKind.GOODBYE, 0,
        P.Goodbye("frame of 33554432 bytes exceeds the maximum of 16777216 bytes"), P.ErrorCode.FRAME_TOO_LARGE,
    ),
}

FLAGS = {"request": 0, "response": P.FLAG_RESPONSE, "error": P.FLAG_RESPONSE, "push": P.FLAG_PUSH}


def test_every_example_is_expected_and_every_expectation_is_in_the_doc() -> None:
    assert sorted(EXAMPLES) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_decodes_to_the_expectation_and_re_encodes_byte_for_byte(name: str) -> None:
    exp = EXPECTED[name]
    data = EXAMPLES[name]
    decoder = P.FrameDecoder()
    decoder.feed(data)
    frame = decoder.next_frame()
    assert frame is not None, "the example is not one complete frame"
    assert decoder.next_frame() is None and decoder.buffered == 0, "bytes follow the frame"
    assert frame[:4] == (exp.code, FLAGS[exp.kind], exp.correlation_id, exp.status)

    if exp.kind == "error":  # the whole payload is the UTF-8 message
        assert frame.payload.decode() == exp.value
        payload = exp.value.encode()
    else:
        types = {"request": P.COMMAND_TYPES, "response": P.RESPONSE_TYPES, "push": P.PUSH_TYPES}[exp.kind]
        decoded = types[frame.code].decode(frame.payload)
        assert type(decoded) is type(exp.value)
        assert decoded == exp.value
        payload = exp.value.encode()
    assert P.encode_frame(exp.code, FLAGS[exp.kind], exp.correlation_id, exp.status, payload) == data


def test_publish_example_carries_the_documented_messages() -> None:
    """The Publish dataclass keeps the bodies raw; look inside them field by field."""
    decoder = P.FrameDecoder()
    decoder.feed(EXAMPLES["publish-request"])
    frame = decoder.next_frame()
    assert frame is not None
    cmd = P.Publish.decode(frame.payload)
    assert (cmd.count, cmd.flags) == (2, 0)
    scan = P.scan_bodies(cmd.data, cmd.body_pos, cmd.count, max_payload=1 << 20)
    fields = [P.body_fields(cmd.data, s) for s in scan.starts]
    assert [(b.subject, b.ttl, b.flags, P.decode_headers(b.headers)) for b in fields] == [
        (b"orders.eu.1", 0, 0, {}),
        (b"orders.eu.2", 60, 0, {"source": "web"}),
    ]
    assert [cmd.data[b.payload_pos : b.payload_pos + b.payload_len] for b in fields] == [b'{"qty":2}', b'{"qty":5}']


# Where the one record starts: frame header, then FetchResult's 40-byte head, or the
# delivery's subscription id and count and the entry's stream, topic and partition.
@pytest.mark.parametrize(("name", "record_at", "after"), [
    ("fetch-response", 16 + 40, 0), ("delivery-push", 16 + 8 + 12, 0), ("request-delivery-push", 16 + 8 + 12, 2 + 12),
])
def test_example_records_pass_their_checksum(name: str, record_at: int, after: int) -> None:
    data = EXAMPLES[name]
    assert P.check_record(data, record_at, len(data) - after) == len(data) - after - record_at
    length = int.from_bytes(data[record_at : record_at + 4], "little")
    crc = int.from_bytes(data[record_at + 4 : record_at + 8], "little")
    assert crc == zlib.crc32(data[record_at + 8 : record_at + 4 + length])  # offset, timestamp, body


def test_crc_check_value_in_the_doc() -> None:
    assert "`0xCBF43926`" in TEXT
    assert zlib.crc32(b"123456789") == 0xCBF43926


# -- the tables ----------------------------------------------------------------------


def test_command_table_matches_the_code() -> None:
    rows = {int(r[0]): tuple(r[1:4]) for r in doc_table("commands")}
    expected = {
        int(c): (c.name, P.COMMAND_TYPES[c].__name__, P.RESPONSE_TYPES[c].__name__) for c in P.Command
    }
    assert rows == expected
    assert len(doc_table("commands")) == len(P.Command)  # no code listed twice


def test_push_table_matches_the_code() -> None:
    rows = {int(r[0]): tuple(r[1:3]) for r in doc_table("pushes")}
    assert rows == {int(k): (k.name, P.PUSH_TYPES[k].__name__) for k in P.PushKind}


def test_error_table_matches_the_enum_exactly() -> None:
    rows = [(int(r[0]), r[1], r[2]) for r in doc_table("errors")]
    assert rows == [(int(c), c.name, c.description) for c in P.ErrorCode]


def test_option_table_matches_the_topic_config_keys() -> None:
    assert sorted(r[0] for r in doc_table("options")) == sorted(OPTION_TYPES)
