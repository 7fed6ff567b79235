"""What the ``ttlbroker`` client commands take: the global options and the
argument types (durations, TTLs, headers, start positions).

The global options (``--server``, ``--token``, ``--json``, ``--context`` and the
TLS ones) are accepted before and after the command. argparse copies a subparser's
defaults over what the main parser parsed, so only the main parser has defaults
(from the environment, else built in); the copies on the commands default to
``SUPPRESS`` and so set a value only when given. Given twice, the later one wins.
A connection option given on the command line is marked (:func:`given`), so that a
context (``_contexts.py``) fills in only what neither the command line nor the
environment gave.

Every duration option goes through :func:`duration_seconds`, which is
``storage.parse_duration_ms`` with a bare number read as seconds: ``30``, ``1.5``,
``90s``, ``500ms``, ``1h30m``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import ssl
from typing import NoReturn

from protocol import parse_go_duration
from storage import parse_duration_ms

from ._exits import CliError, fail

__all__ = [
    "DEFAULT_SERVER", "ENV", "Parser", "HelpFormatter", "global_options", "given", "tls_option", "duration_seconds",
    "seconds", "whole_seconds", "durations", "ttl_value", "MIN_TTL_SECONDS", "start_offset", "start_time", "headers",
    "ident",
]

DEFAULT_SERVER = "127.0.0.1:8090"

#: option -> the environment variable that gives its default.
ENV = {
    "server": "TTLBROKER_SERVER",
    "token": "TTLBROKER_TOKEN",
    "user": "TTLBROKER_USER",
    "password": "TTLBROKER_PASSWORD",
    "tls_ca": "TTLBROKER_TLS_CA",
    "tls_cert": "TTLBROKER_TLS_CERT",
    "tls_key": "TTLBROKER_TLS_KEY",
    "context": "TTLBROKER_CONTEXT",
}


class _Given(argparse.Action):
    """Store the value (True for a flag: ``nargs=0``) and mark the option as given
    on the command line."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object, option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, True if self.nargs == 0 else values)
        setattr(namespace, f"given_{self.dest}", True)  # an attribute of its own: a subparser's namespace is copied over


def given(args: argparse.Namespace, dest: str) -> bool:
    """Whether the connection option ``dest`` (``server``, ``token``, ``tls_ca``,
    ...) was given on the command line."""
    return bool(getattr(args, f"given_{dest}", False))


