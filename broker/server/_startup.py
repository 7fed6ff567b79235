"""Why the broker could not start, as one line an operator can act on.

``serve`` raises :class:`StartupError` where it knows the cause (a monitoring port in
use, unusable TLS files); :func:`startup_failure` turns everything else that can stop
a start (an address in use or not of this machine, a data directory another broker
holds or this user cannot use, a damaged catalog, a missing optional dependency)
into one. ``ttlbroker serve`` prints its message on one line and exits 2. Anything
else is a bug and keeps its traceback.
"""

from __future__ import annotations

import errno
import socket
from typing import TYPE_CHECKING

from protocol import BrokerError

if TYPE_CHECKING:
    from broker.config import Config

__all__ = ["StartupError", "startup_failure"]


class StartupError(Exception):
    """The broker cannot start; ``str(exc)`` names the cause and what to do."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for e in exc.exceptions for leaf in _leaves(e)]
    return [exc]


def startup_failure(exc: BaseException, config: Config) -> StartupError | None:
    """The :class:`StartupError` that ``exc`` (raised before the broker listened,
    possibly inside exception groups) stands for, or None for a bug."""
    leaves = _leaves(exc)
    if len(leaves) != 1:
        return None
    leaf = leaves[0]
    if isinstance(leaf, StartupError):
        return leaf
    if isinstance(leaf, BrokerError):
        # Raised by recovery (a locked or damaged data directory, the export without
        # pyarrow): their messages already say what happened and what to do.
        return StartupError(f"{leaf.code.name} ({int(leaf.code)}): {leaf.message}")
    if isinstance(leaf, OSError):
        return StartupError(_os_error(leaf, config))
    return None


def _os_error(exc: OSError, config: Config) -> str:
    if exc.filename is not None:  # the data or export directory, or a file in one
        where = exc.filename if exc.filename2 is None else f"{exc.filename} -> {exc.filename2}"
        return (
            f"cannot use {where}: {exc.strerror or exc} (the data directory, --data or [system] path, and the "
            "export directory, --export-dir or [export] dir, must be directories this user can read and write)"
        )
    host, port = config.server.host, config.server.port
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if isinstance(exc, socket.gaierror):
        return (
            f"cannot listen on {address}: the host name {host!r} does not resolve ({exc.strerror or exc}); "
            "use an address of this machine with --host or [server] host"
        )
    if exc.errno == errno.EADDRINUSE:
        return (
            f"cannot listen on {address}: the address is in use (another broker or program holds it): "
            "stop it, or choose another port with --port or [server] port"
        )
    if exc.errno == errno.EADDRNOTAVAIL:
        return (
            f"cannot listen on {address}: {host} is not an address of this machine; "
            "use 127.0.0.1, 0.0.0.0 or one of its interfaces with --host or [server] host"
        )
    if exc.errno == errno.EACCES:
        return (
            f"cannot listen on {address}: permission denied (ports below 1024 need privileges); "
            "choose a port of 1024 or more with --port or [server] port"
        )
    return f"cannot listen on {address}: {exc.strerror or exc}; check --host and --port ([server] host and port)"
