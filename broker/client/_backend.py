"""The small interface the client needs from an async runtime, for trio and asyncio.

Everything else in the client is plain ``async def`` code that runs unchanged on
either runtime (httpcore's ``_backends`` pattern): coroutines only care about what
they await, and all of that comes from here.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

__all__ = ["Backend", "TrioBackend", "AsyncioBackend", "QueueFull", "QueueClosed"]


class QueueFull(Exception):
    pass


class QueueClosed(Exception):
    pass


class Transport(Protocol):
    async def send_all(self, data: bytes) -> None: ...
    async def receive_some(self, max_bytes: int) -> bytes: ...
    async def aclose(self) -> None: ...


class Queue(Protocol):
    def put_nowait(self, item: Any) -> None: ...
    async def get(self) -> Any: ...
    def close(self) -> None: ...
    def qsize(self) -> int: ...


class Backend(Protocol):
    name: str

    def event(self) -> Any: ...
    def queue(self, maxsize: int) -> Queue: ...
    async def connect(self, host: str, port: int) -> Transport: ...
    def task_group(self) -> contextlib.AbstractAsyncContextManager[Any]: ...
    def start(self, group: Any, fn: Callable[[], Awaitable[None]]) -> None: ...
    def cancel(self, group: Any) -> None: ...
    def timeout(self, seconds: float | None) -> contextlib.AbstractContextManager[None]: ...
    async def checkpoint(self) -> None: ...


# -- trio --------------------------------------------------------------------------


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


class _TrioTransport:
    def __init__(self, stream: Any) -> None:
        self._stream = stream

    async def send_all(self, data: bytes) -> None:
        await self._stream.send_all(data)

    async def receive_some(self, max_bytes: int) -> bytes:
        return await self._stream.receive_some(max_bytes)

    async def aclose(self) -> None:
        import trio

        await trio.aclose_forcefully(self._stream)


class TrioBackend:
    name = "trio"

    def __init__(self) -> None:
        import trio

        self._trio = trio

    def event(self) -> Any:
        return self._trio.Event()

    def queue(self, maxsize: int) -> _TrioQueue:
        return _TrioQueue(maxsize)

    async def connect(self, host: str, port: int) -> _TrioTransport:
        return _TrioTransport(await self._trio.open_tcp_stream(host, port))

    def task_group(self) -> Any:
        return self._trio.open_nursery()

    def start(self, group: Any, fn: Callable[[], Awaitable[None]]) -> None:
        group.start_soon(fn)

    def cancel(self, group: Any) -> None:
        group.cancel_scope.cancel()

    @contextlib.contextmanager
    def timeout(self, seconds: float | None) -> Any:
        if seconds is None:
            yield
            return
        try:
            with self._trio.fail_after(seconds):
                yield
        except self._trio.TooSlowError:
            raise TimeoutError(f"no answer within {seconds} s") from None

    async def checkpoint(self) -> None:
        await self._trio.lowlevel.checkpoint()



# -- asyncio -----------------------------------------------------------------------


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


class _AsyncioTransport:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    async def send_all(self, data: bytes) -> None:
        self._writer.write(data)
        await self._writer.drain()

    async def receive_some(self, max_bytes: int) -> bytes:
        return await self._reader.read(max_bytes)

    async def aclose(self) -> None:
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()


class _AsyncioGroup:
    def __init__(self) -> None:
        self.tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> _AsyncioGroup:
        return self

    async def __aexit__(self, *exc: object) -> None:
        for t in self.tasks:
            t.cancel()
        for t in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t


class AsyncioBackend:
    name = "asyncio"

    def event(self) -> asyncio.Event:
        return asyncio.Event()

    def queue(self, maxsize: int) -> _AsyncioQueue:
        return _AsyncioQueue(maxsize)

    async def connect(self, host: str, port: int) -> _AsyncioTransport:
        reader, writer = await asyncio.open_connection(host, port, limit=1 << 20)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            import socket

            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return _AsyncioTransport(reader, writer)

    def task_group(self) -> _AsyncioGroup:
        return _AsyncioGroup()

    def start(self, group: _AsyncioGroup, fn: Callable[[], Awaitable[None]]) -> None:
        group.tasks.append(asyncio.ensure_future(fn()))

    def cancel(self, group: _AsyncioGroup) -> None:
        for t in group.tasks:
            t.cancel()

    @contextlib.contextmanager
    def timeout(self, seconds: float | None) -> Any:
        if seconds is None:
            yield
            return
        # asyncio.timeout is an async context manager; emulate with a loop timer.
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        fired = False

        def fire() -> None:
            nonlocal fired
            fired = True
            if task is not None:
                task.cancel()

        handle = loop.call_later(seconds, fire)
        try:
            yield
        except asyncio.CancelledError:
            if fired:
                raise TimeoutError(f"no answer within {seconds} s") from None
            raise
        finally:
            handle.cancel()

    async def checkpoint(self) -> None:
        await asyncio.sleep(0)

