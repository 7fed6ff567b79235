"""TLS on the broker's port: the TLS handshake of each accepted connection.

The ``ssl.SSLContext`` comes from ``config.server_context`` (``[server] tls_cert``,
``tls_key``, ``tls_ca``: TLS 1.2 or later; with ``tls_ca``, clients must present a
certificate signed by it), built when the configuration is loaded and again when
the broker starts, so a bad file stops it with one line naming the file.

:class:`TlsAcceptor` runs in each connection's own task (``server._connection``),
before the connection becomes a session: a slow or broken TLS client costs its own
task only and never holds up the accepts. It

* waits at most ``limits.handshake_timeout`` for the TLS handshake (counted in
  ``handshake_timeouts`` when it expires, like the protocol handshake);
* answers a client that speaks the plain protocol to the TLS port with a plain
  GOODBYE (UNAUTHORIZED, "this port requires TLS"), so that client's error says
  what is wrong instead of "connection reset";
* counts every failed TLS handshake (bad or missing client certificate, a client
  that does not trust the broker's certificate, a TLS version below 1.2, plain
  bytes) in ``tls_handshake_failures`` and logs it at warning with the peer's
  address, at most one line per host per :data:`_limits.LOG_INTERVAL_SECONDS`
  (the line says how many were suppressed before it), so a scanner cannot flood
  the log;
* sends the client the TLS alert of a failed handshake ("certificate required",
  "unknown ca"), so its error says why;
* lets at most ``limits.max_connections`` TLS handshakes run at once: more are
  closed at once (``connections_refused``). Sessions count against
  ``max_connections`` separately, so TLS connections hold at most twice that many
  file descriptors.

The stream it returns is a ``trio.SSLStream``; the session reads and writes it like
the plain ``SocketStream`` (the protocol is unchanged inside TLS).
"""

from __future__ import annotations

import re
import socket
import ssl
from collections.abc import Awaitable, Callable
from functools import partial
import trio

from protocol import ErrorCode, ProtocolConnection, PushKind, Role

from broker.core import Broker, get_logger

from ._limits import ConnectionGuard

__all__ = ["TlsAcceptor", "TLS_REQUIRED_REASON"]

log = get_logger(__name__)

#: What a TLS handshake came to: the TLS stream, or None and what to send the client.
_Outcome = tuple["trio.SSLStream[trio.SocketStream] | None", "Callable[[], Awaitable[None]] | None"]

#: The first byte of every TLS connection (a handshake record).
_TLS_RECORD_HANDSHAKE = 0x16
#: What a client that speaks the plain protocol to the TLS port is told.
TLS_REQUIRED_REASON = "this port requires TLS: connect with TLS (tls=True in the Python client, --tls in the CLI)"
_EOF_TEXT = "the client closed the connection during the TLS handshake (as one that does not trust the broker's certificate does)"
_SSL_TEXT_RE = re.compile(r"^\[[A-Z0-9_]+: [A-Z0-9_]+\] | \(_ssl\.c:\d+\)$")


def _describe(exc: BaseException) -> tuple[str, str]:
    """``(reason, error)`` of a failed TLS handshake: OpenSSL's short code and a
    text for the log."""
    seen = 0
    cause: BaseException | None = exc
    while cause is not None and seen < 5:
        if isinstance(cause, ssl.SSLError):
            reason = cause.reason or type(cause).__name__
            if isinstance(cause, ssl.SSLEOFError) or reason == "UNEXPECTED_EOF_WHILE_READING":
                return reason, _EOF_TEXT
            if isinstance(cause, ssl.SSLCertVerificationError) and cause.verify_message:
                return reason, f"certificate verify failed: {cause.verify_message}"
            return reason, _SSL_TEXT_RE.sub("", str(cause.strerror or cause))
        cause = cause.__cause__ or cause.__context__
        seen += 1
    return type(exc).__name__, str(exc) or type(exc).__name__


