"""The client, written once for both runtimes.

A :class:`Client` holds one connection at a time: a background reader task turns
frames into events (``protocol.ProtocolConnection``) and completes the waiting request
or feeds a subscription; a background writer task sends everything queued in one
write, so concurrent requests are pipelined and coalesced. Requests are matched to
responses by correlation id. Error statuses become the matching
:class:`protocol.BrokerError` subclass (``StreamNotFoundError``,
``InvalidSubjectError``, ...), carrying ``code`` and ``message``.

Reconnection (on by default, as in nats-py). When the connection is lost (a reset,
the broker closing it, a GOODBYE such as SHUTTING_DOWN):

- requests in flight fail with :class:`ConnectionLostError`: the broker may or may
  not have carried them out. Two exceptions: a publish whose messages all carry a
  ``Nats-Msg-Id`` header is sent again after the reconnection (the topic's duplicate
  window makes that safe), and a SUBSCRIBE is sent again (the broker forgets
  subscriptions with the connection);
- the client reconnects in the background, waiting ``reconnect_wait`` seconds
  before the first attempt and twice as long before each next one, up to
  ``reconnect_wait_max``, each wait shortened at random by up to half (jitter, so
  that the clients of a restarted broker do not all come back at once). Each
  attempt connects, handshakes with the same token and name, and subscribes again
  every core subscription under its old id, so the same :class:`Subscription`
  objects go on yielding messages. Messages published while no connection was up
  are not delivered: core subscriptions are at most once;
- calls made meanwhile wait for the reconnection, within their ``timeout``;
- a request the broker refused with SHUTTING_DOWN was not carried out: it is sent
  again once reconnected, within its ``timeout``;
- ``on_disconnect(error)`` and ``on_reconnect(attempts)`` are called (plain functions
  or coroutine functions, one at a time, in order, from a task of the client);
- after ``max_reconnect_attempts`` failed attempts in a row (60 by default, -1 for no
  limit) the client gives up: it is closed, ``on_closed(error)`` is called, and every
  pending call, every later call and every ``async for`` over its subscriptions raise
  :class:`ReconnectFailedError`. With ``reconnect=False`` the first loss does the same
  with the :class:`ConnectionClosedError` that says why (the GOODBYE's reason and
  code when the broker sent one).

Closing the client (``aclose``, or leaving ``async with connect(...)``) ends every
``async for`` over its subscriptions normally, and fails pending calls with
:class:`ConnectionClosedError`.
"""

from __future__ import annotations

import inspect
import itertools
import logging
import os
import random
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import protocol as P
from protocol import (
    EXPIRY_NONE,
    NEED_DATA,
    PROTOCOL_VERSION,
    TTL_NEVER,
    Ack,
    Acks,
    BrokerError,
    Command,
    ErrorCode,
    ErrorResponse,
    Identifier,
    Message,
    Push,
    PushKind,
    Response,
    Role,
)

from ._backend import Backend, QueueClosed, QueueFull
from ._consumers import ConsumerMessage, ConsumersMixin
from ._kv import KV_STREAM, KeyValue, validate_bucket

__all__ = [
    "Client", "Msg", "Fetched", "Subscription", "ConnectionClosedError", "ConnectionLostError",
    "ReconnectFailedError", "parse_address", "MSG_ID_HEADER",
]

log = logging.getLogger("broker.client")

DEFAULT_PORT = 8090
#: The header that identifies a message for the broker's de-duplication (JetStream's).
MSG_ID_HEADER = "Nats-Msg-Id"
_MSG_ID = MSG_ID_HEADER.encode()

#: The commands whose successful responses the waiting call gets as their raw
#: payload, taken from the read in one step (``_feed``), and decodes itself: the
#: answers that come by the thousand (``publish``, ``publish_batch``, ``KeyValue.get``).
RAW_RESPONSES = frozenset({Command.PUBLISH, Command.KV_GET})

#: Reconnection defaults (see the module docstring).
RECONNECT_ATTEMPTS = 60
RECONNECT_WAIT = 0.25
RECONNECT_WAIT_MAX = 2.0


