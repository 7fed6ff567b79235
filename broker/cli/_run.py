"""Running one ``ttlbroker`` client command: :func:`run_client` connects to the
broker, runs the command (``_commands.py``; consumers in ``_consumer.py``, KV buckets
in ``_kv.py``) and turns what went wrong into one line on stderr and the exit status
(``_exits.py``).

Before it connects, the context fills in the connection options not given
(``_contexts.py``), and a command that removes something asks for confirmation on
a terminal (``_confirm.py``).

One-shot commands report a lost connection; only ``sub`` and ``consumer sub`` with
``--reconnect`` reconnect, with a line on stderr for each disconnect and reconnect.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable

from ._args import tls_option
from ._commands import (
    cmd_delete,
    cmd_export,
    cmd_fetch,
    cmd_last,
    cmd_offset,
    cmd_pub,
    cmd_purge,
    cmd_stats,
    cmd_stream,
    cmd_sub,
    cmd_topic,
)
from ._bench import cmd_bench
from ._confirm import confirmed
from ._consumer import cmd_consumer
from ._contexts import ContextError, apply_context
from ._exits import CliError, closed_text, exit_status, fail
from ._kv import cmd_kv
from ._request import cmd_reply, cmd_req
from ._server import cmd_server
from ._output import Out
from broker.client import RECONNECT_ATTEMPTS, Client, ConnectionClosedError, connect

__all__ = ["run_client", "COMMANDS"]

Command = Callable[[Client, argparse.Namespace, Out], Awaitable[None]]

#: Each client command (``args.command``) and the function that runs it.
COMMANDS: dict[str, Command] = {
    "consumer": cmd_consumer, "stream": cmd_stream, "topic": cmd_topic, "pub": cmd_pub, "fetch": cmd_fetch,
    "last": cmd_last, "sub": cmd_sub, "stats": cmd_stats, "export": cmd_export, "kv": cmd_kv,
    "delete": cmd_delete, "purge": cmd_purge, "offset": cmd_offset,
    "req": cmd_req, "reply": cmd_reply, "server": cmd_server, "bench": cmd_bench,
}


def _on_disconnect(err: ConnectionClosedError) -> None:
    print(f"disconnected: {closed_text(err)}; reconnecting", file=sys.stderr, flush=True)


def _on_reconnect_to(server: str, again: str = "subscribed again") -> Callable[[int], None]:
    def on_reconnect(attempts: int) -> None:
        tries = f"{attempts} attempt{'' if attempts == 1 else 's'}"
        print(f"reconnected to {server} after {tries}; {again}", file=sys.stderr, flush=True)

    return on_reconnect


async def run_client(args: argparse.Namespace) -> int:
    """Connect to ``args.server`` and run ``args.command``; returns the exit status
    (one line on stderr when it is not 0: ``_exits.py``)."""
    try:
        apply_context(args)
    except ContextError as exc:
        return fail(CliError.INVALID_CONTEXT, str(exc)).status
    if not confirmed(args):
        return 0
    out = Out(args.json)
    reconnect = bool(getattr(args, "reconnect", False))
    again = "pulling again" if args.command == "consumer" else "subscribed again"
    try:
        tls = tls_option(args)
    except (OSError, ValueError) as exc:  # ssl names no file: say which were given
        given = " ".join(f"--tls-{k} {v}" for k in ("ca", "cert", "key") if (v := getattr(args, f"tls_{k}", None)))
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return fail(CliError.BAD_ARGUMENT, f"cannot load the TLS files ({given}): {why}").status
    connected = False
    try:
        async with connect(
            args.server, token=args.token, user=args.user, password=args.password, name="ttlbroker-cli", reconnect=reconnect,
            max_reconnect_attempts=args.max_reconnects if reconnect else RECONNECT_ATTEMPTS,
            on_disconnect=_on_disconnect if reconnect else None,
            on_reconnect=_on_reconnect_to(args.server, again) if reconnect else None,
            tls=tls,
        ) as c:
            connected = True
            await COMMANDS[args.command](c, args, out)
    except Exception as exc:
        status = exit_status(exc, args.server, connected)
        if status is None:
            raise
        return status
    return 0
