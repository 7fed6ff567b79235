"""One client connection: a reader task, a writer task, and the protocol object.

The reader turns bytes into requests (through ``protocol.ProtocolConnection``) and
runs each handler in order. Responses go into one of two queues: *now* (sent as soon
as the writer runs) or *durable* (sent once the group commit has made the epoch the
handler returned durable). The writer sends whatever is ready, in writes of up to
:data:`WRITE_CHUNK` bytes of whole frames, so pipelined requests get coalesced
responses. Responses may therefore leave in a different order than their requests;
correlation ids match them up.

Opening: the first frame must be a HANDSHAKE, within ``limits.handshake_timeout``.
Any other request before it is answered with HANDSHAKE_REQUIRED (UNKNOWN_COMMAND for
an unknown code) and the connection closed; a frame before the handshake may not be
larger than :data:`MAX_HANDSHAKE_FRAME`. A refused handshake is answered after the
delay :class:`FailureThrottle` gives (logged at warning with the peer address); a
connection that does not handshake in time gets a GOODBYE (HANDSHAKE_TIMEOUT). Until
its handshake a session is in ``guard.waiting``, where a new connection arriving at
the connection limit may evict it (:meth:`Session.evict`). A TLS client on a port
without TLS (its first bytes are a TLS handshake record) is closed at once, counted
in ``tls_handshake_failures`` and logged at warning, rate-limited per host. On a TLS
port the stream is a ``trio.SSLStream`` whose TLS handshake ``_tls.py`` completed.

Memory: every queued byte is counted in ``pending_bytes`` and in the broker-wide
:class:`OutputBudget` until it is sent (``_limits.py`` has the rules). When more than
``max_pending_bytes_per_connection`` is queued, or the budget is spent, the reader
handles no further request until there is room, and deliveries to the connection are
dropped and counted (core subscriptions are at most once). The watch in
``_limits.py`` calls :meth:`Session.cut_off` on slow consumers.

Error handling: whatever the peer does, only this connection ends. Stream errors
(reset, broken pipe) and bytes that break the framing end it with a debug log line
and ``connections_failed``; :meth:`run` also catches, inside trio's exception groups,
anything else the connection's tasks raise (logged at error: a bug), and lets only
``trio.Cancelled`` and non-``Exception`` errors through. A handler that raises a
BrokerError gets that error as its response; any other exception is logged and
answered with INTERNAL_ERROR, and the connection carries on.
"""

from __future__ import annotations

import hmac
import math
import socket
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
    KvGet,
    ProtocolConnection,
    Publish,
    PushKind,
    RemoteProtocolError,
    Request,
    Role,
    error_class,
)

from broker.core import Broker, get_logger
from broker.core import info as server_info
from broker.kv import kv_get_frames
from broker.net import RECEIVE_SIZE, ConnectionGuard

if TYPE_CHECKING:
    from ._dispatch import Dispatch
    from ._subscriptions import Subscription

__all__ = ["Session"]

log = get_logger(__name__)

#: Largest frame accepted before the handshake. A handshake is at most 534 bytes
#: (16 header, 4 magic, 2 version, two str8 of at most 256).
MAX_HANDSHAKE_FRAME = 1024
#: How long a closing connection may take to send what is still queued.
DRAIN_SECONDS = 5.0
#: How long a connection the broker closes (GOODBYE) gets to take its last frames.
GOODBYE_SECONDS = 2.0
#: Bytes of whole frames joined into one write (a larger single frame goes alone).
WRITE_CHUNK = 1024 * 1024
#: Bytes of consecutive PUBLISH requests handled as one batch before their acks are
#: let out (:meth:`Session._release_acks`), when one read delivered more.
PUBLISH_RUN_BYTES = 32 * 1024
#: A read shorter than this held one request or a few: when their answers wait for
#: a sync, the client is waiting for them (``Committer.sync_if_idle``).
SHORT_READ = 4096
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

#: How each end of a connection is counted: reason -> counts as connections_failed.
_FAILED = {
    "closed": False,
    "shutdown": False,
    "slow_consumer": False,
    "evicted": False,
    "handshake_timeout": False,
    "unauthorized": False,
    "connection_lost": True,
    "closed_mid_frame": True,
    "protocol_error": True,
    "request_before_handshake": True,
    "handshake_refused": True,
    "tls_on_plain_port": False,  # counted in tls_handshake_failures
    "task_failed": True,
}


