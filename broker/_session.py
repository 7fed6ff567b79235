"""One client connection: a reader task, a writer task, and the protocol object.

The reader turns bytes into requests (through ``protocol.ProtocolConnection``) and
runs each handler in order. Responses go into one of two queues: *now* (sent as soon
as the writer runs) or *durable* (sent once the group commit has made the epoch the
handler returned durable). The writer sends whatever is ready in one ``send_all``,
so pipelined requests get coalesced responses. Responses may therefore leave in a
different order than their requests; correlation ids match them up.

Backpressure: when more than ``max_pending_bytes_per_connection`` of responses and
deliveries wait to be sent (a client that stops reading), the reader stops reading
requests until the writer catches up, and further deliveries to the connection are
dropped and counted (core subscriptions are at most once).

Error handling: a frame that cannot be delimited gets an error response (with the
frame's correlation id) and a GOODBYE push, and closes this connection only. A
handler that raises a BrokerError gets that error as its response; any other
exception is logged and answered with INTERNAL_ERROR, and the connection carries on.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

import trio

from protocol import (
    NEED_DATA,
    PROTOCOL_VERSION,
    BrokerError,
    Command,
    ErrorCode,
    Handshake,
    HandshakeOk,
    InvalidRequest,
    ProtocolConnection,
    PushKind,
    RemoteProtocolError,
    Request,
    Role,
    error_class,
)

from ._log import get_logger

if TYPE_CHECKING:
    from ._broker import Broker
    from ._subscriptions import Subscription

__all__ = ["Session"]

log = get_logger(__name__)

RECEIVE_SIZE = 256 * 1024
#: How long a closing connection may take to send what is still queued.
DRAIN_SECONDS = 5.0


class Session:
    def __init__(self, broker: Broker, stream: trio.abc.Stream, session_id: int, peer: str) -> None:
        self.broker = broker
        self.stream = stream
        self.id = session_id
        self.peer = peer
        self.conn = ProtocolConnection(Role.SERVER, broker.config.limits.max_frame_bytes)
        self.subs: dict[int, Subscription] = {}
        self.client_name = ""
        self._now: list[bytes] = []
        self._durable: deque[tuple[int, bytes]] = deque()
        self.pending_bytes = 0
        self._limit = broker.config.limits.max_pending_bytes_per_connection
        self._wake = trio.Event()
        self._drained = trio.Event()
        self._closing = False
        self._sending = False
        self._handling = False

    # -- queues --------------------------------------------------------------------

    def kick(self) -> None:
        if not self._wake.is_set():
            self._wake.set()

    def send_now(self, frame: bytes) -> None:
        self._now.append(frame)
        self.pending_bytes += len(frame)
        if not self._handling:  # our own reader flushes what it queues itself
            self.kick()

    def send_durable(self, epoch: int, frame: bytes) -> None:
        self._durable.append((epoch, frame))
        self.pending_bytes += len(frame)
        self.kick()

    def push(self, kind: PushKind, payload: bytes) -> bool:
        """Queue a push; False (and nothing queued) when the connection is backed up."""
        if self.pending_bytes > self._limit or self._closing:
            return False
        self.send_now(self.conn.send_push(kind, payload))
        return True

    # -- tasks ---------------------------------------------------------------------

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._writer)
                try:
                    await self._reader()
                finally:
                    self._closing = True
                    self.kick()  # send what the reader queued before it stopped
                await self.drain()
                nursery.cancel_scope.cancel()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self.broker.drop_session(self)
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(self.stream)

    async def drain(self, seconds: float = DRAIN_SECONDS) -> None:
        """Wait (at most ``seconds``) until everything queued has been sent."""
        with trio.move_on_after(seconds):
            while self._now or self._durable:
                self._drained = trio.Event()
                await self._drained.wait()

    async def _reader(self) -> None:
        conn = self.conn
        receive = self.stream.receive_some
        while True:
            while self.pending_bytes > self._limit:
                self._drained = trio.Event()
                await self._drained.wait()
            try:
                data = await receive(RECEIVE_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            if not data:
                return
            conn.receive_data(data)
            self._handling = True
            try:
                while True:
                    try:
                        event = conn.next_event()
                    except RemoteProtocolError as err:
                        await self._protocol_error(err)
                        return
                    if event is NEED_DATA:
                        break
                    if event.__class__ is Request:
                        await self._handle(event)  # type: ignore[arg-type]
                    else:
                        assert isinstance(event, InvalidRequest)
                        self._refuse(event)
                    if self._closing:
                        return  # a refused handshake
            finally:
                self._handling = False
            if self._now:
                await self._send_ready()  # answer without waking the writer task
            if self._durable:
                self.kick()  # the writer waits for their sync

    async def _writer(self) -> None:
        """Sends what the reader did not: durable acks once their epoch is synced, and
        pushes queued by other connections' publishes."""
        committer = self.broker.committer
        while True:
            await self._send_ready()
            if self._durable:
                committer.watch(self)  # the next sync kicks us
            await self._wake.wait()
            self._wake = trio.Event()

    def _take_ready(self) -> list[bytes]:
        chunk = self._now
        self._now = []
        durable = self._durable
        if durable:
            synced = self.broker.committer.synced
            while durable and durable[0][0] <= synced:
                chunk.append(durable.popleft()[1])
        return chunk

    async def _send_ready(self) -> None:
        """Send every frame that may go now, in one write where possible. Only one
        task sends at a time; the other one returns at once (the sender loops)."""
        if self._sending:
            return
        self._sending = True
        try:
            while True:
                chunk = self._take_ready()
                if not chunk:
                    return
                data = b"".join(chunk) if len(chunk) > 1 else chunk[0]
                await self.stream.send_all(data)
                self.pending_bytes -= len(data)
                if self.pending_bytes <= self._limit or not (self._now or self._durable):
                    self._drained.set()
        finally:
            self._sending = False

    # -- requests ------------------------------------------------------------------

    async def _handle(self, event: Request) -> None:
        broker = self.broker
        cmd = event.command
        corr = event.correlation_id
        code = cmd.CODE
        try:
            if broker.shutting_down:
                raise error_class(ErrorCode.SHUTTING_DOWN)("the broker is shutting down")
            handler = broker.sync_handlers.get(cmd.__class__)
            if handler is not None:
                result: Any = handler(self, cmd)
            elif cmd.__class__ is Handshake:
                result = self._handshake(cmd)  # type: ignore[arg-type]
            else:
                result = await broker.async_handlers[cmd.__class__](self, cmd)
        except BrokerError as err:
            broker.counters.request_errors += 1
            self.send_now(self.conn.send_error(corr, code, err))
            if code == Command.HANDSHAKE:
                self._closing = True
            return
        except trio.Cancelled:
            raise
        except Exception as exc:  # a bug must cost one request, not the server
            broker.counters.request_errors += 1
            log.error("handler_failed", exc_info=True, command=Command(code).name, session=self.id)
            err = error_class(ErrorCode.INTERNAL_ERROR)(f"internal error in {Command(code).name}: {type(exc).__name__}: {exc}")
            self.send_now(self.conn.send_error(corr, code, err))
            return
        if code == Command.PUBLISH and cmd.no_ack:  # type: ignore[attr-defined]
            return
        if result.__class__ is tuple:
            payload, epoch = result
            frame = self.conn.send_raw_response(corr, code, payload)
            if broker.committer.acks_wait and epoch > broker.committer.synced:
                self.send_durable(epoch, frame)
                return
            self.send_now(frame)
        else:
            self.send_now(self.conn.send_raw_response(corr, code, result))

    def _handshake(self, cmd: Handshake) -> bytes:
        if cmd.version != PROTOCOL_VERSION:
            raise error_class(ErrorCode.UNSUPPORTED_VERSION)(
                f"this broker speaks protocol version {PROTOCOL_VERSION}, the client asked for {cmd.version}"
            )
        token = self.broker.config.server.auth_token
        if token and cmd.token != token:
            raise error_class(ErrorCode.UNAUTHORIZED)("the auth token is missing or wrong")
        self.client_name = cmd.client_name
        info = self.broker.info()
        info["session_id"] = self.id
        return HandshakeOk(PROTOCOL_VERSION, info).encode()

    def _refuse(self, event: InvalidRequest) -> None:
        self.broker.counters.request_errors += 1
        self.send_now(self.conn.send_error(event.correlation_id, event.code, event.error))
        if event.fatal:
            self._closing = True

    async def _protocol_error(self, err: RemoteProtocolError) -> None:
        self.broker.counters.request_errors += 1
        log.warning("protocol_error", session=self.id, peer=self.peer, code=err.code.name, error=str(err))
        corr = getattr(err, "correlation_id", 0)
        self.send_now(self.conn.send_error(corr, getattr(err, "frame_code", 0), err))
        self.send_now(self.conn.send_push(PushKind.GOODBYE, str(err).encode(), int(err.code)))
