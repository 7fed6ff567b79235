"""Confirmation before a command removes something: ``stream rm``, ``topic rm``,
``consumer rm``, ``purge``, ``kv rm`` and ``context rm`` ask ``Really delete stream
shop and all its topics? [y/N]`` (on stderr) when stdin is a terminal, and go ahead
only on ``y`` or ``yes``; ``-f``/``--force`` does not ask.

When stdin is not a terminal (a script, a pipe, cron) they go ahead without asking,
as they always did. natscli refuses there instead ("cannot ask for confirmation
without a terminal") unless given ``--force``; ttlbroker keeps the scripts written
before it asked working. A declined question removes nothing, says so on stderr
and exits 0, as natscli does.

:func:`confirmed` is asked before the command connects: a question waiting for an
answer holds no connection open.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["force_option", "confirm", "confirmed", "question"]


def force_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-f", "--force", action="store_true",
        help="do not ask for confirmation (default: ask when stdin is a terminal, go ahead without asking otherwise)",
    )


def confirm(text: str) -> bool:
    """Whether to go ahead: ``TEXT? [y/N]`` on stderr and an answer from stdin when
    stdin is a terminal (``y``/``yes`` goes ahead; anything else, or the end of the
    input, does not); True without asking otherwise."""
    if not sys.stdin.isatty():
        return True
    print(f"{text}? [y/N] ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline()
    if not answer.endswith("\n"):
        print(file=sys.stderr)  # end of input (Ctrl-D): end the prompt's line
    return answer.strip().lower() in ("y", "yes")


def question(args: argparse.Namespace) -> tuple[str, str] | None:
    """The question a client command asks before it runs, and what a "no" leaves
    untouched; None for a command that removes nothing."""
    command, action = args.command, getattr(args, "action", None)
    if command == "stream" and action in ("rm", "delete"):
        return f"Really delete stream {args.stream} and all its topics", f"stream {args.stream}"
    if command == "topic" and action in ("rm", "delete"):
        return f"Really delete topic {args.stream}/{args.topic}", f"topic {args.stream}/{args.topic}"
    if command == "consumer" and action == "rm":
        where = f"{args.stream}/{args.topic}/{args.name}"
        return f"Really delete consumer {where}", f"consumer {where}"
    if command == "purge":
        what = f"subjects {args.subject} of topic" if args.subject else "topic"
        return f"Really purge {what} {args.stream}/{args.topic}", f"topic {args.stream}/{args.topic}"
    if command == "kv" and action == "rm":
        if args.key is not None:
            return f"Really delete key {args.key} of bucket {args.bucket}", f"key {args.key}"
        return f"Really delete bucket {args.bucket} and all its keys", f"bucket {args.bucket}"
    return None


def confirmed(args: argparse.Namespace) -> bool:
    """Whether the command may run: not one that removes, ``--force``, no terminal,
    or a "yes". On a "no", a line on stderr saying nothing was removed."""
    asked = question(args)
    if asked is None or getattr(args, "force", False):
        return True
    text, kept = asked
    if confirm(text):
        return True
    print(f"not confirmed: {kept} is left as it was", file=sys.stderr, flush=True)
    return False
