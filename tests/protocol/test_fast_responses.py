"""Fast paths of the per-request path: the client's ``FrameDecoder.take_ok_responses``
and ``Acks.first`` give what ``next_frame`` and ``Acks.decode`` give, and leave
everything else (other frames, errors, a partial frame, a bad header) to them; the
server's ``ProtocolConnection.take_publish`` takes exactly the PUBLISH requests
``next_event`` would decode as acked ones, and ``uniform_ack_frames`` is what
encoding each request's acks in its response frame gives; the broker's decoded
name identifiers are remembered, within a bound."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import server_connection

import protocol as P

CODES = [P.Command.PUBLISH, P.Command.KV_GET, P.Command.PING, P.Command.FETCH]
frames = st.tuples(
    st.sampled_from(CODES),
    st.sampled_from([P.FLAG_RESPONSE, P.FLAG_RESPONSE, P.FLAG_PUSH, 0]),
    st.integers(0, 2**32 - 1),
    st.sampled_from([0, 0, 0, 6001]),
    st.binary(max_size=40),
)


@given(st.lists(frames, max_size=20), st.lists(st.integers(1, 64), max_size=30), st.booleans())
@settings(max_examples=300)
def test_taking_responses_between_frames_changes_nothing(items, cuts, bad_tail) -> None:  # type: ignore[no-untyped-def]
    """Fed in random pieces, with take_ok_responses tried before every next_frame:
    the frames come out in the same order, the taken ones exactly the successful
    responses to the codes asked for; a bad header after them still raises."""
    data = b"".join(P.encode_frame(code, flags, corr, status, payload) for code, flags, corr, status, payload in items)
    if bad_tail:
        data += P.FRAME_HEADER.pack(3, 0, 0, 0, 0)  # a length below the header's: MALFORMED_FRAME
    wanted = {P.Command.PUBLISH, P.Command.KV_GET}
    dec = P.FrameDecoder()
    out: list[tuple[str, int, int, bytes]] = []
    error = None
    pos = 0
    pieces = [*cuts, len(data)]
    while pos < len(data) and error is None:
        step = pieces.pop(0) if len(pieces) > 1 else len(data)
        dec.feed(data[pos : pos + step])
        pos += step
        while True:
            for corr, payload in dec.take_ok_responses(wanted):
                out.append(("taken", -1, corr, payload))
            try:
                f = dec.next_frame()
            except P.RemoteProtocolError as exc:
                error = exc
                break
            if f is None:
                break
            out.append(("frame", f.code, f.correlation_id, f.payload))
    expected = [
        ("taken", -1, corr, payload) if code in wanted and flags == P.FLAG_RESPONSE and not status else ("frame", code, corr, payload)
        for code, flags, corr, status, payload in items
    ]
    assert out == expected
    assert (error is not None) == bad_tail
    assert dec.buffered == 0 or bad_tail


@given(st.lists(st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1),
                          st.integers(0, 2**64 - 1), st.sampled_from([0, 0, 6014, 6001, 6002])), min_size=1, max_size=3))
@settings(max_examples=300)
def test_the_first_ack_is_the_decoded_first_ack(acks) -> None:  # type: ignore[no-untyped-def]
    errors = {i: f"refused {i}" for i, a in enumerate(acks) if a[4] not in (0, 6014)}
    payload = P.Acks(*(tuple(col) for col in zip(*acks)), errors=errors).encode()  # type: ignore[arg-type]
    first = P.Acks.first(payload)
    decoded = P.Acks.decode(payload)[0]
    assert first[:5] == decoded[:5]
    assert (first.error is None) == (decoded.error is None)
    if first.error is not None:
        assert (first.error.code, first.error.message) == (decoded.error.code, decoded.error.message)  # type: ignore[union-attr]


def test_decoded_names_are_remembered_within_a_bound_and_bad_ones_never() -> None:
    from protocol import _names

    good = P.Identifier.of("Orders EU").encode()  # normalised on the way: "orders.eu"
    first, _ = P.Identifier.decode_from(good, 0)
    again, end = P.Identifier.decode_from(good, 0)
    assert again is first and first == P.Identifier("orders.eu") and end == len(good)
    bad = bytes((2, 3)) + b"a/b"
    for _ in range(2):
        with pytest.raises(P.InvalidNameError):  # type: ignore[attr-defined]
            P.Identifier.decode_from(bad, 0)
    assert b"a/b" not in _names._DECODED_NAMES
    for i in range(_names._DECODED_NAMES_MAX + 10):
        P.Identifier.decode_from(P.Identifier.of(f"n{i}").encode(), 0)
    assert len(_names._DECODED_NAMES) <= _names._DECODED_NAMES_MAX


def _publish_payload(flags: int, count: int, bodies: bytes) -> bytes:
    return bytes([flags]) + count.to_bytes(4, "little") + bodies


_BODY = P.encode_body("a.b", b"x")  # 14 bytes of fixed part, then subject and payload
publish_frames = st.tuples(
    st.sampled_from([P.Command.PUBLISH, P.Command.PUBLISH, P.Command.PUBLISH, P.Command.PING]),
    st.sampled_from([0, 0, 0, P.FLAG_RESPONSE]),
    st.integers(0, 2**32 - 1),
    st.sampled_from([0, 0, 0, P.PUBLISH_NO_ACK, 0x80]),
    st.integers(0, 3),
    st.integers(0, 3),
    st.booleans(),
)


@given(st.lists(publish_frames, max_size=20), st.lists(st.integers(1, 64), max_size=30), st.booleans())
@settings(max_examples=300)
def test_taking_publishes_gives_the_requests_next_event_would(items, cuts, handshaken) -> None:  # type: ignore[no-untyped-def]
    """A server's connection fed in random pieces, with take_publish tried before
    every next_event: what it takes is exactly the PUBLISH requests that want acks
    for at least one message (as next_event decodes them), nothing before the
    handshake; everything else comes from next_event, in order."""

    def payload(flags: int, count: int, nbodies: int, raw: bool) -> bytes:
        return _publish_payload(flags, count, b"\x00" * 20 if raw else _BODY * nbodies)

    frames = [(code, fflags, corr, payload(pflags, count, n, raw)) for code, fflags, corr, pflags, count, n, raw in items]
    data = b"".join(P.encode_frame(code, fflags, corr, 0, p) for code, fflags, corr, p in frames)

    def events(conn: P.ProtocolConnection, take: bool) -> list[object]:
        out: list[object] = []
        pos = 0
        pieces = [*cuts, len(data)]
        while pos < len(data):
            step = pieces.pop(0) if len(pieces) > 1 else len(data)
            conn.receive_data(data[pos : pos + step])
            pos += step
            while True:
                took = conn.take_publish() if take else None
                if took is not None:
                    out.append(("taken", *took))
                    continue
                try:
                    ev = conn.next_event()
                except P.RemoteProtocolError as exc:
                    out.append(("error", str(exc)))
                    return out
                if ev is P.NEED_DATA:
                    break
                out.append(ev)
        return out

    plain = events(server_connection(handshaken), False)
    taken = events(server_connection(handshaken), True)
    expected = []
    for ev in plain:
        cmd = getattr(ev, "command", None)
        if handshaken and isinstance(cmd, P.Publish) and not cmd.flags and cmd.count:
            assert cmd.body_pos == 5
            expected.append(("taken", ev.correlation_id, cmd.data, cmd.count))  # type: ignore[union-attr]
        else:
            expected.append(ev)
    assert [repr(e) for e in taken] == [repr(e) for e in expected]


@given(st.lists(st.tuples(st.integers(0, 2**32 - 1), st.integers(1, 5)), max_size=20),
       st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1), st.integers(0, 2**60))
@settings(max_examples=300)
def test_uniform_ack_frames_are_the_acks_of_each_request_in_a_response_frame(requests, sid, tid, part, first) -> None:  # type: ignore[no-untyped-def]
    expected = []
    offset = first
    for corr, count in requests:
        payload = P.Acks([sid] * count, [tid] * count, [part] * count, list(range(offset, offset + count)), [0] * count, {}).encode()
        expected.append(P.encode_frame(P.Command.PUBLISH, P.FLAG_RESPONSE, corr, 0, payload))
        offset += count
    assert P.uniform_ack_frames(requests, sid, tid, part, first) == b"".join(expected)
