"""Message bodies, records, checksums and headers."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import protocol as P
from protocol import TTL_NONE
from protocol._records import _scan_each


def test_body_layout_is_byte_exact() -> None:
    body = P.encode_body("a.b", b"hi", P.encode_headers({"K": "v"}), ttl=60)
    assert body == (
        struct.pack("<IBBII", 60, 0, 3, 5, 2) + b"a.b" + b"\x01K\x01\x00v" + b"hi"
    )


def test_record_layout_and_checksum() -> None:
    body = P.encode_body("s", b"x")
    rec = P.encode_record(7, 123, body)
    length, crc, off, ts = struct.unpack_from("<IIQQ", rec)
    assert length == len(rec) - 4 and off == 7 and ts == 123
    assert crc == zlib.crc32(rec[8:])
    assert rec[24:] == body
    assert P.check_record(rec, 0, len(rec)) == len(rec)


@given(st.lists(st.tuples(st.text(alphabet="abc.", min_size=1).filter(lambda s: ".." not in s), st.binary(max_size=50)), min_size=1, max_size=20), st.integers(1, 2**40))
def test_build_records_matches_encode_record(items: list[tuple[str, bytes]], first: int) -> None:
    bodies = [P.encode_body(s, p) for s, p in items]
    data = b"xx" + b"".join(bodies)
    starts, ends, pos = [], [], 2
    for b in bodies:
        starts.append(pos)
        pos += len(b)
        ends.append(pos)
    out, positions = P.build_records(data, starts, ends, first, 99)
    expected = [P.encode_record(first + i, 99, b) for i, b in enumerate(bodies)]
    assert bytes(out) == b"".join(expected)
    assert positions == [sum(len(e) for e in expected[:i]) for i in range(len(expected))]
    msgs = P.decode_records(bytes(out), 0, len(out), len(bodies))
    assert [(m.subject, m.payload, m.offset) for m in msgs] == [(s, p, first + i) for i, (s, p) in enumerate(items)]


@given(st.lists(st.tuples(st.binary(max_size=30), st.integers(0, 2**64 - 1)), min_size=1, max_size=12), st.integers(1, 2**40))
def test_build_records_with_a_timestamp_for_each_body(items: list[tuple[bytes, int]], first: int) -> None:
    """``timestamps`` (a mirror's copies keep their origin's): each record gets its
    own, the rest of the bytes as ``encode_record`` makes them."""
    bodies = [P.encode_body("s.x", p) for p, _ in items]
    data = b"".join(bodies)
    starts = [sum(len(b) for b in bodies[:i]) for i in range(len(bodies))]
    ends = [s + len(b) for s, b in zip(starts, bodies)]
    out, _ = P.build_records(data, starts, ends, first, 7, None, [ts for _, ts in items])
    assert bytes(out) == b"".join(P.encode_record(first + i, ts, b) for i, (b, (_, ts)) in enumerate(zip(bodies, items)))


@given(
    st.binary(min_size=14, max_size=80), st.binary(max_size=8), st.binary(max_size=8), st.integers(0, 2**64 - 1),
    st.integers(0, 2**64 - 1), st.none() | st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 255)),
    st.sampled_from([bytes, bytearray, memoryview]),
)
def test_one_body_is_built_as_a_batch_builds_it(
    body: bytes, before: bytes, after: bytes, offset: int, timestamp: int, stamp: tuple[int, int] | None, kind: type
) -> None:
    """``build_records`` of one body (``_build_one``) makes the bytes the loop over a
    batch (``_build_many``) makes of it, stamped or not, from any buffer type and
    position."""
    from protocol._records import _build_many, _build_one

    data = kind(before + body + after)
    start, end = len(before), len(before) + len(body)
    stamps = None if stamp is None else {0: stamp}
    want, positions = _build_many(data, [start], [end], offset, timestamp, stamps)
    assert positions == [0]
    assert _build_one(data, start, end, offset, timestamp, stamp) == want
    assert P.build_records(data, [start], [end], offset, timestamp, stamps) == (want, [0])


def test_every_single_bit_flip_is_detected() -> None:
    rec = P.encode_record(5, 10, P.encode_body("orders.1", b"payload!", P.encode_headers({"a": "b"})))
    for bit in range(len(rec) * 8):
        damaged = bytearray(rec)
        damaged[bit // 8] ^= 1 << (bit % 8)
        assert P.check_record(damaged, 0, len(damaged)) < 0, f"flip of bit {bit} went unnoticed"


def test_truncated_record_is_detected() -> None:
    rec = P.encode_record(5, 10, P.encode_body("s", b"payload"))
    for cut in range(len(rec)):
        assert P.check_record(rec[:cut], 0, cut) < 0


def test_a_header_name_may_have_spaces_between_its_characters() -> None:
    """As nats-server stores ``my key: v``: a space inside a name, not at its ends."""
    block = P.encode_headers({"my key": "v"})
    assert P.decode_headers(block) == {"my key": "v"}


def test_headers_first_occurrence_wins_and_order_is_kept() -> None:
    block = P.encode_headers([("A", "1"), ("B", "2"), ("A", "3")])
    assert P.decode_headers(block) == {"A": "1", "B": "2"}
    assert list(P.decode_headers(block)) == ["A", "B"]
    assert P.find_header(block, b"A") == b"1"
    assert P.find_header(block, b"a") is None  # case-sensitive, like NATS
    assert P.find_header(P.encode_headers({"Nats-TTL": "  5s"}), b"Nats-TTL") == b"5s"


@pytest.mark.parametrize(
    "headers",
    [{"": "x"}, {" ab": "x"}, {"ab ": "x"}, {"a\tb": "x"}, {"a:b": "x"}, {"k": "line\r\nbreak"}, {"k": "x" * 70000}, {"é": "x"}],
)
def test_header_rules(headers: dict[str, str]) -> None:
    with pytest.raises(P.InvalidHeadersError):  # type: ignore[attr-defined]
        P.encode_headers(headers)


def _reference_encode_headers(pairs: list[tuple[object, object]]) -> bytes:
    """encode_headers as the rules say it, one check per name and value, no cache."""
    out = bytearray()
    for name, value in pairs:
        if not isinstance(name, str):
            raise P.InvalidHeadersError(f"header name must be a string, not {type(name).__name__}")  # type: ignore[attr-defined]
        try:
            raw = name.encode("ascii")
        except UnicodeEncodeError:
            raw = b":"  # not ASCII: refused as a character that is not allowed
        else:
            if not 1 <= len(raw) <= 255:
                raise P.InvalidHeadersError(f"header name {name!r} must be 1..255 bytes")  # type: ignore[attr-defined]
        if any(b < 32 or b >= 127 or b == 58 for b in raw) or raw[:1] == b" " or raw[-1:] == b" ":
            raise P.InvalidHeadersError(  # type: ignore[attr-defined]
                f"header name {name!r} may only contain visible ASCII characters other than ':', and spaces between them")
        if not isinstance(value, str):
            raise P.InvalidHeadersError(f"header {name!r} value must be a string, not {type(value).__name__}")  # type: ignore[attr-defined]
        rv = value.encode()
        if len(rv) > 0xFFFF:
            raise P.InvalidHeadersError(f"header {name!r} value is longer than 65535 bytes")  # type: ignore[attr-defined]
        if b"\r" in rv or b"\n" in rv:
            raise P.InvalidHeadersError(f"header {name!r} value must not contain CR or LF")  # type: ignore[attr-defined]
        out += bytes((len(raw),)) + raw + struct.pack("<H", len(rv)) + rv
    return bytes(out)


_HEADER_NAME = st.one_of(
    st.sampled_from(["Nats-TTL", "K", "a b", "a:b", "", "x" * 256, "é", "\x7f", 7, None]),
    st.text(st.characters(min_codepoint=0, max_codepoint=130, exclude_categories=("Cs",)), max_size=5),
)
_HEADER_VALUE = st.one_of(st.text(" ab7é\r\n", max_size=6), st.sampled_from(["x" * 70000, 5, b"v"]))


@given(st.lists(st.tuples(_HEADER_NAME, _HEADER_VALUE), max_size=5), st.booleans())
def test_encode_headers_agrees_with_the_rules(pairs, as_dict) -> None:  # type: ignore[no-untyped-def]
    """The cached, inlined encoder gives the bytes, or the exact error, of the rules
    applied one by one: twice (the second time with the names cached)."""
    if as_dict:
        pairs = list(dict(pairs).items())
    try:
        want = _reference_encode_headers(pairs)
    except P.BrokerError as err:
        for _ in range(2):
            with pytest.raises(P.BrokerError) as exc:
                P.encode_headers(dict(pairs) if as_dict else pairs)
            assert (exc.value.code, exc.value.message) == (P.ErrorCode.INVALID_HEADERS, err.message)
    else:
        for _ in range(2):
            assert P.encode_headers(dict(pairs) if as_dict else pairs) == want


def test_message_marker_properties() -> None:
    m = P.Message("s", b"", b"", 1, 2, 0, int(P.MarkerReason.MAX_AGE))
    assert m.is_marker and m.marker_reason is P.MarkerReason.MAX_AGE
    assert P.MarkerReason.MAX_AGE.header_value == "MaxAge"
    assert P.MarkerReason.from_header_value("Purge") is P.MarkerReason.PURGE
    assert not P.Message("s", b"", b"", 1, 2).is_marker


_NAMES = ["Nats-TTL", "K", "TTLB-Hops", "Nats-Rollup"]


@given(st.lists(st.tuples(st.sampled_from(_NAMES), st.text(" ab7é", max_size=6)), max_size=6), st.sets(st.sampled_from(_NAMES)),
       st.booleans(), st.integers(0, 40))
def test_header_values_is_first_occurrence_stripped(pairs, wanted, as_view, cut) -> None:  # type: ignore[no-untyped-def]
    block = P.encode_headers(pairs)
    names = frozenset(n.encode() for n in wanted)
    want: dict[bytes, bytes] = {}
    for k, v in pairs:
        if k.encode() in names:
            want.setdefault(k.encode(), v.encode().lstrip(b" "))
    assert P.header_values(memoryview(block) if as_view else block, names) == want
    truncated = block[: max(0, len(block) - cut)]
    try:
        expected = P.find_header(truncated, b"\x00") if truncated else None  # the reference walk
    except P.BrokerError as err:
        with pytest.raises(P.BrokerError) as exc:
            P.header_values(truncated, names)
        assert (exc.value.code, exc.value.message) == (err.code, err.message)
    else:
        assert expected is None and P.header_values(truncated, frozenset()) == {}


ALIKE_BODY = st.tuples(
    st.sampled_from([b"a", b"b", b"ab"]), st.sampled_from([b"", b"xy", b"yz", b"xyz"]),
    st.sampled_from([b"", b"\x00\x00"]), st.sampled_from([TTL_NONE, 5]), st.sampled_from([0, 1]),
)


@settings(max_examples=400)
@given(st.lists(ALIKE_BODY, min_size=1, max_size=6), st.integers(0, 3), st.integers(0, 3), st.integers(1, 3),
       st.sampled_from([1, 2]))
@example([(b"a", b"xy", b"", TTL_NONE, 0)] * 3, 0, 0, 3, 1)
@example([(b"a", b"xy", b"", TTL_NONE, 0)] * 3, 0, 0, 1, 1)  # (a payload over the limit: special)
@example([(b"a", b"", b"", TTL_NONE, 0)] * 4, 0, 0, 3, 2)  # (twice the bodies said: each "body" starts alike)
def test_a_batch_of_alike_bodies_scans_as_body_by_body(
    bodies: list[tuple[bytes, bytes, bytes, int, int]], cut: int, extra: int, max_payload: int, fewer: int,
) -> None:
    """``scan_bodies`` of a batch whose bodies are alike (a flood: one header, one
    subject, one size) takes them in one comparison each; whatever the batch (some
    alike, some with a TTL, headers or flags, a byte cut or left over, more bodies
    than the count says), it gives what the body-by-body scan gives, errors and all."""
    data = b"".join(P.encode_body(s, p, h, ttl, f) for s, p, h, ttl, f in bodies)
    data = data[: len(data) - cut] + b"z" * extra
    count = max(1, len(bodies) // fewer)

    def outcome(scan: Callable[[bytes, int, int, int], P.PublishScan]) -> object:
        try:
            return scan(data, 0, count, max_payload)
        except P.BrokerError as err:
            return err.code, str(err)

    assert outcome(P.scan_bodies) == outcome(_scan_each)
