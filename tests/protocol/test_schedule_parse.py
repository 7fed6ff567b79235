"""The message schedule parser (``protocol/nats/_schedule.py``, NATS ADR-51) against
simple models: Go's RFC 3339 against Python's datetime, the cron search against a
second-by-second scan, ``@every``'s skip-ahead, and arbitrary text refused only with
ScheduleError."""

from __future__ import annotations

import zoneinfo
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.nats import rfc3339
from protocol.nats import schedule

ScheduleError, load_zone, next_fire = schedule.ScheduleError, schedule.load_zone, schedule.next_fire
parse_cron, parse_rfc3339_strict, produced_body = schedule.parse_cron, schedule.parse_rfc3339_strict, schedule.produced_body

NS = 1_000_000_000
T0 = 1_800_000_000 * NS


@given(st.integers(1, 2**62))
def test_rfc3339_of_a_time_reads_back(ns: int) -> None:
    assert parse_rfc3339_strict(rfc3339(ns)) == ns


@given(
    st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(9998, 12, 31)),
    st.integers(-23 * 60, 23 * 60), st.integers(0, 10**9 - 1),
)
def test_rfc3339_with_an_offset_is_the_same_instant_as_datetime(dt: datetime, offset_min: int, frac: int) -> None:
    tz = timezone(timedelta(minutes=offset_min))
    local = dt.replace(microsecond=0, tzinfo=tz)
    sign = "-" if offset_min < 0 else "+"
    text = local.strftime("%Y-%m-%dT%H:%M:%S") + f".{frac:09d}{sign}{abs(offset_min) // 60:02d}:{abs(offset_min) % 60:02d}"
    assert parse_rfc3339_strict(text) == int(local.timestamp()) * NS + frac


@pytest.mark.parametrize("text", [
    "2026-12-02t15:00:00Z", "2026-12-02T15:00:00z", "2026-12-02 15:00:00Z", "2026-02-30T00:00:00Z", "2026-12-02T24:00:00Z",
    "2026-12-02T15:00:60Z", "2026-12-02T15:00:00", "2026-12-02T15:00:00+24:00", " 2026-12-02T15:00:00Z",
    "2026-12-02T15:00:00.Z", "2026-12-02T15:00:00.1234567890Z", "26-12-02T15:00:00Z",
])
def test_what_go_refuses_as_rfc3339(text: str) -> None:
    with pytest.raises(ScheduleError):
        parse_rfc3339_strict(text)


def _matches(fields: tuple[set[int], ...], t: datetime) -> bool:
    sec, minute, hour = fields
    return t.second in sec and t.minute in minute and t.hour in hour


_field = lambda hi: st.sets(st.integers(0, hi), min_size=1, max_size=4)  # noqa: E731


