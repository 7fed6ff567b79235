"""The Nats-TTL parser and Go's duration syntax (docs/semantics.md §6.1), table-driven and
with hypothesis."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import TTL_INVALID, TTL_MAX, TTL_NEVER, TTL_NONE, format_go_duration, parse_go_duration, parse_ttl
from protocol._ttl import DurationError

S = 1_000_000_000

# Go's own time.ParseDuration table (src/time/time_test.go), the valid half.
GO_VALID = [
    ("0", 0), ("5s", 5 * S), ("30s", 30 * S), ("1478s", 1478 * S), ("-5s", -5 * S), ("+5s", 5 * S),
    ("-0", 0), ("+0", 0), ("5.0s", 5 * S), ("5.6s", 5 * S + 600_000_000), ("5.s", 5 * S), (".5s", S // 2),
    ("1.0s", S), ("1.00s", S), ("1.004s", S + 4_000_000), ("1.0040s", S + 4_000_000), ("100.00100s", 100 * S + 1_000_000),
    ("10ns", 10), ("11us", 11_000), ("12µs", 12_000), ("12μs", 12_000), ("13ms", 13_000_000), ("14s", 14 * S),
    ("15m", 15 * 60 * S), ("16h", 16 * 3600 * S), ("3h30m", (3 * 3600 + 30 * 60) * S),
    ("10.5s4m", 4 * 60 * S + 10 * S + S // 2), ("-2m3.4s", -(2 * 60 * S + 3 * S + 400_000_000)),
    ("1h2m3s4ms5us6ns", 3600 * S + 120 * S + 3 * S + 4_000_000 + 5_000 + 6), ("39h9m14.425s", (39 * 3600 + 9 * 60 + 14) * S + 425_000_000),
    ("52763797000ns", 52763797000), ("0.3333333333333333333h", 20 * 60 * S), ("9007199254740993ns", (1 << 53) + 1),
    ("9223372036854775807ns", (1 << 63) - 1), ("-9223372036854775808ns", -(1 << 63)),
]
GO_INVALID = ["", "3", "-", "s", ".", "-.", ".s", "+.s", "1d", "\x85\x85", "\xffff", "hello \xffff world", "9223372036854775808ns", "9223372036854775810ns"]


@pytest.mark.parametrize(("text", "ns"), GO_VALID)
def test_go_durations(text: str, ns: int) -> None:
    assert parse_go_duration(text) == ns


@pytest.mark.parametrize("text", GO_INVALID)
def test_go_rejects(text: str) -> None:
    with pytest.raises(DurationError):
        parse_go_duration(text)


@pytest.mark.parametrize(
    ("value", "ttl"),
    [
        (None, TTL_NONE), (b"", TTL_NONE), ("0", TTL_NONE), ("00", TTL_NONE), ("0s", TTL_NONE), ("0ms", TTL_NONE),
        ("1", 1), ("3600", 3600), ("1s", 1), ("1.5s", 1), ("1500ms", 1), ("2500ms", 2), ("1m30s", 90), ("1h", 3600),
        ("+5s", 5), ("never", TTL_NEVER), ("NeVeR", TTL_NEVER), (b"60s", 60), (str(TTL_MAX), TTL_MAX),
        ("500ms", TTL_INVALID), ("-1s", TTL_INVALID), ("abc", TTL_INVALID), ("1d", TTL_INVALID), ("5 ", TTL_INVALID),
        ("-1", TTL_INVALID), ("+5", TTL_INVALID), ("1e3", TTL_INVALID), ("1.5", TTL_INVALID), (str(TTL_MAX + 1), TTL_INVALID),
        ("2000000h", TTL_INVALID), (b"\xff", TTL_INVALID), ("١٢", TTL_INVALID),  # Arabic-Indic digits are not ASCII digits
    ],
)
def test_parse_ttl_table(value: object, ttl: int) -> None:
    assert parse_ttl(value) == ttl  # type: ignore[arg-type]


@given(st.text(max_size=30))
def test_parse_ttl_never_raises_on_any_text(text: str) -> None:
    r = parse_ttl(text)
    assert r in (TTL_NONE, TTL_NEVER, TTL_INVALID) or 1 <= r <= TTL_MAX


@given(st.binary(max_size=30))
def test_parse_ttl_never_raises_on_any_bytes(raw: bytes) -> None:
    parse_ttl(raw)


@given(st.integers(1, TTL_MAX))
def test_whole_seconds_in_every_spelling(n: int) -> None:
    assert parse_ttl(str(n)) == n
    assert parse_ttl(f"{n}s") == n
    assert parse_ttl(f"{n * 1000}ms") == n
    assert parse_ttl(format_go_duration(n)) == n


@given(st.integers(1, 10**6), st.integers(0, 999))
def test_fractions_truncate(n: int, ms: int) -> None:
    assert parse_ttl(f"{n}.{ms:03d}s") == n


def test_format_go_duration_matches_go() -> None:
    assert [format_go_duration(s) for s in (1, 2, 59, 60, 90, 3600, 3661, 86400)] == [
        "1s", "2s", "59s", "1m0s", "1m30s", "1h0m0s", "1h1m1s", "24h0m0s",
    ]
