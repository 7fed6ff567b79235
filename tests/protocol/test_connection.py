"""The connection state machine: handshake first, errors that close and errors that
do not, and frames split anywhere."""

from __future__ import annotations

import pytest
from helpers import feed_bytewise, handshaken_pair

import protocol as P


def test_handshake_then_ready() -> None:
    client, server = handshaken_pair()
    assert client.state is P.State.READY and server.state is P.State.READY


def test_commands_before_handshake_are_refused_but_not_fatal() -> None:
    server = P.ProtocolConnection(P.Role.SERVER)
    server.receive_data(P.encode_frame(P.Command.PING, 0, 9, 0))
    ev = server.next_event()
    assert isinstance(ev, P.InvalidRequest) and ev.correlation_id == 9 and not ev.fatal
    assert ev.error.code == P.ErrorCode.HANDSHAKE_REQUIRED
    assert server.state is P.State.AWAIT_HANDSHAKE


def test_bad_magic_is_fatal() -> None:
    server = P.ProtocolConnection(P.Role.SERVER)
    server.receive_data(P.encode_frame(P.Command.HANDSHAKE, 0, 1, 0, b"HTTP\x01\x00\x00\x00"))
    ev = server.next_event()
    assert isinstance(ev, P.InvalidRequest) and ev.fatal
    assert ev.error.code == P.ErrorCode.UNSUPPORTED_VERSION


def test_unknown_command_and_malformed_payload_keep_the_connection() -> None:
    _, server = handshaken_pair()
    server.receive_data(P.encode_frame(999, 0, 5, 0, b"xyz"))
    server.receive_data(P.encode_frame(P.Command.FETCH, 0, 6, 0, b"\x01"))
    server.receive_data(P.encode_frame(P.Command.PING, 0, 7, 0))
    evs = [server.next_event() for _ in range(3)]
    assert isinstance(evs[0], P.InvalidRequest) and evs[0].error.code == P.ErrorCode.UNKNOWN_COMMAND
    assert isinstance(evs[1], P.InvalidRequest) and evs[1].error.code == P.ErrorCode.MALFORMED_PAYLOAD
    assert isinstance(evs[2], P.Request) and evs[2].correlation_id == 7
    assert server.state is P.State.READY


def test_oversized_frame_is_refused_from_its_header_alone() -> None:
    server = P.ProtocolConnection(P.Role.SERVER, max_frame_size=1024)
    header = P.FRAME_HEADER.pack(10_000_000, P.Command.PUBLISH, 0, 42, 0)  # type: ignore[attr-defined]
    server.receive_data(header)  # no body at all: refused before buffering it
    with pytest.raises(P.RemoteProtocolError) as info:
        server.next_event()
    assert info.value.code == P.ErrorCode.FRAME_TOO_LARGE
    assert info.value.correlation_id == 42  # type: ignore[attr-defined]
    assert server.state is P.State.ERROR
    with pytest.raises(P.RemoteProtocolError):
        server.receive_data(b"more")


def test_undelimitable_frame_is_fatal() -> None:
    server = P.ProtocolConnection(P.Role.SERVER)
    server.receive_data(P.FRAME_HEADER.pack(3, 1, 0, 0, 0))  # type: ignore[attr-defined]
    with pytest.raises(P.RemoteProtocolError) as info:
        server.next_event()
    assert info.value.code == P.ErrorCode.MALFORMED_FRAME


def test_client_side_errors_and_pushes() -> None:
    client, server = handshaken_pair()
    frame = server.send_error(3, P.Command.GET_STREAM, P.StreamNotFoundError("no stream 'x'"))  # type: ignore[attr-defined]
    frame += server.send_push(P.PushKind.GOODBYE, b"bye", int(P.ErrorCode.SHUTTING_DOWN))
    evs = feed_bytewise(client, frame)
    assert isinstance(evs[0], P.ErrorResponse) and isinstance(evs[0].error, P.StreamNotFoundError)  # type: ignore[attr-defined]
    assert evs[0].error.message == "no stream 'x'"
    assert isinstance(evs[1], P.Push) and evs[1].value == P.Goodbye("bye") and evs[1].status == P.ErrorCode.SHUTTING_DOWN


def test_local_misuse_is_a_local_error() -> None:
    client = P.ProtocolConnection(P.Role.CLIENT)
    with pytest.raises(P.LocalProtocolError):
        client.send_request(1, P.Ping())
    server = P.ProtocolConnection(P.Role.SERVER)
    with pytest.raises(P.LocalProtocolError):
        server.send_request(1, P.Ping())
    with pytest.raises(TypeError):
        P.ProtocolError("abstract")


def test_error_classes_cover_every_code() -> None:
    for code in P.ErrorCode:
        if code is P.ErrorCode.OK:
            continue
        err = P.BrokerError.from_code(int(code), "m")
        assert type(err).code is code and err.message == "m"
        assert str(err) == f"m ({code.name} {int(code)})"
    unknown = P.BrokerError.from_code(65000, "from the future")
    assert isinstance(unknown, P.UnknownBrokerError) and unknown.raw_code == 65000
