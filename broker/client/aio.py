"""The asyncio flavour of the client: the same :class:`Client`, on asyncio.

    from broker.client import aio

    async def main():
        async with aio.connect("127.0.0.1:8090") as client:
            await client.publish("orders.eu.1", b"hello")

    aio.run(main())   # uses uvloop when it is installed

``run`` is ``asyncio.run`` with uvloop's event loop where uvloop is installed (the
``bench`` extra installs it).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

from ._backend import AsyncioBackend
from ._client import Client, parse_address

__all__ = ["connect", "run", "loop_factory"]

T = TypeVar("T")


@contextlib.asynccontextmanager
async def connect(
    address: str = "127.0.0.1:8090",
    *,
    token: str = "",
    name: str = "ttlbroker-python",
    timeout: float | None = 30.0,
) -> AsyncIterator[Client]:
    """Connect (asyncio) and handshake; the connection closes when the block ends."""
    host, port = parse_address(address)
    client = Client(AsyncioBackend(), timeout)
    await client._open(host, port, token, name)
    try:
        yield client
    finally:
        await client.aclose()


def loop_factory() -> Any:
    """uvloop's loop factory if uvloop is installed, else None (asyncio's default)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on uvloop if installed, else on asyncio's default loop."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(coro)
