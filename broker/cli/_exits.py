"""How a ``ttlbroker`` client command ends when it does not succeed: the one line on
stderr that says why, and the exit status (1 for an error, 2 when the broker cannot
be reached or the connection is lost, 130 on Ctrl-C).

Every command module uses these; :func:`~._run.run_client` turns :class:`ExitStatus`
into the exit status.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from protocol import BrokerError

from broker.client import ConnectionClosedError, ReconnectFailedError

__all__ = ["ExitStatus", "fail", "error_line", "closed_text", "connection_loss_exits"]


class ExitStatus(Exception):
    """End the command with this exit status (its message is already printed)."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def fail(text: str) -> ExitStatus:
    """Print ``error: text`` on stderr; raise what this returns to exit with status 1."""
    print(f"error: {text}", file=sys.stderr, flush=True)
    return ExitStatus(1)


def error_line(exc: BrokerError) -> str:
    """The line for an error the broker answered with: its code's name and number,
    and its message."""
    return f"error: {exc.code.name} ({int(exc.code)}): {exc.message}"


def closed_text(err: ConnectionClosedError) -> str:
    """Why a connection went, for one line on stderr: the reason, and the GOODBYE's
    code when there was one."""
    code = err.code
    if code is None:
        return err.reason
    name = getattr(code, "name", None)
    return f"{err.reason} ({name} {int(code)})" if name else f"{err.reason} (code {int(code)})"


@contextlib.contextmanager
def connection_loss_exits() -> Iterator[None]:
    """A lost connection (or a client that gave up reconnecting) is one line on
    stderr saying why, and exit status 2."""
    try:
        yield
    except ReconnectFailedError as exc:
        print(f"error: {exc.reason}", file=sys.stderr, flush=True)  # the reason names the loss
        raise ExitStatus(2) from None
    except ConnectionClosedError as exc:
        print(f"error: connection lost: {closed_text(exc)}", file=sys.stderr, flush=True)
        raise ExitStatus(2) from None
