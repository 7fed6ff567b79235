"""One side of a ttlbroker connection, sans-IO (after h11's ``Connection``).

Feed it the bytes you receive (:meth:`ProtocolConnection.receive_data`), take typed
events out (:meth:`ProtocolConnection.next_event`), and get the bytes to send from
the ``send_*`` methods. It never touches a socket, a clock or a thread.

Error handling: a frame that cannot be delimited raises :class:`RemoteProtocolError`
from ``next_event`` and moves the connection to ERROR. A frame that is delimited but
wrong (unknown command, malformed payload, command before handshake) is not fatal:
the server side gets an :class:`InvalidRequest` event to answer with an error, and
the connection carries on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from ._codes import Command, PushKind
from ._base import _Request, _Response
from ._commands import COMMAND_TYPES, Handshake
from ._consumers import PullBatch, PulledMessage
from ._errors import BrokerError, ErrorCode, LocalProtocolError, RemoteProtocolError, error_class
from ._frames import DEFAULT_MAX_FRAME_SIZE, FLAG_PUSH, FLAG_RESPONSE, FrameDecoder, encode_frame
from ._responses import PUSH_TYPES, RESPONSE_TYPES, HandshakeOk
from ._state import Role, State, command_allowed, transition

__all__ = [
    "ProtocolConnection",
    "Role",
    "State",
    "NEED_DATA",
    "Request",
    "InvalidRequest",
    "Response",
    "ErrorResponse",
    "Push",
    "Event",
]


class _NeedData:
    def __repr__(self) -> str:
        return "NEED_DATA"


#: Returned by ``next_event`` when no complete frame is buffered.
NEED_DATA = _NeedData()


@dataclass(slots=True)
class Request:
    """A decoded request (server side). Not frozen: one is made per request, and a
    frozen dataclass costs three times as much to make."""

    correlation_id: int
    command: _Request


@dataclass(frozen=True, slots=True)
class InvalidRequest:
    """A delimited request the server must refuse with ``error`` (server side).

    ``fatal`` is True when the connection must be closed after the answer (a refused
    handshake).
    """

    correlation_id: int
    code: int
    error: BrokerError
    fatal: bool = False


@dataclass(frozen=True, slots=True)
class Response:
    """A successful response (client side)."""

    correlation_id: int
    code: int
    result: _Response


@dataclass(frozen=True, slots=True)
class ErrorResponse:
    """An error response (client side)."""

    correlation_id: int
    code: int
    error: BrokerError


@dataclass(frozen=True, slots=True)
class Push:
    """A frame the broker sent unasked (client side)."""

    kind: int
    value: _Response
    status: int = 0
    #: The request a push belongs to (a PULL's, for PULL_MESSAGES), else 0.
    correlation_id: int = 0


Event = Union[Request, InvalidRequest, Response, ErrorResponse, Push, _NeedData]


class ProtocolConnection:
    """The protocol state of one connection, for one role.

    Args:
        role: ``Role.CLIENT`` or ``Role.SERVER``.
        max_frame_size: the largest frame accepted from the peer, header included.
    """

    def __init__(self, role: Role, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self.role = role
        self.state = State.AWAIT_HANDSHAKE
        self._decoder = FrameDecoder(max_frame_size)
        self.peer_version: int | None = None
        #: Client side: the :class:`PulledMessage` subclass pulled batches decode into
        #: (a client's, with methods to settle each message).
        self.pulled_class: type[PulledMessage] | None = None

    # -- receiving -----------------------------------------------------------------

    @property
    def buffered(self) -> int:
        """Bytes received and not yet taken out as frames (a frame in part, at the
        peer's end, means the peer closed mid-frame)."""
        return self._decoder.buffered

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        if self.state is State.ERROR:
            raise RemoteProtocolError("the connection is in ERROR after a protocol error")
        self._decoder.feed(data)

    def next_event(self) -> Event:
        """The next event, or NEED_DATA.

        Raises:
            RemoteProtocolError: the peer broke the framing; the connection is now in
                ERROR. The error's ``correlation_id`` attribute names the frame.
        """
        try:
            frame = self._decoder.next_frame()
        except RemoteProtocolError:
            self.state = transition(self.role, self.state, "protocol_error")
            raise
        if frame is None:
            return NEED_DATA
        code, flags, corr, status, payload = frame
        if self.role is Role.SERVER:
            return self._server_event(code, flags, corr, payload)
        return self._client_event(code, flags, corr, status, payload)

    def take_publish(self) -> tuple[int, bytes, int] | None:
        """Server side, once the handshake is done: the next frame taken out if it is
        a PUBLISH request that wants acks (``FrameDecoder.take_publish``: its
        correlation id, payload and message count), the same request
        :meth:`next_event` would give as ``Request(corr, Publish(count, payload))``.
        None: anything else (call :meth:`next_event`)."""
        if self.state is not State.READY:
            return None
        return self._decoder.take_publish()

    def take_requests(self, code: int, limit: int) -> list[tuple[int, bytes]]:
        """Server side, once the handshake is done: up to ``limit`` frames taken out
        while they are requests of command ``code`` (``FrameDecoder.take_requests``:
        correlation id and payload each), in order; empty when the next frame is
        anything else (call :meth:`next_event`). Each one is the event
        :meth:`request_event` makes of it, the one :meth:`next_event` would have
        given; ``code`` must be a command other than the handshake."""
        if self.state is not State.READY:
            return []
        return self._decoder.take_requests(code, limit)

    def request_event(self, code: int, correlation_id: int, payload: bytes) -> Event:
        """Server side: the event :meth:`next_event` gives for a request frame of
        ``code`` with this id and payload that :meth:`take_requests` took out (a
        :class:`Request`, or the :class:`InvalidRequest` refusing it)."""
        return self._server_event(code, 0, correlation_id, payload)

    def _server_event(self, code: int, flags: int, corr: int, payload: bytes) -> Event:
        if flags:
            return self._protocol_error(f"a client may not send frames with flags {flags:#x}", corr)
        cls = COMMAND_TYPES.get(code)
        if cls is None:
            return InvalidRequest(corr, code, error_class(ErrorCode.UNKNOWN_COMMAND)(f"unknown command code {code}"))
        # READY takes every command but the handshake: no table look-up for those.
        if (self.state is not State.READY or code == Command.HANDSHAKE) and not command_allowed(self.state, code):
            if self.state is State.AWAIT_HANDSHAKE:
                err = error_class(ErrorCode.HANDSHAKE_REQUIRED)(f"{Command(code).name} sent before the handshake")
            else:
                err = error_class(ErrorCode.MALFORMED_PAYLOAD)("the handshake was already done on this connection")
            return InvalidRequest(corr, code, err)
        try:
            command = cls.decode(payload)
        except BrokerError as refused:
            return InvalidRequest(corr, code, refused, fatal=code == Command.HANDSHAKE)
        except Exception as exc:  # a decoder bug must not take the server down
            bug = error_class(ErrorCode.MALFORMED_PAYLOAD)(f"{Command(code).name}: cannot decode payload ({exc})")
            return InvalidRequest(corr, code, bug, fatal=code == Command.HANDSHAKE)
        if code == Command.HANDSHAKE:
            assert isinstance(command, Handshake)
            self.peer_version = command.version
        return Request(corr, command)

    def _protocol_error(self, message: str, corr: int) -> Event:
        self.state = transition(self.role, self.state, "protocol_error")
        err = RemoteProtocolError(message, ErrorCode.MALFORMED_FRAME)
        err.correlation_id = corr
        raise err

    def _client_event(self, code: int, flags: int, corr: int, status: int, payload: bytes) -> Event:
        if flags & FLAG_PUSH:
            cls = PUSH_TYPES.get(code)
            if cls is None:
                return self._protocol_error(f"unknown push kind {code}", corr)
            try:
                if cls is PullBatch:
                    return Push(code, PullBatch.decode(payload, self.pulled_class), status, corr)
                return Push(code, cls.decode(payload), status, corr)
            except BrokerError as err:
                return self._protocol_error(f"malformed {PushKind(code).name} push: {err.message}", corr)
        if not flags & FLAG_RESPONSE:
            return self._protocol_error("the broker sent a frame that is neither a response nor a push", corr)
        if status:
            error = BrokerError.from_code(status, payload.decode(errors="replace"))
            if code == Command.HANDSHAKE and self.state is State.HANDSHAKE_SENT:
                self.state = transition(self.role, self.state, "handshake_refused")
            return ErrorResponse(corr, code, error)
        cls = RESPONSE_TYPES.get(code)
        if cls is None:
            return self._protocol_error(f"response to unknown command code {code}", corr)
        try:
            result = PullBatch.decode(payload, self.pulled_class) if cls is PullBatch else cls.decode(payload)
        except BrokerError as err:
            return self._protocol_error(f"malformed response to {Command(code).name}: {err.message}", corr)
        if code == Command.HANDSHAKE and self.state is State.HANDSHAKE_SENT:
            assert isinstance(result, HandshakeOk)
            self.peer_version = result.version
            self.state = transition(self.role, self.state, "handshake_accepted")
        return Response(corr, code, result)

    # -- sending -------------------------------------------------------------------

    def send_request(self, correlation_id: int, command: _Request) -> bytes:
        """Client side: the frame for ``command``.

        Raises:
            LocalProtocolError: not a client, the connection is closed, or a command
                other than the handshake before the handshake.
        """
        if self.role is not Role.CLIENT:
            raise LocalProtocolError("only a client sends requests")
        if self.state in (State.CLOSED, State.ERROR):
            raise LocalProtocolError(f"the connection is {self.state.value}")
        if isinstance(command, Handshake):
            self.state = transition(self.role, self.state, "send_handshake")
        elif self.state is State.AWAIT_HANDSHAKE:
            raise LocalProtocolError("send the handshake first")
        return encode_frame(command.CODE, 0, correlation_id, 0, command.encode())

    def send_response(self, correlation_id: int, code: int, response: _Response) -> bytes:
        """Server side: a successful response to the request ``code``."""
        if code == Command.HANDSHAKE and self.state is State.AWAIT_HANDSHAKE:
            self.state = transition(self.role, self.state, "handshake_accepted")
        return encode_frame(code, FLAG_RESPONSE, correlation_id, 0, response.encode())

    def send_raw_response(self, correlation_id: int, code: int, payload: bytes) -> bytes:
        """Server side: a successful response whose payload is already encoded."""
        if code == Command.HANDSHAKE and self.state is State.AWAIT_HANDSHAKE:
            self.state = transition(self.role, self.state, "handshake_accepted")
        return encode_frame(code, FLAG_RESPONSE, correlation_id, 0, payload)

    def send_error(self, correlation_id: int, code: int, error: BrokerError | RemoteProtocolError) -> bytes:
        """Server side: an error response (status = the error's code)."""
        if code == Command.HANDSHAKE and self.state is State.AWAIT_HANDSHAKE:
            self.state = transition(self.role, self.state, "handshake_refused")
        message = error.message if isinstance(error, BrokerError) else str(error)
        return encode_frame(code & 0xFFFF, FLAG_RESPONSE, correlation_id & 0xFFFFFFFF, int(error.code), message.encode()[:65536])

    def send_push(self, kind: PushKind, payload: bytes, status: int = 0, correlation_id: int = 0) -> bytes:
        """Server side: a push frame with an already encoded payload (``correlation_id``:
        the request it belongs to, a PULL's for ``PULL_MESSAGES``)."""
        return encode_frame(kind, FLAG_PUSH, correlation_id, status, payload)

    def close(self) -> None:
        self.state = transition(self.role, self.state, "close")
