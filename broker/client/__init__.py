"""The bundled ttlbroker client, for trio (this module) and asyncio (``.aio``).

    import trio
    from broker.client import connect

    async def main():
        async with connect("127.0.0.1:8090") as client:
            await client.create_stream("shop")
            await client.create_topic("shop", "orders", partitions=3, subjects=["orders.>"])
            ack = await client.publish("orders.eu.1", b"hello")
            fetched = await client.fetch("shop", "orders", ack.partition, ack.offset)
            print(fetched.messages[0].payload)

    trio.run(main)

Errors from the broker are raised as the ``protocol`` error classes, one per code
(``StreamNotFoundError``, ``InvalidSubjectError``, ...), all subclasses of
:class:`BrokerError` with ``code`` and ``message``.

The client reconnects when its connection is lost (``reconnect=True``, the default):
see ``broker.client._client`` for what happens to requests in flight
(:class:`ConnectionLostError`), to subscriptions, and when it gives up
(:class:`ReconnectFailedError`).

TLS: ``connect(address, tls=tls_context(ca="ca.pem"))`` (or ``tls=True`` for a
certificate from a CA the system trusts); see :func:`tls_context`.

What this package owns: the client side of the protocol, on both runtimes: the
connection kept up (``_connection.py``), requests and the broker's commands
(``_requests.py``), KV buckets (``_kv.py``), durable consumers (``_consumers.py``),
all put together in :class:`Client` (``_client.py``), and the runtime backends
(``_backend.py``) and TLS (``_tls.py``) under them.

What it may import: ``protocol`` and the standard library (trio when it runs on
trio, uvloop when installed), nothing else of ttlbroker: it is the layer below
everything else, so that a program that only talks to a broker never loads the
server.

Public names (``__all__``): :func:`connect`, :class:`Client`, :class:`Subscription`,
:class:`Msg`, :func:`encode_msg`, :class:`Fetched`, :data:`MSG_ID_HEADER`, the
connection errors (:class:`ConnectionClosedError`, :class:`ConnectionLostError`,
:class:`ReconnectFailedError`, and :class:`NotABrokerError` when the address is another
kind of server's; :func:`describe` words any of them, and an OS or TLS error, in a
few words), the durable consumers' :class:`ConsumerInfo`,
:class:`ConsumerMessage` and :class:`MessageStream`, the KV buckets' :class:`KeyValue`,
:class:`Entry` and :data:`KV_STREAM` (the stream that holds every bucket),
``connect``'s reconnection defaults :data:`RECONNECT_ATTEMPTS`, :data:`RECONNECT_WAIT`
and :data:`RECONNECT_WAIT_MAX`, :func:`tls_context`, :func:`parse_address`,
:class:`TrioBackend`, and from ``protocol`` the message and answer types
(:class:`Message`, :class:`Ack`, :class:`Acks`, :class:`StreamDetails`,
:class:`TopicDetails`, :class:`MarkerReason`, :data:`TTL_NEVER`), :class:`ErrorCode`,
:class:`BrokerError` and its subclass for every error code. ``broker.client.aio`` is
the asyncio flavour of :func:`connect`.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator

from protocol import ERROR_CLASSES as _ERROR_CLASSES
from protocol import TTL_NEVER as TTL_NEVER
from protocol import Ack as Ack
from protocol import Acks as Acks
from protocol import BrokerError as BrokerError
from protocol import ErrorCode as ErrorCode
from protocol import MarkerReason as MarkerReason
from protocol import Message as Message
from protocol import StreamDetails as StreamDetails
from protocol import TopicDetails as TopicDetails

from ._backend import TrioBackend as TrioBackend
from ._client import Client as Client
from ._connection import RECONNECT_ATTEMPTS as RECONNECT_ATTEMPTS
from ._connection import RECONNECT_WAIT as RECONNECT_WAIT
from ._connection import RECONNECT_WAIT_MAX as RECONNECT_WAIT_MAX
from ._connection import ErrorCallback, ReconnectCallback
from ._connection import Subscription as Subscription
from ._connection import parse_address as parse_address
from ._consumers import ConsumerInfo as ConsumerInfo
from ._consumers import ConsumerMessage as ConsumerMessage
from ._consumers import MessageStream as MessageStream
from ._errors import ConnectionClosedError as ConnectionClosedError
from ._errors import ConnectionLostError as ConnectionLostError
from ._errors import NoRespondersError as NoRespondersError
from ._errors import NotABrokerError as NotABrokerError
from ._errors import ReconnectFailedError as ReconnectFailedError
from ._errors import describe as describe
from ._kv import KV_STREAM as KV_STREAM
from ._kv import Entry as Entry
from ._kv import KeyValue as KeyValue
from ._messages import MSG_ID_HEADER as MSG_ID_HEADER
from ._messages import Fetched as Fetched
from ._messages import Msg as Msg
from ._messages import encode_msg as encode_msg
from ._tls import resolve_tls
from ._tls import tls_context as tls_context

globals().update({cls.__name__: cls for cls in _ERROR_CLASSES.values()})


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
    """Connect (trio) and handshake; the connection closes when the block ends.

    ``token``: the broker's ``[server] auth_token``; or ``user`` and ``password``:
    one of its ``[[auth.users]]``, whose permissions then apply to every command
    (``PermissionDeniedError`` names the subject refused).

    The first connection is not retried: its errors are raised. Later losses are
    handled as :class:`Client` says (``reconnect`` and the options after it).

    ``tls``: an ``ssl.SSLContext`` (see :func:`tls_context`), ``True`` for the
    system's trusted CAs, or None/False for plain TCP; ``address`` may also be
    written ``tls://host:port``. The broker's certificate must be valid for the
    address's host. Reconnections use the same TLS settings.

    Raises:
        OSError: nothing listens there.
        NotABrokerError: something else answers there: a NATS server (its ``INFO``),
            an HTTP server (its answer to the handshake), or anything that is not the
            protocol (``found`` says which).
        TimeoutError: no answer within ``timeout`` (to the handshake: a server that
            waits for its client to speak some other protocol).
        ssl.SSLError: the TLS handshake failed (``ssl.SSLCertVerificationError``:
            the broker's certificate is not signed by a trusted CA, or not for this
            host); a broker that requires TLS refuses a plain connection with
            UnauthorizedError.
        UnauthorizedError / UnsupportedVersionError / TooManyConnectionsError /
            ShuttingDownError: the broker refused the handshake.
    """
    address, tls_ctx = resolve_tls(address, tls)
    host, port = parse_address(address)
    client = Client(
        TrioBackend(tls_ctx), timeout, reconnect=reconnect, max_reconnect_attempts=max_reconnect_attempts,
        reconnect_wait=reconnect_wait, reconnect_wait_max=reconnect_wait_max,
        on_disconnect=on_disconnect, on_reconnect=on_reconnect, on_closed=on_closed,
    )
    await client._open(host, port, token, name, user, password)
    try:
        yield client
    finally:
        await client.aclose()


__all__ = [
    n for n in dir()
    if not n.startswith("_") and n not in (
        "annotations", "contextlib", "ssl", "AsyncIterator", "ErrorCallback", "ReconnectCallback", "resolve_tls",
    )
]
