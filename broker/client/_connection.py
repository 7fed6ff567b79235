"""The client's connection, kept up: :class:`Connection`, the base of ``Client``,
and the core subscriptions that outlive each TCP connection.

A :class:`Connection` holds one TCP connection (:class:`_Conn`) at a time. Its link
(``_backend.py``) hands it the bytes read; :meth:`Connection._feed` turns them into
events (``protocol.ProtocolConnection``) and completes the request waiting under
each response's correlation id, or feeds a subscription. Everything written is
queued on the link and goes out in one write, so concurrent requests are pipelined
and coalesced. When the connection is lost it fails what was in flight on it,
reconnects in the background and subscribes again; what that means for the
application is written in ``_client.py``. Requests with their timeouts and retries
are built on this in ``_requests.py``.

Durable consumers (``_consumers.py``) add to what happens here through the hooks at
the end of :class:`Connection` (pulled messages' class, queued acks), so that this
module needs nothing from theirs.
"""

from __future__ import annotations

import enum
import inspect
import itertools
import logging
import random
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, Final, Protocol, Self

import protocol as P
from protocol import (
    NEED_DATA,
    PROTOCOL_VERSION,
    BrokerError,
    Command,
    Delivery,
    ErrorResponse,
    Goodbye,
    Message,
    PullBatch,
    Push,
    Response,
    Role,
)

from ._backend import Backend, Event, Link, QueueClosed, QueueFull
from ._errors import (
    SNIFF_BYTES,
    ConnectionClosedError,
    ConnectionLostError,
    ReconnectFailedError,
    describe,
    error_code,
    identify_server,
)

__all__ = [
    "Connection", "Subscription", "RECONNECTED", "parse_address", "RAW_RESPONSES",
    "RECONNECT_ATTEMPTS", "RECONNECT_WAIT", "RECONNECT_WAIT_MAX", "Callback", "ErrorCallback", "ReconnectCallback",
]

log = logging.getLogger("broker.client")

DEFAULT_PORT = 8090

#: The correlation id of every handshake: its bytes on the wire (u32 LE, bytes 8 to
#: 11 of the frame) are CR LF CR LF. An HTTP server reading the handshake as a
#: request finds an empty line there, the end of a request head, and answers at once
#: (400, ``HTTP/1.1 400 Bad Request``) instead of waiting for the rest of a head that
#: never comes; that answer is how the client tells it is talking to an HTTP port
#: (:func:`~._errors.identify_server`). A broker takes any correlation id.
HANDSHAKE_CORRELATION_ID = 0x0A0D0A0D

#: The commands whose successful responses the waiting call gets as their raw
#: payload, taken from the read in one step (``_feed``), and decodes itself: the
#: answers that come by the thousand (``publish``, ``publish_batch``, ``KeyValue.get``).
RAW_RESPONSES = frozenset({Command.PUBLISH, Command.KV_GET})

#: Reconnection defaults (those of nats-py; ``_client.py`` says what they do).
RECONNECT_ATTEMPTS = 60
RECONNECT_WAIT = 0.25
RECONNECT_WAIT_MAX = 2.0

#: An application callback: a plain function or a coroutine function (awaited).
Callback = Callable[..., object]
#: ``on_disconnect`` and ``on_closed``: called with the error that says why.
ErrorCallback = Callable[[ConnectionClosedError], object]
#: ``on_reconnect``: called with the number of attempts it took.
ReconnectCallback = Callable[[int], object]


def parse_address(address: str) -> tuple[str, int]:
    """``"host:port"``, ``"host"`` or ``":port"`` → ``(host, port)``."""
    host, sep, port = address.rpartition(":")
    if not sep:
        return address or "127.0.0.1", DEFAULT_PORT
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host or "127.0.0.1", int(port)


class Pending(Protocol):
    """What waits in a connection's ``pending`` for the response to its correlation
    id: a request's ``Backend.waiter``, or a pull in flight (``_consumers._PullCall``)."""

    def set_result(self, value: Any) -> None: ...
    def set_exception(self, exc: BaseException) -> None: ...


class _NoLink:
    """The link of a connection whose socket is not open yet: nothing to write to."""

    def write(self, data: bytes) -> None:
        pass

    async def drain(self) -> None:
        pass

    async def aclose(self) -> None:
        pass