class TlsAcceptor:
    """The TLS side of accepting connections (see the module docstring). One per
    server; :meth:`accept` runs in each connection's task."""

    def __init__(self, context: ssl.SSLContext, broker: Broker, guard: ConnectionGuard) -> None:
        self.context = context
        self.broker = broker
        self.guard = guard
        #: TLS handshakes in progress.
        self.handshaking = 0

    async def accept(
        self, stream: trio.SocketStream, peer: str, session_id: int, plain_reply: bytes | None = None,
    ) -> trio.SSLStream[trio.SocketStream] | None:
        """The TLS stream of ``stream`` once its handshake is done, or None when it
        failed (logged and counted; the caller closes ``stream``). ``plain_reply``:
        what a client that sends plain bytes is told (default: a GOODBYE saying the
        port requires TLS). Never raises (but Cancelled)."""
        broker = self.broker
        limits = broker.config.limits
        if self.handshaking >= limits.max_connections:
            broker.counters.connections_refused += 1
            self._log_limited(
                "warning", "connection_refused", peer, session=session_id, reason="too_many_tls_handshakes",
            )
            return None
        self.handshaking += 1
        try:
            outcome: _Outcome | None = None
            with trio.move_on_after(limits.handshake_timeout):
                outcome = await self._handshake(stream, peer, session_id, plain_reply)
            if outcome is None:
                broker.counters.handshake_timeouts += 1
                self._log_limited("info", "handshake_timeout", peer, session=session_id, seconds=limits.handshake_timeout, tls=True)
                return None
            secured, answer = outcome
            if answer is not None:  # what the failed client is told, after the timeout's scope
                await answer()
            return secured
        finally:
            self.handshaking -= 1

    async def _handshake(self, stream: trio.SocketStream, peer: str, session_id: int, plain_reply: bytes | None) -> _Outcome:
        """The TLS stream, or None and how to answer the client (counted and logged)."""
        try:
            first = await stream.socket.recv(1, socket.MSG_PEEK)
        except OSError:
            log.debug("connection_closed", session=session_id, peer=peer, reason="connection_lost")
            return None, None
        if not first:
            log.debug("connection_closed", session=session_id, peer=peer, reason="closed")
            return None, None
        counters = self.broker.counters
        if first[0] != _TLS_RECORD_HANDSHAKE:
            counters.tls_handshake_failures += 1
            self._log_limited(
                "warning", "tls_handshake_failed", peer, session=session_id, reason="NOT_TLS",
                error="the client sent plain bytes, not a TLS handshake",
            )
            return None, partial(_tell_plain_client, stream, plain_reply)
        tls = trio.SSLStream(stream, self.context, server_side=True)
        try:
            await tls.do_handshake()
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            counters.tls_handshake_failures += 1
            reason, error = _describe(exc)
            self._log_limited("warning", "tls_handshake_failed", peer, session=session_id, reason=reason, error=error)
            return None, partial(_send_alert, tls, stream)
        return tls, None

    def _log_limited(self, level: str, event: str, peer: str, **fields: object) -> None:
        host = peer.rsplit(":", 1)[0]
        suppressed = self.guard.log_limit.allow(host, trio.current_time())
        if suppressed is None:
            return
        getattr(log, level)(event, peer=peer, **fields, suppressed=suppressed)


async def _send_alert(tls: trio.SSLStream[trio.SocketStream], stream: trio.SocketStream) -> None:
    """Send the TLS alert OpenSSL wrote when the handshake failed ("certificate
    required", "bad certificate", "protocol version"), so the client's error says
    why. trio's SSLStream leaves it in its outgoing buffer when the handshake raises
    (the attribute is private: without it the client just sees the connection
    close)."""
    outgoing = getattr(tls, "_outgoing", None)
    if not isinstance(outgoing, ssl.MemoryBIO):
        return
    alert = outgoing.read()
    if alert:
        with trio.move_on_after(1):
            try:
                await stream.send_all(alert)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass


async def _tell_plain_client(stream: trio.SocketStream, reply: bytes | None = None) -> None:
    """Answer a plain-protocol client on the TLS port with a plain GOODBYE (or
    ``reply``), after reading what it sent (closing with unread bytes would reset
    the connection and could destroy the GOODBYE), then wait a moment for it to
    close first."""
    frame = reply or ProtocolConnection(Role.SERVER).send_push(PushKind.GOODBYE, TLS_REQUIRED_REASON.encode(), int(ErrorCode.UNAUTHORIZED))
    with trio.move_on_after(1):
        try:
            await stream.receive_some(4096)
            await stream.send_all(frame)
            await stream.send_eof()
            while await stream.receive_some(4096):
                pass
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
