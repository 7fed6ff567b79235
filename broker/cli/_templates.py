"""``pub`` templates: the subject, the data and the header values of a message may
hold natscli's template actions, so that ``pub --count N`` sends N different
messages (``nats pub``'s ``--count`` with Go templates; natscli
``internal/util/headers.go``, ``PubReplyBodyTemplate``).

An action is ``{{NAME}}``, ``{{.NAME}}`` or ``{{Random MIN MAX}}`` (spaces inside
the braces do not matter):

=============  ===============================================================
``Count``      the message's number, 1 to N (``Cnt`` is the same)
``TimeStamp``  the time now, RFC 3339 in local time (``2026-01-02T15:04:05+01:00``)
``Unix``       seconds since 1970 (UTC)
``UnixNano``   nanoseconds since 1970 (UTC)
``Time``       the time now, Go's ``time.Kitchen`` (``3:04PM``)
``ID``         a unique id (22 characters, as a NATS nuid)
``Random``     ``Random MIN MAX``: a random string of letters and digits, MIN to
               MAX long
=============  ===============================================================

The time is read once per message, so every action of one message sees the same
time. Anything else between ``{{`` and ``}}``, or a ``{{`` never closed, is
refused before anything is sent (natscli sends such a text as it is, after a
warning); ``pub --no-templates`` sends the text as given. Data that is not UTF-8
(binary data from stdin) is never read as a template.
"""

from __future__ import annotations

import datetime as dt
import random
import re
import secrets
import time
from collections.abc import Callable, Mapping

from broker.client import encode_msg

__all__ = ["MessageTemplate", "TemplateError", "FUNCTIONS"]

#: The functions, as natscli names them.
FUNCTIONS = ("Count", "Cnt", "TimeStamp", "Unix", "UnixNano", "Time", "ID", "Random")

_ACTION = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)
_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_RANDOM_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


class TemplateError(ValueError):
    """A template that cannot be read; the message says where and why."""


class _Now:
    """What one message's actions read: its number and the time, read once."""

    __slots__ = ("count", "ns")

    def __init__(self, count: int) -> None:
        self.count = count
        self.ns = time.time_ns()


class _Nuid:
    """Unique ids as NATS makes them (nats-io/nuid): 12 random base-62 characters,
    then a 10-character sequence that starts at a random value and grows by a random
    step; a new prefix when the sequence runs out."""

    _SEQ_MAX = 62**10

    def __init__(self) -> None:
        self._new_prefix()

    def _new_prefix(self) -> None:
        self.prefix = "".join(secrets.choice(_ALPHABET) for _ in range(12))
        self.seq = secrets.randbelow(self._SEQ_MAX)
        self.inc = 33 + secrets.randbelow(333 - 33)

    def next(self) -> str:
        self.seq += self.inc
        if self.seq >= self._SEQ_MAX:
            self._new_prefix()
        n, digits = self.seq, []
        for _ in range(10):
            n, d = divmod(n, 62)
            digits.append(_ALPHABET[d])
        return self.prefix + "".join(reversed(digits))


_nuid = _Nuid()


def _timestamp(now: _Now) -> str:
    t = dt.datetime.fromtimestamp(now.ns / 1e9).astimezone().replace(microsecond=0)
    text = t.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text  # Go's RFC3339 writes a zero offset as Z


def _kitchen(now: _Now) -> str:
    t = dt.datetime.fromtimestamp(now.ns / 1e9)
    return f"{t.hour % 12 or 12}:{t.minute:02d}{'AM' if t.hour < 12 else 'PM'}"


def _random(low: int, high: int) -> str:
    """natscli's ``RandomString``: not for secrets (math/rand there, ``random`` here)."""
    if low > high:
        low, high = high, low
    return "".join(random.choices(_RANDOM_LETTERS, k=random.randint(low, high)))


