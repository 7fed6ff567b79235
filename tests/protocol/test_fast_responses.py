"""Fast paths of the per-request path: the client's ``FrameDecoder.take_ok_response``
and ``Acks.first`` give what ``next_frame`` and ``Acks.decode`` give, and leave
everything else (other frames, errors, a partial frame, a bad header) to them; the
broker's decoded name identifiers are remembered, within a bound."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
    """Fed in random pieces, with take_ok_response tried before every next_frame:
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
            took = dec.take_ok_response(wanted)
            if took is not None:
                out.append(("taken", -1, took[0], took[1]))
                continue
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
