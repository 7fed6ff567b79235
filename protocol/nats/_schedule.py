"""Message schedules (NATS ADR-51), sans-IO: the headers, the schedule patterns and
the headers of a produced message, as nats-server 2.12+ reads and writes them
(``server/scheduler.go``, ``server/cron.go``, ``server/stream.go``).

A schedule is a message stored on its own subject carrying ``Nats-Schedule`` (the
pattern) and ``Nats-Schedule-Target`` (where the produced message goes); optional
``Nats-Schedule-TTL`` (the produced message's ``Nats-TTL``), ``Nats-Schedule-Rollup``
(only ``sub``), ``Nats-Schedule-Source`` (produce the last message of that subject
instead of the schedule's own content) and ``Nats-Schedule-Time-Zone`` (an IANA zone,
for cron patterns only).

Patterns (:func:`next_fire`):

* ``@at <RFC 3339 time>``: fires once (Go's strict ``time.RFC3339``: ``T``, ``Z`` or
  ``±hh:mm``, optional fraction);
* ``@every <Go duration>``: at least one second; repeats;
* a cron expression of six fields (second minute hour day-of-month month
  day-of-week: numbers, ``*``/``?``, ranges ``a-b``, steps ``/n``, lists ``a,b``, month
  and day names), or ``@yearly``/``@annually``, ``@monthly``, ``@weekly``,
  ``@daily``/``@midnight``, ``@hourly``; repeats. A pattern that cannot fire within
  five years is invalid.

A repeating schedule never fires twice to catch up (after a restart): a next time
already past moves to the first one after now, as the server does.
"""

from __future__ import annotations

import re
import zoneinfo
from datetime import UTC, datetime, timedelta

from protocol import TTL_INVALID, encode_body, encode_headers, parse_go_duration, parse_ttl

from .._records import _iter_header_block

__all__ = [
    "SCHEDULE",
    "SCHEDULER",
    "SCHEDULE_HEADERS",
    "SCHEDULE_NEXT",
    "SCHEDULE_NEXT_PURGE",
    "SCHEDULE_ROLLUP",
    "SCHEDULE_SOURCE",
    "SCHEDULE_TARGET",
    "SCHEDULE_TIME_ZONE",
    "SCHEDULE_TTL",
    "ScheduleError",
    "load_zone",
    "next_fire",
    "parse_cron",
    "parse_rfc3339_strict",
    "produced_body",
    "schedule_ttl_valid",
]

SCHEDULE = b"Nats-Schedule"
SCHEDULE_TARGET = b"Nats-Schedule-Target"
SCHEDULE_TTL = b"Nats-Schedule-TTL"
SCHEDULE_ROLLUP = b"Nats-Schedule-Rollup"
SCHEDULE_SOURCE = b"Nats-Schedule-Source"
SCHEDULE_TIME_ZONE = b"Nats-Schedule-Time-Zone"
#: On a produced message: the schedule's subject, and when it fires next (RFC 3339,
#: nanoseconds) or ``purge`` (a one-off: storing the produced message removes the schedule).
SCHEDULER = b"Nats-Scheduler"
SCHEDULE_NEXT = b"Nats-Schedule-Next"
SCHEDULE_NEXT_PURGE = b"purge"
#: Every header this module reads.
SCHEDULE_HEADERS = frozenset(
    (SCHEDULE, SCHEDULE_TARGET, SCHEDULE_TTL, SCHEDULE_ROLLUP, SCHEDULE_SOURCE, SCHEDULE_TIME_ZONE, SCHEDULER, SCHEDULE_NEXT)
)

NS = 1_000_000_000
_UTC = UTC
_EPOCH = datetime(1970, 1, 1, tzinfo=_UTC)


class ScheduleError(ValueError):
    """A pattern (or time zone) nats-server refuses."""


def load_zone(value: bytes | None) -> zoneinfo.ZoneInfo | None:
    """``Nats-Schedule-Time-Zone``: None when absent; an IANA zone.

    Raises:
        ScheduleError: present but empty, or not a zone name (the server's 10223).
    """
    if value is None:
        return None
    try:
        name = value.decode()
        if not name or name.startswith("/") or ".." in name:
            raise ValueError(name)
        return zoneinfo.ZoneInfo(name)
    except (ValueError, UnicodeDecodeError, zoneinfo.ZoneInfoNotFoundError, OSError):
        raise ScheduleError("message schedules time zone is invalid") from None


_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?(Z|([+-])(\d{2}):(\d{2}))", re.ASCII
)


