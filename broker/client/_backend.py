"""The small interface the client needs from an async runtime, for trio and asyncio.

Everything else in the client is plain ``async def`` code that runs unchanged on
either runtime (httpcore's ``_backends`` pattern): coroutines only care about what
they await, and all of that comes from here.

A *link* is the connection as the client sees it: ``write(data)`` queues bytes
without blocking, incoming bytes are handed to ``on_data`` and the end of the
connection to ``on_lost``. On asyncio the link is an ``asyncio.Protocol``: bytes
arrive in a callback and ``write`` goes straight to the transport, so a request costs
no task switch at all. On trio a reader task and a writer task do the same job.

A backend also runs the client's background tasks (``spawn``: the reconnection,
the callbacks, closing a lost link) from ``start`` until ``aclose``. On trio they run
in a nursery that ``start`` opens in the task that connects and ``aclose`` closes
in the same task (``connect`` does both); the links' tasks run there too, so a
link opened by the reconnection outlives the task that opened it.

A backend built with an ``ssl.SSLContext`` (``tls``) opens every link over TLS,
checking the broker's certificate against the host it connects to; its links
complete the TLS handshake before ``open_link`` returns, and a failed handshake
raises the ``ssl.SSLError`` that says why (on both runtimes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import ssl
from collections.abc import Awaitable, Callable, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

if TYPE_CHECKING:  # trio is imported when a TrioBackend is made: asyncio programs need none of it
    import trio

__all__ = ["Backend", "TrioBackend", "AsyncioBackend", "QueueFull", "QueueClosed", "Link", "Event"]

log = logging.getLogger("broker.client")

OnData = Callable[[bytes | bytearray], None]
OnLost = Callable[[BaseException | None], None]

#: Bytes queued for sending before ``drain`` makes a writer wait.
HIGH_WATER = 8 * 1024 * 1024
#: Frames written in one turn of the event loop after which they go at once (asyncio;
#: the rest still go at the end of the turn): with hundreds of requests in flight the
#: broker starts on the first ones while the client is still making the others.
FLUSH_FRAMES = 64
#: What a TLS handshake that the broker ended without a word raises (a broker
#: without TLS on that port closes a TLS client at once).
TLS_EOF_MESSAGE = "the broker closed the connection during the TLS handshake: does it serve TLS on this port?"


def timeout_error(seconds: float) -> TimeoutError:
    """What a request that got no answer in time raises (``seconds``: the client's
    timeout)."""
    return TimeoutError(f"no answer within {seconds} s")


def _tls_eof() -> ssl.SSLEOFError:
    return ssl.SSLEOFError(ssl.SSL_ERROR_EOF, TLS_EOF_MESSAGE)


class QueueFull(Exception):
    pass


class QueueClosed(Exception):
    pass


class Link(Protocol):
    def write(self, data: bytes) -> None: ...
    async def drain(self) -> None: ...
    async def aclose(self) -> None: ...


class Waiter(Protocol):
    #: When ``wait`` raises TimeoutError (the backend's clock; inf: never).
    deadline: float

    def set_result(self, value: Any) -> None: ...
    def set_exception(self, exc: BaseException) -> None: ...
    def wait(self) -> Awaitable[Any]: ...
    def cancel(self) -> None: ...


class Queue(Protocol):
    def put_nowait(self, item: Any) -> None: ...
    async def get(self) -> Any: ...
    def close(self) -> None: ...
    def qsize(self) -> int: ...


class Event(Protocol):
    def set(self) -> None: ...
    def is_set(self) -> bool: ...
    async def wait(self) -> Any: ...


class Backend(Protocol):
    name: str

    async def start(self) -> None: ...
    async def aclose(self) -> None: ...
    def spawn(self, fn: Callable[..., Awaitable[object]], *args: object) -> None: ...
    async def sleep(self, seconds: float) -> None: ...
    def event(self) -> Event: ...
    def now(self) -> float: ...
    def waiter(self, seconds: float | None = None) -> Waiter: ...
    def queue(self, maxsize: int) -> Queue: ...
    async def open_link(self, host: str, port: int, on_data: OnData, on_lost: OnLost) -> Link: ...
    def timeout(self, seconds: float | None, shown: float | None = None) -> contextlib.AbstractContextManager[None]: ...


# -- trio --------------------------------------------------------------------------


class _TrioWaiter:
    __slots__ = ("_event", "_value", "_error", "_seconds", "deadline")

    def __init__(self, seconds: float | None = None) -> None:
        import trio

        self._event = trio.Event()
        self._value: Any = None
        self._error: BaseException | None = None
        self._seconds = seconds
        self.deadline = math.inf if seconds is None else trio.current_time() + seconds

    def set_result(self, value: Any) -> None:
        self._value = value
        self._event.set()

    def set_exception(self, exc: BaseException) -> None:
        self._error = exc
        self._event.set()

    async def wait(self) -> Any:
        if self._seconds is None:
            await self._event.wait()
        else:
            import trio

            with trio.move_on_at(self.deadline):
                await self._event.wait()
            if not self._event.is_set():
                raise timeout_error(self._seconds)
        if self._error is not None:
            raise self._error
        return self._value

    def cancel(self) -> None:
        pass  # nothing to release: ``wait`` owns its deadline


class _TrioQueue:
    def __init__(self, maxsize: int) -> None:
        import trio

        self._trio = trio
        self._send, self._recv = trio.open_memory_channel(maxsize)

    def put_nowait(self, item: Any) -> None:
        try:
            self._send.send_nowait(item)
        except self._trio.WouldBlock:
            raise QueueFull from None
        except (self._trio.ClosedResourceError, self._trio.BrokenResourceError):
            raise QueueClosed from None

    async def get(self) -> Any:
        try:
            return await self._recv.receive()
        except (self._trio.EndOfChannel, self._trio.ClosedResourceError):
            raise QueueClosed from None

    def close(self) -> None:
        self._send.close()

    def qsize(self) -> int:
        return self._recv.statistics().current_buffer_used


class _TrioLink:
    """A trio stream with a reader task and a coalescing writer task (both run in
    the backend's nursery, under the link's own cancel scope)."""

    def __init__(self, stream: trio.abc.Stream, on_data: OnData, on_lost: OnLost) -> None:
        import trio

        self._trio = trio
        self._stream = stream
        self._on_data = on_data
        self._on_lost = on_lost
        self._out: list[bytes] = []
        self._queued = 0
        self._wake = trio.Event()
        self._drained = trio.Event()
        self._scope = trio.CancelScope()
        self._closed = False

    async def run(self) -> None:
        with self._scope:
            async with self._trio.open_nursery() as nursery:
                nursery.start_soon(self._reader)
                nursery.start_soon(self._writer)

    def write(self, data: bytes) -> None:
        if self._closed:
            return
        self._out.append(data)
        self._queued += len(data)
        self._wake.set()

    async def drain(self) -> None:
        while self._queued > HIGH_WATER and not self._closed:
            self._drained = self._trio.Event()
            await self._drained.wait()

    def _lose(self, error: BaseException | None) -> None:
        if not self._closed:
            self._closed = True
            self._drained.set()
            self._on_lost(error)

    async def _reader(self) -> None:
        error: BaseException | None = None
        try:
            while True:
                data = await self._stream.receive_some(256 * 1024)
                if not data:
                    break
                self._on_data(data)
        except Exception as exc:  # the stream broke
            error = exc
        self._lose(error)

    async def _writer(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = self._trio.Event()
            out, self._out = self._out, []
            if not out:
                continue
            data = out[0] if len(out) == 1 else b"".join(out)
            try:
                await self._stream.send_all(data)
            except Exception as exc:
                self._lose(exc)
                return
            self._queued -= len(data)
            if self._queued <= HIGH_WATER:
                self._drained.set()

    async def aclose(self) -> None:
        self._closed = True
        self._drained.set()
        self._scope.cancel()
        await self._trio.aclose_forcefully(self._stream)


class TrioBackend:
    name = "trio"

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        import trio

        self._trio = trio
        self._tls = tls
        self._nursery_cm: contextlib.AbstractAsyncContextManager[trio.Nursery] | None = None
        self._nursery: trio.Nursery | None = None
        self._owner: trio.lowlevel.Task | None = None
        self._scopes: set[trio.CancelScope] = set()
        self._stopped = False

    async def start(self) -> None:
        """Open the nursery of the client's tasks (in the connecting task)."""
        self._owner = self._trio.lowlevel.current_task()
        self._nursery_cm = self._trio.open_nursery()
        self._nursery = await self._nursery_cm.__aenter__()

    async def aclose(self) -> None:
        """Cancel every task of the client; in the task that called ``start``, also
        close the nursery (elsewhere that is left to the owner's own ``aclose``)."""
        self._stopped = True
        for scope in list(self._scopes):
            scope.cancel()
        cm = self._nursery_cm
        if self._nursery is None or cm is None or self._trio.lowlevel.current_task() is not self._owner:
            return
        self._nursery = None
        try:
            await cm.__aexit__(None, None, None)
        except Exception:  # the tasks catch their own errors: this is a bug
            log.exception("a background task of the client failed")

    def spawn(self, fn: Callable[..., Awaitable[object]], *args: object) -> None:
        if self._nursery is not None and not self._stopped:
            self._nursery.start_soon(self._task, fn, args)

    async def _task(self, fn: Callable[..., Awaitable[object]], args: tuple[object, ...]) -> None:
        # Each task has its own scope: the nursery's would cancel the owner's code too.
        with self._trio.CancelScope() as scope:
            if self._stopped:
                scope.cancel()
            self._scopes.add(scope)
            try:
                await fn(*args)
            except Exception:
                log.exception("a background task of the client failed")
            finally:
                self._scopes.discard(scope)

    async def sleep(self, seconds: float) -> None:
        await self._trio.sleep(seconds)

    def event(self) -> trio.Event:
        return self._trio.Event()

    def now(self) -> float:
        return self._trio.current_time()

    def waiter(self, seconds: float | None = None) -> _TrioWaiter:
        return _TrioWaiter(seconds)

    def queue(self, maxsize: int) -> _TrioQueue:
        return _TrioQueue(maxsize)

    async def open_link(self, host: str, port: int, on_data: OnData, on_lost: OnLost) -> _TrioLink:
        stream: trio.abc.Stream = await self._trio.open_tcp_stream(host, port)
        if self._tls is not None:
            stream = await self._tls_handshake(stream, host)
        if self._nursery is None or self._stopped:
            await self._trio.aclose_forcefully(stream)
            raise RuntimeError("the client is closed")
        link = _TrioLink(stream, on_data, on_lost)
        self.spawn(link.run)
        return link

    async def _tls_handshake(self, tcp: trio.abc.Stream, host: str) -> trio.SSLStream[trio.abc.Stream]:
        """``tcp`` wrapped in TLS, handshake done; raises the ``ssl.SSLError`` that
        made it fail (trio wraps it in BrokenResourceError), as asyncio does."""
        trio = self._trio
        stream = trio.SSLStream(tcp, self._tls, server_hostname=host)
        try:
            await stream.do_handshake()
        except BaseException as exc:
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(tcp)
            if isinstance(exc, trio.BrokenResourceError):
                cause = exc.__cause__
                if isinstance(cause, ssl.SSLEOFError) or cause is None or isinstance(cause, ConnectionResetError):
                    raise _tls_eof() from None
                if isinstance(cause, OSError):  # ssl.SSLError is one
                    raise cause from None
                raise ssl.SSLError(ssl.SSL_ERROR_SSL, f"the TLS handshake failed: {cause}") from exc
            raise
        return stream

    @contextlib.contextmanager
    def timeout(self, seconds: float | None, shown: float | None = None) -> Iterator[None]:
        if seconds is None:
            yield
            return
        try:
            with self._trio.fail_after(max(seconds, 0)):
                yield
        except self._trio.TooSlowError:
            raise timeout_error(seconds if shown is None else shown) from None