_SIMPLE: dict[str, Callable[[_Now], str]] = {
    "Count": lambda n: str(n.count),
    "Cnt": lambda n: str(n.count),
    "TimeStamp": _timestamp,
    "Unix": lambda n: str(n.ns // 1_000_000_000),
    "UnixNano": lambda n: str(n.ns),
    "Time": _kitchen,
    "ID": lambda n: _nuid.next(),
}

#: A compiled text: literal pieces and actions, in order.
_Piece = str | Callable[[_Now], str]


def _action(inner: str, where: str) -> Callable[[_Now], str]:
    words = inner.split()
    name = words[0] if words else ""
    field = name.removeprefix(".")
    if name == "Random":
        if len(words) != 3 or not all(w.isdigit() for w in words[1:]):
            raise TemplateError(f"{where}: {{{{{inner}}}}}: Random takes two whole numbers, the shortest and the longest length")
        low, high = int(words[1]), int(words[2])
        if max(low, high) > 1_000_000:
            raise TemplateError(f"{where}: {{{{{inner}}}}}: Random makes at most 1,000,000 characters")
        return lambda n: _random(low, high)
    if field in _SIMPLE and len(words) == 1:
        return _SIMPLE[field]
    known = ", ".join(FUNCTIONS)
    raise TemplateError(f"{where}: {{{{{inner}}}}} is not a template function ({known}; --no-templates sends the text as it is)")


def _compile(text: str, where: str) -> list[_Piece] | None:
    """The pieces of ``text``, or None when it holds no action."""
    if "{{" not in text:
        return None
    pieces: list[_Piece] = []
    at = 0
    for m in _ACTION.finditer(text):
        if m.start() > at:
            pieces.append(text[at:m.start()])
        pieces.append(_action(m.group(1).strip(), where))
        at = m.end()
    if "{{" in text[at:]:
        raise TemplateError(f"{where}: a {{{{ at character {text.index('{{', at) + 1} is never closed with }}}}")
    if at < len(text):
        pieces.append(text[at:])
    return pieces


def _render(pieces: list[_Piece], now: _Now) -> str:
    return "".join(p if isinstance(p, str) else p(now) for p in pieces)


class MessageTemplate:
    """A message to publish whose subject, data and header values may hold
    templates.

    Raises:
        TemplateError: one of them cannot be read (the message names which).
    """

    def __init__(self, subject: str, data: bytes, headers: Mapping[str, str], *, enabled: bool = True) -> None:
        self.subject = subject
        self.data = data
        self.headers = dict(headers)
        self._subject: list[_Piece] | None = None
        self._data: list[_Piece] | None = None
        self._headers: dict[str, list[_Piece]] = {}
        self._body: bytes | None = None
        if not enabled:
            return
        self._subject = _compile(subject, "the subject")
        try:
            text = data.decode()
        except UnicodeDecodeError:
            text = ""  # binary data: never a template
        self._data = _compile(text, "the data")
        for key, value in self.headers.items():
            pieces = _compile(value, f"header {key}")
            if pieces is not None:
                self._headers[key] = pieces

    @property
    def varies(self) -> bool:
        """Whether the messages differ from one another (any template at all)."""
        return self._subject is not None or self._data is not None or bool(self._headers)

    def render(self, count: int) -> tuple[str, bytes, dict[str, str]]:
        """Message number ``count`` (from 1): its subject, data and headers."""
        now = _Now(count)
        subject = self.subject if self._subject is None else _render(self._subject, now)
        data = self.data if self._data is None else _render(self._data, now).encode()
        headers = dict(self.headers)
        for key, pieces in self._headers.items():
            headers[key] = _render(pieces, now)
        return subject, data, headers

    def batch(self, done: int, most: int, budget: int) -> list[bytes]:
        """Messages ``done + 1`` on, encoded for ``publish_batch``: at most ``most``
        of them and ``budget`` bytes (one at least, whatever its size). With no
        template, the same body each time, encoded once."""
        if not self.varies:
            if self._body is None:
                self._body = encode_msg(self.subject, self.data, self.headers or None)
            return [self._body] * max(1, min(most, budget // len(self._body)))
        out: list[bytes] = []
        size = 0
        for i in range(done + 1, done + most + 1):
            subject, data, headers = self.render(i)
            body = encode_msg(subject, data, headers or None)
            if out and size + len(body) > budget:
                break  # rendered for nothing: the next batch renders it again, with its own time
            out.append(body)
            size += len(body)
        return out