def parse_rfc3339_strict(text: str) -> int:
    """Go's ``time.Parse(time.RFC3339, text)`` in ns since the epoch.

    Raises:
        ScheduleError: anything Go refuses (lower-case ``t``/``z``, spaces, a field
            out of range, a day the month does not have).
    """
    m = _RFC3339.fullmatch(text)
    if m is None:
        raise ScheduleError(f"not an RFC 3339 time: {text!r}")
    y, mo, d, h, mi, s = (int(m.group(k)) for k in range(1, 7))
    frac = m.group(7)
    offset = 0
    if m.group(8) != "Z":
        oh, om = int(m.group(10)), int(m.group(11))
        if oh > 23 or om > 59:
            raise ScheduleError(f"time zone offset out of range: {text!r}")
        offset = (oh * 3600 + om * 60) * (-1 if m.group(9) == "-" else 1)
    if h > 23 or mi > 59 or s > 59:
        raise ScheduleError(f"time out of range: {text!r}")
    try:
        dt = datetime(y, mo, d, h, mi, s, tzinfo=_UTC)
    except ValueError:
        raise ScheduleError(f"day out of range: {text!r}") from None
    secs = (dt - _EPOCH) // timedelta(seconds=1) - offset
    return secs * NS + (int(frac.ljust(9, "0")) if frac else 0)


