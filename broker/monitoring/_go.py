"""What the NATS endpoints (``_varz.py``, ``_connz.py``, ``_jsz.py``) copy from
nats-server's Go: how it reads a query parameter and words a bad one
(``decodeBool``, ``decodeInt``, ``decodeUint64``, ``decodeState`` of
``server/monitor.go``, over Go's ``strconv``), its duration texts (``myUptime``) and
Go's ``%q``.

A bad parameter is :class:`BadParameter`, which the monitor answers with 400 and the
text nats-server writes (``text/plain``, no newline), e.g. ``Error decoding boolean
for 'subs': strconv.ParseBool: parsing "x": invalid syntax``. A parameter given
twice counts by its first value, an empty one as absent (Go's ``Query().Get``).
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl

__all__ = ["BadParameter", "Query", "go_quote", "uptime", "ns_duration"]

_INT = re.compile(r"[+-]?[0-9]+")
_UINT = re.compile(r"[0-9]+")
_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})
_INT64_MAX = 2**63 - 1
_UINT64_MAX = 2**64 - 1
#: ``/connz?state=``: nats-server's ``ConnOpen``, ``ConnClosed``, ``ConnAll``.
STATES = {"open": "open", "closed": "closed", "any": "all", "all": "all"}
_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v", '"': '\\"', "\\": "\\\\"}


class BadParameter(Exception):
    """A query parameter nats-server would refuse: answered 400 with ``text``
    (:attr:`body`)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    @property
    def body(self) -> bytes:
        """The text as the response's bytes (a parameter's bytes that are not UTF-8
        as they came)."""
        return self.text.encode("utf-8", "surrogateescape")


class Query:
    """The query string of a request target, read as nats-server reads its
    parameters."""

    def __init__(self, target: str) -> None:
        self.values: dict[str, str] = {}
        if "?" in target:
            # Bytes that are not UTF-8 are kept as they came (surrogate escapes), as Go
            # keeps them: its errors quote them (``\xff``) and echo them raw.
            for key, value in parse_qsl(target.split("?", 1)[1], keep_blank_values=True, errors="surrogateescape"):
                self.values.setdefault(key, value)

    def get(self, name: str) -> str:
        """The parameter's first value ("" when absent)."""
        return self.values.get(name, "")

    def flag(self, name: str) -> bool:
        """``strconv.ParseBool``: 1, t, T, TRUE, true, True and their false twins."""
        text = self.get(name)
        if text == "" or text in _FALSE:
            return False
        if text in _TRUE:
            return True
        raise BadParameter(f"Error decoding boolean for '{name}': strconv.ParseBool: parsing {go_quote(text)}: invalid syntax")

    def integer(self, name: str) -> int:
        """``strconv.Atoi`` (a 64-bit int)."""
        text = self.get(name)
        if text == "":
            return 0
        if not _INT.fullmatch(text):
            raise BadParameter(f"Error decoding int for '{name}': strconv.Atoi: parsing {go_quote(text)}: invalid syntax")
        value = int(text)
        if not -_INT64_MAX - 1 <= value <= _INT64_MAX:
            raise BadParameter(f"Error decoding int for '{name}': strconv.Atoi: parsing {go_quote(text)}: value out of range")
        return value

    def uint64(self, name: str) -> int:
        """``strconv.ParseUint(text, 10, 64)``."""
        text = self.get(name)
        if text == "":
            return 0
        if not _UINT.fullmatch(text):
            raise BadParameter(f"Error decoding uint64 for '{name}': strconv.ParseUint: parsing {go_quote(text)}: invalid syntax")
        value = int(text)
        if value > _UINT64_MAX:
            raise BadParameter(f"Error decoding uint64 for '{name}': strconv.ParseUint: parsing {go_quote(text)}: value out of range")
        return value

    def state(self) -> str:
        """``/connz``'s ``state``: ``open`` (also when absent), ``closed`` or ``all``
        (``any`` too), in any case."""
        text = self.get("state")
        if text == "":
            return "open"
        state = STATES.get(text.lower())
        if state is None:
            raise BadParameter(f"Error decoding state for {text}")
        return state


def go_quote(text: str) -> str:
    """``text`` as Go's ``strconv.Quote`` (and ``%q``) writes it."""
    out = []
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif "\udc80" <= ch <= "\udcff":  # a byte that is not UTF-8 (``Query``'s surrogate escape)
            out.append(f"\\x{ord(ch) - 0xDC00:02x}")
        elif ch.isprintable():
            out.append(ch)
        elif ord(ch) < 0x80:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) <= 0xFFFF:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    return '"' + "".join(out) + '"'


def uptime(seconds: float) -> str:
    """nats-server's ``myUptime``: whole seconds as ``1y2d3h4m5s``, leading zero
    units left out (``0s``, ``4m5s``)."""
    secs = max(int(seconds), 0)
    mins, hours, days = secs // 60, secs // 3600, secs // 86400
    years = days // 365
    if years:
        return f"{years}y{days % 365}d{hours % 24}h{mins % 60}m{secs % 60}s"
    if days:
        return f"{days}d{hours % 24}h{mins % 60}m{secs % 60}s"
    if hours:
        return f"{hours}h{mins % 60}m{secs % 60}s"
    if mins:
        return f"{mins}m{secs % 60}s"
    return f"{secs}s"


def ns_duration(seconds: float) -> int:
    """A duration as Go's ``time.Duration`` marshals it: integer nanoseconds."""
    return round(seconds * 1_000_000_000)
