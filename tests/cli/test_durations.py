"""Durations on the command line: one parser (``storage.parse_duration_ms``, a bare
number read as seconds by the CLI) behind every duration option, and each option's
value reaching the broker in the unit its field has."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys

import pytest
from conftest import BrokerProcess, env_with_project
from hypothesis import example, given
from hypothesis import strategies as st

from broker.cli._args import duration_seconds, durations, seconds, ttl_value, whole_seconds
from broker.cli._output import duration as format_duration
from broker.cli import build_parser
from protocol import parse_go_duration
from storage import parse_duration_ms

UNITS_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1000.0, "sec": 1000.0, "m": 60_000.0, "min": 60_000.0, "h": 3_600_000.0}


@pytest.mark.parametrize(("text", "seconds_"), [
    ("30", 30.0), ("1.5", 1.5), ("0", 0.0), ("90s", 90.0), ("500ms", 0.5), ("1h30m", 5400.0), ("1m30s", 90.0),
    ("2h45m10s", 9910.0), ("1.5h", 5400.0), (".5s", 0.5), ("1m0.5s", 60.5), ("2 min", 120.0), ("1 H", 3600.0),
    ("100us", 0.0001), ("1h1ms", 3600.001),
])
def test_the_forms_a_duration_takes(text: str, seconds_: float) -> None:
    assert math.isclose(duration_seconds(text), seconds_, abs_tol=1e-12)


@pytest.mark.parametrize("text", ["", "s", "1d", "1x", "h1", "1h-30m", "1e3", "inf", "nan", "1_000", "1.2.3s", "ms", "+5s", "1 h 3"])
def test_what_is_not_a_duration(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration such as"):
        duration_seconds(text)


@pytest.mark.parametrize("text", ["-1", "-1s", "-1h30m"])
def test_negative_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="must not be negative"):
        duration_seconds(text)


def test_the_config_keeps_bare_numbers_as_milliseconds() -> None:
    assert parse_duration_ms("200") == 200.0 and parse_duration_ms("1h30m") == 5_400_000.0
    assert parse_duration_ms(5) == 5.0


terms = st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from(sorted(UNITS_MS))), min_size=1, max_size=6)


@given(terms)
def test_a_compound_duration_is_the_sum_of_its_terms(parts: list[tuple[int, str]]) -> None:
    text = "".join(f"{n}{unit}" for n, unit in parts)
    expected = sum(n * UNITS_MS[unit] for n, unit in parts)
    assert math.isclose(parse_duration_ms(text), expected, rel_tol=1e-12, abs_tol=1e-9)
    assert math.isclose(duration_seconds(text), expected / 1000, rel_tol=1e-12, abs_tol=1e-12)


@given(st.integers(0, 2_000_000), st.sampled_from(["ns", "us", "ms", "s", "m", "h"]))  # within Go's 292 years
def test_go_durations_read_the_same_here(n: int, unit: str) -> None:
    text = f"{n}{unit}"
    assert math.isclose(duration_seconds(text), parse_go_duration(text) / 1e9, rel_tol=1e-9, abs_tol=1e-9)


@given(st.integers(0, 10**10))
@example(0)
@example(999)
@example(5_400_000)
def test_what_the_cli_prints_it_reads_back(ms: int) -> None:
    text = format_duration(ms / 1000)
    assert parse_duration_ms(text) == pytest.approx(ms, abs=1e-6)


@given(st.text(max_size=20))
def test_any_text_is_a_duration_or_a_value_error(text: str) -> None:
    try:
        value = duration_seconds(text)
    except ValueError:
        return
    assert math.isfinite(value) and value >= 0


def test_argument_types() -> None:
    assert seconds("1m30s") == 90.0 and whole_seconds("1h30m") == 5400 and durations("1s, 5s,1m") == [1.0, 5.0, 60.0]
    with pytest.raises(argparse.ArgumentTypeError, match="invalid duration '1.5s': this option takes whole seconds"):
        whole_seconds("1.5s")
    with pytest.raises(argparse.ArgumentTypeError, match=r"invalid duration 'soon' \(use e.g. 30, 90s, 500ms, 1h30m\)"):
        seconds("soon")
    # TTLs go as the Nats-TTL header: the NATS server's forms as typed, others as seconds
    assert [ttl_value(t) for t in ("30", "90s", "1h30m", "NEVER", "2 min", "1.5 min", "1s", "0")] == [
        "30", "90s", "1h30m", "never", "120s", "90s", "1s", "0",
    ]
    # NATS refuses a TTL under a second (zero is none): refused here, with the minimum
    for short in ("500ms", "0.5", "999ms"):
        with pytest.raises(argparse.ArgumentTypeError, match=rf"invalid TTL '{short}': the minimum is 1s \(0 = no TTL"):
            ttl_value(short)


# Every duration option of every command, and the attribute it lands in.
OPTIONS = [
    (["topic", "create", "s", "t", "--expiry", "1h30m"], "expiry", 5400),
    (["topic", "update", "s", "t", "--expiry", "90s"], "expiry", 90),
    (["topic", "create", "s", "t", "--marker-ttl", "1m"], "marker_ttl", 60),
    (["topic", "update", "s", "t", "--duplicate-window", "2m"], "duplicate_window", 120),
    (["kv", "add", "b", "--ttl", "1h"], "ttl", 3600),
    (["kv", "add", "b", "--marker-ttl", "30s"], "marker_ttl", 30),
    (["kv", "put", "b", "k", "v", "--ttl", "1h30m"], "ttl", "1h30m"),
    (["kv", "create", "b", "k", "v", "--ttl", "90"], "ttl", "90"),
    (["pub", "x", "y", "--ttl", "1h30m"], "ttl", "1h30m"),
    (["consumer", "add", "s", "t", "c", "--ack-wait", "1m30s"], "ack_wait", 90.0),
    (["consumer", "add", "s", "t", "c", "--backoff", "500ms,1m"], "backoff", [0.5, 60.0]),
    (["consumer", "add", "s", "t", "c", "--member-timeout", "45s"], "member_timeout", 45.0),
    (["consumer", "next", "s", "t", "c", "--wait", "250ms"], "wait", 0.25),
]


@pytest.mark.parametrize(("argv", "dest", "value"), OPTIONS, ids=[" ".join(argv) for argv, _, _ in OPTIONS])
def test_every_duration_option_takes_every_form(argv: list[str], dest: str, value: object) -> None:
    assert getattr(build_parser().parse_args(argv), dest) == value


def run(address: str, *args: str) -> dict:  # type: ignore[type-arg]
    p = subprocess.run([sys.executable, "-m", "broker", "--server", address, "--json", *args], capture_output=True,
                       text=True, env=env_with_project(), timeout=60)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.splitlines()[0])  # type: ignore[no-any-return]


def test_durations_reach_the_broker_in_its_units(tmp_path_factory: pytest.TempPathFactory) -> None:
    proc = BrokerProcess(tmp_path_factory.mktemp("durations-data"))
    try:
        a = proc.address
        run(a, "stream", "create", "d")
        t = run(a, "topic", "create", "d", "t", "--subjects", "d.>", "--expiry", "1h30m", "--allow-msg-ttl",
                "--marker-ttl", "1m", "--duplicate-window", "90s")
        assert (t["message_expiry"], t["subject_delete_marker_ttl"], t["duplicate_window"]) == (5400, 60, 90)
        kv = run(a, "kv", "add", "sessions", "--ttl", "1h", "--marker-ttl", "2m")
        assert (kv["ttl"], kv["marker_ttl"]) == (3600, 120)
        c = run(a, "consumer", "add", "d", "t", "w", "--ack-wait", "1m30s", "--backoff", "1m30s,5m",
                "--partitioned", "--member-timeout", "500ms")
        assert c["config"]["backoff"] == [90.0, 300.0] and c["config"]["ack_wait"] == 90.0
        assert c["config"]["member_timeout"] == 0.5
        ack = run(a, "pub", "d.x", "hi", "--ttl", "2 min")
        msg = run(a, "fetch", "d", "t", "--offset", str(ack["offset"]), "--count", "1")
        assert msg["ttl"] == 120 and msg["headers"] == {"Nats-TTL": "120s"}
    finally:
        proc.stop()
