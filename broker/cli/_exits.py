"""How a ``ttlbroker`` command ends when it does not succeed: the one line on stderr
that says why, and the exit status.

The line names the error: ``error: NAME (CODE): message`` for an error the broker
answered with (its name and number in the protocol's table, ``protocol.ErrorCode``,
``docs/protocol.md``), ``error: NAME: message`` for one the command found itself
(:class:`CliError`: those never travel on the wire, so they have a name and no
number). A message never spans lines. ``docs/operations.md`` ("The command line")
lists the names and the exit statuses: 0 done; 1 the broker refused
(``error: NAME (CODE)``), or ``consumer next`` got nothing; 2 the command could not
run or reach the broker; 130 Ctrl-C; 141 stdout closed (``| head``), without a word.

Every command module uses these; :func:`~._run.run_client` turns what a command
raised into the line and the status (:func:`exit_status`).
"""

from __future__ import annotations

import contextlib
import enum
import sys
from collections.abc import Iterator

from protocol import BrokerError, ErrorCode

from broker.client import ConnectionClosedError, NotABrokerError, ReconnectFailedError, describe

__all__ = [
    "CliError", "ExitStatus", "BROKEN_PIPE_STATUS", "fail", "say", "error_line", "named", "closed_text",
    "not_a_broker_text", "exit_status", "connection_loss_exits",
]

#: The exit status when stdout's reader went away (``ttlbroker fetch ... | head``):
#: 128 + SIGPIPE, what the shell reports for a Unix tool that SIGPIPE ended.
BROKEN_PIPE_STATUS = 141

#: Where the CLI's broker listens by default, for the errors that say which port it wants.
_BINARY_PORT = "the port `ttlbroker serve` prints as `listening on HOST:PORT` ([server] port, 8090 by default)"


class CliError(enum.Enum):
    """The errors a command finds itself (not the broker): each one's name, the exit
    status it ends with, and what it means (the table of ``docs/operations.md``)."""

    status: int
    description: str

    def __new__(cls, status: int, description: str) -> CliError:
        member = object.__new__(cls)
        member._value_ = (status, description)
        member.status = status
        member.description = description
        return member

    BAD_ARGUMENT = 2, (
        "an argument is missing, unknown, malformed or goes against another one, or a file it names cannot be read"
    )
    INVALID_CONFIG = 2, "the configuration file cannot be read, or has an unknown key or a bad value"
    CANNOT_START = 2, "`serve`: the broker cannot start (a port in use, a data directory it cannot use)"
    CANNOT_CONNECT = 2, (
        "nothing accepts connections at the address, the TLS handshake failed, or nothing answered the handshake"
    )
    NOT_A_BROKER = 2, (
        "the address is another kind of server's (a NATS server, an HTTP server such as a broker's monitoring port), "
        "not a broker's binary protocol port"
    )
    CONNECTION_LOST = 2, "the connection to the broker was lost during the command"
    TIMEOUT = 2, "the broker did not answer a request in time"
    NO_MESSAGE = 1, "`consumer next`: no message came within `--wait`"
    NO_RESPONDERS = 1, "`req`: no subscription took the request (the broker answered at once with no responders)"
    NO_REPLY = 1, "`req`: no reply came within `--timeout`"
    INVALID_CONTEXT = 2, "a context (`--context`, the selected one, a `context` command's) is unknown, cannot be read or is malformed"
    JOB_FAILED = 2, "`analyze`, `compact`, `load`: the job cannot run (its input or output, Java, Spark, the broker)"


