"""The errors of a lost connection, and the short text that says what failed.

:class:`ConnectionClosedError` says why a connection went (a GOODBYE's reason and
code when the broker sent one); :class:`ConnectionLostError` fails a request that was
in flight then, :class:`ReconnectFailedError` every call once the client gave up
reconnecting; :class:`NotABrokerError` says that what answered the handshake is
another kind of server (a NATS server, an HTTP server), from the first bytes it sent
(:func:`identify_server`). The broker's own refusals are the ``protocol`` error
classes; :class:`NoRespondersError` says that a request reached nobody.
"""

from __future__ import annotations

import json
import os
import ssl

from protocol import BrokerError, ErrorCode

__all__ = [
    "ConnectionClosedError", "ConnectionLostError", "NoRespondersError", "ReconnectFailedError", "NotABrokerError",
    "identify_server", "describe", "error_code",
]


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
        last = f"; the last one failed: {describe(last_error)}" if last_error is not None else ""
        super().__init__(f"gave up reconnecting after {tries} ({lost.reason}{last})", lost.code)
        self.attempts = attempts
        self.last_error = last_error
        self.__cause__ = lost


class NoRespondersError(Exception):
    """A request reached no subscriber: the broker answered it at once with the
    no-responders status (503) instead of leaving it to time out, as nats-server
    does (nats-py raises its own ``NoRespondersError`` then).

    Attributes:
        subject: the subject of the request.
    """

    def __init__(self, subject: str) -> None:
        super().__init__(f"no responders are available for a request on {subject!r}")
        self.subject = subject


class NotABrokerError(ConnectionClosedError):
    """What answered the handshake is not a ttlbroker broker (its first bytes are no
    frame of the protocol): the address is some other server's, often another port of
    the same broker.

    Attributes:
        found: ``"nats"`` (it sent a NATS ``INFO``), ``"http"`` (it answered as an
            HTTP server) or ``"unknown"``.
        first_line: the first line it sent, as text (cut after 40 characters).
        software: what it says it is when it says so: ``"ttlbroker"`` for a
            ttlbroker's own NATS listener or monitoring port (the ``INFO``'s
            ``ttlbroker_version``, the HTTP ``Server`` header), else the HTTP
            ``Server`` header or ``version X`` from the ``INFO``; "" when unknown.
    """

    def __init__(self, found: str, first_line: str, software: str = "", detail: str = "") -> None:
        said = f"it sent {first_line!r}" + (f": {detail}" if detail else "")
        if found in ("nats", "http"):
            what = {"nats": "a NATS server", "http": "an HTTP server"}[found]
            if software == "ttlbroker":
                what = "the NATS listener of a ttlbroker broker" if found == "nats" else "the monitoring (HTTP) port of a ttlbroker broker"
            elif software:
                what += f" ({software})"
            reason = f"the server is {what}, not a ttlbroker broker's binary protocol port ({said})"
        else:
            reason = f"the server does not speak ttlbroker's binary protocol ({said})"
        super().__init__(reason)
        self.found = found
        self.first_line = first_line
        self.software = software


#: How many of a connection's first bytes :func:`identify_server` looks at.
SNIFF_BYTES = 1024


def identify_server(head: bytes, detail: str = "") -> NotABrokerError:
    """What sent ``head`` (the first bytes read on a connection whose handshake got no
    valid answer): a NATS server greets every client with ``INFO {...}``; an HTTP
    server answers the handshake (which holds an empty line, see ``_connection.py``)
    with ``HTTP/1.x <status>``. ``detail``: the protocol error, for anything else."""
    first = head.split(b"\n", 1)[0].rstrip(b"\r")
    line = first[:40].decode("utf-8", "backslashreplace") + ("..." if len(first) > 40 else "")
    if first.startswith(b"INFO ") or first == b"INFO":
        software = ""
        try:
            info = json.loads(first[5:])
        except ValueError:  # cut short, or not JSON
            info = None
        if isinstance(info, dict):
            software = "ttlbroker" if "ttlbroker_version" in info else f"version {info['version']}" if info.get("version") else ""
        return NotABrokerError("nats", line, software)
    if first.startswith(b"HTTP/"):
        server = ""
        for header in head.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]:
            name, _, value = header.partition(b":")
            if name.strip().lower() == b"server":
                server = value.strip().decode("utf-8", "replace")
        return NotABrokerError("http", line, server)
    return NotABrokerError("unknown", line, "", detail)


def describe(exc: BaseException) -> str:
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


def error_code(status: int) -> int:
    """A frame's status as an :class:`ErrorCode` when it is one, else as it is."""
    try:
        return ErrorCode(status)  # type: ignore[call-arg]  # a lookup by value, not __new__(value, description)
    except ValueError:
        return status
