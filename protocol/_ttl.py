"""Per-message TTL values: the ``Nats-TTL`` header and the binary TTL field.

The header is parsed exactly as the NATS server parses it (``server/stream.go``
``parseMessageTTL``; ``docs/semantics.md`` §6.1), with one difference, where we follow
ADR-43 over the server (§6.2):

1. empty (or absent) -> no TTL;
2. ``never`` in any case -> never expires;
3. a Go duration (``time.ParseDuration``: ``90s``, ``1h30m``, ``1.5s``, ``500ms``,
   signed, fractional, compound; bare ``0``): exactly zero -> **no TTL** (ADR-43's
   rule, docs/semantics.md §6.2; the current server refuses it); below one second or
   negative -> invalid; otherwise whole seconds, truncated (``1500ms`` -> 1);
4. otherwise a plain run of ASCII digits -> that many seconds (``00`` -> 0 -> no
   TTL); anything else (a sign, a space, a dot, an unknown unit like ``1d``) ->
   invalid.

A TTL must also fit the binary field: at most ``TTL_MAX`` seconds (about 136 years;
Go's durations reach 292 years, so longer values are refused here, not wrapped).

The binary field (``u32``): 0 = none, ``0xFFFFFFFF`` = never, anything else is
seconds.
"""

from __future__ import annotations

__all__ = [
    "TTL_NONE", "TTL_NEVER", "TTL_MAX", "TTL_INVALID", "parse_ttl", "parse_go_duration", "format_go_duration",
    "format_go_duration_ns",
]

TTL_NONE = 0
TTL_NEVER = 0xFFFFFFFF
TTL_MAX = 0xFFFFFFFE

#: Returned by :func:`parse_ttl` for a value that must be refused.
TTL_INVALID = -1

_NS = 1
_US = 1000 * _NS
_MS = 1000 * _US
_S = 1000 * _MS
_UNITS = {
    "ns": _NS,
    "us": _US,
    "\u00b5s": _US,  # µs, MICRO SIGN
    "\u03bcs": _US,  # μs, GREEK SMALL LETTER MU
    "ms": _MS,
    "s": _S,
    "m": 60 * _S,
    "h": 3600 * _S,
}
_MAX = 1 << 63


class DurationError(ValueError):
    pass


def _leading_int(s: str) -> tuple[int, str]:
    i = 0
    x = 0
    while i < len(s) and "0" <= s[i] <= "9":
        x = x * 10 + (ord(s[i]) - 48)
        if x > _MAX:
            raise DurationError("invalid duration (overflow)")
        i += 1
    return x, s[i:]


def _leading_fraction(s: str) -> tuple[int, float, str]:
    i = 0
    x = 0
    scale = 1.0
    overflow = False
    while i < len(s) and "0" <= s[i] <= "9":
        if not overflow:
            if x > (_MAX - 1) // 10:
                overflow = True
            else:
                y = x * 10 + (ord(s[i]) - 48)
                if y > _MAX:
                    overflow = True
                else:
                    x = y
                    scale *= 10
        i += 1
    return x, scale, s[i:]


def parse_go_duration(text: str) -> int:
    """Go's ``time.ParseDuration``, in nanoseconds.

    Raises:
        DurationError: anything Go refuses (no unit, unknown unit, overflow, ...).
    """
    s = text
    neg = False
    if s and s[0] in "+-":
        neg = s[0] == "-"
        s = s[1:]
    if s == "0":
        return 0
    if not s:
        raise DurationError(f"invalid duration {text!r}")
    d = 0
    while s:
        if not (s[0] == "." or "0" <= s[0] <= "9"):
            raise DurationError(f"invalid duration {text!r}")
        before = len(s)
        v, s = _leading_int(s)
        pre = before != len(s)
        post = False
        f, scale = 0, 1.0
        if s and s[0] == ".":
            s = s[1:]
            before = len(s)
            f, scale, s = _leading_fraction(s)
            post = before != len(s)
        if not pre and not post:
            raise DurationError(f"invalid duration {text!r}")
        i = 0
        while i < len(s) and not (s[i] == "." or "0" <= s[i] <= "9"):
            i += 1
        if i == 0:
            raise DurationError(f"missing unit in duration {text!r}")
        unit_name, s = s[:i], s[i:]
        unit = _UNITS.get(unit_name)
        if unit is None:
            raise DurationError(f"unknown unit {unit_name!r} in duration {text!r}")
        if v > _MAX // unit:
            raise DurationError(f"invalid duration {text!r} (overflow)")
        v *= unit
        if f > 0:
            v += int(float(f) * (float(unit) / scale))
            if v > _MAX:
                raise DurationError(f"invalid duration {text!r} (overflow)")
        d += v
        if d > _MAX:
            raise DurationError(f"invalid duration {text!r} (overflow)")
    if neg:
        return -d
    if d > _MAX - 1:
        raise DurationError(f"invalid duration {text!r} (overflow)")
    return d


