"""The decoder's invariant (h11's fuzz harness): any input either decodes or raises
the protocol's own error, never anything else."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

import protocol as P


@given(st.lists(st.binary(max_size=64), max_size=8))
@settings(max_examples=500)
def test_frame_decoder_only_raises_remote_protocol_error(chunks: list[bytes]) -> None:
    dec = P.FrameDecoder(max_frame_size=4096)
    try:
        for c in chunks:
            dec.feed(c)
            while dec.next_frame() is not None:
                pass
    except P.RemoteProtocolError:
        pass


@given(st.integers(0, 400), st.binary(max_size=300))
@settings(max_examples=1500)
def test_command_decoders_only_raise_broker_errors(code: int, payload: bytes) -> None:
    cls = P.COMMAND_TYPES.get(code)
    if cls is None:
        return
    try:
        cls.decode(payload)
    except P.BrokerError:
        pass


@given(st.sampled_from(sorted(P.COMMAND_TYPES)), st.binary(max_size=200), st.integers(0, 2**32 - 1))
@settings(max_examples=800)
def test_server_connection_turns_any_payload_into_an_event(code: int, payload: bytes, corr: int) -> None:
    server = P.ProtocolConnection(P.Role.SERVER)
    server.state = P.State.READY
    server.receive_data(P.encode_frame(code, 0, corr, 0, payload))
    ev = server.next_event()
    assert isinstance(ev, (P.Request, P.InvalidRequest))
    assert ev.correlation_id == corr
    if isinstance(ev, P.InvalidRequest):
        assert isinstance(ev.error, P.BrokerError)


@given(st.binary(max_size=400))
@settings(max_examples=500)
def test_server_connection_on_garbage(data: bytes) -> None:
    server = P.ProtocolConnection(P.Role.SERVER, max_frame_size=1024)
    server.receive_data(data)
    try:
        while server.next_event() is not P.NEED_DATA:
            pass
    except P.RemoteProtocolError:
        assert server.state is P.State.ERROR


@given(st.binary(max_size=400))
@settings(max_examples=500)
def test_client_connection_on_garbage(data: bytes) -> None:
    client = P.ProtocolConnection(P.Role.CLIENT)
    client.state = P.State.READY
    client.receive_data(data)
    try:
        while client.next_event() is not P.NEED_DATA:
            pass
    except P.RemoteProtocolError:
        pass


@given(st.binary(max_size=500), st.integers(0, 20))
@settings(max_examples=500)
def test_scan_bodies_only_raises_malformed_payload(data: bytes, count: int) -> None:
    try:
        P.scan_bodies(data, 0, count, 1 << 20)
    except P.BrokerError as err:
        assert err.code == P.ErrorCode.MALFORMED_PAYLOAD


@given(st.binary(max_size=300))
def test_header_block_decoder_only_raises_invalid_headers(block: bytes) -> None:
    try:
        P.decode_headers(block)
    except P.BrokerError as err:
        assert err.code == P.ErrorCode.INVALID_HEADERS