def _round_second(ns: int) -> int:
    """Go's ``Time.Round(time.Second)`` (halves away from zero) of a time after 1970."""
    return (ns + NS // 2) // NS * NS


_PREDEFINED = {
    "@yearly": "0 0 0 1 1 *", "@annually": "0 0 0 1 1 *", "@monthly": "0 0 0 1 * *", "@weekly": "0 0 0 * * 0",
    "@daily": "0 0 0 * * *", "@midnight": "0 0 0 * * *", "@hourly": "0 0 * * * *",
}


def next_fire(pattern: str, zone: zoneinfo.ZoneInfo | None, ts_ns: int, now_ns: int) -> tuple[int, bool]:
    """When a schedule with ``pattern`` fires, counting from ``ts_ns`` (the schedule's
    store time, or its last firing), and whether it repeats. ``zone``: the
    ``Nats-Schedule-Time-Zone`` (cron patterns only). A repeating schedule whose
    next time is before ``now_ns`` moves to the first one after now.

    Raises:
        ScheduleError: the pattern is invalid (the server's 10189).
    """
    if pattern.startswith("@at "):
        if zone is not None:
            raise ScheduleError("a time zone is not supported for @at")
        return parse_rfc3339_strict(pattern[4:]), False
    if pattern.startswith("@every "):
        if zone is not None:
            raise ScheduleError("a time zone is not supported for @every")
        try:
            dur = parse_go_duration(pattern[7:])
        except ValueError as err:  # (DurationError)
            raise ScheduleError(str(err)) from None
        if dur < NS:
            raise ScheduleError("@every needs an interval of at least a second")
        nxt = _round_second(ts_ns) + dur
        if nxt < now_ns:
            nxt = _round_second(now_ns) + dur
        return nxt, True
    cron = _PREDEFINED.get(pattern, pattern)
    fields = _cron_fields(cron)
    nxt = _cron_next(fields, zone, ts_ns)
    if nxt < now_ns:
        nxt = _cron_next(fields, zone, _round_second(now_ns))
    return nxt, True


def parse_cron(pattern: str, zone: zoneinfo.ZoneInfo | None, ts_ns: int) -> int:
    """The first time after ``ts_ns`` (the next whole second on) a six-field cron
    pattern fires. Raises ScheduleError."""
    return _cron_next(_cron_fields(pattern), zone, ts_ns)


# -- cron (server/cron.go, after robfig/cron) -----------------------------------------

_STAR = 1 << 63
_MONTHS = {n: i + 1 for i, n in enumerate(("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"))}
_DOW = {n: i for i, n in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}
#: (min, max, names) per field: second, minute, hour, day of month, month, day of week.
_BOUNDS: tuple[tuple[int, int, dict[str, int] | None], ...] = (
    (0, 59, None), (0, 59, None), (0, 23, None), (1, 31, None), (1, 12, _MONTHS), (0, 6, _DOW),
)
_INT = re.compile(r"[+-]?\d+", re.ASCII)


def _cron_fields(pattern: str) -> tuple[int, ...]:
    fields = pattern.split()
    if len(fields) != 6:
        raise ScheduleError(f"pattern requires 6 fields, got {len(fields)}")
    return tuple(_field(f, b) for f, b in zip(fields, _BOUNDS))


def _field(text: str, bounds: tuple[int, int, dict[str, int] | None]) -> int:
    bits = 0
    for expr in text.split(","):
        if expr:
            bits |= _range(expr, bounds)
    return bits


def _int_or_name(text: str, names: dict[str, int] | None) -> int:
    if names is not None and text.lower() in names:
        return names[text.lower()]
    return _int(text)


def _int(text: str) -> int:
    if not _INT.fullmatch(text):
        raise ScheduleError(f"failed to parse int from {text}")
    n = int(text)
    if n < 0:
        raise ScheduleError(f"negative number ({n}) not allowed: {text}")
    return n


def _range(expr: str, bounds: tuple[int, int, dict[str, int] | None]) -> int:
    lo, hi, names = bounds
    range_and_step = expr.split("/")
    low_high = range_and_step[0].split("-")
    extra = 0
    if low_high[0] in ("*", "?"):
        start, end, extra = lo, hi, _STAR
    else:
        start = _int_or_name(low_high[0], names)
        if len(low_high) == 1:
            end = start
        elif len(low_high) == 2:
            end = _int_or_name(low_high[1], names)
        else:
            raise ScheduleError(f"too many hyphens: {expr}")
    if len(range_and_step) == 1:
        step = 1
    elif len(range_and_step) == 2:
        step = _int(range_and_step[1])
        if len(low_high) == 1:
            end = hi  # "N/step" means "N-max/step"
        if step > 1:
            extra = 0
    else:
        raise ScheduleError(f"too many slashes: {expr}")
    if start < lo or end > hi or start > end or step == 0:
        raise ScheduleError(f"range out of bounds: {expr}")
    bits = 0
    for i in range(start, end + 1, step):
        bits |= 1 << i
    return bits | extra


def _day_matches(dom: int, dow: int, t: datetime) -> bool:
    dom_match = bool(1 << t.day & dom)
    dow_match = bool(1 << ((t.weekday() + 1) % 7) & dow)
    if dom & _STAR or dow & _STAR:
        return dom_match and dow_match
    return dom_match or dow_match


def _cron_next(fields: tuple[int, ...], zone: zoneinfo.ZoneInfo | None, ts_ns: int) -> int:
    """The server's search (``parseCron``), on the zone's wall clock: from the next
    whole second, each field moved on until it matches, a wrap going back to the month."""
    second, minute, hour, dom, month, dow = fields
    tz = zone if zone is not None else _UTC
    secs = ts_ns // NS + 1
    t = datetime.fromtimestamp(secs, tz).replace(tzinfo=None)  # wall clock
    truncated = False
    year_limit = t.year + 5
    while True:
        if t.year > year_limit:
            raise ScheduleError("pattern exceeds maximum range")
        wrapped = False
        while not 1 << t.month & month:
            if not truncated:
                truncated = True
                t = t.replace(day=1, hour=0, minute=0, second=0)
            t = t.replace(year=t.year + 1, month=1) if t.month == 12 else t.replace(month=t.month + 1)
            if t.month == 1:
                wrapped = True
                break
        if wrapped:
            continue
        while not _day_matches(dom, dow, t):
            if not truncated:
                truncated = True
                t = t.replace(hour=0, minute=0, second=0)
            t += timedelta(days=1)
            if t.day == 1:
                wrapped = True
                break
        if wrapped:
            continue
        while not 1 << t.hour & hour:
            if not truncated:
                truncated = True
                t = t.replace(minute=0, second=0)
            t += timedelta(hours=1)
            if t.hour == 0:
                wrapped = True
                break
        if wrapped:
            continue
        while not 1 << t.minute & minute:
            if not truncated:
                truncated = True
                t = t.replace(second=0)
            t += timedelta(minutes=1)
            if t.minute == 0:
                wrapped = True
                break
        if wrapped:
            continue
        while not 1 << t.second & second:
            truncated = True
            t += timedelta(seconds=1)
            if t.second == 0:
                wrapped = True
                break
        if wrapped:
            continue
        return int(t.replace(tzinfo=tz).timestamp()) * NS


def schedule_ttl_valid(value: bytes | None) -> bool:
    """``Nats-Schedule-TTL``: absent or empty, or a TTL ``Nats-TTL`` accepts."""
    return not value or parse_ttl(value) != TTL_INVALID


# -- the produced message ------------------------------------------------------------

_STRIPPED_PREFIXES = (b"Nats-Schedule", b"Nats-Expected-")
_STRIPPED = frozenset((b"Nats-Msg-Id", b"Nats-TTL", b"Nats-Rollup"))


def produced_body(
    target: bytes, block: bytes | memoryview, payload: bytes | memoryview, scheduler: bytes, next_text: str,
    ttl: bytes | None, rollup: bytes | None,
) -> bytes:
    """The body of the message a schedule produces on ``target``, from the header
    block and payload of its content (the schedule's own, or its source's last
    message): every ``Nats-Schedule*`` (and ``Nats-Scheduler``), ``Nats-Expected-*``,
    ``Nats-Msg-Id``, ``Nats-TTL`` and ``Nats-Rollup`` header taken out, then
    ``Nats-Scheduler`` (the schedule's subject), ``Nats-Schedule-Next`` (``purge`` or
    the next time), ``Nats-TTL`` (the schedule's TTL) and ``Nats-Rollup`` (its
    rollup) appended."""
    pairs = [
        (k.decode("ascii"), v.decode(errors="replace")) for k, v in _iter_header_block(block)
        if not k.startswith(_STRIPPED_PREFIXES) and k not in _STRIPPED
    ]
    pairs.append(("Nats-Scheduler", scheduler.decode()))
    pairs.append(("Nats-Schedule-Next", next_text))
    if ttl:
        pairs.append(("Nats-TTL", ttl.decode()))
    if rollup:
        pairs.append(("Nats-Rollup", rollup.decode()))
    return encode_body(target, bytes(payload), encode_headers(pairs))