def _publish_request(request: tuple[int, bytes, int]) -> Request:
    """A PUBLISH request taken out of a read (``ProtocolConnection.take_publish``)
    as the event ``next_event`` would have made of it."""
    corr, payload, count = request
    return Request(corr, Publish(count, payload))


class Session:
    #: Which protocol it speaks (``net.Connection``).
    protocol = "ttlbroker"

    def __init__(
        self,
        broker: Broker,
        stream: trio.abc.Stream,
        session_id: int,
        peer: str,
        guard: ConnectionGuard | None = None,
        dispatch: Dispatch | None = None,
    ) -> None:
        limits = broker.config.limits
        self.broker = broker
        self.stream = stream
        #: The stream's socket, for writes that need not wait (None over TLS): a
        #: second object on the same descriptor, made and detached by :meth:`_run`,
        #: used only while ``self.stream`` is still ``_sock_stream`` (a NATS client
        #: may start TLS on it later).
        self._sock: socket.socket | None = None
        self._sock_stream: trio.abc.Stream | None = None
        self.id = session_id
        self.peer = peer
        self.peer_host = peer.rsplit(":", 1)[0]
        self.guard = guard = guard or ConnectionGuard(limits)
        #: The command table (None: a NATS session, which has its own).
        self.dispatch = dispatch
        self.budget = guard.budget
        self.throttle = guard.throttle
        guard.waiting[self] = trio.current_time()  # until its handshake
        self.conn = ProtocolConnection(Role.SERVER, limits.max_frame_bytes)
        self.subs: dict[int, Subscription] = {}
        #: Waiting pulls and consumer-group memberships (``_pulls.py``, ``_groups.py``).
        self.pulls: set[Any] = set()
        self.members: dict[Any, Any] = {}
        #: The correlation id of the request being handled (a pull answered later).
        self.corr = 0
        self.client_name = ""
        self.ready = False
        self._now: deque[bytes] = deque()
        self._now_bytes = 0
        self._durable: deque[tuple[int, bytes]] = deque()
        #: Bytes queued or being written (the in-flight write included).
        self.pending_bytes = 0
        #: Bytes written since the connection opened.
        self._sent_bytes = 0
        #: When pending_bytes went over the limit (the watch in _limits.py sets it).
        self.over_limit_since: float | None = None
        self._limit = limits.max_pending_bytes_per_connection
        self._wake = trio.Event()
        self._drained = trio.Event()
        self._closing = False
        self._sending = False
        self._handling = False
        self._in_handler = False
        self._write_started: float | None = None
        self._broken = False
        self._reason: str | None = None
        self._drain_seconds = DRAIN_SECONDS
        self._read_scope: trio.CancelScope | None = None
        self._task_scope: trio.CancelScope | None = None
        #: The reader is writing (a cancel now could cut a frame in half).
        self._reader_sending = False
        #: Shields the connection from the server's cancellation, so that a shutdown
        #: can say GOODBYE first; ``abort`` cancels it.
        self._shield: trio.CancelScope | None = None
        self._aborted = False
        self._ended = trio.Event()
        #: Bytes :meth:`_receive` read since its last checkpoint.
        self._unchecked = 0

    # -- queues --------------------------------------------------------------------

    def kick(self) -> None:
        if not self._wake.is_set():
            self._wake.set()

    def send_now(self, frame: bytes) -> None:
        n = len(frame)
        self._now.append(frame)
        self._now_bytes += n
        self.pending_bytes += n
        self.budget.add(n)
        if not self._handling:  # our own reader flushes what it queues itself
            self.kick()

    def send_durable(self, epoch: int, frame: bytes) -> None:
        """Queue ``frame`` to go once ``epoch`` is durable: the group commit calls
        :meth:`on_sync` then (nothing wakes the writer before)."""
        n = len(frame)
        self._durable.append((epoch, frame))
        self.pending_bytes += n
        self.budget.add(n)
        self.broker.committer.watch(self)

    def on_sync(self) -> None:
        """The group commit made acks durable: send them now, and wake the writer
        only for what the socket did not take."""
        if not self._send_nowait():
            self.kick()  # the writer sends the rest (and watches for the next sync)
        elif self._durable:
            self.broker.committer.watch(self)  # written after the sync began

    def accepts_pushes(self) -> bool:
        """False when a push would be dropped (this connection or the broker is full)."""
        return not self._closing and self.pending_bytes <= self._limit and self.budget.has_room(1)

    def push(self, kind: PushKind, payload: bytes) -> bool:
        """Queue a push; False (and nothing queued) when the connection is backed up
        or the output budget has no room for it."""
        if self._closing or self.pending_bytes > self._limit or not self.budget.has_room(len(payload) + 16):
            return False
        self.send_now(self.conn.send_push(kind, payload))
        return True

    def push_pull(self, corr: int, payload: bytes) -> None:
        """Messages for a waiting pull: never dropped (they are outstanding, and a
        pull is a request), so they are queued like a response."""
        self.send_now(self.conn.send_push(PushKind.PULL_MESSAGES, payload, correlation_id=corr))

    def _goodbye(self, code: ErrorCode, reason: str) -> None:
        """Queue a GOODBYE (whatever the limits: it is the last frame)."""
        self._handling = False
        self.send_now(self.conn.send_push(PushKind.GOODBYE, reason.encode(), int(code)))

    # -- ending --------------------------------------------------------------------

    def _end_as(self, reason: str) -> None:
        """Mark the connection as ending; the first reason given is the one kept."""
        self._closing = True
        self.guard.waiting.pop(self, None)  # no longer a candidate for eviction
        if self._reason is None:
            self._reason = reason

    def _stop_reading(self) -> None:
        # An async handler is not interrupted (it may be half-way through an admin
        # change); the reader stops after it, seeing _closing.
        if self._read_scope is not None and not self._in_handler:
            self._read_scope.cancel()

    def _lost(self) -> None:
        """The stream broke (reset, broken pipe): end now, nothing more can be sent."""
        self._broken = True
        self._end_as("connection_lost")
        if self._task_scope is not None:
            self._task_scope.cancel()

    def cut_off(self, reason: str, rule: str) -> None:
        """Close a slow consumer: drop what it has queued (freeing the budget at once),
        queue a GOODBYE with SLOW_CONSUMER, and stop reading its requests."""
        if self._closing:
            return  # ending anyway, within GOODBYE_SECONDS or DRAIN_SECONDS
        self.broker.counters.slow_consumers += 1
        log.warning(
            "slow_consumer", session=self.id, peer=self.peer, client=self.client_name, rule=rule,
            pending_bytes=self.pending_bytes, subscriptions=len(self.subs),
        )
        self._end_as("slow_consumer")
        dropped = self._now_bytes + sum(len(f) for _, f in self._durable)
        self._now.clear()
        self._durable.clear()
        self._now_bytes = 0
        self.pending_bytes -= dropped
        self.budget.sent(dropped)
        self._goodbye(ErrorCode.SLOW_CONSUMER, reason)
        self._drain_seconds = GOODBYE_SECONDS
        self._stop_reading()

    def evict(self, limit: int) -> None:
        """Make room for a new connection: this one, still without a handshake, gets
        a GOODBYE with TOO_MANY_CONNECTIONS and is closed."""
        if self._closing:
            return
        self.broker.counters.connections_refused += 1
        log.warning("connection_refused", session=self.id, peer=self.peer, reason="evicted_without_handshake")
        self._end_as("evicted")
        self._goodbye(
            ErrorCode.TOO_MANY_CONNECTIONS,
            f"the broker is at its limit of {limit} connections and this one has not handshaken",
        )
        self._drain_seconds = GOODBYE_SECONDS
        self._stop_reading()

    def shut_down(self, reason: str) -> None:
        """The broker is shutting down: queue a GOODBYE with SHUTTING_DOWN (after
        every ack already durable; an ack whose fsync has not happened is dropped,
        its request may or may not have been carried out) and stop reading. The
        connection then sends what it holds, waits a little for the client to close
        (so the GOODBYE is not lost to a reset), and ends."""
        if self._closing:
            return  # ending anyway, with its own GOODBYE or none
        self._end_as("shutdown")
        synced = self.broker.committer.synced
        dropped = 0
        while self._durable:
            epoch, frame = self._durable.popleft()
            if epoch <= synced:
                self._now.append(frame)
                self._now_bytes += len(frame)
            else:
                dropped += len(frame)
        self.pending_bytes -= dropped
        self.budget.sent(dropped)
        self._goodbye(ErrorCode.SHUTTING_DOWN, reason)
        self._drain_seconds = GOODBYE_SECONDS
        # A reader in a handler or in the middle of a write sees _closing when it
        # gets back to its loop; a cancel could cut a frame in half.
        if self._read_scope is not None and not self._in_handler and not self._reader_sending:
            self._read_scope.cancel()

    def abort(self) -> None:
        """End the connection now, whatever it is doing (the end of a shutdown)."""
        self._aborted = True
        if self._shield is not None:
            self._shield.cancel()

    async def wait_ended(self) -> None:
        """Wait until :meth:`run` has closed the connection."""
        await self._ended.wait()

    @property
    def closing(self) -> bool:
        """The connection is ending (it handles no more requests, takes no pushes)."""
        return self._closing

    def write_stalled_since(self, now: float) -> float:
        """Seconds the current write has been waiting for the peer (0 if none)."""
        started = self._write_started
        return 0.0 if started is None else now - started

    # -- tasks ---------------------------------------------------------------------

    async def run(self) -> None:
        """Serve the connection until it ends; never raises anything but
        ``trio.Cancelled`` (and BaseExceptions such as KeyboardInterrupt).

        The server's cancellation does not reach it (a shutdown first says GOODBYE,
        see :meth:`shut_down`); :meth:`abort` ends it."""
        with trio.CancelScope(shield=True) as shield:
            self._shield = shield
            if self._aborted:
                shield.cancel()
            try:
                await self._run()
            finally:
                self._ended.set()

    async def _run(self) -> None:
        try:
            if isinstance(self.stream, trio.SocketStream):
                self._sock = socket.socket(fileno=self.stream.socket.fileno())
                self._sock.setblocking(False)
                self._sock_stream = self.stream
            async with trio.open_nursery() as nursery:
                self._task_scope = nursery.cancel_scope
                nursery.start_soon(self._writer)
                await self._read()
                self.kick()  # send what the reader queued before it stopped
                await self.drain(self._drain_seconds)
                if self._reason == "shutdown" and not self.pending_bytes and not self._broken:
                    await self._linger(GOODBYE_SECONDS)
                nursery.cancel_scope.cancel()
        except* (trio.BrokenResourceError, trio.ClosedResourceError):
            self._lost()
        except* Exception:
            # Not the peer's doing: a bug in our code. It costs this connection only.
            self._end_as("task_failed")
            log.error("connection_task_failed", exc_info=True, session=self.id, peer=self.peer)
        finally:
            self.guard.waiting.pop(self, None)
            self._closed()
            self.guard.sessions.discard(self)
            leftover, self.pending_bytes = self.pending_bytes, 0
            self.budget.sent(leftover)
            self._now.clear()
            self._durable.clear()
            if self._sock is not None:
                self._sock.detach()  # the stream owns the descriptor and closes it
                self._sock = None
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(self.stream)
            reason = self._reason or "closed"
            if _FAILED.get(reason, True):
                self.broker.counters.connections_failed += 1
            log.debug("connection_closed", session=self.id, peer=self.peer, reason=reason)

    def _closed(self) -> None:
        """The connection ended: what it held in the broker goes (its subscriptions,
        waiting pulls and memberships)."""
        assert self.dispatch is not None
        self.dispatch.session_closed(self)

    async def _linger(self, seconds: float) -> None:
        """After the last frame: half-close, and read (discarding) until the client
        closes too, for at most ``seconds``. Closing a socket with unread bytes
        resets it, and a reset can destroy the GOODBYE before the client reads it."""
        with trio.move_on_after(seconds):
            try:
                send_eof = getattr(self.stream, "send_eof", None)
                if send_eof is not None:
                    await send_eof()
                while await self.stream.receive_some(RECEIVE_SIZE):
                    pass
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

    async def drain(self, seconds: float = DRAIN_SECONDS) -> None:
        """Wait (at most ``seconds``) until everything queued has been sent."""
        with trio.move_on_after(seconds):
            while self.pending_bytes and not self._broken:
                await self._wait_sent()

    async def drain_queued(self, seconds: float = DRAIN_SECONDS) -> None:
        """Wait (at most ``seconds``) until what is queued now has been sent; what is
        queued meanwhile (a client that goes on sending requests) is not waited for."""
        target = self._sent_bytes + self.pending_bytes
        with trio.move_on_after(seconds):
            while self._sent_bytes < target and self.pending_bytes and not self._broken:
                await self._wait_sent()

    async def _wait_sent(self) -> None:
        """Wait for the next write that leaves the connection within its limit (or
        empties its queues). Every waiter shares one event."""
        if self._drained.is_set():
            self._drained = trio.Event()
        self.kick()
        await self._drained.wait()

    async def _read(self) -> None:
        """Read and handle requests until the connection ends; the handshake must
        come within the timeout."""
        timeout = self.broker.config.limits.handshake_timeout
        with trio.CancelScope(deadline=trio.current_time() + timeout) as scope:
            self._read_scope = scope
            await self._read_loop()
        self._read_scope = None
        if scope.cancelled_caught and not self.ready and not self._closing:
            self.broker.counters.handshake_timeouts += 1
            log.info("handshake_timeout", session=self.id, peer=self.peer, seconds=timeout)
            self._end_as("handshake_timeout")
            self._goodbye(ErrorCode.HANDSHAKE_TIMEOUT, f"no handshake within {timeout:g} s")
            self._drain_seconds = GOODBYE_SECONDS

    async def _receive(self) -> bytes:
        """The next bytes the client sent (b"" at its end). On a plain socket, read
        the socket itself: at once when bytes are waiting (a client that sent its
        next request while we answered the last), with no trip through trio's
        scheduler, and after waiting until it is readable otherwise (a wait is a
        checkpoint). Once :data:`RECEIVE_SIZE` bytes came in without a checkpoint it
        checkpoints before reading again, so a client that never stops sending keeps
        the loop no longer than with one checkpoint per full read. Over TLS, the
        stream's ``receive_some``.

        The socket is read into the broker's one receive buffer and what came is
        copied out: ``recv`` would allocate :data:`RECEIVE_SIZE` bytes a read and
        shrink them to what came, which the C allocator serves with an
        ``mmap``, ``mremap`` and ``munmap`` a read once reads stop freeing whole
        buffers (a request and its answer at a time)."""
        size = RECEIVE_SIZE if self.ready else 4096
        sock = self._sock
        if sock is None or self.stream is not self._sock_stream:
            return await self.stream.receive_some(size)
        if self._unchecked >= RECEIVE_SIZE:
            self._unchecked = 0
            await trio.lowlevel.checkpoint()
        buffer = self.guard.receive_buffer
        while True:
            try:
                data = buffer[: sock.recv_into(buffer, size)].tobytes()
            except BlockingIOError:
                self._unchecked = 0
                await trio.lowlevel.wait_readable(sock)
                continue
            except OSError as exc:
                raise trio.BrokenResourceError(f"socket connection broken: {exc}") from exc
            self._unchecked += len(data)
            return data

    async def _read_loop(self) -> None:
        conn = self.conn
        take_publish = conn.take_publish
        take_requests = conn.take_requests
        receive = self._receive
        budget = self.budget
        broker = self.broker
        sync_handlers = self.dispatch.sync if self.dispatch is not None else {}
        while True:
            if self._closing:
                return  # ended while the reader was writing
            if self.pending_bytes > self._limit or budget.total > budget.limit:
                await self._wait_room()
            try:
                data = await receive()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._lost()
                return
            if not data:
                # The decoder keeps a partial frame; no public accessor exists for it.
                self._end_as("closed_mid_frame" if conn._decoder.buffered else "closed")
                return
            if self._closing:
                return  # ended while these bytes were on their way to us: its GOODBYE is the last frame
            if not self.ready and data[:2] == TLS_RECORD_START and not conn._decoder.buffered:
                self._tls_on_plain_port()
                return
            conn.receive_data(data)
            self._handling = True
            # Consecutive PUBLISH requests, handled as one: (correlation id, payload,
            # message count) each, taken out of the read without an event each.
            publishes: list[tuple[int, bytes, int]] = []
            run_bytes = 0
            try:
                while True:
                    if self.ready:
                        taken = take_publish()
                        if taken is not None:
                            publishes.append(taken)
                            run_bytes += len(taken[1])
                            if run_bytes < PUBLISH_RUN_BYTES or not conn._decoder.buffered:
                                continue
                            # A long run, and more of the read to come: answer it first.
                            await self._publish_run(publishes)
                            publishes = []
                            run_bytes = 0
                            await self._release_acks()
                            if self._stopped_or_full() and await self._ending():
                                return
                            continue
                        # Consecutive KV_GET requests: (correlation id, payload) each.
                        gets = take_requests(_KV_GET, KV_GET_RUN)
                        if gets:
                            if publishes:
                                await self._publish_run(publishes)
                                publishes = []
                                run_bytes = 0
                                if self._stopped_or_full() and await self._ending():
                                    return
                            if await self._kv_get_run(gets):
                                return
                            continue
                    try:
                        event = conn.next_event()
                    except RemoteProtocolError as err:
                        if publishes:
                            await self._publish_run(publishes)
                        self._protocol_error(err)
                        return
                    if publishes:
                        await self._publish_run(publishes)
                        publishes = []
                        run_bytes = 0
                        if self._stopped_or_full() and await self._ending():
                            return
                    if event is NEED_DATA:
                        break
                    if not self.ready:
                        await self._open(event)  # type: ignore[arg-type]
                    elif event.__class__ is Request:
                        handler = sync_handlers.get(event.command.__class__)  # type: ignore[union-attr]
                        if handler is not None and not broker.shutting_down:
                            self._handle_now(event, handler)  # type: ignore[arg-type]  # no coroutine: most requests
                            if self._now_bytes >= SEND_EARLY:
                                self._send_nowait()
                        else:
                            await self._handle(event)  # type: ignore[arg-type]
                    else:
                        assert isinstance(event, InvalidRequest)
                        self._refuse(event)
                    if self._stopped_or_full() and await self._ending():
                        return
            finally:
                self._handling = False
            if not self.ready and conn._decoder.buffered > MAX_HANDSHAKE_FRAME:
                self._refuse_large_first_frame()
                return
            if self._now and not self._send_nowait():
                self._reader_sending = True
                try:
                    await self._send_ready()  # answer without waking the writer task
                finally:
                    self._reader_sending = False
            if self._durable and len(data) < SHORT_READ:
                # One request (or a few) whose answers wait for a sync: its client
                # sends nothing more before them.
                broker.committer.sync_if_idle()

    def _stopped_or_full(self) -> bool:
        """The connection is ending, or it or the broker is over its output limit
        (then :meth:`_ending` has something to do)."""
        return self._closing or self.pending_bytes > self._limit or self.budget.total > self.budget.limit

    async def _ending(self) -> bool:
        """After a request: wait while the connection or the broker is over its
        output limit; True when the connection is ending."""
        if not self._closing and (self.pending_bytes > self._limit or self.budget.total > self.budget.limit):
            await self._wait_room()
        return self._closing

    async def _wait_room(self) -> None:
        """Backpressure: wait until this connection is within its limit and the
        broker within its budget; the writer sends meanwhile."""
        handling, self._handling = self._handling, False
        budget = self.budget
        try:
            while not self._closing:
                if self.pending_bytes > self._limit:
                    await self._wait_sent()
                elif budget.total > budget.limit:
                    self.kick()
                    await budget.wait_room()
                else:
                    return
        finally:
            self._handling = handling

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

    def _take_chunk(self) -> bytes | None:
        """Up to WRITE_CHUNK bytes of whole frames that may go now, or None."""
        now = self._now
        durable = self._durable
        if durable:
            synced = self.broker.committer.synced
            while durable and durable[0][0] <= synced:
                frame = durable.popleft()[1]
                now.append(frame)
                self._now_bytes += len(frame)
        if not now:
            return None
        if self._now_bytes <= WRITE_CHUNK:
            data = now[0] if len(now) == 1 else b"".join(now)
            now.clear()
            self._now_bytes = 0
            return data
        frames = [now.popleft()]
        size = len(frames[0])
        while now and size + len(now[0]) <= WRITE_CHUNK:
            frame = now.popleft()
            frames.append(frame)
            size += len(frame)
        self._now_bytes -= size
        return frames[0] if len(frames) == 1 else b"".join(frames)

    async def _send_ready(self) -> None:
        """Send every frame that may go now. Only one task sends at a time; the other
        one returns at once (the sender loops). A broken stream ends the connection
        here, so no stream error leaves this method."""
        if self._sending or self._broken:
            return
        self._sending = True
        try:
            while True:
                data = self._take_chunk()
                if data is None:
                    return
                self._write_started = trio.current_time()
                try:
                    await self.stream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    self._lost()
                    return
                except trio.Cancelled:
                    self._broken = True  # part of a frame may be out: send nothing more
                    raise
                self._write_started = None
                self._sent(len(data))
        finally:
            self._sending = False
            self._write_started = None

    def _send_nowait(self) -> bool:
        """Send what may go now with non-blocking writes on the socket itself, when no
        write is under way; True when nothing that may go is left. One system call
        and no task switch for the common case, a client that reads its answers (what
        the socket does not take goes back to the front of the queue, for
        :meth:`_send_ready`). Over TLS there is no socket to write to: False."""
        sock = self._sock
        if sock is None or self._sending or self._broken or self.stream is not self._sock_stream:
            return False
        while True:
            data = self._take_chunk()
            if data is None:
                return True
            try:
                n = sock.send(data)
            except BlockingIOError:
                n = 0
            except OSError:
                self._lost()
                return True
            self._sent(n)
            if n < len(data):
                rest = data[n:]
                self._now.appendleft(rest)
                self._now_bytes += len(rest)
                return False

    def _sent(self, n: int) -> None:
        """``n`` queued bytes went out."""
        self._sent_bytes += n
        self.pending_bytes -= n
        self.budget.sent(n)
        if self.pending_bytes <= self._limit:
            self.over_limit_since = None
            self._drained.set()
        elif not (self._now or self._durable):
            self._drained.set()

    # -- opening -------------------------------------------------------------------

    async def _open(self, event: Request | InvalidRequest) -> None:
        """The first frame: a handshake, or the end of the connection."""
        corr = event.correlation_id
        if event.__class__ is InvalidRequest:
            assert isinstance(event, InvalidRequest)
            if event.code == Command.HANDSHAKE:  # a handshake that cannot be decoded
                await self._refuse_handshake(corr, event.error)
                return
            self.broker.counters.request_errors += 1
            log.debug("request_before_handshake", session=self.id, peer=self.peer, code=event.code)
            self.send_now(self.conn.send_error(corr, event.code, event.error))
            self._end_as("request_before_handshake")
            self._drain_seconds = GOODBYE_SECONDS
            return
        assert isinstance(event, Request) and isinstance(event.command, Handshake)
        cmd = event.command
        broker = self.broker
        if broker.shutting_down:
            self.send_now(self.conn.send_error(corr, Command.HANDSHAKE, error_class(ErrorCode.SHUTTING_DOWN)("the broker is shutting down")))
            self._end_as("shutdown")
            return
        if cmd.version != PROTOCOL_VERSION:
            await self._refuse_handshake(corr, error_class(ErrorCode.UNSUPPORTED_VERSION)(
                f"this broker speaks protocol version {PROTOCOL_VERSION}, the client asked for {cmd.version}"
            ))
            return
        token = broker.config.server.auth_token
        if token and not hmac.compare_digest(cmd.token.encode(), token.encode()):
            await self._refuse_handshake(corr, error_class(ErrorCode.UNAUTHORIZED)("the auth token is missing or wrong"))
            return
        self.ready = True
        self.guard.waiting.pop(self, None)
        if self._read_scope is not None:
            self._read_scope.deadline = math.inf
        self.client_name = cmd.client_name
        info = server_info(broker)
        info["session_id"] = self.id
        self.send_now(self.conn.send_raw_response(corr, Command.HANDSHAKE, HandshakeOk(PROTOCOL_VERSION, info).encode()))

    async def _refuse_handshake(self, corr: int, err: BrokerError) -> None:
        """Answer a failed handshake after the throttle's delay, then close; count
        it, and log it (at most one line per host per 10 s, saying how many lines of
        that host were left out since its last)."""
        counters = self.broker.counters
        counters.request_errors += 1
        if err.code == ErrorCode.UNAUTHORIZED:
            counters.auth_failures += 1
            self._end_as("unauthorized")
        else:
            self._end_as("handshake_refused")
        now = trio.current_time()
        delay = self.throttle.failure(self.peer_host, now)
        suppressed = self.guard.log_limit.allow(self.peer_host, now)  # a guesser must not flood the log
        if suppressed is not None:
            log.warning(
                "handshake_failed", session=self.id, peer=self.peer, code=err.code.name, error=err.message,
                delay_seconds=round(delay, 3), suppressed=suppressed,
            )
        if self._read_scope is not None:
            self._read_scope.deadline = math.inf  # the delay is ours, not a timeout
        await trio.sleep(delay)
        self.send_now(self.conn.send_error(corr, Command.HANDSHAKE, err))
        self._drain_seconds = GOODBYE_SECONDS

    def _tls_on_plain_port(self) -> None:
        """The first bytes are a TLS handshake: close (the client cannot read a plain
        GOODBYE), count and log it (at most one line per host per 10 s)."""
        self.broker.counters.tls_handshake_failures += 1
        suppressed = self.guard.log_limit.allow(self.peer_host, trio.current_time())
        if suppressed is not None:
            log.warning(
                "tls_handshake_failed", session=self.id, peer=self.peer, reason="TLS_ON_PLAIN_PORT",
                error="a TLS client on a port without TLS (the broker has no [server] tls_cert)", suppressed=suppressed,
            )
        self._end_as("tls_on_plain_port")

    def _refuse_large_first_frame(self) -> None:
        err = error_class(ErrorCode.FRAME_TOO_LARGE)(
            f"a frame before the handshake may be at most {MAX_HANDSHAKE_FRAME} bytes"
        )
        self.broker.counters.request_errors += 1
        log.debug("protocol_error", session=self.id, peer=self.peer, code=err.code.name, error=err.message)
        self._goodbye(err.code, err.message)
        self._end_as("protocol_error")
        self._drain_seconds = GOODBYE_SECONDS

    # -- requests ------------------------------------------------------------------

    def _handle_now(self, event: Request, handler: Any) -> None:
        """Handle a request whose handler is synchronous (most are), and queue its
        answer: no coroutine, no checkpoint."""
        cmd = event.command
        corr = self.corr = event.correlation_id
        try:
            result = handler(self, cmd)
        except Exception as exc:
            self._failed([corr], cmd.CODE, exc)
            return
        self._answer(corr, cmd, result)

    async def _handle(self, event: Request) -> None:
        broker = self.broker
        cmd = event.command
        dispatch = self.dispatch
        assert dispatch is not None
        handler = dispatch.sync.get(cmd.__class__)
        if handler is not None and not broker.shutting_down:
            self._handle_now(event, handler)
            return
        corr = event.correlation_id
        try:
            if broker.shutting_down:
                raise error_class(ErrorCode.SHUTTING_DOWN)("the broker is shutting down")
            self.corr = corr
            self._in_handler = True
            try:
                result = await dispatch.async_[cmd.__class__](self, cmd)
            finally:
                self._in_handler = False
            if self._closing:
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
        each as it would be alone: stretches of them by ``_kv.kv_get_frames``
        (queued as one write each), a handler's error by :meth:`_failed`, and a
        request the run leaves to the ordinary path (a malformed payload, a bucket
        that refreshes keys on read) as the event ``next_event`` would have made of
        it; all of them the ordinary way while the broker shuts down. After each
        stretch (at most :data:`SEND_EARLY` bytes of answers, and one more) and each
        request on its own, what the read loop does after a request: send early,
        and wait while over the output limits. True: the connection is ending."""
        broker = self.broker
        assert self.dispatch is not None
        handler = self.dispatch.sync[KvGet]
        n = len(requests)
        i = 0
        while i < n:
            if broker.shutting_down:
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
            if self._now_bytes >= SEND_EARLY:
                self._send_nowait()
            if self._stopped_or_full() and await self._ending():
                return True
        return False

    def _kv_get_alone(self, request: tuple[int, bytes], handler: Any, exc: Exception | None) -> None:
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
        if event.__class__ is not Request:
            self._refuse(event)  # type: ignore[arg-type]
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
        if self._now:
            self._send_nowait()
        if self._durable:
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
            self._unchecked = 0

    def _publish_now(self, requests: list[tuple[int, bytes, int]]) -> bool:
        """Consecutive PUBLISH requests from what one read delivered (``(correlation
        id, payload, message count)``: ``ProtocolConnection.take_publish``): one
        batch for the broker (one append, one group-commit epoch) and their acks
        queued as one write (``_publishing.publish_frames``); one alone goes
        straight to its handler. False when they must go one at a time through :meth:`_handle` (the
        broker is shutting down, or says they cannot be joined: a malformed one
        among them, or a compare-and-set, rollup or de-duplication header)."""
        broker = self.broker
        if broker.shutting_down:
            return False
        if len(requests) == 1:
            handler = self.dispatch.sync.get(Publish) if self.dispatch is not None else None
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
        corr = getattr(err, "correlation_id", 0)
        self.send_now(self.conn.send_error(corr, getattr(err, "frame_code", 0), err))
        self._goodbye(err.code, str(err))
        self._end_as("protocol_error")
        self._drain_seconds = GOODBYE_SECONDS
