"""A small HTTP/1.1 server on h11, for the monitoring endpoints (``_monitor.py``).

h11 parses and frames; this module does the I/O and the rules around it:

1. **Bounded.** A request head over :data:`MAX_HEAD_BYTES` gets 431, a body over
   :data:`MAX_BODY_BYTES` 413 (the endpoints take no body; a small one is read and
   ignored). At most :data:`MAX_CONNECTIONS` connections are served at once; one
   more is closed as soon as it is accepted.
2. **Timed.** A request must arrive whole within :data:`REQUEST_SECONDS` of the
   connection becoming idle (accepted, or its previous response sent): a client
   that sends part of one gets 408, an idle keep-alive connection is closed
   quietly. A response must be taken within :data:`SEND_SECONDS`.
3. **Kept alive.** HTTP/1.1 connections serve requests one after another until
   the client closes or sends ``Connection: close`` (h11 decides).
4. **Contained.** Bytes that are not HTTP/1.x get 400 (h11's hint), another HTTP
   version 505, and only that connection closes; a bug in a handler gets 500 and is
   logged. Nothing a client sends reaches the caller's nursery (only cancellation
   passes).

The handler is ``async (Request) -> Response`` and runs on the event loop.
After an error response the connection is half-closed and what the client still
sends is read and dropped for a moment (:data:`LINGER_SECONDS`), so that closing
with unread input does not reset the connection before the client reads the error.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus

import h11
import trio

from broker.core import get_logger

__all__ = ["Request", "Response", "HttpStats", "serve_http", "MAX_HEAD_BYTES", "MAX_BODY_BYTES", "MAX_CONNECTIONS"]

log = get_logger(__name__)

#: Largest request head (request line and headers). h11's default is 16 KiB;
#: nginx's is 1 KiB plus 8 KiB buffers. A scrape sends a few hundred bytes.
MAX_HEAD_BYTES = 8 * 1024
#: Largest request body read (and ignored).
MAX_BODY_BYTES = 64 * 1024
#: Connections served at once (Prometheus holds one per scraper).
MAX_CONNECTIONS = 64
#: Time for a whole request to arrive, from when the connection is idle.
REQUEST_SECONDS = 10.0
#: Time for the client to take a response.
SEND_SECONDS = 10.0
#: How long an error response's connection is drained before it is closed.
LINGER_SECONDS = 1.0
_CHUNK = 16 * 1024

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
    """What the server did since start (``_metrics.py`` shows it)."""

    def __init__(self) -> None:
        self.connections_total = 0
        #: Connections closed at once because MAX_CONNECTIONS were being served.
        self.connections_refused = 0
        self.connections = 0
        #: Responses sent, by status code.
        self.responses: dict[int, int] = {}

    def responded(self, status: int) -> None:
        self.responses[status] = self.responses.get(status, 0) + 1


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
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve HTTP on ``listeners`` until cancelled; ``task_status.started()`` once
    accepting. An accept error that trio does not retry stops only this server
    (logged); the caller's nursery never sees it."""

    async def connection(stream: trio.SocketStream) -> None:
        stats.connections_total += 1
        if stats.connections >= MAX_CONNECTIONS:
            stats.connections_refused += 1
            log.debug("http_connection_refused", limit=MAX_CONNECTIONS)
            await trio.aclose_forcefully(stream)
            return
        stats.connections += 1
        try:
            await _serve_connection(stream, handler, stats)
        finally:
            stats.connections -= 1

    started = False
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, connection, listeners)
            started = True
            task_status.started()
    except Exception:
        if not started:
            raise
        log.error("http_stopped", exc_info=True)


async def _serve_connection(stream: trio.SocketStream, handler: Handler, stats: HttpStats) -> None:
    """One connection, request after request. Never raises (but Cancelled)."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
    try:
        while True:
            with trio.move_on_after(REQUEST_SECONDS) as waiting:
                request = await _read_request(conn, stream)
            if waiting.cancelled_caught:
                if conn.trailing_data[0] or conn.their_state is not h11.IDLE:
                    await _error(conn, stream, stats, 408, "the request did not arrive in time")
                return  # an idle keep-alive connection: close quietly
            if request is None:
                return  # the client closed
            try:
                response = await handler(request)
            except Exception:
                log.error("http_handler_failed", exc_info=True, target=request.target)
                response = Response(500, b"internal error\n")
            if not await _send(conn, stream, stats, response, head_only=request.method == "HEAD"):
                return
            if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                return
            conn.start_next_cycle()
    except h11.RemoteProtocolError as exc:
        await _error(conn, stream, stats, exc.error_status_hint, f"bad request: {exc}")
    except _Refused as exc:
        await _error(conn, stream, stats, exc.status, exc.text)
    except (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError):
        pass
    except Exception:
        log.error("http_connection_failed", exc_info=True)
    finally:
        with trio.CancelScope(shield=True):
            await trio.aclose_forcefully(stream)


async def _read_request(conn: h11.Connection, stream: trio.SocketStream) -> Request | None:
    """The next whole request (its body read and dropped), or None at a clean end
    of stream between requests."""
    request: h11.Request | None = None
    body = 0
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await stream.receive_some(_CHUNK))  # b"" is the end of stream: h11 says what it means
            continue
        if isinstance(event, h11.ConnectionClosed):
            return None
        if isinstance(event, h11.Request):
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


async def _send(conn: h11.Connection, stream: trio.SocketStream, stats: HttpStats, response: Response, *, head_only: bool = False, close: bool = False) -> bool:
    """Send ``response``; False if the client did not take it in time."""
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
    data = conn.send(h11.Response(status_code=response.status, headers=headers, reason=reason))
    assert data is not None
    if not head_only and response.body:
        data += conn.send(h11.Data(data=response.body)) or b""
    data += conn.send(h11.EndOfMessage()) or b""
    stats.responded(response.status)
    with trio.move_on_after(SEND_SECONDS):
        await stream.send_all(data)
        return True
    return False


async def _error(conn: h11.Connection, stream: trio.SocketStream, stats: HttpStats, status: int, text: str) -> None:
    """Answer a request that cannot be served, if h11 still allows a response, then
    half-close and drain. Never raises (but Cancelled)."""
    try:
        if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            sent = await _send(conn, stream, stats, Response(status, text.encode() + b"\n"), close=True)
            if not sent:
                return
        with trio.move_on_after(LINGER_SECONDS):
            await stream.send_eof()
            drained = 0
            while drained < MAX_BODY_BYTES and (data := await stream.receive_some(_CHUNK)):
                drained += len(data)
    except (h11.LocalProtocolError, trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError):
        pass
