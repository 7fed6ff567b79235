"""The server's run of KV gets: ``ProtocolConnection.take_requests`` takes exactly
the frames ``next_event`` would decode as requests of the code asked for, in order,
and ``request_event`` makes of each the event ``next_event`` would have given (a
Request, or the InvalidRequest refusing it); ``info_map_frame`` is an InfoMap's
payload in its response frame, byte for byte."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import server_connection

import protocol as P

_KV_GET = int(P.Command.KV_GET)
_TARGET = P.Identifier.of("kv").encode() + P.Identifier.of("b").encode()


def _get_payload(kind: int, key: str, revision: int) -> bytes:
    """A KV_GET payload: well formed, or damaged in one of the ways a client can."""
    good = P.KvGet(P.Identifier.of("kv"), P.Identifier.of("b"), key, revision).encode()
    if kind == 0:
        return good
    if kind == 1:
        return good[:-1]  # the revision cut short
    if kind == 2:
        return good + b"\x00"  # a byte too many
    if kind == 3:
        return _TARGET + b"\x02\xff\xfe" + revision.to_bytes(8, "little")  # a key that is not UTF-8
    if kind == 4:
        return P.KvGet(P.Identifier.of(7), P.Identifier.of("other"), key, revision).encode()  # numeric ids
    if kind == 5:
        return b"\x09"  # no identifiers
    return b""


requests = st.tuples(
    st.sampled_from([P.Command.KV_GET, P.Command.KV_GET, P.Command.KV_GET, P.Command.PING, P.Command.PUBLISH, 999]),
    st.sampled_from([0, 0, 0, 0, P.FLAG_RESPONSE]),
    st.integers(0, 2**32 - 1),
    st.sampled_from([0, 0, 0, 6001]),  # a request's status is not looked at
    st.integers(0, 6),
    st.text(max_size=6),
    st.integers(0, 2**64 - 1),
)


@given(st.lists(requests, max_size=25), st.lists(st.integers(1, 80), max_size=30), st.integers(1, 5), st.booleans(), st.booleans())
@settings(max_examples=400)
def test_taking_requests_gives_the_events_next_event_would(items, cuts, limit, handshaken, bad_tail) -> None:  # type: ignore[no-untyped-def]
    """A server's connection fed in random pieces, with take_requests(KV_GET) tried
    before every next_event: what it takes is exactly the KV_GET requests (flags 0,
    complete), nothing before the handshake, at most ``limit`` a call, and
    request_event makes of each the event next_event gives; everything else, a bad
    header after them included, comes from next_event, in order."""
    data = b"".join(
        P.encode_frame(code, flags, corr, status, _get_payload(kind, key, rev) if code == _KV_GET else b"")
        for code, flags, corr, status, kind, key, rev in items
    )
    if bad_tail:
        data += P.FRAME_HEADER.pack(3, 0, 0, 0, 0)  # a length below the header's: MALFORMED_FRAME

    def events(conn: P.ProtocolConnection, take: bool) -> list[object]:
        out: list[object] = []
        pos = 0
        pieces = [*cuts, len(data)]
        while pos < len(data):
            step = pieces.pop(0) if len(pieces) > 1 else len(data)
            conn.receive_data(data[pos : pos + step])
            pos += step
            while True:
                took = conn.take_requests(_KV_GET, limit) if take else []
                if took:
                    assert len(took) <= limit
                    out.extend(("taken", conn.request_event(_KV_GET, corr, payload)) for corr, payload in took)
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
        code = getattr(ev, "code", None) if isinstance(ev, P.InvalidRequest) else None
        if handshaken and (isinstance(getattr(ev, "command", None), P.KvGet) or code == _KV_GET):
            expected.append(("taken", ev))
        else:
            expected.append(ev)
    assert [repr(e) for e in taken] == [repr(e) for e in expected]


def test_a_partial_request_waits_for_the_rest() -> None:
    """A KV_GET split across reads is taken once it is whole, after the ones before it."""
    conn = P.ProtocolConnection(P.Role.SERVER)
    conn.state = P.State.READY
    frames = [P.encode_frame(_KV_GET, 0, corr, 0, _get_payload(0, f"k{corr}", 0)) for corr in (1, 2)]
    data = b"".join(frames)
    conn.receive_data(data[:-5])
    assert [corr for corr, _ in conn.take_requests(_KV_GET, 10)] == [1]
    assert conn.take_requests(_KV_GET, 10) == []
    assert conn.next_event() is P.NEED_DATA
    conn.receive_data(data[-5:])
    assert conn.take_requests(_KV_GET, 10) == [(2, frames[1][16:])]


values = st.dictionaries(
    st.text(max_size=8),
    st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.text(max_size=20), st.binary(max_size=300)),
    max_size=12,
)


@given(values, st.integers(0, 2**32 - 1), st.sampled_from([_KV_GET, int(P.Command.KV_TOUCH)]))
@settings(max_examples=300)
def test_info_map_frame_is_the_info_map_in_its_response_frame(values, corr, code) -> None:  # type: ignore[no-untyped-def]
    expected = P.encode_frame(code, P.FLAG_RESPONSE, corr, 0, P.InfoMap(values).encode())
    assert P.info_map_frame(code, corr, values) == expected
