"""A small HTTP/1.1 server on h11, for the monitoring endpoints (``_monitor.py``).

h11 parses and frames; this module does the I/O and the rules around it:

1. **Bounded.** A request head over :data:`MAX_HEAD_BYTES` gets 431, a body over
   :data:`MAX_BODY_BYTES` 413 (the endpoints take no body; a small one is read and
   ignored).
2. **Limited, and a new connection always gets its chance.** At most ``[http]
   max_connections`` connections are open at once, and at most
   ``max_connections_per_peer`` from one peer host (its IP address). A new
   connection over a limit takes the place of an open connection that costs the
   server nothing but its slot: at the peer's limit one of that peer's, at the total
   limit one of the peer holding the most. The one replaced is, first, a connection
   lingering after an error response; then one waiting for a request (idle between
   requests, with part of a head, or a handler waiting for its turn at slow work,
   :func:`waiting`); then one whose response the client is slow to take; the one in
   that state longest goes first. A connection whose handler is working is never
   replaced. So slow and idle clients may hold every slot, but never keep a probe
   out: a new connection is refused (closed as soon as it is accepted) only when
   every connection it could replace is being served. nginx frees connections the
   same way when it runs out (``ngx_drain_connections``: its idle keep-alive
   connections, oldest first); nats-server's monitoring has no limit at all.
3. **Timed.** A new connection's request (head and body) must arrive whole within
   ``[http] head_timeout`` of the accept; on a kept-alive connection, within
   ``head_timeout`` of its first byte, which may come up to :data:`IDLE_SECONDS`
   after the previous response. A client that sent part of a request gets 408; one
   that sent nothing is closed quietly (nginx's ``client_header_timeout``, Go's
   ``ReadHeaderTimeout``). A response must be taken within :data:`SEND_SECONDS`.
4. **Kept alive.** HTTP/1.1 connections serve requests one after another until
   the client closes or sends ``Connection: close`` (h11 decides).
5. **HEAD is GET without the body**, for every answer the server gives, errors
   included: the same status line and headers, ``Content-Length`` too.
6. **Contained.** Bytes that are not HTTP/1.x get 400 (h11's hint), another HTTP
   version 505, and only that connection closes; a bug in a handler gets 500 and is
   logged. Nothing a client sends reaches the caller's nursery (only cancellation
   passes).
7. **Counted.** Refusals, replacements and timeouts are counted in the broker's
   ``Counters`` (``http_connections_refused``, ``http_connections_evicted``,
   ``http_request_timeouts``, ``http_response_timeouts``) and logged, at most one
   line per event and peer host every 10 s (``broker.net.LogLimiter``; the line says
   how many it stands for), so a flood cannot flood the log.

The handler is ``async (Request) -> Response`` and runs on the event loop, in the
connection's task. After an error response the connection is half-closed and what
the client still sends is read and dropped for a moment (:data:`LINGER_SECONDS`), so
that closing with unread input does not reset the connection before the client
reads the error.
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from http import HTTPStatus

import h11
import trio

from broker.config import HttpConfig
from broker.core import Counters, get_logger
from broker.net import LogLimiter

__all__ = [
    "Request", "Response", "HttpStats", "serve_http", "waiting", "MAX_HEAD_BYTES", "MAX_BODY_BYTES", "IDLE_SECONDS",
    "SEND_SECONDS",
]

log = get_logger(__name__)

#: Largest request head (request line and headers). h11's default is 16 KiB;
#: nginx's is 1 KiB plus 8 KiB buffers. A scrape sends a few hundred bytes.
MAX_HEAD_BYTES = 8 * 1024
#: Largest request body read (and ignored).
MAX_BODY_BYTES = 64 * 1024
#: How long a kept-alive connection may wait for the first byte of its next request.
#: Prometheus scrapes every 15 s by default and reconnects when it finds the
#: connection closed; an idle connection is also the first to go for a new one.
IDLE_SECONDS = 10.0
#: Time for the client to take a response.
SEND_SECONDS = 10.0
#: How long an error response's connection is drained before it is closed.
LINGER_SECONDS = 1.0
_CHUNK = 16 * 1024
#: Bytes of a request's start kept to tell a HEAD that h11 could not parse.
_START_BYTES = 16

SERVER_HEADER = b"ttlbroker"


@dataclass(frozen=True)
class Request:
    method: str
    #: The request target as sent (path and query).
    target: str
    #: Header names lower-cased (h11's normalisation).
    headers: tuple[tuple[bytes, bytes], ...] = ()

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    def header(self, name: bytes) -> bytes | None:
        for k, v in self.headers:
            if k == name:
                return v
        return None


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = field(default=())


Handler = Callable[[Request], Awaitable[Response]]


class HttpStats:
    """What the server did since start (``_metrics.py`` shows it). The counts that
    only grow are fields of the broker's ``counters`` (``http_*``), so that ``stats``
    and ``/varz`` show them too; what needs a label or is a gauge is here.

    Args:
        counters: the broker's counters (a fresh set if None: a server of its own).
    """

    def __init__(self, counters: Counters | None = None) -> None:
        self.counters = counters if counters is not None else Counters()
        #: Connections open now.
        self.connections = 0
        #: Responses sent, by status code.
        self.responses: dict[int, int] = {}

    def responded(self, status: int) -> None:
        self.responses[status] = self.responses.get(status, 0) + 1


class _State(enum.IntEnum):
    """What an open connection is doing, in the order rule 2 replaces them."""

    #: An error response was sent; draining what the client still sends.
    LINGERING = 0
    #: Waiting for a request (idle, or part of a head), or for its turn at slow work.
    WAITING = 1
    #: Sending a response.
    SENDING = 2
    #: A handler is working for it: never replaced.
    BUSY = 3


class _Conn:
    """One open connection, as the limits see it."""

    __slots__ = ("peer", "scope", "state", "since", "start", "method")

    def __init__(self, peer: str, now: float) -> None:
        self.peer = peer
        #: Cancelled when a new connection takes its place.
        self.scope = trio.CancelScope()
        self.state = _State.WAITING
        #: When it entered ``state`` (``trio.current_time()``).
        self.since = now
        #: The first bytes of the current request, and its method once parsed: how
        #: an error answers a HEAD (rule 5).
        self.start = b""
        self.method: bytes | None = None

    def enter(self, state: _State) -> None:
        self.state = state
        self.since = trio.current_time()

    @property
    def head_only(self) -> bool:
        """Whether the current request is a HEAD (its answer has no body)."""
        if self.method is not None:
            return self.method == b"HEAD"
        return self.start.lstrip(b"\r\n").startswith(b"HEAD ")


#: The connection whose task this is (each connection's task sets it): what
#: :func:`waiting` marks.
_current: contextvars.ContextVar[_Conn | None] = contextvars.ContextVar("_current", default=None)


@contextlib.contextmanager
def waiting() -> Iterator[None]:
    """Inside a handler, around a wait for its turn at slow work (a scrape waiting
    for the one before it): meanwhile its connection counts as waiting, and a new
    connection at a limit may take its place (rule 2), which cancels the handler.
    Elsewhere, nothing."""
    conn = _current.get()
    if conn is None:
        yield
        return
    conn.enter(_State.WAITING)
    try:
        yield
    finally:
        conn.enter(_State.BUSY)


class _Refused(Exception):
    """A request this server does not take: answered with ``status``, then closed."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