_NO_LINK: Final = _NoLink()


class Queued(Protocol):
    """Frames queued to go without a response (a consumer's acks), sent by
    :meth:`flush`."""

    def flush(self) -> None: ...


class Reconnected(enum.Enum):
    """The type of :data:`RECONNECTED`."""

    RECONNECTED = "reconnected"


#: Queued in a subscription with ``_marks`` when the client has reconnected.
RECONNECTED: Final = Reconnected.RECONNECTED


class Subscription:
    """A core subscription: an async iterator of :class:`Message`, and an async
    context manager that unsubscribes on exit.

    It survives reconnections (the client subscribes again under the same id); the
    iteration ends when it is unsubscribed or the client closed, and raises the
    client's error (:class:`ReconnectFailedError`, :class:`ConnectionClosedError`)
    when the client stopped on its own, after the messages already received.

    Attributes:
        subject_filter: what it subscribed to.
        dropped: messages discarded because more than ``max_pending`` were waiting
            to be read (core delivery is at most once; read faster or raise the
            limit).
    """

    def __init__(self, client: Connection, sid: int, subject_filter: str, max_pending: int) -> None:
        self._client = client
        self.sid = sid
        self.subject_filter = subject_filter
        self._queue = client._backend.queue(max_pending)
        self.dropped = 0
        self.closed = False
        #: The connection on which the broker has it.
        self._conn: _Conn | None = None
        self._error: BaseException | None = None
        #: Reconnections so far; with ``_marks``, each also queues RECONNECTED (a
        #: reader that must not miss what was published meanwhile fetches it then).
        self._gaps = 0
        self._marks = False

    @property
    def pending(self) -> int:
        return self._queue.qsize()

    def _deliver(self, messages: Iterable[Message]) -> None:
        for m in messages:
            try:
                self._queue.put_nowait(m)
            except QueueFull:
                self.dropped += 1
            except QueueClosed:
                return

    def _end(self, error: BaseException | None = None) -> None:
        """No more messages: the iteration ends (``error`` None) or raises ``error``
        once the messages already queued are read."""
        if not self.closed:
            self.closed = True
            self._error = error
            self._queue.close()

    async def next(self, timeout: float | None = None) -> Message:
        """The next message.

        Raises:
            TimeoutError: none arrived within ``timeout`` seconds.
            StopAsyncIteration: the subscription or the client was closed.
            ConnectionClosedError: the client stopped on its own (gave up
                reconnecting: :class:`ReconnectFailedError`; or lost its connection
                with ``reconnect=False``).
        """
        while True:
            item = await self._next_item(timeout)
            if item is not RECONNECTED:
                return item

    async def _next_item(self, timeout: float | None = None) -> Message | Reconnected:
        """The next message, or RECONNECTED (see ``_marks``)."""
        with self._client._backend.timeout(timeout):
            try:
                item: Message | Reconnected = await self._queue.get()
                return item
            except QueueClosed:
                pass
        if self._error is not None:
            raise self._error  # as it is (its __cause__ says why)
        raise StopAsyncIteration

    def _reconnecting(self) -> None:
        """Called before it is subscribed again on a new connection."""
        self._gaps += 1
        if self._marks:
            try:
                self._queue.put_nowait(RECONNECTED)
            except (QueueFull, QueueClosed):
                pass  # a full queue is read soon anyway, and _gaps tells

    def __aiter__(self) -> AsyncIterator[Message]:
        return self

    async def __anext__(self) -> Message:
        return await self.next()

    async def unsubscribe(self) -> None:
        if self.closed:
            return
        self._end()
        client = self._client
        client._subs.pop(self.sid, None)
        conn = client._conn
        if conn is None or self._conn is not conn:
            return  # the broker forgot it with the connection
        try:
            with client._backend.timeout(client._timeout):
                await client._roundtrip(conn, P.Unsubscribe(self.sid))
        except ConnectionClosedError:
            pass  # gone with the connection

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.unsubscribe()