# -- asyncio -----------------------------------------------------------------------


class _AsyncioWaiter:
    """A future, and (with a timeout) a place in the set of its deadline's step in
    :class:`_Deadlines`, left as soon as it is answered or cancelled: no timer and no
    task of its own."""

    __slots__ = ("_fut", "_due", "_seconds", "deadline")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._fut = loop.create_future()
        self._due: _Due | None = None
        self._seconds = 0.0
        self.deadline = math.inf

    def set_result(self, value: Any) -> None:
        fut = self._fut
        if not fut.done():
            fut.set_result(value)
        due = self._due
        if due is not None:  # cancel() written out: one call per answer, not two
            due.discard(self)
            self._due = None

    def set_exception(self, exc: BaseException) -> None:
        if not self._fut.done():
            self._fut.set_exception(exc)
        if self._due is not None:
            self.cancel()

    def cancel(self) -> None:
        """Leave its deadline's set (answered, or abandoned: its caller was
        cancelled or timed out)."""
        if self._due is not None:
            self._due.discard(self)
            self._due = None

    def wait(self) -> asyncio.Future[Any]:
        return self._fut


class _AsyncioQueue:
    _CLOSED = object()

    def __init__(self, maxsize: int) -> None:
        self._q: asyncio.Queue[Any] = asyncio.Queue()
        self._max = maxsize
        self._closed = False

    def put_nowait(self, item: Any) -> None:
        if self._closed:
            raise QueueClosed
        if self._q.qsize() >= self._max:
            raise QueueFull
        self._q.put_nowait(item)

    async def get(self) -> Any:
        if self._closed and self._q.empty():
            raise QueueClosed
        item = await self._q.get()
        if item is self._CLOSED:
            self._q.put_nowait(item)
            raise QueueClosed
        return item

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._q.put_nowait(self._CLOSED)

    def qsize(self) -> int:
        return self._q.qsize()