class ConnectionClosedError(ConnectionError):
    """The connection to the broker is gone.

    Attributes:
        reason: why, in words (for a GOODBYE: ``"the broker said goodbye: " +`` the
            broker's reason).
        code: the GOODBYE's status (an :class:`ErrorCode`, e.g. ``SHUTTING_DOWN``),
            or None when the broker sent none.
    """

    def __init__(self, reason: str, code: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


class ConnectionLostError(ConnectionClosedError):
    """The connection was lost while this request was in flight: the broker may or
    may not have carried it out. Retry it if it is idempotent (a publish with a
    ``Nats-Msg-Id`` header is, within its topic's duplicate window). ``__cause__``
    is the :class:`ConnectionClosedError` that says why the connection went."""

    def __init__(self, lost: ConnectionClosedError) -> None:
        super().__init__(
            f"the connection was lost while the request was in flight, so it may or may not have been "
            f"carried out ({lost.reason})",
            lost.code,
        )
        self.__cause__ = lost


class ReconnectFailedError(ConnectionClosedError):
    """The client gave up reconnecting: ``attempts`` attempts in a row failed, the last
    with ``last_error``. ``code`` is the code of the loss (e.g. ``SHUTTING_DOWN``);
    ``__cause__`` is the :class:`ConnectionClosedError` that says why the connection
    went."""

    def __init__(self, lost: ConnectionClosedError, attempts: int, last_error: BaseException | None) -> None:
        tries = f"{attempts} attempt{'' if attempts == 1 else 's'}"
        last = f"; the last one failed: {_describe(last_error)}" if last_error is not None else ""
        super().__init__(f"gave up reconnecting after {tries} ({lost.reason}{last})", lost.code)
        self.attempts = attempts
        self.last_error = last_error
        self.__cause__ = lost


def _describe(exc: BaseException) -> str:
    """A short text for what failed (the same on trio and asyncio: the system's
    error text where there is one, e.g. "Connection refused")."""
    if isinstance(exc, ConnectionClosedError):
        return exc.reason
    if isinstance(exc, BrokerError):
        return f"{exc.code.name} ({int(exc.code)}): {exc.message}"
    if isinstance(exc, TimeoutError):
        return str(exc) or "timed out"
    tls = _ssl_error(exc)
    if tls is not None:  # its errno is OpenSSL's, not the system's
        if isinstance(tls, ssl.SSLCertVerificationError) and tls.verify_message:
            return f"TLS: certificate verify failed: {tls.verify_message}"
        text = str(tls.strerror or tls.reason or tls).split(" (_ssl.c:")[0]
        return f"TLS: {text}"
    errno = _errno(exc)
    if errno is not None:
        return os.strerror(errno)
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _ssl_error(exc: BaseException | None, depth: int = 0) -> ssl.SSLError | None:
    """The first ``ssl.SSLError`` in ``exc`` and its causes (trio wraps it)."""
    if exc is None or depth > 5:
        return None
    if isinstance(exc, ssl.SSLError):
        return exc
    return _ssl_error(exc.__cause__ or exc.__context__, depth + 1)


def _errno(exc: BaseException | None, depth: int = 0) -> int | None:
    """The first OS error number in ``exc``, its causes and (for trio's "all attempts
    to connect failed") the exception group behind it."""
    if exc is None or depth > 5:
        return None
    if isinstance(exc, OSError) and exc.errno:
        return exc.errno
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _errno(inner, depth + 1)
            if found is not None:
                return found
    return _errno(exc.__cause__ or exc.__context__, depth + 1)


def _code(status: int) -> int:
    try:
        return ErrorCode(status)  # type: ignore[call-arg]  # a lookup by value, not __new__(value, description)
    except ValueError:
        return status


def _has_msg_id(body: bytes) -> bool:
    headers = P.body_fields(body, 0).headers
    return bool(headers) and P.find_header(headers, _MSG_ID) is not None


def parse_address(address: str) -> tuple[str, int]:
    """``"host:port"``, ``"host"`` or ``":port"`` → ``(host, port)``."""
    host, sep, port = address.rpartition(":")
    if not sep:
        return address or "127.0.0.1", DEFAULT_PORT
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host or "127.0.0.1", int(port)


class Msg(NamedTuple):
    """A message to publish.

    ``ttl``: seconds (int) or ``"never"`` for the binary TTL field; a ``Nats-TTL``
    header is the other way to give one.
    """

    subject: str
    payload: bytes | str = b""
    headers: Mapping[str, str] | None = None
    ttl: int | str | None = None


def _ttl_field(ttl: int | str | None) -> int:
    if ttl is None:
        return 0
    if isinstance(ttl, str):
        if ttl.lower() == "never":
            return TTL_NEVER
        raise ValueError(f"ttl must be seconds or 'never', not {ttl!r} (send other forms as a Nats-TTL header)")
    if not 0 <= ttl < TTL_NEVER:
        raise ValueError(f"ttl {ttl} does not fit the u32 TTL field")
    return ttl


def encode_msg(
    subject: str, payload: bytes | str = b"", headers: Mapping[str, str] | None = None, ttl: int | str | None = None,
    *, prefix: bytes = b"",
) -> bytes:
    """A message body (``prefix`` in front of it, in the same join)."""
    raw = payload.encode() if isinstance(payload, str) else payload
    return P.encode_body(subject, raw, P.encode_headers(headers) if headers else b"", _ttl_field(ttl), prefix=prefix)


@dataclass(frozen=True)
class Fetched:
    """The answer to a fetch: messages and where to continue."""

    messages: list[Message]
    next_offset: int
    first_offset: int
    last_offset: int
    partition: int

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.messages)

    def __len__(self) -> int:
        return len(self.messages)


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

    def __init__(self, client: Client, sid: int, subject_filter: str, max_pending: int) -> None:
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

    async def _next_item(self, timeout: float | None = None) -> Any:
        """The next message, or RECONNECTED (see ``_marks``)."""
        with self._client._backend.timeout(timeout):
            try:
                return await self._queue.get()
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


