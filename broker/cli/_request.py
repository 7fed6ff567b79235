"""``ttlbroker req`` and ``ttlbroker reply``: NATS's request/reply from the command
line, as the ``nats`` CLI has them (``nats req``, ``nats reply``), across both
protocols: ``req`` gets the answer of a nats-py responder, ``reply`` answers
nats-py's ``nc.request``.

Their habits are natscli's: what happens goes to stderr as lines led by the time
(``15:04:05 Sending request on "svc.echo"``), message bodies to stdout (a blank line
after each, ``nil body`` for an empty one), headers as ``-H K:V``, ``reply`` answers
with ANSWER, or echoes the request back with its headers and a
``NATS-Reply-Counter`` header (``--echo``, also when neither ANSWER nor
``--command`` is given), or runs ``--command`` (``{{0}}``, ``{{1}}``, ... replaced by
the request subject's tokens; ``NATS_REQUEST_SUBJECT`` and ``NATS_REQUEST_BODY`` in
its environment) and answers with what it printed. A request that reaches nobody
fails at once (the broker's no-responders answer), one unanswered after
``--timeout`` fails then: one line on stderr, exit status 1.

Unlike ``nats reply``, there is no queue group: ttlbroker subscriptions have none, so
every ``ttlbroker reply`` on a subject answers each request (the requester takes the
first answer).
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from typing import TYPE_CHECKING

import trio

from protocol import Message

from ._args import seconds
from ._exits import CliError, connection_loss_exits, fail
from ._output import Out, message_json
from broker.client import Client, NoRespondersError

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]

__all__ = ["add_request_commands", "cmd_req", "cmd_reply", "header_pairs", "log_line"]

#: ``--timeout``'s default: natscli's.
DEFAULT_TIMEOUT = 5.0


def log_line(text: str) -> None:
    """One line on stderr led by the time of day, as natscli logs (Go's ``log`` with
    ``Ltime``)."""
    print(f"{time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


def header_pairs(pairs: list[str] | None) -> dict[str, str]:
    """``-H K:V`` (natscli's form; ``K=V``, ``ttlbroker pub``'s, too: the first of
    ``:`` and ``=`` splits) as a dict.

    Raises:
        SystemExit: a pair with neither, or an empty name (one line, exit status 2).
    """
    out: dict[str, str] = {}
    for p in pairs or []:
        at = min((i for i in (p.find(":"), p.find("=")) if i >= 0), default=-1)
        if at <= 0:
            raise SystemExit(f"error: -H takes KEY:VALUE, not {p!r}")
        out[p[:at].strip()] = p[at + 1 :].strip()
    return out


def add_request_commands(sub: Subparsers, g: list[argparse.ArgumentParser]) -> None:
    """``req`` and ``reply`` on the main parser's subparsers."""
    p = sub.add_parser(
        "req", parents=g, help="send a request and print the reply (DATA from stdin when absent)",
        description="Publish DATA on SUBJECT with a reply subject of this client's inbox and print the first reply, as "
        "`nats req` does. A request no subscriber takes fails at once (no responders); one unanswered fails after "
        "--timeout. Both: exit status 1.",
    )
    p.add_argument("subject", help="the subject to send the request on")
    p.add_argument("data", nargs="?", help="the request's payload (default: stdin)")
    _header_option(p, "the request")
    p.add_argument("--count", type=int, default=1, metavar="N", help="send the request N times, one after the other (default 1)")
    p.add_argument(
        "--timeout", type=seconds, default=DEFAULT_TIMEOUT, metavar="DURATION",
        help=f"how long to wait for each reply (default {DEFAULT_TIMEOUT:g}s)",
    )
    p.add_argument("-r", "--raw", action="store_true", help="print the replies' payloads only (default: off)")

    p = sub.add_parser(
        "reply", parents=g, help="answer the requests on a subject, until interrupted",
        description="Subscribe to SUBJECT and answer every request on it, as `nats reply` does: with ANSWER, the request "
        "echoed back (--echo, the default without ANSWER or --command), or what --command prints. Every "
        "`ttlbroker reply` on a subject answers (there are no queue groups).",
    )
    p.add_argument("subject", help="the subject (or filter) to answer requests on")
    p.add_argument("answer", nargs="?", help="the payload of every reply (default: none, --echo)")
    p.add_argument("--echo", action="store_true", help="reply with the request's payload and headers (default: off)")
    p.add_argument(
        "--command", dest="run", metavar="CMD",
        help="run CMD for each request and reply with its output ({{0}}, {{1}}, ...: the subject's tokens; "
        "$NATS_REQUEST_SUBJECT and $NATS_REQUEST_BODY set; default: none)",
    )
    _header_option(p, "each reply")
    p.add_argument("--count", type=int, default=0, metavar="N", help="exit after answering N requests (default 0: until interrupted)")


def _header_option(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "-H", "--header", action="append", metavar="K:V",
        help=f"a header of {what}, KEY:VALUE (KEY=VALUE too; repeatable; default: none)",
    )


# -- req ---------------------------------------------------------------------------