def parse_ttl(value: bytes | str | None) -> int:
    """A ``Nats-TTL`` header value -> seconds, ``TTL_NONE``, ``TTL_NEVER`` or ``TTL_INVALID``.

    Runtime complexity: O(len(value)).
    """
    if value is None:
        return TTL_NONE
    if isinstance(value, bytes):
        if value.isdigit():  # ASCII digits only: plain seconds, what clients send (fast path)
            seconds = int(value)
            if seconds == 0:
                return TTL_NONE  # "0" (Go's zero duration), "00", "000": ignored
            return seconds if seconds <= TTL_MAX else TTL_INVALID
        try:
            text = value.decode()
        except UnicodeDecodeError:
            return TTL_INVALID
    else:
        text = value
    if text == "":
        return TTL_NONE
    if text.lower() == "never":
        return TTL_NEVER
    try:
        ns = parse_go_duration(text)
    except DurationError:
        pass
    else:
        if ns == 0:
            return TTL_NONE  # a TTL of zero is ignored (ADR-43; docs/semantics.md §6.2)
        if ns < _S:
            return TTL_INVALID
        seconds = ns // _S
        return seconds if seconds <= TTL_MAX else TTL_INVALID
    if not text.isascii() or not text.isdigit():
        return TTL_INVALID
    seconds = int(text)
    if seconds == 0:
        return TTL_NONE  # "00", "000": zero, as the server reads them
    return seconds if seconds <= TTL_MAX else TTL_INVALID


def _fraction(value: int, unit: int) -> str:
    """``value / unit`` in decimal, trailing zeros of the fraction dropped (Go's ``fmtFrac``)."""
    whole, rest = divmod(value, unit)
    if not rest:
        return str(whole)
    digits = str(rest).rjust(len(str(unit)) - 1, "0").rstrip("0")
    return f"{whole}.{digits}"


def format_go_duration_ns(ns: int) -> str:
    """Nanoseconds as Go's ``Duration.String()`` prints them: ``0s``, ``750ns``,
    ``1.5µs``, ``250ms``, ``1.5s``, ``1m30s``, ``1h0m0.5s`` (nats-server's ``%v`` of a
    duration in its messages)."""
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    u = abs(ns)
    if u < 1_000_000_000:
        if u < 1_000:
            return f"{sign}{u}ns"
        if u < 1_000_000:
            return f"{sign}{_fraction(u, 1_000)}µs"
        return f"{sign}{_fraction(u, 1_000_000)}ms"
    minutes, rest = divmod(u, 60_000_000_000)
    out = f"{_fraction(rest, 1_000_000_000)}s"
    if minutes:
        hours, minutes = divmod(minutes, 60)
        out = (f"{hours}h" if hours else "") + f"{minutes}m" + out
    return sign + out


def format_go_duration(seconds: int) -> str:
    """Whole seconds as Go's ``Duration.String()`` prints them: ``1s``, ``1m0s``,
    ``1m30s``, ``1h0m0s`` (the form of a marker's ``Nats-TTL``, ``docs/semantics.md``
    §9.3)."""
    if seconds < 60:
        return f"{seconds}s"
    m, s = divmod(seconds, 60)
    if m < 60:
        return f"{m}m{s}s"
    h, m = divmod(m, 60)
    return f"{h}h{m}m{s}s"