class _AsyncioLink(asyncio.Protocol):
    """The connection as an ``asyncio.Protocol``: no reader or writer task at all.

    The writes made in one turn of the event loop (a thousand concurrent
    ``publish`` calls) are joined into one ``transport.write`` at the end of the
    turn: one system call for all of them, where each write of its own would cost
    one (and, over TLS, a record of its own, which the broker pays for about what a
    small request costs it). Every :data:`FLUSH_FRAMES` frames go at once, so that
    the broker need not wait for the whole turn (client and broker then work at the
    same time, on two cores, instead of taking turns)."""

    def __init__(self, on_data: OnData, on_lost: OnLost) -> None:
        self._on_data = on_data
        self._on_lost = on_lost
        self._transport: asyncio.Transport | None = None
        self._paused: asyncio.Future[None] | None = None
        self._out: list[bytes] = []
        self._loop = asyncio.get_running_loop()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream connection's transport: uvloop's is not an asyncio.Transport subclass.
        self._transport = transport  # type: ignore[assignment]  # (see above)
        transport.set_write_buffer_limits(high=HIGH_WATER)  # type: ignore[attr-defined]  # (see above)

    def data_received(self, data: bytes) -> None:
        self._on_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._out = []
        if self._paused is not None and not self._paused.done():
            self._paused.set_result(None)
        self._on_lost(exc)

    def pause_writing(self) -> None:
        self._paused = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._paused is not None and not self._paused.done():
            self._paused.set_result(None)
        self._paused = None

    def write(self, data: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            out = self._out
            if not out:
                self._loop.call_soon(self._flush)
            out.append(data)
            if len(out) >= FLUSH_FRAMES:
                self._flush()

    def _flush(self) -> None:
        out, self._out = self._out, []
        if out and self._transport is not None and not self._transport.is_closing():
            self._transport.write(out[0] if len(out) == 1 else b"".join(out))

    async def drain(self) -> None:
        self._flush()  # so that the transport's buffer says how much is queued
        if self._paused is not None:
            await self._paused

    async def aclose(self) -> None:
        self._flush()
        if self._transport is not None:
            self._transport.close()
            self._transport = None
        await asyncio.sleep(0)


class AsyncioBackend:
    name = "asyncio"

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self._tls = tls
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False
        self._deadlines: _Deadlines | None = None

    async def start(self) -> None:
        self._closed = False

    async def aclose(self) -> None:
        """Cancel every task of the client and wait for them."""
        self._closed = True
        tasks = [t for t in self._tasks if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        for result in await asyncio.gather(*tasks, return_exceptions=True):
            if isinstance(result, Exception):  # the tasks catch their own errors: a bug
                log.error("a background task of the client failed", exc_info=result)

    def spawn(self, fn: Callable[..., Awaitable[object]], *args: object) -> None:
        if self._closed:
            return
        task = asyncio.ensure_future(fn(*args))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def event(self) -> asyncio.Event:
        return asyncio.Event()

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    def waiter(self, seconds: float | None = None) -> _AsyncioWaiter:
        """A waiter; with ``seconds``, its ``wait`` raises TimeoutError at the end of
        the step of :class:`_Deadlines` that ``seconds`` from now falls in."""
        deadlines = self._deadlines
        if deadlines is None:
            deadlines = self._deadlines = _Deadlines(asyncio.get_running_loop())
        w = _AsyncioWaiter(deadlines.loop)
        if seconds is not None:
            at, waiting = deadlines.set_at(seconds)
            waiting.add(w)
            w._due = waiting
            w._seconds = seconds
            w.deadline = at
        return w

    def queue(self, maxsize: int) -> _AsyncioQueue:
        return _AsyncioQueue(maxsize)

    async def open_link(self, host: str, port: int, on_data: OnData, on_lost: OnLost) -> _AsyncioLink:
        loop = asyncio.get_running_loop()
        if self._tls is None:
            _, link = await loop.create_connection(lambda: _AsyncioLink(on_data, on_lost), host, port)
        else:
            try:
                _, link = await loop.create_connection(
                    lambda: _AsyncioLink(on_data, on_lost), host, port, ssl=self._tls, server_hostname=host,
                )
            except (ssl.SSLEOFError, ConnectionResetError):  # asyncio says the latter, with no text
                raise _tls_eof() from None
        return link

    def timeout(self, seconds: float | None, shown: float | None = None) -> contextlib.AbstractContextManager[None]:
        if seconds is None:
            return _NO_TIMEOUT
        if self._deadlines is None:
            self._deadlines = _Deadlines(asyncio.get_running_loop())
        return _AsyncioTimeout(self._deadlines, max(seconds, 0), seconds if shown is None else shown)


_NO_TIMEOUT = contextlib.nullcontext()

#: What ends at one deadline of :class:`_Deadlines`.
_Due: TypeAlias = "set[_AsyncioWaiter | _AsyncioTimeout]"


class _Deadlines:
    """The timers of one client's timeouts, shared: a timeout ends at the end of a
    step of ``seconds / 100`` (at most 0.1 s), and the timeouts that end at the same
    moment share one timer. A request then costs a set insertion and removal, not
    a timer of its own, whatever the number of requests in flight. What waits is a
    task (:class:`_AsyncioTimeout`, cancelled at the deadline) or a request's
    waiter (:class:`_AsyncioWaiter`, failed with TimeoutError at the deadline)."""

    __slots__ = ("loop", "_due", "_last")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._due: dict[float, _Due] = {}
        #: ``(now, seconds, at, set)`` of the last call of :meth:`set_at`.
        self._last: tuple[float, float, float, _Due] = (math.nan, math.nan, 0.0, set())

    def set_at(self, seconds: float) -> tuple[float, _Due]:
        """The deadline for a timeout of ``seconds`` from now, and the set of what
        ends then. The same as the last call's while the loop's clock has not moved
        (uvloop's moves once per turn: a thousand requests made in one turn work it
        out once); with ``seconds`` above 0 that deadline is still ahead, its set
        still waiting."""
        now = self.loop.time()
        last = self._last
        if last[0] == now and last[1] == seconds:
            return last[2], last[3]
        step = min(0.1, seconds / 100) or 1e-3
        at = math.ceil((now + seconds) / step) * step
        waiting = self._due.get(at)
        if waiting is None:
            waiting = self._due[at] = set()
            self.loop.call_at(at, self._fire, at)
        if seconds > 0:
            self._last = (now, seconds, at, waiting)
        return at, waiting

    def add(self, seconds: float, timeout: _AsyncioTimeout) -> float:
        at, waiting = self.set_at(seconds)
        waiting.add(timeout)
        return at

    def discard(self, at: float, timeout: _AsyncioTimeout) -> None:
        waiting = self._due.get(at)
        if waiting is not None:
            waiting.discard(timeout)

    def _fire(self, at: float) -> None:
        for item in self._due.pop(at, ()):
            if isinstance(item, _AsyncioWaiter):
                item._due = None
                item.set_exception(timeout_error(item._seconds))
            else:
                item.fire()


class _AsyncioTimeout:
    """``asyncio.timeout`` is an async context manager; this is the same as a plain
    one: the task is cancelled at the deadline, and the cancellation turned into
    TimeoutError on the way out (up to 1 % late: see :class:`_Deadlines`)."""

    __slots__ = ("_deadlines", "_seconds", "_shown", "_task", "_at", "_fired")

    def __init__(self, deadlines: _Deadlines, seconds: float, shown: float) -> None:
        self._deadlines = deadlines
        self._seconds = seconds
        self._shown = shown
        self._fired = False

    def __enter__(self) -> None:
        self._task = asyncio.current_task()
        self._at = self._deadlines.add(self._seconds, self)

    def fire(self) -> None:
        self._fired = True
        if self._task is not None:
            self._task.cancel()

    def __exit__(self, typ: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._deadlines.discard(self._at, self)
        if typ is asyncio.CancelledError and self._fired:
            if self._task is not None:
                self._task.uncancel()  # our cancel, consumed here (as asyncio.timeout does)
            raise timeout_error(self._shown) from None