async def cmd_req(c: Client, args: argparse.Namespace, out: Out) -> None:
    data = args.data.encode() if args.data is not None else sys.stdin.buffer.read()
    hdrs = header_pairs(args.header) or None
    chatty = not args.raw and not out.json
    for n in range(1, max(args.count, 1) + 1):
        if chatty:
            log_line(f"Sending request on {_quoted(args.subject)}")
        started = time.perf_counter()
        try:
            m = await c.request(args.subject, data, headers=hdrs, timeout=args.timeout)
        except NoRespondersError as exc:
            raise fail(CliError.NO_RESPONDERS, str(exc)) from None
        except TimeoutError as exc:
            raise fail(CliError.NO_REPLY, str(exc)) from None
        rtt = time.perf_counter() - started
        if out.json:
            out.obj({"request": n, **_fields(m), "rtt_ms": round(rtt * 1000, 3)})
            continue
        if chatty:
            log_line(f"Received with rtt {go_duration(rtt)}")
            for k, v in m.headers.items():
                log_line(f"{k}: {v}")
        _print_body(m.payload, args.raw)


def _fields(m: Message) -> dict[str, object]:
    """What ``--json`` shows of a request or a reply: its subject, headers and
    payload (base64 when it is not UTF-8, as every command prints messages)."""
    shown = message_json(m, None, None)
    return {k: shown[k] for k in ("subject", "headers", "payload", "payload_encoding") if k in shown}


def _print_body(payload: bytes, raw: bool) -> None:
    """A body on stdout as natscli prints it: the text, then a blank line (``nil
    body`` when empty); ``raw``: the bytes and a newline, nothing else."""
    if raw:
        sys.stdout.buffer.write(payload + (b"" if payload.endswith(b"\n") else b"\n"))
        sys.stdout.flush()
        return
    text = payload.decode(errors="replace") if payload else "nil body"
    print(text if text.endswith("\n") else text + "\n", flush=True)


def go_duration(s: float) -> str:
    """A duration as Go prints a ``time.Duration`` (what natscli shows): ``812µs``,
    ``1.234ms``, ``2.5s``, to three decimals."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if s >= scale:
            return f"{s / scale:.3f}".rstrip("0").rstrip(".") + unit
    return f"{round(s * 1e9)}ns"


# -- reply ---------------------------------------------------------------------------


async def cmd_reply(c: Client, args: argparse.Namespace, out: Out) -> None:
    """Answer each request on ``args.subject`` until interrupted (or ``--count``); a
    lost connection ends it with one line on stderr, exit status 2."""
    echo = args.echo
    if args.answer is None and args.run is None and not echo:
        if not out.json:
            log_line("No body or command supplied, enabling echo mode")
        echo = True
    extra = header_pairs(args.header)
    answered = 0
    with connection_loss_exits():
        async with await c.subscribe(args.subject) as sub:
            if not out.json:
                log_line(f"Listening on {_quoted(args.subject)}")
            async for m in sub:
                n = answered
                _show_request(out, n, m)
                if not m.reply:
                    log_line(f"[#{n}] the message on {_quoted(m.subject)} carries no reply subject: nothing to answer")
                    continue
                hdrs = dict(extra)
                if echo:
                    hdrs = {**m.headers, **hdrs, "NATS-Reply-Counter": str(n)}
                    payload = m.payload
                elif args.run is not None:
                    payload = await _run_command(args.run, m)
                else:
                    payload = args.answer.encode()
                await c.respond(m, payload, headers=hdrs or None)
                answered += 1
                if args.count and answered >= args.count:
                    break


def _quoted(text: str) -> str:
    """Go's ``%q`` of a subject (no escapes needed: subjects hold no quotes or
    control characters)."""
    return f'"{text}"'


def _show_request(out: Out, n: int, m: Message) -> None:
    if out.json:
        out.obj({"request": n, **_fields(m), "reply": m.reply})
        return
    log_line(f"[#{n}] Received on subject {_quoted(m.subject)}:")
    for k, v in m.headers.items():
        log_line(f"{k}: {v}")
    print(flush=True)
    print(m.payload.decode(errors="replace"), flush=True)


async def _run_command(template: str, m: Message) -> bytes:
    """``--command`` for one request: its output (stdout and stderr together, as
    natscli's ``CombinedOutput``), also when it fails (then a line on stderr says so,
    and the reply is still sent)."""
    text = template
    for i, token in enumerate(m.subject.split(".")):
        text = text.replace(f"{{{{{i}}}}}", token)
    try:
        argv = shlex.split(text)
    except ValueError as exc:
        log_line(f"Could not parse command: {exc}")
        return b""
    if not argv:
        log_line("Could not parse command: it is empty")
        return b""
    env = {**os.environ, "NATS_REQUEST_SUBJECT": m.subject, "NATS_REQUEST_BODY": m.payload.decode(errors="replace")}
    try:
        done = await trio.run_process(argv, capture_stdout=True, stderr=subprocess.STDOUT, check=False, env=env)
    except OSError as exc:
        log_line(f"Command {_quoted(text)} failed to run: {exc.strerror or exc}")
        return b""
    if done.returncode:
        log_line(f"Command {_quoted(text)} failed to run: exit status {done.returncode}")
    return bytes(done.stdout)