class ExitStatus(Exception):
    """End the command with this exit status (its message is already printed)."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def say(line: str) -> None:
    """Print one line on stderr: a line break inside it becomes a space."""
    print(" ".join(line.splitlines()), file=sys.stderr, flush=True)


def fail(error: CliError, text: str) -> ExitStatus:
    """Print ``error: NAME: text``; raise what this returns to exit with the error's
    status."""
    say(f"error: {error.name}: {text}")
    return ExitStatus(error.status)


def error_line(exc: BrokerError) -> str:
    """The line for an error the broker answered with: its code's name and number,
    and its message."""
    return f"error: {exc.code.name} ({int(exc.code)}): {exc.message}"


def named(error: CliError, text: str) -> str:
    """``error: NAME: text``, or ``error: text`` when ``text`` starts with the name
    and number of a broker's error already (``UNAUTHORIZED (8): ...``, as the
    startup and the ``load`` job word an error the broker raised)."""
    head, _, _ = text.partition(" (")
    if head in ErrorCode.__members__ and text[len(head) + 2 :].split(")", 1)[0].isdigit():
        return f"error: {text}"
    return f"error: {error.name}: {text}"


def closed_text(err: ConnectionClosedError) -> str:
    """Why a connection went, for one line on stderr: the reason, and the GOODBYE's
    code when there was one."""
    code = err.code
    if code is None:
        return err.reason
    name = getattr(code, "name", None)
    return f"{err.reason} ({name} {int(code)})" if name else f"{err.reason} (code {int(code)})"


def not_a_broker_text(exc: NotABrokerError, server: str) -> str:
    """What the CLI says when ``server`` is some other server's address: what it found
    there, and which port it wants."""
    if exc.found == "nats":
        if exc.software == "ttlbroker":
            return (f"{server} is the NATS listener of a ttlbroker broker, not its binary protocol port: the CLI "
                    f"talks to {_BINARY_PORT}")
        what = f"a NATS server ({exc.software})" if exc.software else "a NATS server"
        return f"{server} is {what}, not a ttlbroker broker: the CLI talks to a broker's binary protocol port, {_BINARY_PORT}"
    if exc.found == "http":
        if exc.software == "ttlbroker":
            return (f"{server} is the monitoring (HTTP) port of a ttlbroker broker, not its binary protocol port: the "
                    f"CLI talks to {_BINARY_PORT}")
        what = f"an HTTP server ({exc.software})" if exc.software else "an HTTP server"
        return (f"{server} is {what}: it answered {exc.first_line!r}; the CLI talks to a ttlbroker broker's binary "
                f"protocol port, {_BINARY_PORT}")
    return f"{server} does not answer in ttlbroker's binary protocol ({exc.reason}): the CLI talks to {_BINARY_PORT}"


def exit_status(exc: BaseException, server: str, connected: bool) -> int | None:
    """Print the line for ``exc``, which ended a client command talking to ``server``
    (``connected``: after the handshake), and return the exit status; None for an
    exception that is not one of a command's errors (a bug: let it go)."""
    if isinstance(exc, ExitStatus):
        return exc.status
    if isinstance(exc, BrokerError):
        say(error_line(exc))
        return 1
    if isinstance(exc, NotABrokerError):
        return fail(CliError.NOT_A_BROKER, not_a_broker_text(exc, server)).status
    if isinstance(exc, ConnectionClosedError):
        cause = exc.__cause__
        if isinstance(cause, BrokerError):  # a GOODBYE that refused the handshake, or ended the session
            say(error_line(cause))
            return 1
        if not connected:
            return fail(CliError.CANNOT_CONNECT, f"cannot connect to {server}: {exc.reason}").status
        return fail(CliError.CONNECTION_LOST, closed_text(exc)).status
    if isinstance(exc, TimeoutError):
        if not connected:
            return fail(CliError.CANNOT_CONNECT, f"cannot connect to {server}: {exc}").status
        return fail(CliError.TIMEOUT, str(exc)).status
    if isinstance(exc, OSError) and not isinstance(exc, BrokenPipeError):  # a broken stdout is main's
        return fail(CliError.CANNOT_CONNECT, f"cannot connect to {server}: {describe(exc)}").status
    return None


@contextlib.contextmanager
def connection_loss_exits() -> Iterator[None]:
    """A lost connection (or a client that gave up reconnecting) is one line on
    stderr saying why, and exit status 2."""
    try:
        yield
    except ReconnectFailedError as exc:
        raise fail(CliError.CONNECTION_LOST, exc.reason) from None  # the reason names the loss
    except ConnectionClosedError as exc:
        raise fail(CliError.CONNECTION_LOST, closed_text(exc)) from None
