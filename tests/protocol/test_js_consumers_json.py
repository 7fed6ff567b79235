"""The NATS consumer shapes of ``protocol/_js_consumers.py``: pull requests, ack
subjects and bodies, RFC 3339 times, the config mapping and its refusals."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import protocol as P
from protocol import AckKind
from protocol.nats import JSError, rfc3339
from protocol.nats import (
    ACK_NEXT,
    NextRequest,
    PushSettings,
    ack_subject,
    consumer_config_from_nats,
    consumer_config_to_nats,
    parse_ack_body,
    parse_ack_subject,
    parse_next_request,
    parse_rfc3339,
)

NAME = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-", min_size=1, max_size=20)
N = st.integers(0, 2**63 - 1)


@given(NAME, NAME, N, N, N, N, N)
def test_ack_subject_round_trip(stream: str, consumer: str, d: int, s: int, c: int, ts: int, p: int) -> None:
    a = parse_ack_subject(ack_subject(stream, consumer, d, s, c, ts, p))
    assert a is not None and tuple(a) == (stream, consumer, d, s, c, ts, p)


def test_ack_subject_v2_and_others() -> None:
    v2 = "$JS.ACK.dom.acchash.S.c.2.10.11.1700000000000000000.3.token"
    assert tuple(parse_ack_subject(v2) or ()) == ("S", "c", 2, 10, 11, 1700000000000000000, 3)
    for bad in ("$JS.ACK.S.c.1.2", "$JS.ACK.S.c.x.2.3.4.5", "$JS.NAK.S.c.1.2.3.4.5", "orders.1"):
        assert parse_ack_subject(bad) is None


@pytest.mark.parametrize(("body", "expected"), [
    (b"", (AckKind.ACK, 0)),
    (b"+ACK", (AckKind.ACK, 0)),
    (b"-NAK", (AckKind.NAK, 0)),
    (b'-NAK {"delay": 5000000000}', (AckKind.NAK, 5_000_000_000)),
    (b"+TERM", (AckKind.TERM, 0)),
    (b"+TERM because", (AckKind.TERM, 0)),
    (b"+WPI", (AckKind.IN_PROGRESS, 0)),
    (b"+NXT", (ACK_NEXT, 1)),
    (b"+NXT 5", (ACK_NEXT, 5)),
    (b'+NXT {"batch": 3}', (ACK_NEXT, 3)),
])
def test_ack_bodies(body: bytes, expected: tuple[int, int]) -> None:
    assert parse_ack_body(body) == expected


@given(st.binary(max_size=40))
def test_ack_body_parser_never_fails_otherwise(body: bytes) -> None:
    try:
        kind, value = parse_ack_body(body)
    except ValueError:
        return
    assert value >= 0 and kind in (*AckKind, ACK_NEXT)


def test_next_requests_as_the_server_reads_them() -> None:
    assert parse_next_request(b"") == NextRequest(1, 0, 0, False, 0)
    assert parse_next_request(b" 7 ") == NextRequest(7, 0, 0, False, 0)
    assert parse_next_request(b'{"batch": 3, "max_bytes": 100, "expires": 5, "no_wait": true}') == NextRequest(3, 100, 5, True, 0, True)
    # ADR-42's fields of a JSON request.
    assert parse_next_request(b'{"batch": 1, "group": "g", "min_pending": 2, "min_ack_pending": 3, "id": "P"}') == NextRequest(
        1, 0, 0, False, 0, True, "g", 2, 3, "P")
    with pytest.raises(ValueError):
        parse_next_request(b'{"batch": 1, "group": 5}')
    with pytest.raises(ValueError, match="heartbeat value too large"):
        parse_next_request(b'{"batch": 1, "expires": 10, "idle_heartbeat": 6}')
    with pytest.raises(ValueError):
        parse_next_request(b'{"batch": "x"}')
    with pytest.raises(ValueError):
        parse_next_request(b"{nope")


@given(st.binary(max_size=60))
def test_next_request_parser_raises_only_value_error(payload: bytes) -> None:
    try:
        nr = parse_next_request(payload)
    except ValueError:
        return
    assert nr.expires_ns >= 0


@given(st.integers(1, 2**62))
def test_rfc3339_round_trip(ns: int) -> None:
    assert parse_rfc3339(rfc3339(ns)) == ns


def test_rfc3339_offsets() -> None:
    assert parse_rfc3339("2024-01-02T03:04:05.5+01:00") == parse_rfc3339("2024-01-02T02:04:05.500Z")
    with pytest.raises(ValueError):
        parse_rfc3339("yesterday")


def _err(cfg: dict[str, Any], durable: bool = True) -> tuple[int, int, str]:
    with pytest.raises(JSError) as e:
        consumer_config_from_nats(cfg, durable)
    return e.value.code, e.value.err_code, e.value.description


def test_config_mapping_and_back() -> None:
    cfg = {"durable_name": "d", "deliver_policy": "by_start_sequence", "opt_start_seq": 4, "ack_policy": "explicit",
           "ack_wait": 2_000_000_000, "max_deliver": 5, "filter_subjects": ["a.>", "b.*"], "max_ack_pending": 10,
           "max_waiting": 3, "replay_policy": "instant", "num_replicas": 0}
    ours, settings = consumer_config_from_nats(cfg, durable=True)
    assert ours == {"filter_subjects": ["a.>", "b.*"], "deliver_policy": "by_start_offset", "opt_start_offset": 4,
                    "ack_policy": "explicit", "ack_wait": 2.0, "max_deliver": 5, "max_waiting": 3, "max_ack_pending": 10}
    assert settings == PushSettings(durable=True)
    full = {**ours, "backoff": [], "mode": "shared", "member_timeout": 30.0, "description": ""}
    back = consumer_config_to_nats("d", full, settings, 0)
    assert back["deliver_policy"] == "by_start_sequence" and back["opt_start_seq"] == 4
    assert back["ack_wait"] == 2_000_000_000 and back["filter_subjects"] == ["a.>", "b.*"] and back["durable_name"] == "d"
    ordered = {"deliver_subject": "_INBOX.x", "ack_policy": "none", "max_deliver": 1, "flow_control": True,
               "idle_heartbeat": 5_000_000_000, "mem_storage": True, "num_replicas": 1, "deliver_policy": "last_per_subject",
               "headers_only": True, "filter_subject": "$KV.b.>", "ack_wait": 79200 * 10**9}
    ours, settings = consumer_config_from_nats(ordered, durable=False)
    assert ours["ack_policy"] == "none" and "max_deliver" not in ours and ours["filter_subjects"] == ["$KV.b.>"]
    assert settings.deliver_subject == "_INBOX.x" and settings.flow_control and settings.headers_only


def test_config_refusals() -> None:
    assert _err({"replay_policy": "original"})[:2] == (400, 10094)
    assert _err({"rate_limit_bps": 100}) == (400, 10086, "consumer in pull mode can not have rate limit set")
    assert _err({"deliver_group": 7, "deliver_subject": "x"})[:2] == (400, 10025)
    assert _err({"num_replicas": 3}) == (500, 10074, "replicas > 1 not supported in non-clustered mode")
    assert _err({"filter_subject": "a", "filter_subjects": ["b"]})[1] == 10136
    assert _err({"filter_subjects": ["a", ""]})[1] == 10139
    assert _err({"ack_policy": "sometimes"}) == (400, 10181, "consumer ack policy invalid")
    assert _err({"ack_wait": -1}) == (400, 10183, "consumer ack wait needs to be positive")
    assert _err({"backoff": [0]}) == (400, 10184, "consumer backoff needs to be positive")
    assert _err({"deliver_subject": "x", "max_waiting": 5}, False)[1] == 10080
    assert _err({"max_ack_pending": 5})[1] == 10082  # ack none (the default)
    assert _err({"flow_control": True})[1] == 10089
    assert _err({"deliver_subject": "x.*"}, False)[1] == 10079
    assert _err({"deliver_subject": "x..y"}, False) == (400, 10112, "invalid push consumer deliver subject")
    assert _err({"deliver_subject": "x y"}, False)[1] == 10112
    assert _err({"deliver_subject": "x", "idle_heartbeat": 1000}, False)[1] == 10083
    assert _err({"deliver_subject": "x", "flow_control": True}, False)[1] == 10108
    assert _err({"max_expires": 999_999}) == (400, 10115, "consumer max request expires needs to be >= 1ms")
    assert _err({"metadata": {"a": 1}})[:2] == (400, 10025)
    assert _err({"whatever": 1}) == (400, 10094, "consumer option 'whatever' is not supported by ttlbroker")
    assert _err([])[1] == 10078  # type: ignore[arg-type]


@pytest.mark.parametrize(("ns", "text"), [
    (0, "0s"), (750, "750ns"), (1_500, "1.5µs"), (250_000_000, "250ms"), (1_000_000, "1ms"), (10**9, "1s"),
    (1_500_000_000, "1.5s"), (90 * 10**9, "1m30s"), (3600 * 10**9, "1h0m0s"), (3600 * 10**9 + 500_000_000, "1h0m0.5s"),
    (-2 * 10**9, "-2s"),
])
def test_go_durations_as_go_prints_them(ns: int, text: str) -> None:
    assert P.format_go_duration_ns(ns) == text


@given(st.integers(min_value=1, max_value=10**15))
def test_whole_seconds_print_as_the_seconds_formatter_prints_them(seconds: int) -> None:
    assert P.format_go_duration_ns(seconds * 10**9) == P.format_go_duration(seconds)
