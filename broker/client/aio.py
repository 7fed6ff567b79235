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
import ssl
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, TypeVar

from ._backend import AsyncioBackend
from ._client import Client
from ._connection import (
    RECONNECT_ATTEMPTS,
    RECONNECT_WAIT,
    RECONNECT_WAIT_MAX,
    ErrorCallback,
    ReconnectCallback,
    parse_address,
)
from ._consumers import ConsumerInfo, ConsumerMessage, MessageStream
from ._errors import ConnectionClosedError, ConnectionLostError, NoRespondersError, NotABrokerError, ReconnectFailedError
from ._tls import resolve_tls, tls_context

__all__ = [
    "connect", "run", "loop_factory", "tls_context", "Client", "ConsumerInfo", "ConsumerMessage", "MessageStream", "ConnectionClosedError",
    "ConnectionLostError", "NoRespondersError", "ReconnectFailedError", "NotABrokerError",
]

T = TypeVar("T")


@contextlib.asynccontextmanager
async def connect(
    address: str = "127.0.0.1:8090",
    *,
    token: str = "",
    user: str = "",
    password: str = "",
    name: str = "ttlbroker-python",
    timeout: float | None = 30.0,
    reconnect: bool = True,
    max_reconnect_attempts: int = RECONNECT_ATTEMPTS,
    reconnect_wait: float = RECONNECT_WAIT,
    reconnect_wait_max: float = RECONNECT_WAIT_MAX,
    on_disconnect: ErrorCallback | None = None,
    on_reconnect: ReconnectCallback | None = None,
    on_closed: ErrorCallback | None = None,
    tls: ssl.SSLContext | bool | None = None,
) -> AsyncIterator[Client]:
    """Connect (asyncio) and handshake; the connection closes when the block ends.
    The same options (``tls`` included) and errors as ``broker.client.connect``."""
    address, tls_ctx = resolve_tls(address, tls)
    host, port = parse_address(address)
    client = Client(
        AsyncioBackend(tls_ctx), timeout, reconnect=reconnect, max_reconnect_attempts=max_reconnect_attempts,
        reconnect_wait=reconnect_wait, reconnect_wait_max=reconnect_wait_max,
        on_disconnect=on_disconnect, on_reconnect=on_reconnect, on_closed=on_closed,
    )
    await client._open(host, port, token, name, user, password)
    try:
        yield client
    finally:
        await client.aclose()


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
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