class HelpFormatter(argparse.HelpFormatter):
    """argparse's help, with the default of every option that has one: ``(default:
    X)`` after its help, unless the help says its default in words already (one whose
    default is "not given", ``None``, must say what that means: a test walks the
    whole parser and checks)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if shows_default(action) and "default" not in text.lower():
            text += " (default: %(default)s)"
        return text


def shows_default(action: argparse.Action) -> bool:
    """Whether ``action`` has a default worth showing: a value it takes when not
    given (a flag's off, or nothing at all, is not one)."""
    return action.nargs != 0 and action.default is not None and action.default is not argparse.SUPPRESS


class Parser(argparse.ArgumentParser):
    """The ``ttlbroker`` parser and every command's (``add_subparsers`` makes its
    commands' parsers of the parent's class): help that shows defaults
    (:class:`HelpFormatter`), and a usage error as one line, ``error: BAD_ARGUMENT:
    ...``, exit status 2."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]  # argparse's own keyword arguments, passed on

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {CliError.BAD_ARGUMENT.name}: {message} (see `{self.prog} --help`)\n")


def global_options(*, defaults: bool) -> argparse.ArgumentParser:
    """A parent parser with the global options: with their defaults for the main
    parser (``defaults=True``), or setting nothing unless given for the commands."""
    env = os.environ
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("global options (before or after the command)")

    def default(value: object) -> object:
        return value if defaults else argparse.SUPPRESS

    server = env.get(ENV["server"]) or DEFAULT_SERVER
    now = f"; now {server}" if env.get(ENV["server"]) else ""
    g.add_argument(
        "-s", "--server", metavar="HOST:PORT", default=default(server), action=_Given,
        help=f"the broker's address (default: {DEFAULT_SERVER}, or ${ENV['server']}{now})",
    )
    g.add_argument(
        "--token", metavar="TOKEN", default=default(env.get(ENV["token"], "")), action=_Given,
        help=f"the broker's auth token (default: ${ENV['token']}, else none)",
    )
    g.add_argument(
        "--user", metavar="USER", default=default(env.get(ENV["user"], "")), action=_Given,
        help=f"one of the broker's [[auth.users]] (default: ${ENV['user']}, else none)",
    )
    g.add_argument(
        "--password", metavar="PASSWORD", default=default(env.get(ENV["password"], "")), action=_Given,
        help=f"that user's password (default: ${ENV['password']}: better than the command line, which others may see)",
    )
    g.add_argument(
        "--json", action="store_true", default=default(False),
        help="print JSON: one object per result, list entry or message (JSON Lines)",
    )
    g.add_argument("--tls", action=_Given, nargs=0, default=default(False), help="connect with TLS (the system's CAs)")
    for name, what in (("ca", "the CA certificate(s) that signed the broker's, PEM"),
                       ("cert", "a client certificate, PEM (for a broker that requires one)"),
                       ("key", "the client certificate's private key, PEM, when not in the --tls-cert file")):
        key = f"tls_{name}"
        g.add_argument(
            f"--tls-{name}", metavar="FILE", default=default(env.get(ENV[key]) or None), action=_Given,
            help=f"{what}; implies --tls (default: ${ENV[key]}, else none)",
        )
    g.add_argument(
        "--context", metavar="NAME", default=default(env.get(ENV["context"]) or None),
        help=f"take the connection options not given here or in the environment from this context "
        f"(default: ${ENV['context']}, else the one `ttlbroker context select` chose, else none)",
    )
    return p


def tls_option(args: argparse.Namespace) -> ssl.SSLContext | bool | None:
    """What ``connect(..., tls=...)`` takes for these arguments: None (no TLS), True
    (TLS with the system's CAs) or an ``ssl.SSLContext`` made from the files.

    Raises:
        OSError / ssl.SSLError: a file cannot be read or is not PEM.
        ValueError: ``--tls-key`` without ``--tls-cert``.
    """
    from broker.client import tls_context

    ca, cert, key = getattr(args, "tls_ca", None), getattr(args, "tls_cert", None), getattr(args, "tls_key", None)
    if ca or cert or key:
        return tls_context(ca=ca, cert=cert, key=key)
    return True if getattr(args, "tls", False) else None


# -- durations --------------------------------------------------------------------


def duration_seconds(text: str, what: str = "duration") -> float:
    """Seconds from ``30``, ``1.5``, ``90s``, ``500ms``, ``1h30m`` (a bare number is
    seconds).

    Raises:
        ValueError: not a duration, negative or not finite.
    """
    return parse_duration_ms(text, what, bare_unit_ms=1000.0) / 1000.0


def _argument_error(text: str, exc: ValueError) -> argparse.ArgumentTypeError:
    why = str(exc)
    if "negative" in why or "finite" in why:
        return argparse.ArgumentTypeError(f"invalid duration {text!r}: {why.removeprefix('duration ')}")
    return argparse.ArgumentTypeError(f"invalid duration {text!r} (use e.g. 30, 90s, 500ms, 1h30m)")


def seconds(text: str) -> float:
    """argparse type: a duration, in seconds (fractions kept)."""
    try:
        return duration_seconds(text)
    except ValueError as exc:
        raise _argument_error(text, exc) from None


def whole_seconds(text: str) -> int:
    """argparse type: a duration that travels as whole seconds (max age, marker TTL,
    duplicate window, a bucket's TTLs); a fraction of a second is refused, not
    rounded."""
    value = seconds(text)
    if value != int(value):
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: this option takes whole seconds")
    return int(value)


def durations(text: str) -> list[float]:
    """argparse type: ``D,D,...`` (``--backoff 1s,5s,1m``)."""
    return [seconds(t.strip()) for t in text.split(",") if t.strip()]


#: The shortest per-message (or key) TTL: NATS refuses one under a second.
MIN_TTL_SECONDS = 1.0


def ttl_value(text: str) -> str:
    """argparse type: a message or key TTL, ``never`` or a duration, as the
    ``Nats-TTL`` header carries it. What the NATS server reads (``30``, ``90s``,
    ``1h30m``) is sent as typed; another spelling this parser takes (``2 min``) goes
    as whole-or-fractional seconds (``120s``). The NATS rules apply: zero is no TTL,
    and under a second is refused, here before anything is sent."""
    if text.strip().lower() == "never":
        return "never"
    value = seconds(text)
    if 0 < value < MIN_TTL_SECONDS:
        raise argparse.ArgumentTypeError(
            f"invalid TTL {text!r}: the minimum is 1s (0 = no TTL, never = no expiry)"
        )
    if text.isascii() and text.isdigit():
        return text
    try:
        parse_go_duration(text)
        return text
    except ValueError:
        return f"{value:g}s"


# -- other arguments -----------------------------------------------------------------


def start_offset(text: str) -> int | dict[int, int]:
    """argparse type: ``N`` (every partition) or ``P:N,P:N`` (per partition)."""
    try:
        if ":" not in text:
            return int(text)
        return {int(p): int(o) for p, _, o in (part.partition(":") for part in text.split(","))}
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid start offset {text!r} (N, or PARTITION:N,...)") from None


def start_time(text: str) -> dt.datetime:
    """argparse type: an ISO 8601 time (UTC unless it says)."""
    try:
        t = dt.datetime.fromisoformat(text.replace("z", "Z").replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid time {text!r} (ISO 8601, e.g. 2026-01-02T15:04:05Z)") from None
    return t if t.tzinfo is not None else t.replace(tzinfo=dt.timezone.utc)


def headers(pairs: list[str] | None) -> dict[str, str]:
    """``--header K=V`` pairs as a dict.

    Raises:
        ExitStatus: a malformed one (its line printed, BAD_ARGUMENT).
    """
    out = {}
    for p in pairs or []:
        key, sep, value = p.partition("=")
        if not sep or not key:
            raise fail(CliError.BAD_ARGUMENT, f"--header takes KEY=VALUE, not {p!r}")
        out[key] = value
    return out


def ident(text: str) -> int | str:
    """A stream or topic given by id (digits) or by name."""
    return int(text) if text.isdigit() else text

