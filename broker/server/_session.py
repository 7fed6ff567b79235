"""One binary-protocol connection: the protocol object, the handshake, and the read
loop that turns requests into handler calls.

The session *has* a :class:`broker.net.Transport` (the stream, the output queues,
the writer task, the lifecycle and its table, the ending); the NATS session has
one too. Handlers get the session (``_dispatch.Requester``) and answer through it.

The read loop (:meth:`Session._read_loop`) reads top to bottom: read, feed the
protocol object, handle what the read completed, send the answers. Every request
comes in one way, :meth:`Session._take`, as one of three things: a run of
consecutive PUBLISH requests (one batch for the publish path), a run of
consecutive KV_GET requests (answered as one write), or one event of
``ProtocolConnection.next_event``. Responses go out at once or once the group
commit has made the epoch the handler returned durable (``Transport.send_durable``),
so pipelined requests get coalesced responses. Responses may leave in a different
order than their requests; correlation ids match them up.

Opening: the first frame must be a HANDSHAKE, within ``limits.handshake_timeout``.
Any other request before it is answered with HANDSHAKE_REQUIRED (UNKNOWN_COMMAND for
an unknown code) and the connection closed; a frame before the handshake may not be
larger than :data:`MAX_HANDSHAKE_FRAME`. A refused handshake is answered after the
delay ``FailureThrottle`` gives (logged at warning with the peer address); a
connection that does not handshake in time gets a GOODBYE (HANDSHAKE_TIMEOUT). Until
its handshake a session is in ``guard.waiting``, where a new connection arriving at
the connection limit may evict it (``Transport.evict``). A TLS client on a port
without TLS (its first bytes are a TLS handshake record) is closed at once, counted
in ``tls_handshake_failures`` and logged at warning, rate-limited per host. On a TLS
port the stream is a ``trio.SSLStream`` whose TLS handshake ``broker.net`` completed.

Memory: when more than ``max_pending_bytes_per_connection`` is queued, or the
broker's output budget is spent, the reader handles no further request until there
is room, and deliveries to the connection are dropped and counted (core
subscriptions are at most once). The watch in ``broker.net`` cuts off slow
consumers.

Error handling: whatever the peer does, only this connection ends. Bytes that break
the framing get an error and a GOODBYE; a handler that raises a BrokerError gets
that error as its response; any other exception is logged and answered with
INTERNAL_ERROR, and the connection carries on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio

from broker.core import Broker, get_logger
from broker.core import info as server_info
from broker.kv import kv_get_frames
from broker.net import GOODBYE_SECONDS, SHORT_READ, ConnectionGuard, Reading, Transport
from protocol import (
    NEED_DATA,
    PROTOCOL_VERSION,
    BrokerError,
    Command,
    ErrorCode,
    Event,
    Handshake,
    HandshakeOk,
    InvalidRequest,
    KvGet,
    ProtocolConnection,
    Publish,
    PushKind,
    RemoteProtocolError,
    Request,
    Role,
    error_class,
)

from ._permissions import check_command

if TYPE_CHECKING:
    from ._dispatch import Dispatch, Handler
    from ._subscriptions import Subscription

__all__ = ["Session"]

log = get_logger(__name__)

#: Largest frame accepted before the handshake. A handshake is at most 1,046 bytes
#: (16 header, 4 magic, 2 version, four str8 of at most 256).
MAX_HANDSHAKE_FRAME = 1100
#: Bytes of consecutive PUBLISH requests handled as one batch before their acks are
#: let out (:meth:`Session._release_acks`), when one read delivered more.
PUBLISH_RUN_BYTES = 32 * 1024
#: Bytes of answers queued in the middle of a read that are sent before the rest of
#: the read is handled: a client that pipelines (500 KV gets in flight) gets the first
#: answers and sends more requests while the broker handles the rest, instead of the
#: two taking turns a whole read at a time.
SEND_EARLY = 16 * 1024
#: Consecutive KV_GET requests taken out of a read at a time and answered as one
#: run (:meth:`Session._kv_get_run`, which looks at :data:`SEND_EARLY` and the output
#: limits after each :data:`SEND_EARLY` bytes of answers).
KV_GET_RUN = 32
_KV_GET = int(Command.KV_GET)
#: How a TLS connection starts (a handshake record, TLS 1.x); no frame before the
#: handshake can start so (its length would be over MAX_HANDSHAKE_FRAME).
TLS_RECORD_START = b"\x16\x03"

#: What :meth:`Session._take` gives: an event of ``next_event`` (NEED_DATA when the
#: read is used up), a run of PUBLISH requests, the same after
#: :data:`PUBLISH_RUN_BYTES` with more of the read to come, a run of KV_GET requests.
_EVENT, _PUBLISHES, _LONG_PUBLISHES, _KV_GETS = range(4)


def _publish_request(request: tuple[int, bytes, int]) -> Request:
    """A PUBLISH request taken out of a read (``ProtocolConnection.take_publish``)
    as the event ``next_event`` would have made of it."""
    corr, payload, count = request
    return Request(corr, Publish(count, payload))


class Session:
    """See the module docstring. (A little over the usual size: the read loop's
    runs of publishes and KV gets, each answered as its requests would be one by
    one, are its own.)"""

    def __init__(
        self,
        broker: Broker,
        stream: trio.abc.Stream,
        session_id: int,
        peer: str,
        guard: ConnectionGuard,
        dispatch: Dispatch,
    ) -> None:
        self.broker = broker
        self.id = session_id
        self.peer = peer
        self.dispatch = dispatch
        self.conn = ProtocolConnection(Role.SERVER, broker.config.limits.max_frame_bytes)
        self.transport = t = Transport(broker, stream, session_id, peer, guard, self, "ttlbroker")
        # What handlers call most, bound once (no forwarding call per frame).
        self.send_now = t.send_now
        self.send_durable = t.send_durable
        self.accepts_pushes = t.accepts_pushes
        self.has_room = t.has_room
        self.subs: dict[int, Subscription] = {}
        #: Waiting pulls and consumer-group memberships (``broker.consumers``).
        self.pulls: set[Any] = set()
        self.members: dict[Any, Any] = {}
        #: The correlation id of the request being handled (a pull answered later).
        self.corr = 0
        self.client_name = ""
        #: Who the client is, and what it may do (None: everything): ``broker.auth``.
        self.user = ""
        self.perms: Any = None

    # -- what the transport and the broker call ------------------------------------------

    async def run(self) -> None:
        """Serve the connection until it ends (``Transport.run``)."""
        await self.transport.run(self._read_loop)

    @property
    def closing(self) -> bool:
        """The connection is ending (it handles no more requests, takes no pushes)."""
        return self.transport.closing

    def goodbye_frame(self, code: ErrorCode, reason: str) -> bytes:
        return self.conn.send_push(PushKind.GOODBYE, reason.encode(), int(code))

    def on_sync(self) -> None:
        self.transport.on_sync()

    def closed(self) -> None:
        """The connection ended: what it held in the broker goes (its subscriptions,
        waiting pulls and memberships)."""
        self.dispatch.session_closed(self)

    def push(self, kind: PushKind, payload: bytes) -> bool:
        """Queue a push; False (and nothing queued) when the connection is backed up
        or the output budget has no room for it."""
        if not self.has_room(len(payload) + 16):
            return False
        self.send_now(self.conn.send_push(kind, payload))
        return True

    def push_pull(self, corr: int, payload: bytes) -> None:
        """Messages for a waiting pull: never dropped (they are outstanding, and a
        pull is a request), so they are queued like a response."""
        self.send_now(self.conn.send_push(PushKind.PULL_MESSAGES, payload, correlation_id=corr))

    # -- the read loop -------------------------------------------------------------------

    def _partial(self) -> int:
        return self.conn.buffered

    async def _read_loop(self) -> None:
        """Read, handle what the read completed, send its answers; until the
        connection ends."""
        t = self.transport
        conn = self.conn
        committer = self.broker.committer
        while True:
            if t.closing:
                return  # ended while the reader was writing
            if t.full():
                await t.wait_room()
            data = await t.read(self._partial)
            if data is None:
                return
            if t.awaiting_handshake and data[:2] == TLS_RECORD_START and not conn.buffered:
                self._tls_on_plain_port()
                return
            conn.receive_data(data)
            t.reading = Reading.HANDLING
            try:
                if not await self._handle_read():
                    return
            finally:
                t.reading = Reading.RECEIVING
            if t.awaiting_handshake and conn.buffered > MAX_HANDSHAKE_FRAME:
                self._refuse_large_first_frame()
                return
            await t.send_answers()
            if len(data) < SHORT_READ and t.has_durable():
                # One request (or a few) whose answers wait for a sync: its client
                # sends nothing more before them.
                committer.sync_if_idle()

    def _take(self) -> tuple[int, Any]:
        """The next thing to handle of what the reads brought, in order: a run of
        PUBLISH requests (``(correlation id, payload, message count)`` each, taken out
        of the read without an event each; a long one is given when it reaches
        :data:`PUBLISH_RUN_BYTES` with more of the read to come), a run of KV_GET
        requests (``(correlation id, payload)`` each), or the next event (NEED_DATA:
        nothing more). Both kinds of run exist only once the handshake is done.

        Raises:
            RemoteProtocolError: the bytes broke the framing.
        """
        conn = self.conn
        taken = conn.take_publish()
        if taken is not None:
            run = [taken]
            size = len(taken[1])
            while True:
                if size >= PUBLISH_RUN_BYTES and conn.buffered:
                    return _LONG_PUBLISHES, run
                taken = conn.take_publish()
                if taken is None:
                    return _PUBLISHES, run
                run.append(taken)
                size += len(taken[1])
        gets = conn.take_requests(_KV_GET, KV_GET_RUN)
        if gets:
            return _KV_GETS, gets
        return _EVENT, conn.next_event()

    async def _handle_read(self) -> bool:
        """Handle, in order, every request the reads so far completed (from
        :meth:`_take`); after each, send early what passed :data:`SEND_EARLY`, and
        wait while over the output limits. False: the connection is ending."""
        t = self.transport
        broker = self.broker
        sync_handlers = self.dispatch.sync
        while True:
            try:
                kind, item = self._take()
            except RemoteProtocolError as err:
                self._protocol_error(err)
                return False
            if kind == _EVENT:
                if item is NEED_DATA:
                    return True
                handler = sync_handlers.get(item.command.__class__) if item.__class__ is Request else None
                if handler is not None and not t.awaiting_handshake and not broker.shutting_down:
                    self._handle_now(item, handler)  # no coroutine: most requests
                else:
                    await self._event(item)
            elif kind == _KV_GETS:
                if await self._kv_get_run(item):
                    return False
                continue  # (the run looked at the limits itself)
            else:
                await self._publish_run(item)
                if kind == _LONG_PUBLISHES:
                    await self._release_acks()
            if t.now_bytes >= SEND_EARLY:
                t.send_nowait()
            if t.stopped_or_full() and await t.ending():
                return False

    async def _event(self, event: Event) -> None:
        """An event a synchronous handler does not take: the handshake, a request
        with an asynchronous handler (or any while the broker shuts down), or a
        request refused by the protocol."""
        if self.transport.awaiting_handshake:
            assert isinstance(event, (Request, InvalidRequest)), event
            await self._open(event)
        elif isinstance(event, Request):
            await self._handle(event)
        else:
            assert isinstance(event, InvalidRequest), event
            self._refuse(event)

    # -- opening -------------------------------------------------------------------------

    async def _open(self, event: Request | InvalidRequest) -> None:
        """The first frame: a handshake, or the end of the connection."""
        t = self.transport
        corr = event.correlation_id
        if isinstance(event, InvalidRequest):
            if event.code == Command.HANDSHAKE:  # a handshake that cannot be decoded
                await self._refuse_handshake(corr, event.error)
                return
            self.broker.counters.request_errors += 1
            log.debug("request_before_handshake", session=self.id, peer=self.peer, code=event.code)
            t.fail(self.conn.send_error(corr, event.code, event.error), "request_before_handshake")
            return
        cmd = event.command
        assert isinstance(cmd, Handshake), cmd
        broker = self.broker
        if broker.shutting_down:
            self.send_now(self.conn.send_error(corr, Command.HANDSHAKE, error_class(ErrorCode.SHUTTING_DOWN)("the broker is shutting down")))
            t.end_as("shutdown")
            return
        if cmd.version != PROTOCOL_VERSION:
            await self._refuse_handshake(corr, error_class(ErrorCode.UNSUPPORTED_VERSION)(
                f"this broker speaks protocol version {PROTOCOL_VERSION}, the client asked for {cmd.version}"
            ))
            return
        auth = broker.auth
        identity = await auth.check(user=cmd.user, password=cmd.password, token=cmd.token)
        if identity is None:
            if auth.users:
                what = f"user {cmd.user!r}: unknown, or the password is wrong" if cmd.user else "a user and password are required"
            else:
                what = "the auth token is missing or wrong"
            await self._refuse_handshake(corr, error_class(ErrorCode.UNAUTHORIZED)(what))
            return
        self.user = identity.user
        self.perms = identity.permissions
        t.opened()
        self.client_name = cmd.client_name
        info = server_info(broker)
        info["session_id"] = self.id
        self.send_now(self.conn.send_raw_response(corr, Command.HANDSHAKE, HandshakeOk(PROTOCOL_VERSION, info).encode()))

    async def _refuse_handshake(self, corr: int, err: BrokerError) -> None:
        """Answer a failed handshake after the throttle's delay, then close
        (``Transport.refuse``)."""
        await self.transport.refuse(err, self.conn.send_error(corr, Command.HANDSHAKE, err))

    def _tls_on_plain_port(self) -> None:
        """The first bytes are a TLS handshake: close (the client cannot read a plain
        GOODBYE), count and log it (at most one line per host per 10 s)."""
        t = self.transport
        self.broker.counters.tls_handshake_failures += 1
        suppressed = t.guard.log_limit.allow(t.peer_host, trio.current_time())
        if suppressed is not None:
            log.warning(
                "tls_handshake_failed", session=self.id, peer=self.peer, reason="TLS_ON_PLAIN_PORT",
                error="a TLS client on a port without TLS (the broker has no [server] tls_cert)", suppressed=suppressed,
            )
        t.end_as("tls_on_plain_port")

    def _refuse_large_first_frame(self) -> None:
        err = error_class(ErrorCode.FRAME_TOO_LARGE)(
            f"a frame before the handshake may be at most {MAX_HANDSHAKE_FRAME} bytes"
        )
        self.broker.counters.request_errors += 1
        log.debug("protocol_error", session=self.id, peer=self.peer, code=err.code.name, error=err.message)
        t = self.transport
        t.goodbye(err.code, err.message)
        t.end_as("protocol_error")
        t.drain_seconds = GOODBYE_SECONDS

    # -- requests ------------------------------------------------------------------------

    def _handle_now(self, event: Request, handler: Handler) -> None:
        """Handle a request whose handler is synchronous (most are), and queue its
        answer: no coroutine, no checkpoint."""
        cmd = event.command
        corr = self.corr = event.correlation_id
        try:
            if self.perms is not None:
                check_command(self.broker, self.perms, cmd)
            result = handler(self, cmd)
        except Exception as exc:
            self._failed([corr], cmd.CODE, exc)
            return
        self._answer(corr, cmd, result)

    async def _handle(self, event: Request) -> None:
        """A request: its synchronous handler, or its asynchronous one awaited (not
        interrupted by an ending: the reader stops after it)."""
        broker = self.broker
        cmd = event.command
        dispatch = self.dispatch
        handler = dispatch.sync.get(cmd.__class__)
        if handler is not None and not broker.shutting_down:
            self._handle_now(event, handler)
            return
        corr = event.correlation_id
        try:
            if broker.shutting_down:
                raise error_class(ErrorCode.SHUTTING_DOWN)("the broker is shutting down")
            if self.perms is not None:
                check_command(broker, self.perms, cmd)
            self.corr = corr
            t = self.transport
            reading, t.reading = t.reading, Reading.IN_HANDLER
            try:
                result = await dispatch.async_[cmd.__class__](self, cmd)
            finally:
                t.reading = reading
            if t.closing:
                return  # cut off meanwhile: its GOODBYE is the last frame
        except trio.Cancelled:
            raise
        except Exception as exc:
            self._failed([corr], cmd.CODE, exc)
            return
        self._answer(corr, cmd, result)

    def _answer(self, corr: int, cmd: Any, result: Any) -> None:
        """Queue what a handler returned: nothing (None, or a publish without acks),
        a payload to send now, or ``(payload, epoch)`` to send once ``epoch`` is
        durable."""
        code = cmd.CODE
        if result is None or (code == Command.PUBLISH and cmd.no_ack):
            return  # no response (a no-ack publish or ack), or one sent later (a pull)
        if result.__class__ is tuple:
            payload, epoch = result
            frame = self.conn.send_raw_response(corr, code, payload)
            committer = self.broker.committer
            if committer.acks_wait and epoch > committer.synced:
                self.send_durable(epoch, frame)
                return
            self.send_now(frame)
        else:
            self.send_now(self.conn.send_raw_response(corr, code, result))

    async def _publish_run(self, requests: list[tuple[int, bytes, int]]) -> None:
        """Consecutive PUBLISH requests from what one read delivered (see
        :meth:`_publish_now`)."""
        if not self._publish_now(requests):
            for request in requests:
                await self._handle(_publish_request(request))

    async def _kv_get_run(self, requests: list[tuple[int, bytes]]) -> bool:
        """Consecutive KV_GET requests from what one read delivered (``(correlation
        id, payload)``: ``ProtocolConnection.take_requests``), answered in order,
        each as it would be alone: stretches of them by ``broker.kv.kv_get_frames``
        (queued as one write each), a handler's error by :meth:`_failed`, and a
        request the run leaves to the ordinary path (a malformed payload, a bucket
        that refreshes keys on read) as the event ``next_event`` would have made of
        it; all of them the ordinary way while the broker shuts down. After each
        stretch (at most :data:`SEND_EARLY` bytes of answers, and one more) and each
        request on its own, what the read loop does after a request: send early,
        and wait while over the output limits. True: the connection is ending."""
        broker = self.broker
        t = self.transport
        handler = self.dispatch.sync[KvGet]
        n = len(requests)
        i = 0
        while i < n:
            if broker.shutting_down or self.perms is not None:
                self._kv_get_alone(requests[i], handler, None)
                i += 1
            else:
                frames, size, i, exc = kv_get_frames(self.dispatch.kv, requests, i, SEND_EARLY)
                if frames:
                    self.corr = requests[i - 1][0]
                    self.send_now(frames[0] if len(frames) == 1 else b"".join(frames))
                if i < n and (exc is not None or size < SEND_EARLY):
                    self._kv_get_alone(requests[i], handler, exc)
                    i += 1
            if t.now_bytes >= SEND_EARLY:
                t.send_nowait()
            if t.stopped_or_full() and await t.ending():
                return True
        return False

    def _kv_get_alone(self, request: tuple[int, bytes], handler: Handler, exc: Exception | None) -> None:
        """One KV_GET request of a run answered as the read loop answers it: the
        error its handler raised in the run (``exc``), or else the event
        ``next_event`` would have made of it, refused or handled (or refused while
        the broker shuts down, as :meth:`_handle` does)."""
        corr, payload = request
        if exc is not None:
            self.corr = corr
            self._failed([corr], _KV_GET, exc)
            return
        event = self.conn.request_event(_KV_GET, corr, payload)
        if not isinstance(event, Request):
            assert isinstance(event, InvalidRequest), event
            self._refuse(event)
        elif self.broker.shutting_down:
            self._failed([corr], _KV_GET, error_class(ErrorCode.SHUTTING_DOWN)("the broker is shutting down"))
        else:
            self._handle_now(event, handler)

    async def _release_acks(self) -> None:
        """After a run of :data:`PUBLISH_RUN_BYTES` in the middle of a read: send its
        acks now if they may go, or let the group commit sync it first (a
        checkpoint: the committer runs, and ``on_sync`` sends them). So a client
        that pipelines gets the acks of a read's first requests while the broker
        handles the rest of it, and can send more meanwhile, instead of the two
        taking turns a whole read at a time.

        Not on a slow disk (its last sync went to the sync thread): a sync of the
        run alone would make the rest of the read wait for the one after it, and the
        whole read goes with one sync instead."""
        t = self.transport
        if t.has_queued():
            t.send_nowait()
        if t.has_durable():
            committer = self.broker.committer
            if committer.slow_disk:
                return
            epoch = committer.epoch
            await trio.lowlevel.checkpoint()
            if committer.epoch == epoch:
                # trio may have run this task first: the committer, runnable since the
                # run's write, takes its step before our second one (unless it is in
                # a sync already, which the run then follows).
                await trio.lowlevel.checkpoint()
            t.unchecked_bytes = 0

    def _publish_now(self, requests: list[tuple[int, bytes, int]]) -> bool:
        """Consecutive PUBLISH requests from what one read delivered (``(correlation
        id, payload, message count)``: ``ProtocolConnection.take_publish``): one
        batch for the broker (one append, one group-commit epoch) and their acks
        queued as one write (``Publisher.publish_frames``); one alone goes
        straight to its handler. False when they must go one at a time through :meth:`_handle` (the
        broker is shutting down, or says they cannot be joined: a malformed one
        among them, or a compare-and-set, rollup or de-duplication header)."""
        broker = self.broker
        if broker.shutting_down or self.perms is not None:
            return False  # (with permissions: each request checked on its own)
        if len(requests) == 1:
            handler = self.dispatch.sync.get(Publish)
            if handler is None:
                return False
            self._handle_now(_publish_request(requests[0]), handler)
            return True
        self.corr = requests[-1][0]
        try:
            replies = broker.publisher.publish_frames(self, requests)
        except Exception as exc:
            self._failed([corr for corr, _, _ in requests], Command.PUBLISH, exc)
            return True
        if replies is None:
            return False
        frames, epoch = replies
        committer = broker.committer
        if epoch and committer.acks_wait and epoch > committer.synced:
            self.send_durable(epoch, frames)
        else:
            self.send_now(frames)
        return True

    def _failed(self, corrs: list[int], code: int, exc: Exception) -> None:
        """A handler raised: a BrokerError is the answer to each request; anything
        else is a bug, logged, that costs these requests (INTERNAL_ERROR), not the
        server."""
        broker = self.broker
        broker.counters.request_errors += len(corrs)
        if isinstance(exc, BrokerError):
            err = exc
        else:
            log.error("handler_failed", exc_info=True, command=Command(code).name, session=self.id)
            err = error_class(ErrorCode.INTERNAL_ERROR)(f"internal error in {Command(code).name}: {type(exc).__name__}: {exc}")
        for corr in corrs:
            self.send_now(self.conn.send_error(corr, code, err))

    def _refuse(self, event: InvalidRequest) -> None:
        self.broker.counters.request_errors += 1
        self.send_now(self.conn.send_error(event.correlation_id, event.code, event.error))

    def _protocol_error(self, err: RemoteProtocolError) -> None:
        self.broker.counters.request_errors += 1
        log.debug("protocol_error", session=self.id, peer=self.peer, code=err.code.name, error=str(err))
        self.send_now(self.conn.send_error(err.correlation_id, err.frame_code, err))
        t = self.transport
        t.goodbye(err.code, str(err))
        t.end_as("protocol_error")
        t.drain_seconds = GOODBYE_SECONDS