#: Queued in a subscription with ``_marks`` when the client has reconnected.
RECONNECTED: Any = object()


class _Conn:
    """One TCP connection of a client and what belongs to it."""

    __slots__ = ("link", "proto", "frames", "pending", "ready", "lost", "goodbye", "refusal", "gone")

    def __init__(self, gone: Any) -> None:
        self.link: Any = None
        self.proto = P.ProtocolConnection(Role.CLIENT)
        self.proto.pulled_class = ConsumerMessage
        #: The protocol's frame decoder, which ``_feed`` takes acks from directly.
        self.frames: P.FrameDecoder = self.proto._decoder
        self.pending: dict[int, Any] = {}
        #: Handshake done (and subscriptions re-created): requests may use it.
        self.ready = False
        #: Why it ended, once it has.
        self.lost: ConnectionClosedError | None = None
        self.goodbye: ConnectionClosedError | None = None
        #: A GOODBYE that refused the handshake, as the broker's error.
        self.refusal: BrokerError | None = None
        #: Set when it ends.
        self.gone = gone


Callback = Callable[..., Any]


class Client(ConsumersMixin):
    """A connection to a broker, kept up (see the module docstring). Build one with
    ``broker.client.connect`` (trio) or ``broker.client.aio.connect`` (asyncio); both
    give this same class.

    Args:
        backend: the runtime backend.
        timeout: seconds to wait for any one response, including any wait for a
            reconnection (None = forever); also the limit of each connection attempt.
        reconnect: reconnect when the connection is lost.
        max_reconnect_attempts: failed attempts in a row before giving up (-1: never).
        reconnect_wait: seconds before the first attempt; doubled for each next one.
        reconnect_wait_max: the longest wait between two attempts.
        on_disconnect: called with the :class:`ConnectionClosedError` saying why,
            each time the connection is lost.
        on_reconnect: called with the number of attempts it took, each time the
            client is connected again.
        on_closed: called with the error once the client stops on its own (it gave
            up reconnecting, or lost the connection with ``reconnect=False``); not
            when you close it.

    Attributes:
        closed: the client is closed for good (by ``aclose``, or it stopped).
        close_reason: the :class:`ConnectionClosedError` every call raises then.
        connected: a connection is up now.
        reconnects: how many times it has reconnected.
        server_info: the broker's handshake info (of the current connection).
    """

    def __init__(
        self,
        backend: Backend,
        timeout: float | None = 30.0,
        *,
        reconnect: bool = True,
        max_reconnect_attempts: int = RECONNECT_ATTEMPTS,
        reconnect_wait: float = RECONNECT_WAIT,
        reconnect_wait_max: float = RECONNECT_WAIT_MAX,
        on_disconnect: Callback | None = None,
        on_reconnect: Callback | None = None,
        on_closed: Callback | None = None,
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
        self._sids = itertools.count(1)
        self._subs: dict[int, Subscription] = {}
        self._conn: _Conn | None = None
        self._attempt: _Conn | None = None
        self._ready: Any = None
        self._address: tuple[str, int, str, str] = ("", 0, "", "")
        self._callbacks: deque[tuple[Callback, tuple[Any, ...]]] = deque()
        self._dispatching = False
        self._user_closed = False
        #: Why the current (or last) connection was lost.
        self.last_error: ConnectionClosedError | None = None
        self.closed = False
        self.close_reason: ConnectionClosedError | None = None
        self.reconnects = 0
        self.server_info: dict[str, Any] = {}
        self._init_consumers()

    @property
    def connected(self) -> bool:
        return self._conn is not None

    # -- connection ------------------------------------------------------------------

    async def _open(self, host: str, port: int, token: str = "", name: str = "ttlbroker-python") -> None:
        """Connect for the first time (no retry: errors are raised)."""
        self._address = (host, port, token, name)
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
        conn = _Conn(self._backend.event())
        self._attempt = conn
        try:
            with self._backend.timeout(self._timeout):
                conn.link = await self._backend.open_link(
                    host, port, lambda data: self._feed(conn, data), lambda exc: self._conn_lost(conn, exc)
                )
                lost: ConnectionLostError | None = None
                try:
                    ok = await self._roundtrip(conn, P.Handshake(PROTOCOL_VERSION, token, name))
                    conn.ready = True
                    if resubscribe:
                        await self._resubscribe(conn)
                except ConnectionLostError as exc:
                    lost = exc
                if lost is not None:
                    # Nothing was in flight for the application: say why it went.
                    raise conn.refusal or conn.lost or lost
        except BaseException:
            if conn.lost is None:
                conn.lost = ConnectionClosedError("the connection attempt was abandoned")
                conn.gone.set()
            if conn.link is not None:
                await conn.link.aclose()
            raise
        finally:
            if self._attempt is conn:
                self._attempt = None
        self.server_info = ok.info
        return conn

    async def _resubscribe(self, conn: _Conn) -> None:
        """Subscribe again, pipelined, every subscription (those still being created
        too: ``subscribe`` sees that this did it)."""
        subs = [s for s in self._subs.values() if not s.closed]
        waits = [self._backend.waiter() for _ in subs]
        for sub, w in zip(subs, waits):
            sub._reconnecting()  # before anything the new connection delivers
            corr = next(self._corr) & 0xFFFFFFFF or next(self._corr)
            conn.pending[corr] = w
            conn.link.write(conn.proto.send_request(corr, P.Subscribe(sub.sid, sub.subject_filter)))
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

    async def aclose(self) -> None:
        """Close the client: pending requests fail with ConnectionClosedError, the
        iterations over its subscriptions end, reconnection stops. Acks still
        queued are sent first (and made durable), and consume loops stopped."""
        try:
            if not self._user_closed and not self.closed:
                await self._flush_acks_before_close()
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
            if self._ready is not None:
                self._ready.set()
            if conn is not None and conn.link is not None:
                await conn.link.aclose()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _conn_lost(self, conn: _Conn, exc: BaseException | None, err: ConnectionClosedError | None = None) -> None:
        """A connection ended (called by its link, or on a GOODBYE or a protocol
        error): fail what was in flight on it and, if it was the one in use,
        reconnect or stop."""
        if conn.lost is not None:
            return
        if err is None:
            err = conn.goodbye
        if err is None:
            if exc is None:
                err = ConnectionClosedError("the broker closed the connection")
            else:
                err = ConnectionClosedError(f"the connection broke ({_describe(exc)})")
        conn.lost = err
        conn.gone.set()
        pending, conn.pending = conn.pending, {}
        for w in pending.values():
            w.set_exception(ConnectionLostError(err))
        if conn.link is not None:
            self._backend.spawn(conn.link.aclose)
        if self._conn is not conn:
            return  # an attempt: it sees the failure itself
        self._conn = None
        self._drop_queued_acks()
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
                log.debug("reconnect attempt %d failed: %s", attempts, _describe(exc))
                continue
            if conn.lost is not None:  # lost again before we could use it
                last = conn.lost
                continue
            self._conn = conn
            self.reconnects += 1
            self._ready.set()
            self._emit(self._on_reconnect, attempts)
            return

    def _emit(self, callback: Callback | None, *args: Any) -> None:
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

    def _feed(self, conn: _Conn, data: bytes) -> None:
        """Bytes from the broker (called by the link, never concurrently)."""
        if conn.lost is not None:
            return
        proto = conn.proto
        take = conn.frames.take_ok_responses
        pending = conn.pending
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
                cls = event.__class__
                if cls is Response:
                    w = conn.pending.pop(event.correlation_id, None)  # type: ignore[union-attr]
                    if w is not None:
                        w.set_result(event.result)  # type: ignore[union-attr]
                elif cls is ErrorResponse:
                    w = conn.pending.pop(event.correlation_id, None)  # type: ignore[union-attr]
                    if w is not None:
                        w.set_exception(event.error)  # type: ignore[union-attr]
                elif cls is Push:
                    self._on_push(conn, event)  # type: ignore[arg-type]
                    if conn.lost is not None:
                        return
        except P.RemoteProtocolError as exc:
            self._conn_lost(conn, None, ConnectionClosedError(f"the broker broke the protocol: {exc}"))

    def _on_push(self, conn: _Conn, event: Push) -> None:
        if event.kind == PushKind.PULL_MESSAGES:
            self._on_pull_push(conn, event)
        elif event.kind == PushKind.DELIVERY:
            delivery = event.value
            sub = self._subs.get(delivery.subscription_id)  # type: ignore[attr-defined]
            if sub is not None:
                sub._deliver(delivery.messages)  # type: ignore[attr-defined]
        elif event.kind == PushKind.GOODBYE:
            # The broker's last frame: the connection is over now.
            status = event.status
            text = event.value.reason  # type: ignore[attr-defined]
            goodbye = ConnectionClosedError(f"the broker said goodbye: {text}", _code(status) if status else None)
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

    async def _wait_connected(self) -> _Conn:
        """The connection in use, once there is one (raises close_reason if closed)."""
        while True:
            conn = self._conn
            if conn is not None:
                return conn
            if self.closed:
                raise self.close_reason or ConnectionClosedError("the connection is closed")
            await self._ready.wait()

    async def _roundtrip(self, conn: _Conn, command: Any, payload: bytes | None = None) -> Any:
        """Send one request on ``conn`` and wait for its answer: ``command``, or with
        ``payload`` the Command code of that encoded payload."""
        if conn.lost is not None:
            raise conn.refusal or conn.lost
        corr = next(self._corr) & 0xFFFFFFFF or next(self._corr)
        waiter = self._backend.waiter()
        conn.pending[corr] = waiter
        if payload is None:
            conn.link.write(conn.proto.send_request(corr, command))
        else:
            conn.link.write(P.encode_frame(command, 0, corr, 0, payload))
        try:
            return await waiter.wait()
        finally:
            conn.pending.pop(corr, None)

    async def _request(self, command: Any, retry: bool | Callable[[], bool] = False) -> Any:
        """Send a request and wait for its answer, within the timeout; wait for a
        reconnection first if the connection is down. ``retry`` (or what it returns,
        asked only then): the request may be sent again after a reconnection if the
        connection drops with it in flight."""
        return await self._call(command.CODE, command.encode(), retry)

    async def _call(self, code: int, payload: bytes, retry: bool | Callable[[], bool] = False) -> Any:
        """:meth:`_request` for a payload already encoded (``code``: its Command).

        With the connection up (the common case) this is one frame written and one
        waiter whose timeout shares a timer with every other request's
        (``Backend.waiter``): no task, no cancel scope, no timer of its own. What
        happens after a loss or a refusal goes to :meth:`_call_again`."""
        conn = self._conn
        if conn is None or conn.lost is not None:
            return await self._call_again(code, payload, retry, self._timeout, None)
        corr = next(self._corr) & 0xFFFFFFFF or next(self._corr)
        w = self._backend.waiter(self._timeout)
        pending = conn.pending
        pending[corr] = w
        conn.link.write(P.encode_frame(code, 0, corr, 0, payload))
        try:
            return await w.wait()
        except TimeoutError as exc:
            raise self._timeout_error(exc) from None
        except ConnectionLostError:
            if not self._sends_again(retry):
                raise
            again = None
        except BrokerError as err:
            if not self._sends_again(retry, err):
                raise
            again = conn
        finally:
            if pending.pop(corr, None) is not None:
                w.cancel()  # abandoned: timed out, or our caller was cancelled
        left = None if self._timeout is None else w.deadline - self._backend.now()
        return await self._call_again(code, payload, retry, left, again)

    async def _call_again(
        self, code: int, payload: bytes, retry: bool | Callable[[], bool], seconds: float | None, gone: _Conn | None,
    ) -> Any:
        """The rest of :meth:`_call`: wait for a connection (after ``gone`` ends, when
        given), send, and again after a loss (if ``retry``) or a SHUTTING_DOWN
        refusal, all within ``seconds``."""
        conn = None
        try:
            with self._backend.timeout(seconds, self._timeout):
                if gone is not None:
                    await gone.gone.wait()
                while True:
                    if conn is None:
                        conn = await self._wait_connected()
                    try:
                        return await self._roundtrip(conn, code, payload)
                    except ConnectionLostError:
                        if not self._sends_again(retry):
                            raise
                    except BrokerError as err:
                        if not self._sends_again(retry, err):
                            raise
                        await conn.gone.wait()
                    conn = None
        except TimeoutError as exc:
            raise self._timeout_error(exc) from None

    def _sends_again(self, retry: bool | Callable[[], bool], refusal: BrokerError | None = None) -> bool:
        """Whether a request goes again once reconnected: after a loss with it in
        flight when ``retry`` says so; after a ``refusal``, when the broker refused
        it on its way down (SHUTTING_DOWN: not carried out)."""
        if not self._reconnect or self.closed:
            return False
        if refusal is not None:
            return refusal.code == ErrorCode.SHUTTING_DOWN
        return retry() if callable(retry) else retry

    def _timeout_error(self, exc: TimeoutError) -> TimeoutError:
        """The timeout, saying so when the connection is down."""
        if self._conn is None and not self.closed and self.last_error is not None:
            return TimeoutError(f"{exc}: the connection is down ({self.last_error.reason}) and the client is still reconnecting")
        return exc

    async def _send_no_ack(self, command: Any) -> None:
        """Send a request that gets no response (waiting for a connection first)."""
        conn = self._conn
        if conn is None:
            with self._backend.timeout(self._timeout):
                conn = await self._wait_connected()
        conn.link.write(conn.proto.send_request(0, command))
        await conn.link.drain()

    # -- server --------------------------------------------------------------------

    async def ping(self) -> float:
        """Round trip time in seconds."""
        t = time.perf_counter()
        await self._request(P.Ping())
        return time.perf_counter() - t

    async def info(self) -> dict[str, Any]:
        return (await self._request(P.GetServerInfo())).values

    async def stats(self) -> dict[str, Any]:
        return (await self._request(P.GetStats())).values

    # -- KV buckets --------------------------------------------------------------------

    async def kv_create(
        self,
        bucket: str,
        *,
        history: int = 1,
        ttl: int = 0,
        refresh: str = "on_write",
        visibility: str = "never_return_expired",
        marker_ttl: int = 60,
    ) -> KeyValue:
        """Create a KV bucket (FLIP-25 semantics; ``docs/semantics.md``).

        Args:
            history: revisions kept per key.
            ttl: default TTL of a key in seconds (0: keys live until deleted).
            refresh: ``on_write`` (a put restarts the TTL) or ``on_read_and_write``
                (a get does too).
            visibility: ``never_return_expired`` or ``return_expired_if_not_cleaned_up``.
            marker_ttl: how long the marker an expired key leaves stays, in seconds.

        Raises:
            InvalidKeyError: a bad bucket name. TopicNameExistsError: it exists.
        """
        name = validate_bucket(bucket)
        try:
            await self.create_stream(KV_STREAM)
        except P.BrokerError as err:
            if err.code != P.ErrorCode.STREAM_NAME_EXISTS:
                raise
        info = await self.create_topic(
            KV_STREAM, name, partitions=1, message_expiry=0, subjects=[f"$KV.{name}.>"],
            max_msgs_per_subject=history, allow_msg_ttl=True, allow_rollup=True, subject_delete_marker_ttl=marker_ttl,
            kv={"ttl": ttl, "refresh": refresh, "visibility": visibility},
        )
        return KeyValue(self, name, info)

    async def kv(self, bucket: str) -> KeyValue:
        """An existing bucket.

        Raises:
            StreamNotFoundError / TopicNotFoundError: no such bucket. NotABucketError.
        """
        name = validate_bucket(bucket)
        info = await self.get_topic(KV_STREAM, name)
        if not info.options.get("kv"):
            raise P.error_class(P.ErrorCode.NOT_A_BUCKET)(f"topic {KV_STREAM}/{name} is not a KV bucket")
        return KeyValue(self, name, info)

    async def export(self, *, seal: bool = False) -> dict[str, Any]:
        """Export sealed segments to Parquet now (``seal``: seal the active segments
        first, so that everything stored so far is exported). Returns ``dir``,
        ``sealed``, ``exported`` (one entry per segment) and ``segments_in_export``.

        Raises:
            ExportNotConfiguredError: the broker has no export directory.
        """
        return (await self._request(P.Export(P.EXPORT_SEAL if seal else 0))).values

    # -- streams and topics ----------------------------------------------------------

    async def create_stream(self, name: str, stream_id: int = 0) -> P.StreamDetails:
        return await self._request(P.CreateStream(stream_id, name))

    async def get_stream(self, stream: int | str) -> P.StreamDetails:
        return await self._request(P.GetStream(Identifier.of(stream)))

    async def list_streams(self) -> list[P.StreamDetails]:
        return list((await self._request(P.ListStreams())).streams)

    async def update_stream(self, stream: int | str, name: str) -> P.StreamDetails:
        return await self._request(P.UpdateStream(Identifier.of(stream), name))

    async def delete_stream(self, stream: int | str) -> None:
        await self._request(P.DeleteStream(Identifier.of(stream)))

    async def create_topic(
        self,
        stream: int | str,
        name: str,
        partitions: int = 1,
        message_expiry: int | None = None,
        subjects: list[str] | None = None,
        topic_id: int = 0,
        **options: Any,
    ) -> P.TopicDetails:
        """Create a topic.

        Args:
            message_expiry: max age in seconds; ``None`` = the broker's default
                (``[system.segment] message_expiry``), ``0`` = none.
            subjects: the subject filters it captures (default
                ``["<stream>.<topic>.>"]``).
            options: further topic options (``max_msgs_per_subject``, ``deny_purge``,
                ``segment_size``, ...).
        """
        expiry = 0 if message_expiry is None else (EXPIRY_NONE if message_expiry == 0 else message_expiry)
        if subjects is not None:
            options["subjects"] = list(subjects)
        return await self._request(P.CreateTopic(Identifier.of(stream), topic_id, partitions, expiry, name, options))

    async def update_topic(self, stream: int | str, topic: int | str, **changes: Any) -> P.TopicDetails:
        """Change topic options (``message_expiry``, ``subjects``, ...); only the
        keys given change."""
        if "subjects" in changes and changes["subjects"] is not None:
            changes["subjects"] = list(changes["subjects"])
        return await self._request(P.UpdateTopic(Identifier.of(stream), Identifier.of(topic), changes))

    async def get_topic(self, stream: int | str, topic: int | str) -> P.TopicDetails:
        return await self._request(P.GetTopic(Identifier.of(stream), Identifier.of(topic)))

    async def list_topics(self, stream: int | str) -> list[P.TopicDetails]:
        return list((await self._request(P.ListTopics(Identifier.of(stream)))).topics)

    async def delete_topic(self, stream: int | str, topic: int | str) -> None:
        await self._request(P.DeleteTopic(Identifier.of(stream), Identifier.of(topic)))

    # -- messages --------------------------------------------------------------------

    async def publish(
        self,
        subject: str,
        payload: bytes | str = b"",
        *,
        headers: Mapping[str, str] | None = None,
        ttl: int | str | None = None,
        ack: bool = True,
    ) -> Ack | None:
        """Publish one message and wait for its ack.

        A message with a ``Nats-Msg-Id`` header is sent again after a reconnection if
        the connection dropped before its ack came: the topic's duplicate window
        (``duplicate_window``) makes the broker store it once. Without one, the loss
        raises :class:`ConnectionLostError` (it may or may not have been stored).
        ``ack=False`` sends and forgets (at most once).

        Raises:
            BrokerError: the message was not stored (its ack's error); for a subject no
                topic captures that is NoTopicForSubjectError (core subscribers still
                received it).
            ConnectionLostError: the connection dropped with the publish in flight.
            TimeoutError: no ack (or no connection) within the client's timeout.
        """
        if not ack:
            await self._send_no_ack(P.Publish.from_bodies([encode_msg(subject, payload, headers, ttl)], P.PUBLISH_NO_ACK))
            return None
        retry = headers is not None and MSG_ID_HEADER in headers
        a = Acks.first(await self._call(Command.PUBLISH, encode_msg(subject, payload, headers, ttl, prefix=P.PUBLISH_ONE), retry))
        if a.error is not None:
            raise a.error
        return a

    async def publish_batch(self, messages: Iterable[Msg | tuple[Any, ...] | bytes], *, ack: bool = True) -> Acks | None:
        """Publish many messages in one frame; one ack each, in order (errors are in
        the acks, not raised: see ``Acks.raise_for_errors``).

        ``messages`` may hold :class:`Msg`, ``(subject, payload[, headers[, ttl]])``
        tuples, or bodies already encoded with ``encode_msg``. A batch whose every
        message has a ``Nats-Msg-Id`` header is sent again after a reconnection, as
        :meth:`publish` does; any other raises :class:`ConnectionLostError`.
        """
        bodies = [m if isinstance(m, (bytes, bytearray)) else encode_msg(*m) for m in messages]
        cmd = P.Publish.from_bodies(bodies, 0 if ack else P.PUBLISH_NO_ACK)
        if not ack:
            await self._send_no_ack(cmd)
            return None
        # The acks come as their raw payload (``_feed``).
        return Acks.decode(await self._request(cmd, lambda: bool(bodies) and all(_has_msg_id(b) for b in bodies)))

    async def fetch(
        self,
        stream: int | str,
        topic: int | str,
        partition: int = 0,
        offset: int = 1,
        count: int = 100,
        *,
        max_bytes: int = 0,
        subject: str | None = None,
    ) -> Fetched:
        """Read up to ``count`` live messages of one partition from ``offset`` on.

        ``subject`` filters by subject (wildcards allowed). ``next_offset`` of the
        result is where to continue.

        Raises:
            CorruptedRecordError: the first record to return is corrupt (fetch from
                the next offset to read past it).
        """
        r: P.FetchResult = await self._request(
            P.Fetch(Identifier.of(stream), Identifier.of(topic), partition, offset, count, max_bytes, subject or "")
        )
        return Fetched(r.messages(), r.next_offset, r.first_offset, r.last_offset, r.partition)

    async def get_last(self, stream: int | str, topic: int | str, subject: str) -> Message:
        """The newest live message on ``subject``.

        Raises:
            MessageNotFoundError: none.
        """
        r: P.FetchResult = await self._request(P.GetLast(Identifier.of(stream), Identifier.of(topic), subject))
        return r.messages()[0]

    async def delete_message(self, stream: int | str, topic: int | str, partition: int, offset: int) -> None:
        await self._request(P.DeleteMessage(Identifier.of(stream), Identifier.of(topic), partition, offset))

    async def purge(self, stream: int | str, topic: int | str, subject: str | None = None) -> int:
        """Remove every message of the topic, or of the subjects matching ``subject``;
        returns how many went."""
        r = await self._request(P.Purge(Identifier.of(stream), Identifier.of(topic), subject or ""))
        return r.purged

    async def subscribe(self, subject_filter: str, *, max_pending: int = 65536) -> Subscription:
        """Receive every message published on matching subjects from now on, at most
        once (stored or not)."""
        sid = next(self._sids)
        sub = Subscription(self, sid, subject_filter, max_pending)
        self._subs[sid] = sub  # before the answer: deliveries may come with it
        try:
            with self._backend.timeout(self._timeout):
                while True:
                    conn = await self._wait_connected()
                    if sub._error is not None:
                        raise sub._error
                    if sub._conn is conn:
                        break  # a reconnection subscribed it meanwhile
                    try:
                        await self._roundtrip(conn, P.Subscribe(sid, subject_filter))
                    except ConnectionLostError:
                        # The broker forgot it with the connection: subscribe again.
                        if not self._reconnect or self.closed:
                            raise
                        continue
                    except BrokerError as err:
                        if err.code != ErrorCode.SHUTTING_DOWN or not self._reconnect or self.closed:
                            raise
                        await conn.gone.wait()
                        continue
                    sub._conn = conn
                    break
        except TimeoutError as exc:
            self._subs.pop(sid, None)
            sub._end()
            raise self._timeout_error(exc) from None
        except BaseException:
            self._subs.pop(sid, None)
            sub._end()
            raise
        return sub

    # -- consumer offsets ------------------------------------------------------------

    async def store_offset(self, stream: int | str, topic: int | str, consumer: str, partition: int, offset: int) -> None:
        await self._request(P.StoreConsumerOffset(Identifier.of(stream), Identifier.of(topic), partition, consumer, offset))

    async def get_offset(self, stream: int | str, topic: int | str, consumer: str, partition: int) -> int:
        """Raises: ConsumerOffsetNotFoundError."""
        r = await self._request(P.GetConsumerOffset(Identifier.of(stream), Identifier.of(topic), partition, consumer))
        return r.offset

    async def delete_offset(self, stream: int | str, topic: int | str, consumer: str, partition: int) -> None:
        await self._request(P.DeleteConsumerOffset(Identifier.of(stream), Identifier.of(topic), partition, consumer))