class _Conn:
    """One TCP connection of a client and what belongs to it."""

    __slots__ = ("link", "proto", "frames", "pending", "ready", "lost", "goodbye", "refusal", "gone", "head")

    def __init__(self, gone: Event, pulled_class: type[P.PulledMessage] | None) -> None:
        self.link: Link = _NO_LINK
        self.proto = P.ProtocolConnection(Role.CLIENT)
        self.proto.pulled_class = pulled_class
        #: The protocol's frame decoder, which ``_feed`` takes acks from directly.
        self.frames: P.FrameDecoder = self.proto._decoder
        self.pending: dict[int, Pending] = {}
        #: Handshake done (and subscriptions re-created): requests may use it.
        self.ready = False
        #: Why it ended, once it has.
        self.lost: ConnectionClosedError | None = None
        self.goodbye: ConnectionClosedError | None = None
        #: A GOODBYE that refused the handshake, as the broker's error.
        self.refusal: BrokerError | None = None
        #: Set when it ends.
        self.gone = gone
        #: The first bytes read before the handshake's answer (at most SNIFF_BYTES):
        #: what a server that is no broker sent, to say what it is.
        self.head = bytearray()


class Connection:
    """The connection of a :class:`~broker.client.Client`, kept up: connecting and
    the handshake, losing the connection and reconnecting, the application's
    callbacks, and reading what the broker sends. Built with ``Client``'s arguments
    (documented there)."""

    def __init__(
        self,
        backend: Backend,
        timeout: float | None = 30.0,
        *,
        reconnect: bool = True,
        max_reconnect_attempts: int = RECONNECT_ATTEMPTS,
        reconnect_wait: float = RECONNECT_WAIT,
        reconnect_wait_max: float = RECONNECT_WAIT_MAX,
        on_disconnect: ErrorCallback | None = None,
        on_reconnect: ReconnectCallback | None = None,
        on_closed: ErrorCallback | None = None,
    ) -> None:
        if reconnect_wait < 0 or reconnect_wait_max < 0:
            raise ValueError("reconnect_wait and reconnect_wait_max must not be negative")
        self._backend = backend
        self._timeout = timeout
        self._reconnect = reconnect
        self._max_attempts = max_reconnect_attempts
        self._wait = reconnect_wait
        self._wait_max = max(reconnect_wait_max, reconnect_wait)
        self._on_disconnect = on_disconnect
        self._on_reconnect = on_reconnect
        self._on_closed = on_closed
        self._corr = itertools.count(1)
        #: What has frames queued to go without a response: flushed before any
        #: request is written, so no request overtakes them (:meth:`_write_request`).
        self._queued: set[Queued] = set()
        self._sids = itertools.count(1)
        self._subs: dict[int, Subscription] = {}
        self._conn: _Conn | None = None
        self._attempt: _Conn | None = None
        #: Set when a connection is up, or the client closed (a new one for each loss).
        self._ready: Event = backend.event()
        self._address: tuple[str, int, str, str] = ("", 0, "", "")
        self._credentials: tuple[str, str] = ("", "")  # (user, password)
        self._callbacks: deque[tuple[Callback, tuple[object, ...]]] = deque()
        self._dispatching = False
        self._user_closed = False
        #: Why the current (or last) connection was lost.
        self.last_error: ConnectionClosedError | None = None
        self.closed = False
        self.close_reason: ConnectionClosedError | None = None
        self.reconnects = 0
        self.server_info: dict[str, Any] = {}
        self._init_parts()

    @property
    def connected(self) -> bool:
        return self._conn is not None

    # -- connecting ------------------------------------------------------------------

    async def _open(
        self, host: str, port: int, token: str = "", name: str = "ttlbroker-python", user: str = "", password: str = "",
    ) -> None:
        """Connect for the first time (no retry: errors are raised)."""
        self._address = (host, port, token, name)
        self._credentials = (user, password)
        await self._backend.start()
        self._ready = self._backend.event()
        try:
            conn = await self._connect(resubscribe=False)
        except BaseException:
            await self.aclose()
            raise
        self._conn = conn
        self._ready.set()

    async def _connect(self, resubscribe: bool) -> _Conn:
        """One connection attempt: connect, handshake, subscribe again. Raises what
        failed (OSError, TimeoutError, BrokerError, ConnectionClosedError)."""
        host, port, token, name = self._address
        conn = _Conn(self._backend.event(), self._pulled_class)
        self._attempt = conn
        try:
            with self._backend.timeout(self._timeout):
                conn.link = await self._backend.open_link(
                    host, port, lambda data: self._feed(conn, data), lambda exc: self._conn_lost(conn, exc)
                )
                lost: ConnectionLostError | None = None
                try:
                    user, password = self._credentials
                    ok: P.HandshakeOk = await self._roundtrip(
                        conn, P.Handshake(PROTOCOL_VERSION, token, name, user, password), corr=HANDSHAKE_CORRELATION_ID,
                    )
                    conn.ready = True
                    self.server_info = ok.info  # (what the subscriptions made again may ask for)
                    if resubscribe:
                        await self._resubscribe(conn)
                except ConnectionLostError as exc:
                    lost = exc
                if lost is not None:
                    # Nothing was in flight for the application: say why it went.
                    raise conn.refusal or conn.lost or lost
        except BaseException as exc:
            if conn.lost is None:
                conn.lost = ConnectionClosedError("the connection attempt was abandoned")
                conn.gone.set()
            if conn.link is not _NO_LINK:
                await conn.link.aclose()
            if isinstance(exc, TimeoutError) and conn.link is not _NO_LINK and not conn.ready:
                # Connected, but nothing answered the handshake: a server that waits
                # for its client to speak some other protocol first.
                raise TimeoutError(
                    f"no answer to the handshake within {self._timeout:g} s: is {host}:{port} a ttlbroker broker's "
                    "binary protocol port?"
                ) from None
            raise
        finally:
            if self._attempt is conn:
                self._attempt = None
        return conn

    def _subscribe_command(self, sub: Subscription) -> P.Subscribe:
        """The SUBSCRIBE of ``sub``: with ``SUBSCRIBE_REPLIES`` when the broker says it
        knows reply subjects (its handshake info's ``reply_subjects``), so that
        requests come with theirs (an older broker refuses the flag)."""
        flags = P.SUBSCRIBE_REPLIES if self.server_info.get("reply_subjects") else 0
        return P.Subscribe(sub.sid, sub.subject_filter, flags)

    async def _resubscribe(self, conn: _Conn) -> None:
        """Subscribe again, pipelined, every subscription (those still being created
        too: ``subscribe`` sees that this did it)."""
        subs = [s for s in self._subs.values() if not s.closed]
        waits = [self._backend.waiter() for _ in subs]
        for sub, w in zip(subs, waits):
            sub._reconnecting()  # before anything the new connection delivers
            corr = next(self._corr) & 0xFFFFFFFF or next(self._corr)
            conn.pending[corr] = w
            conn.link.write(conn.proto.send_request(corr, self._subscribe_command(sub)))
        lost: ConnectionClosedError | None = None
        for sub, w in zip(subs, waits):  # every answer is awaited (asyncio logs the others)
            try:
                await w.wait()
            except BrokerError as err:  # e.g. the broker's limits changed
                self._subs.pop(sub.sid, None)
                sub._end(err)
            except ConnectionClosedError as err:
                lost = lost or err
            else:
                sub._conn = conn
        if lost is not None:
            raise lost

    # -- closing -------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the client: pending requests fail with ConnectionClosedError, the
        iterations over its subscriptions end, reconnection stops. Acks still
        queued are sent first (and made durable), and consume loops stopped."""
        try:
            if not self._user_closed and not self.closed:
                await self._before_close()
            await self._close_connection()
        finally:
            await self._backend.aclose()

    async def _close_connection(self) -> None:
        if not self._user_closed:
            self._user_closed = True
            err = ConnectionClosedError("the client closed the connection")
            if not self.closed:
                self.closed = True
                self.close_reason = err
            for conn in (self._conn, self._attempt):
                if conn is not None and conn.lost is None:
                    conn.lost = err
                    conn.gone.set()
                    pending, conn.pending = conn.pending, {}
                    for w in pending.values():
                        w.set_exception(err)
            conn, self._conn = self._conn, None
            for sub in list(self._subs.values()):
                sub._end()
            self._subs.clear()
            self._ready.set()
            if conn is not None and conn.link is not _NO_LINK:
                await conn.link.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- losing it, and reconnecting ------------------------------------------------

    def _conn_lost(self, conn: _Conn, exc: BaseException | None, err: ConnectionClosedError | None = None) -> None:
        """A connection ended (called by its link, or on a GOODBYE or a protocol
        error): fail what was in flight on it and, if it was the one in use,
        reconnect or stop."""
        if conn.lost is not None:
            return
        if err is None:
            err = conn.goodbye
        if err is None and exc is None and not conn.ready and conn.head:
            # Closed with less than a frame header read: a NATS INFO or an HTTP answer?
            found = identify_server(bytes(conn.head))
            err = found if found.found != "unknown" else None
        if err is None:
            if exc is None:
                err = ConnectionClosedError("the broker closed the connection")
            else:
                err = ConnectionClosedError(f"the connection broke ({describe(exc)})")
        conn.lost = err
        conn.gone.set()
        pending, conn.pending = conn.pending, {}
        for w in pending.values():
            w.set_exception(ConnectionLostError(err))
        if conn.link is not _NO_LINK:
            self._backend.spawn(conn.link.aclose)
        if self._conn is not conn:
            return  # an attempt: it sees the failure itself
        self._conn = None
        self._on_disconnected()
        self.last_error = err
        if self.closed:
            return
        if not self._reconnect:
            self._emit(self._on_disconnect, err)
            self._stop(err)
            return
        self._ready = self._backend.event()
        self._emit(self._on_disconnect, err)
        self._backend.spawn(self._reconnect_loop, err)

    def _stop(self, err: ConnectionClosedError) -> None:
        """Stop for good on our own: every pending and later call, and every
        iteration, raise ``err``."""
        self.closed = True
        self.close_reason = err
        for sub in list(self._subs.values()):
            sub._end(err)
        self._subs.clear()
        self._ready.set()
        self._emit(self._on_closed, err)

    def _backoff(self, attempt: int) -> float:
        """The wait before attempt ``attempt`` (1, 2, ...): exponential, capped, with
        up to half of it taken off at random."""
        wait = min(self._wait_max, self._wait * 2 ** min(attempt - 1, 32))
        return wait * (1 - random.random() / 2)

    async def _reconnect_loop(self, lost: ConnectionClosedError) -> None:
        attempts = 0
        last: BaseException | None = None
        while not self.closed:
            if 0 <= self._max_attempts <= attempts:
                self._stop(ReconnectFailedError(lost, attempts, last))
                return
            attempts += 1
            await self._backend.sleep(self._backoff(attempts))
            if self.closed:
                return
            try:
                conn = await self._connect(resubscribe=True)
            except Exception as exc:  # OSError, TimeoutError, BrokerError, ConnectionClosedError, ...
                last = exc
                log.debug("reconnect attempt %d failed: %s", attempts, describe(exc))
                continue
            if conn.lost is not None:  # lost again before we could use it
                last = conn.lost
                continue
            self._conn = conn
            self.reconnects += 1
            self._ready.set()
            self._emit(self._on_reconnect, attempts)
            return

    def _emit(self, callback: Callback | None, *args: object) -> None:
        """Call an application callback from the client's own task, in order."""
        if callback is None:
            return
        self._callbacks.append((callback, args))
        if not self._dispatching:
            self._dispatching = True
            self._backend.spawn(self._dispatch)

    async def _dispatch(self) -> None:
        try:
            while self._callbacks:
                callback, args = self._callbacks.popleft()
                try:
                    result = callback(*args)
                    if inspect.isawaitable(result):
                        await result
                except Exception:
                    log.exception("a connection callback failed")
        finally:
            self._dispatching = False

    # -- reading -------------------------------------------------------------------

    def _feed(self, conn: _Conn, data: bytes | bytearray) -> None:
        """Bytes from the broker (called by the link, never concurrently)."""
        if conn.lost is not None:
            return
        proto = conn.proto
        take = conn.frames.take_ok_responses
        pending = conn.pending
        if not conn.ready and len(conn.head) < SNIFF_BYTES:
            conn.head += data[: SNIFF_BYTES - len(conn.head)]
        try:
            proto.receive_data(data)
            while True:
                for corr, raw in take(RAW_RESPONSES):
                    w = pending.pop(corr, None)
                    if w is not None:
                        w.set_result(raw)
                event = proto.next_event()
                if event is NEED_DATA:
                    return
                # type(...) is, not isinstance: the event classes are final, and this
                # is the per-response path.
                if type(event) is Response:
                    w = conn.pending.pop(event.correlation_id, None)
                    if w is not None:
                        w.set_result(event.result)
                elif type(event) is ErrorResponse:
                    w = conn.pending.pop(event.correlation_id, None)
                    if w is not None:
                        w.set_exception(event.error)
                elif type(event) is Push:
                    self._on_push(conn, event)
                    if conn.lost is not None:
                        return
        except P.RemoteProtocolError as exc:
            if not conn.ready:  # the first answer is no frame: some other kind of server
                self._conn_lost(conn, None, identify_server(bytes(conn.head), str(exc)))
            else:
                self._conn_lost(conn, None, ConnectionClosedError(f"the broker broke the protocol: {exc}"))

    def _on_push(self, conn: _Conn, event: Push) -> None:
        value = event.value
        if type(value) is PullBatch:  # PULL_MESSAGES
            self._on_pull_push(conn, event.correlation_id, value)
        elif type(value) is Delivery:
            sub = self._subs.get(value.subscription_id)
            if sub is not None:
                sub._deliver(value.messages)
        elif type(value) is Goodbye:
            # The broker's last frame: the connection is over now.
            status = event.status
            text = value.reason
            goodbye = ConnectionClosedError(f"the broker said goodbye: {text}", error_code(status) if status else None)
            if status:
                err = BrokerError.from_code(status, text)
                goodbye.__cause__ = err
                if not conn.ready:
                    # A goodbye on a connection still handshaking answers the handshake.
                    conn.refusal = err
                    pending, conn.pending = conn.pending, {}
                    for w in pending.values():
                        w.set_exception(err)
            conn.goodbye = goodbye
            self._conn_lost(conn, None)

    # -- one request on one connection ------------------------------------------------

    async def _wait_connected(self) -> _Conn:
        """The connection in use, once there is one (raises close_reason if closed)."""
        while True:
            conn = self._conn
            if conn is not None:
                return conn
            if self.closed:
                raise self.close_reason or ConnectionClosedError("the connection is closed")
            await self._ready.wait()

    # ``command`` is a protocol request (its base class is private to ``protocol``) and
    # the answer is whatever response that command has: both are typed Any here.
    async def _roundtrip(self, conn: _Conn, command: Any, payload: bytes | None = None, corr: int = 0) -> Any:
        """Send one request on ``conn`` and wait for its answer: ``command``, or with
        ``payload`` the Command code of that encoded payload; ``corr``: its
        correlation id (0: the next one)."""
        if conn.lost is not None:
            raise conn.refusal or conn.lost
        corr = corr or next(self._corr) & 0xFFFFFFFF or next(self._corr)
        waiter = self._backend.waiter()
        conn.pending[corr] = waiter
        if payload is None:
            self._write_request(conn, conn.proto.send_request(corr, command))
        else:
            self._write_request(conn, P.encode_frame(command, 0, corr, 0, payload))
        try:
            return await waiter.wait()
        finally:
            conn.pending.pop(corr, None)

    def _write_request(self, conn: _Conn, frame: bytes) -> None:
        """Write one request, after every frame queued to go without a response before
        it (the consumers' acks, ``_consumers._Acker``): a request written on a
        connection never overtakes them, so what it asks sees them (read your own
        acks: a consumer info after ``await msg.ack()`` counts that ack)."""
        if self._queued:
            self._flush_queued()
        conn.link.write(frame)

    def _flush_queued(self) -> None:
        for queued in list(self._queued):
            queued.flush()

    # -- what the parts built on this class add (``_consumers.ConsumerMethods``) ------

    #: The class pulled messages are decoded into (``ProtocolConnection.pulled_class``).
    _pulled_class: type[P.PulledMessage] | None = None

    def _init_parts(self) -> None:
        """The state of the parts built on this class (the end of ``__init__``)."""

    async def _before_close(self) -> None:
        """Called by ``aclose`` before the connection closes, unless the client has
        stopped on its own already."""

    def _on_disconnected(self) -> None:
        """The connection in use was lost: drop what belonged to it."""

    def _on_pull_push(self, conn: _Conn, correlation_id: int, batch: PullBatch) -> None:
        """A ``PULL_MESSAGES`` push, for the pull in flight under ``correlation_id``."""
