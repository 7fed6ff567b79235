"""The client, written once for both runtimes.

A :class:`Client` holds one connection at a time: what the broker sends is turned
into events (``protocol.ProtocolConnection``) that complete the waiting request or
feed a subscription, and everything queued for sending goes in one write, so
concurrent requests are pipelined and coalesced (``_backend.py`` says how, on trio and
on asyncio). Requests are matched to responses by correlation id. Error statuses
become the matching :class:`protocol.BrokerError` subclass (``StreamNotFoundError``,
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

from ._consumers import ConsumerMethods
from ._kv import KVMethods

__all__ = ["Client"]


class Client(KVMethods, ConsumerMethods):
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

    # The methods are those of the parts, by concern: connecting, reconnecting and
    # reading (``_connection.Connection``), requests and the broker's commands
    # (``_requests.Requests``), KV buckets (``_kv.KVMethods``) and durable consumers
    # (``_consumers.ConsumerMethods``).