@settings(max_examples=40, deadline=None)
@given(_field(59), _field(59), st.one_of(st.none(), _field(23)), st.integers(0, 400 * 86400))
def test_cron_is_the_first_matching_second_after(secs: set[int], mins: set[int], hours: set[int] | None, shift: int) -> None:
    ts = T0 + shift * NS + 123
    pattern = f"{','.join(map(str, sorted(secs)))} {','.join(map(str, sorted(mins)))} " \
              f"{'*' if hours is None else ','.join(map(str, sorted(hours)))} * * *"
    got = parse_cron(pattern, None, ts)
    fields = (secs, mins, set(range(24)) if hours is None else hours)
    when = datetime.fromtimestamp(got // NS, UTC)
    assert got % NS == 0 and got > ts
    assert _matches(fields, when)
    # No matching second in between (a scan, minute by minute where a minute cannot match).
    t = datetime.fromtimestamp(ts // NS + 1, UTC)
    while t < when:
        if t.hour in fields[2] and t.minute in mins:
            assert t.second not in secs, (pattern, t)
            t += timedelta(seconds=1)
        else:
            t = (t + timedelta(minutes=1)).replace(second=0)


@pytest.mark.parametrize(("pattern", "expected"), [
    ("@hourly", "2027-01-15T09:00:00Z"), ("@daily", "2027-01-16T00:00:00Z"), ("@midnight", "2027-01-16T00:00:00Z"),
    ("@weekly", "2027-01-17T00:00:00Z"), ("@monthly", "2027-02-01T00:00:00Z"), ("@yearly", "2028-01-01T00:00:00Z"),
    ("@annually", "2028-01-01T00:00:00Z"), ("0 */15 * * * *", "2027-01-15T08:15:00Z"), ("30 0 8 15 jan ?", "2027-01-15T08:00:30Z"),
    ("0 0 12 * * SAT,sun", "2027-01-16T12:00:00Z"), ("0 0 0 1 * mon", "2027-01-18T00:00:00Z"),  # day of month OR day of week
    ("0 0 0 29 2 *", "2028-02-29T00:00:00Z"),
])
def test_cron_forms(pattern: str, expected: str) -> None:
    assert next_fire(pattern, None, T0, T0) == (parse_rfc3339_strict(expected), True)  # T0: Friday 2027-01-15T08:00:00Z


def test_a_time_zone_moves_cron_to_its_wall_clock() -> None:
    berlin = load_zone(b"Europe/Berlin")
    assert next_fire("0 0 10 * * *", berlin, T0, T0)[0] == parse_rfc3339_strict("2027-01-15T09:00:00Z")
    assert isinstance(berlin, zoneinfo.ZoneInfo)
    for bad in (b"", b"Mars/Olympus", b"../etc/passwd", b"\xff"):
        with pytest.raises(ScheduleError):
            load_zone(bad)


@given(st.integers(1, 3600), st.integers(0, 10**6), st.integers(0, 10**4))
def test_every_fires_a_duration_after_the_last_and_skips_what_was_missed(secs: int, since: int, late: int) -> None:
    ts = T0 + since * 1_000_000
    now = ts + late * NS
    got, repeat = next_fire(f"@every {secs}s", None, ts, now)
    assert repeat
    rounded = (ts + NS // 2) // NS * NS
    if rounded + secs * NS >= now:
        assert got == rounded + secs * NS
    else:  # never fires twice to catch up: the first one after now
        assert got == (now + NS // 2) // NS * NS + secs * NS
    assert got >= now or got == rounded + secs * NS


@given(st.text(max_size=40))
def test_any_text_is_a_pattern_or_refused_with_schedule_error(text: str) -> None:
    try:
        got, _ = next_fire(text, None, T0, T0)
    except ScheduleError:
        return
    assert got > 0


@pytest.mark.parametrize("text", [
    "@at", "@every", "@every 0s", "@every -5s", "@every 999ms", "* * * * *", "* * * * * * *", "60 * * * * *",
    "* * 24 * * *", "* * * 0 * *", "* * * * 13 *", "* * * * * 7", "5-1 * * * * *", "*/0 * * * * *", "1-2-3 * * * * *",
    "1/2/3 * * * * *", "x * * * * *", "@at 2026-12-02T15:00:00+01", "@sometimes",
])
def test_patterns_nats_server_refuses(text: str) -> None:
    with pytest.raises(ScheduleError):
        next_fire(text, None, T0, T0)
    assert next_fire("@at 2026-12-02T15:00:00Z", None, T0, T0)[1] is False


def test_at_and_every_take_no_time_zone() -> None:
    zone = load_zone(b"UTC")
    for pattern in ("@at 2026-12-02T15:00:00Z", "@every 1m"):
        with pytest.raises(ScheduleError):
            next_fire(pattern, zone, T0, T0)


def test_the_produced_body_strips_and_adds_the_servers_headers() -> None:
    from protocol import encode_headers
    from protocol.nats._schedule import _iter_header_block

    block = encode_headers([
        ("A", "1"), ("Nats-Schedule", "@every 1s"), ("Nats-Schedule-Target", "x"), ("Nats-Expected-Stream", "S"),
        ("Nats-Msg-Id", "i"), ("Nats-TTL", "5s"), ("Nats-Rollup", "sub"), ("Nats-Scheduler", "old"), ("B", "2"),
    ])
    body = produced_body(b"t.out", block, b"data", b"t.s", "2027-01-15T08:00:01Z", b"1m", b"sub")
    headers_at = body.index(b"t.out") + len(b"t.out")
    got = [(k.decode(), v.decode()) for k, v in _iter_header_block(body[headers_at : len(body) - 4])]
    assert got == [("A", "1"), ("B", "2"), ("Nats-Scheduler", "t.s"), ("Nats-Schedule-Next", "2027-01-15T08:00:01Z"),
                   ("Nats-TTL", "1m"), ("Nats-Rollup", "sub")]
    assert body.endswith(b"data")