async def serve_http(
    listeners: list[trio.SocketListener],
    handler: Handler,
    stats: HttpStats,
    limits: HttpConfig | None = None,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve HTTP on ``listeners`` until cancelled; ``task_status.started()`` once
    accepting. ``limits``: ``max_connections``, ``max_connections_per_peer`` and
    ``head_timeout`` of ``[http]`` (the defaults if None).

    Error handling: an accept error that trio does not retry stops only this server
    (logged); the caller's nursery never sees it, nor anything a connection does.
    """
    server = _Server(handler, stats, limits or HttpConfig())
    started = False
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, server.connection, listeners)
            started = True
            task_status.started()
    except Exception:
        if not started:
            raise
        log.error("http_stopped", exc_info=True)


def _peer_host(stream: trio.SocketStream) -> str:
    name = stream.socket.getpeername()
    return str(name[0]) if isinstance(name, tuple) else str(name)


class _Server:
    """The connections of one :func:`serve_http`: their limits (rule 2) and their
    requests."""

    def __init__(self, handler: Handler, stats: HttpStats, limits: HttpConfig) -> None:
        self.handler = handler
        self.stats = stats
        self.counters = stats.counters
        self.max_total = limits.max_connections
        self.max_per_peer = limits.max_connections_per_peer
        self.head_timeout = limits.head_timeout
        #: Open connections by peer host.
        self.by_peer: dict[str, set[_Conn]] = {}
        self.log_limit = LogLimiter()

    # -- limits ---------------------------------------------------------------------

    def admit(self, peer: str) -> _Conn | None:
        """A slot for a new connection from ``peer``, made by replacing another if a
        limit is reached (rule 2); None: refused (counted and logged).

        Runtime complexity: O(1) below the limits; at one, O(connections of the
        peer) or O(connections)."""
        now = trio.current_time()
        mine = self.by_peer.get(peer)
        limit = ""
        if mine is not None and len(mine) >= self.max_per_peer:
            limit = "max_connections_per_peer"
            victim = _least_busy(mine, lambda c: (c.state, c.since))
        elif self.stats.connections >= self.max_total:
            limit = "max_connections"
            victim = _least_busy(
                (c for conns in self.by_peer.values() for c in conns),
                lambda c: (c.state, -len(self.by_peer[c.peer]), c.since),
            )
        else:
            victim = None
        if victim is not None:
            self._evict(victim, peer, limit, now)
        elif limit:
            self.counters.http_connections_refused += 1
            self._log_limited(
                "warning", "http_connection_refused", peer, limit=limit, open=self.stats.connections,
                open_from_peer=len(mine or ()), reason="every connection it could replace is being served",
            )
            return None
        conn = _Conn(peer, now)
        self.by_peer.setdefault(peer, set()).add(conn)
        self.stats.connections += 1
        return conn

    def _evict(self, victim: _Conn, peer: str, limit: str, now: float) -> None:
        self._remove(victim)
        victim.scope.cancel()
        self.counters.http_connections_evicted += 1
        self._log_limited(
            "info", "http_connection_evicted", victim.peer, state=victim.state.name.lower(),
            seconds=round(now - victim.since, 3), limit=limit, new_peer=peer,
        )

    def _remove(self, conn: _Conn) -> None:
        conns = self.by_peer.get(conn.peer)
        if conns is None or conn not in conns:
            return  # already replaced
        conns.discard(conn)
        if not conns:
            del self.by_peer[conn.peer]
        self.stats.connections -= 1

    def _log_limited(self, level: str, event: str, peer: str, **fields: object) -> None:
        suppressed = self.log_limit.allow(f"{event} {peer}", trio.current_time())
        if suppressed is not None:
            getattr(log, level)(event, peer=peer, **fields, suppressed=suppressed)

    # -- connections ----------------------------------------------------------------

    async def connection(self, stream: trio.SocketStream) -> None:
        """The ``serve_listeners`` handler: one connection. Never raises (but
        Cancelled)."""
        try:
            self.counters.http_connections_total += 1
            try:
                peer = _peer_host(stream)
            except OSError:  # gone already
                return
            conn = self.admit(peer)
            if conn is None:
                return
            token = _current.set(conn)
            try:
                with conn.scope:  # cancelled when a new connection takes its place
                    await self._serve(conn, stream)
            finally:
                _current.reset(token)
                self._remove(conn)
        except Exception:
            log.error("http_connection_failed", exc_info=True)
        finally:
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)

    async def _serve(self, conn: _Conn, stream: trio.SocketStream) -> None:
        """Request after request. Never raises (but Cancelled)."""
        h = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        deadline = trio.current_time() + self.head_timeout  # a new connection: its first request from the accept
        fresh = True
        try:
            while True:
                conn.enter(_State.WAITING)
                conn.start, conn.method = h.trailing_data[0][:_START_BYTES], None  # a pipelined request's start
                idle = not fresh and not conn.start
                if not fresh:
                    deadline = trio.current_time() + (IDLE_SECONDS if idle else self.head_timeout)
                with trio.CancelScope(deadline=deadline) as scope:
                    request = await self._read_request(h, stream, conn, scope, idle=idle)
                if scope.cancelled_caught:
                    if fresh or conn.start:
                        self.counters.http_request_timeouts += 1
                        self._log_limited(
                            "info", "http_request_timeout", conn.peer, received=bool(conn.start),
                            timeout=self.head_timeout,
                        )
                    if conn.start:
                        await self._error(h, stream, conn, 408, "the request did not arrive in time")
                    return  # nothing of a request: close quietly
                if request is None:
                    return  # the client closed
                fresh = False
                conn.enter(_State.BUSY)
                try:
                    response = await self.handler(request)
                except Exception:
                    log.error("http_handler_failed", exc_info=True, target=request.target)
                    response = Response(500, b"internal error\n")
                if not await self._send(h, stream, conn, response):
                    return
                if h.our_state is h11.MUST_CLOSE or h.their_state is h11.MUST_CLOSE:
                    return
                h.start_next_cycle()
        except h11.RemoteProtocolError as exc:
            await self._error(h, stream, conn, exc.error_status_hint, f"bad request: {exc}")
        except _Refused as exc:
            await self._error(h, stream, conn, exc.status, exc.text)
        except (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError):
            pass

    async def _read_request(
        self, h: h11.Connection, stream: trio.SocketStream, conn: _Conn, scope: trio.CancelScope, *, idle: bool,
    ) -> Request | None:
        """The next whole request (its body read and dropped), or None at a clean
        end of stream between requests. On an ``idle`` kept-alive connection, the
        request's first byte moves ``scope``'s deadline to ``head_timeout`` from then."""
        request: h11.Request | None = None
        body = 0
        while True:
            event = h.next_event()
            if event is h11.NEED_DATA:
                data = await stream.receive_some(_CHUNK)
                if data and len(conn.start) < _START_BYTES:
                    if idle and not conn.start:  # the first byte after a pause: the head's time starts
                        scope.deadline = trio.current_time() + self.head_timeout
                    conn.start += data[:_START_BYTES - len(conn.start)]
                h.receive_data(data)  # b"" is the end of stream: h11 says what it means
                continue
            if isinstance(event, h11.ConnectionClosed):
                return None
            if isinstance(event, h11.Request):
                conn.method = bytes(event.method)
                if event.http_version not in (b"1.0", b"1.1"):
                    raise _Refused(505, "only HTTP/1.0 and HTTP/1.1 are served")
                request = event
            elif isinstance(event, h11.Data):
                body += len(event.data)
                if body > MAX_BODY_BYTES:
                    raise _Refused(413, f"a request body is at most {MAX_BODY_BYTES} bytes")
            elif isinstance(event, h11.EndOfMessage):
                assert request is not None
                return Request(
                    request.method.decode("ascii", "replace"), request.target.decode("ascii", "replace"),
                    tuple((bytes(k), bytes(v)) for k, v in request.headers),
                )

    async def _send(self, h: h11.Connection, stream: trio.SocketStream, conn: _Conn, response: Response, *, close: bool = False) -> bool:
        """Send ``response`` (its head alone to a HEAD); False if the client did not
        take it in time."""
        headers = [
            (b"content-type", response.content_type.encode()),
            (b"content-length", str(len(response.body)).encode()),
            (b"server", SERVER_HEADER),
            (b"cache-control", b"no-store"),
            *((k.encode(), v.encode()) for k, v in response.headers),
        ]
        if close:
            headers.append((b"connection", b"close"))
        try:
            reason = HTTPStatus(response.status).phrase.encode()
        except ValueError:
            reason = b""
        data = h.send(h11.Response(status_code=response.status, headers=headers, reason=reason))
        assert data is not None
        if not conn.head_only:
            if response.body:
                data += h.send(h11.Data(data=response.body)) or b""
            data += h.send(h11.EndOfMessage()) or b""
        elif not close:
            # h11 parsed this HEAD, so it frames the answer without a body. An error
            # may answer a HEAD h11 could not parse (it would want the body the head
            # announces); the connection closes after an error anyway.
            data += h.send(h11.EndOfMessage()) or b""
        self.stats.responded(response.status)
        conn.enter(_State.SENDING)
        with trio.move_on_after(SEND_SECONDS):
            await stream.send_all(data)
            return True
        self.counters.http_response_timeouts += 1
        self._log_limited("info", "http_response_timeout", conn.peer, status=response.status, timeout=SEND_SECONDS)
        return False

    async def _error(self, h: h11.Connection, stream: trio.SocketStream, conn: _Conn, status: int, text: str) -> None:
        """Answer a request that cannot be served, if h11 still allows a response,
        then half-close and drain. Never raises (but Cancelled)."""
        try:
            if h.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                sent = await self._send(h, stream, conn, Response(status, text.encode() + b"\n"), close=True)
                if not sent:
                    return
            conn.enter(_State.LINGERING)
            with trio.move_on_after(LINGER_SECONDS):
                await stream.send_eof()
                drained = 0
                while drained < MAX_BODY_BYTES and (data := await stream.receive_some(_CHUNK)):
                    drained += len(data)
        except (h11.LocalProtocolError, trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError):
            pass


def _least_busy(conns: Iterable[_Conn], key: Callable[[_Conn], tuple[float, ...]]) -> _Conn | None:
    """The connection of ``conns`` to replace first by ``key`` (rule 2); None if every
    one is busy."""
    return min((c for c in conns if c.state is not _State.BUSY), key=key, default=None)
